#pragma once

// The `trainer:` config section's YAML keys, bound to TrainerOptions (see
// relay/trainer/options.h). Included by the config binding only.

#include "relay/trainer/options.h"

namespace relay::model {

// trainer.lora (here, beside the trainer's keys; found by ADL).
template <class V>
void visit_fields(V& v, LoraConfig& o) {
  v.field("rank", o.rank);
  v.field("alpha", o.alpha);
  v.field("dropout", o.dropout);
  v.field("targets", o.targets);
}

}  // namespace relay::model

namespace relay::trainer {

// ------------------------------------------------------------- YAML keys
// The `trainer:` section's keys, in the order configs and docs/config.md list
// them. The config binding walks these with a reader, a writer and a lister:
//   v.field(key, value)          a scalar (or a list of strings)
//   v.field(key, value, table)   an enum, by its NameTable
//   v.section(key, sub)          a nested map, walked by its own visit_fields
// A field added to a struct is configurable once it is named here.

template <class V>
void visit_fields(V& v, AdvantageOptions& o) {
  v.field("estimator", o.estimator, kAdvantageEstimatorNames);
  v.field("norm_by_std", o.norm_by_std);
  v.field("std_scale", o.std_scale, kStdScaleNames);
  v.field("epsilon", o.epsilon);
  v.field("gamma", o.gamma);
  v.field("lambda", o.lambda);
  v.field("prefix_reward_weight_alpha", o.prefix_reward_weight_alpha);
  v.field("prefix_reward_weight_beta", o.prefix_reward_weight_beta);
}

template <class V>
void visit_fields(V& v, PpoClipOptions& o) {
  v.field("clip_low", o.clip_low);
  v.field("clip_high", o.clip_high);
  v.field("clip_c", o.clip_c);
  v.field("clip_delta", o.clip_delta);
  v.field("log_ratio_clamp", o.log_ratio_clamp);
  v.field("behav_imp_weight_cap", o.behav_imp_weight_cap);
  v.field("agg_mode", o.agg_mode, kLossAggModeNames);
}

template <class V>
void visit_fields(V& v, GspoOptions& o) {
  v.field("clip_low", o.clip_low);
  v.field("clip_high", o.clip_high);
}

template <class V>
void visit_fields(V& v, GmpoOptions& o) {
  v.field("clip_low", o.clip_low);
  v.field("clip_high", o.clip_high);
}

template <class V>
void visit_fields(V& v, CispoOptions& o) {
  v.field("clip_low", o.clip_low);
  v.field("clip_high", o.clip_high);
}

template <class V>
void visit_fields(V& v, SapoOptions& o) {
  v.field("tau_pos", o.tau_pos);
  v.field("tau_neg", o.tau_neg);
}

template <class V>
void visit_fields(V& v, ClipCovOptions& o) {
  v.field("ratio", o.clip_cov_ratio);
  v.field("lb", o.clip_cov_lb);
  v.field("ub", o.clip_cov_ub);
}

template <class V>
void visit_fields(V& v, KlCovOptions& o) {
  v.field("ratio", o.kl_cov_ratio);
  v.field("coef", o.ppo_kl_coef);
}

template <class V>
void visit_fields(V& v, LuffyOptions& o) {
  v.field("off_policy_reshape", o.shaping, kOffPolicyShapingNames);
  v.field("gamma", o.gamma);
  v.field("reshape_weight", o.shaping_weight);
  v.field("reshape_pow_exp", o.pow_exponent);
  v.field("off_max_clip", o.off_max_clip);
  v.field("off_min_clip", o.off_min_clip);
  v.field("clip_upper_bound", o.clip_upper_bound);
  v.field("loss_remove_clip", o.loss_remove_clip);
  v.field("on_policy_reshape", o.on_policy_shaping, kOffPolicyShapingNames);
  v.field("on_reshape_weight", o.on_policy_shaping_weight);
  v.field("on_reshape_pow_exp", o.on_policy_pow_exponent);
}

template <class V>
void visit_fields(V& v, EntropyControlOptions& o) {
  v.field("coef", o.coef);
  v.field("target", o.target);
  v.field("delta", o.delta);
  v.field("max_coef", o.max_coef);
}

template <class V>
void visit_fields(V& v, RewardKlOptions& o) {
  v.field("coef", o.controller.kl_coef);
  v.field("controller", o.controller.type, kKlControllerNames);
  v.field("target_kl", o.controller.target_kl);
  v.field("horizon", o.controller.horizon);
  v.field("estimator", o.estimator, kKlEstimatorNames);
}

template <class V>
void visit_fields(V& v, RolloutCorrectionOptions& o) {
  v.field("is_level", o.is_level, kCorrectionLevelNames);
  v.field("is_mode", o.is_mode, kIsWeightModeNames);
  v.field("is_threshold", o.is_threshold);
  v.field("is_threshold_lower", o.is_threshold_lower);
  v.field("is_batch_normalize", o.is_batch_normalize);
  v.field("rs_level", o.rs_level, kCorrectionLevelNames);
  v.field("rs_criterion", o.rs_criterion, kRejectionCriterionNames);
  v.field("rs_threshold", o.rs_threshold);
  v.field("rs_threshold_lower", o.rs_threshold_lower);
  v.field("veto_threshold", o.veto_threshold);
  v.field("bypass", o.bypass);
  v.field("log_clamp", o.log_clamp);
}

template <class V>
void visit_fields(V& v, OptimizerOptions& o) {
  v.field("weight_decay", o.weight_decay);
  v.field("beta1", o.beta1);
  v.field("beta2", o.beta2);
  v.field("eps", o.eps);
  v.field("max_grad_norm", o.max_grad_norm);
  v.field("schedule", o.schedule, kLrScheduleNames);
  v.field("warmup_steps", o.warmup_steps);
  v.field("total_steps", o.total_steps);
  v.field("min_lr_ratio", o.min_lr_ratio);
  v.field("fp32_master_weights", o.fp32_master_weights);
}

template <class V>
void visit_fields(V& v, CriticOptions& o) {
  v.field("path", o.path);
  v.field("lr", o.optimizer.lr);
  v.field("clip_range", o.loss.clip_range);
  v.field("agg_mode", o.loss.agg_mode, kLossAggModeNames);
  v.field("warmup_steps", o.warmup_steps);
  v.section("optimizer", o.optimizer);
}

template <class V>
void visit_fields(V& v, DistillOptions& o) {
  v.field("teacher", o.teacher);
  v.field("mode", o.mode, kDistillModeNames);
  v.field("coef", o.coef);
  v.field("discount", o.discount);
  v.field("estimator", o.estimator, kKlEstimatorNames);
}

template <class V>
void visit_fields(V& v, OverlongBufferOptions& o) {
  v.field("length", o.length);
  v.field("penalty_factor", o.penalty_factor);
}

template <class V>
void visit_fields(V& v, TrainerOptions& o) {
  v.field("max_staleness", o.max_staleness);
  v.field("lr", o.optimizer.lr);
  v.field("loss", o.loss.kind, kPolicyLossNames);
  v.field("proximal", o.proximal, kProximalSourceNames);
  v.field("micro_batch_tokens", o.micro_batch_tokens);
  v.field("pack_sequences", o.pack_sequences);
  v.field("ppo_epochs", o.ppo_epochs);
  v.field("mini_batches", o.mini_batches);
  v.field("allow_missing_logprobs", o.allow_missing_logprobs);
  v.field("drop_equal_reward_groups", o.drop_equal_reward_groups);
  v.field("mask_truncated", o.mask_truncated);
  v.section("overlong_buffer", o.overlong_buffer);
  v.field("kl_coef", o.kl_coef);
  v.field("kl_estimator", o.kl_estimator, kKlEstimatorNames);
  v.field("sft_coef", o.sft_coef);
  v.field("loss_scale_factor", o.loss_scale_factor);
  v.field("reference", o.reference);
  v.field("max_reuse", o.max_reuse);
  v.field("max_extra_batches", o.max_extra_batches);
  v.field("world_size", o.data_parallel.world_size);
  v.field("rendezvous", o.data_parallel.rendezvous);
  v.field("allreduce_bucket_mb", o.data_parallel.allreduce_bucket_mb);
  v.field("collective_timeout_s", o.data_parallel.collective_timeout_s);
  v.field("sharding", o.sharding, kShardingNames);
  v.field("activation_checkpointing", o.activation_checkpointing);
  v.field("lm_head_keep_mb", o.lm_head_keep_mb);
  v.field("router_replay", o.router_replay, kRouterReplayNames);
  v.section("advantage", o.advantage);
  v.section("ppo", o.loss.ppo);
  v.section("gspo", o.loss.gspo);
  v.section("gmpo", o.loss.gmpo);
  v.section("cispo", o.loss.cispo);
  v.section("sapo", o.loss.sapo);
  v.section("clip_cov", o.loss.clip_cov);
  v.section("kl_cov", o.loss.kl_cov);
  v.section("luffy", o.loss.luffy);
  v.section("entropy", o.entropy);
  v.section("reward_kl", o.reward_kl);
  v.section("rollout_correction", o.rollout_correction);
  v.section("optimizer", o.optimizer);
  v.section("lora", o.lora);
  v.section("critic", o.critic);
  v.section("distill", o.distill);
}

}  // namespace relay::trainer
