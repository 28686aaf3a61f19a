#include "relay/trainer/options.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "relay/model/device.h"

namespace relay::trainer {
namespace {

// Prefixes a parser's error with the YAML path it came from.
Status at_path(const std::string& path, const Status& status) {
  return Status(status.code(), absl::StrCat(path, ": ", std::string(status.message())));
}

StatusOr<ProximalSource> parse_proximal(const std::string& name) {
  if (name == "recorded") return ProximalSource::kRecorded;
  if (name == "recompute") return ProximalSource::kRecompute;
  if (name == "loglinear") return ProximalSource::kLoglinear;
  return InvalidArgumentError(absl::StrCat("trainer.proximal: unknown proximal source '", name,
                                           "'; known: recorded, recompute, loglinear"));
}

StatusOr<LrSchedule> parse_schedule(const std::string& name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "linear_warmup") return LrSchedule::kLinearWarmup;
  if (name == "cosine") return LrSchedule::kCosine;
  return InvalidArgumentError(absl::StrCat("trainer.optimizer.schedule: unknown schedule '", name,
                                           "'; known: constant, linear_warmup, cosine"));
}

}  // namespace

StatusOr<TrainerOptions> trainer_options(const ExperimentConfig& config) {
  const TrainerConfig& c = config.trainer;
  TrainerOptions o;

  const AdvantageConfig& ca = c.advantage;
  StatusOr<AdvantageEstimator> estimator = parse_advantage_estimator(ca.estimator);
  if (!estimator.ok()) return at_path("trainer.advantage.estimator", estimator.status());
  o.advantage.estimator = *estimator;
  o.advantage.norm_by_std = ca.norm_by_std;
  StatusOr<StdScale> std_scale = parse_std_scale(ca.std_scale);
  if (!std_scale.ok()) return at_path("trainer.advantage.std_scale", std_scale.status());
  o.advantage.std_scale = *std_scale;
  o.advantage.epsilon = ca.epsilon;
  o.advantage.gamma = ca.gamma;
  o.advantage.lambda = ca.lambda;
  o.advantage.prefix_reward_weight_alpha = ca.prefix_reward_weight_alpha;
  o.advantage.prefix_reward_weight_beta = ca.prefix_reward_weight_beta;

  RELAY_ASSIGN_OR_RETURN(o.loss.kind, parse_policy_loss_kind(c.loss, "trainer.loss"));
  RELAY_ASSIGN_OR_RETURN(o.proximal, parse_proximal(c.proximal));

  const PpoConfig& cp = c.ppo;
  PpoClipOptions& ppo = o.loss.ppo;
  ppo.clip_low = cp.clip_low;
  ppo.clip_high = cp.clip_high;
  ppo.clip_c = cp.clip_c;
  ppo.clip_delta = cp.clip_delta;
  ppo.log_ratio_clamp = cp.log_ratio_clamp;
  ppo.behav_imp_weight_cap = cp.behav_imp_weight_cap;
  RELAY_ASSIGN_OR_RETURN(ppo.agg_mode, parse_loss_agg_mode(cp.agg_mode, "trainer.ppo.agg_mode"));

  // The other losses aggregate with trainer.ppo.agg_mode too, except GSPO and
  // SAPO, whose formulations fix it (seq-mean-token-mean).
  o.loss.gspo.clip_low = c.gspo.clip_low;
  o.loss.gspo.clip_high = c.gspo.clip_high;
  o.loss.gmpo.clip_low = c.gmpo.clip_low;
  o.loss.gmpo.clip_high = c.gmpo.clip_high;
  o.loss.cispo.clip_low = c.cispo.clip_low;
  o.loss.cispo.clip_high = c.cispo.clip_high;
  o.loss.cispo.agg_mode = ppo.agg_mode;
  o.loss.sapo.tau_pos = c.sapo.tau_pos;
  o.loss.sapo.tau_neg = c.sapo.tau_neg;
  o.loss.clip_cov.clip_low = cp.clip_low;
  o.loss.clip_cov.clip_high = cp.clip_high;
  o.loss.clip_cov.clip_cov_ratio = c.clip_cov.ratio;
  o.loss.clip_cov.clip_cov_lb = c.clip_cov.lb;
  o.loss.clip_cov.clip_cov_ub = c.clip_cov.ub;
  o.loss.clip_cov.seed = static_cast<uint64_t>(config.run.seed);
  o.loss.clip_cov.agg_mode = ppo.agg_mode;
  o.loss.kl_cov.kl_cov_ratio = c.kl_cov.ratio;
  o.loss.kl_cov.ppo_kl_coef = c.kl_cov.coef;
  o.loss.kl_cov.agg_mode = ppo.agg_mode;

  LuffyOptions& luffy = o.loss.luffy;
  luffy.on_policy = ppo;
  luffy.on_policy.clip_c = 0;  // LUFFY has no dual clip
  luffy.gamma = c.luffy.gamma;
  StatusOr<OffPolicyShaping> shaping = parse_off_policy_shaping(
      c.luffy.off_policy_reshape, &luffy.gamma, "trainer.luffy.off_policy_reshape");
  if (!shaping.ok()) return shaping.status();
  luffy.shaping = *shaping;
  luffy.shaping_weight = c.luffy.reshape_weight;
  luffy.pow_exponent = c.luffy.reshape_pow_exp;
  luffy.off_max_clip = c.luffy.off_max_clip;
  luffy.off_min_clip = c.luffy.off_min_clip;
  luffy.clip_upper_bound = c.luffy.clip_upper_bound;
  luffy.loss_remove_clip = c.luffy.loss_remove_clip;
  luffy.on_policy_gamma = c.luffy.gamma;
  StatusOr<OffPolicyShaping> on_shaping = parse_off_policy_shaping(
      c.luffy.on_policy_reshape, &luffy.on_policy_gamma, "trainer.luffy.on_policy_reshape");
  if (!on_shaping.ok()) return on_shaping.status();
  luffy.on_policy_shaping = *on_shaping;
  luffy.on_policy_shaping_weight = c.luffy.on_reshape_weight;
  luffy.on_policy_pow_exponent = c.luffy.on_reshape_pow_exp;
  luffy.sft_coef = 0;  // the trainer's sft_coef term covers LUFFY's multitask SFT

  o.entropy.coef = c.entropy.coef;
  o.entropy.target = c.entropy.target;
  o.entropy.delta = c.entropy.delta;
  o.entropy.max_coef = c.entropy.max_coef;

  o.reward_kl.controller.kl_coef = c.reward_kl.coef;
  RELAY_ASSIGN_OR_RETURN(
      o.reward_kl.controller.type,
      parse_kl_controller_type(c.reward_kl.controller, "trainer.reward_kl.controller"));
  o.reward_kl.controller.target_kl = c.reward_kl.target_kl;
  o.reward_kl.controller.horizon = c.reward_kl.horizon;
  RELAY_ASSIGN_OR_RETURN(o.reward_kl.estimator,
                         parse_kl_estimator(c.reward_kl.estimator, "trainer.reward_kl.estimator"));
  o.max_reuse = c.max_reuse;

  const RolloutCorrectionConfig& crc = c.rollout_correction;
  RolloutCorrectionOptions& rc = o.rollout_correction;
  RELAY_ASSIGN_OR_RETURN(
      rc.is_level, parse_correction_level(crc.is_level, "trainer.rollout_correction.is_level"));
  RELAY_ASSIGN_OR_RETURN(rc.is_mode,
                         parse_is_weight_mode(crc.is_mode, "trainer.rollout_correction.is_mode"));
  rc.is_threshold = crc.is_threshold;
  rc.is_threshold_lower = crc.is_threshold_lower;
  rc.is_batch_normalize = crc.is_batch_normalize;
  RELAY_ASSIGN_OR_RETURN(
      rc.rs_level, parse_correction_level(crc.rs_level, "trainer.rollout_correction.rs_level"));
  RELAY_ASSIGN_OR_RETURN(
      rc.rs_criterion,
      parse_rejection_criterion(crc.rs_criterion, "trainer.rollout_correction.rs_criterion"));
  rc.rs_threshold = crc.rs_threshold;
  rc.rs_threshold_lower = crc.rs_threshold_lower;
  rc.veto_threshold = crc.veto_threshold;
  rc.bypass = crc.bypass;
  rc.log_clamp = crc.log_clamp;
  RELAY_RETURN_IF_ERROR(validate(rc, "trainer.rollout_correction"));

  o.loss_scale_factor = c.loss_scale_factor;
  o.temperature = config.rollout.temperature;  // score at the sampling temperature
  o.micro_batch_tokens = c.micro_batch_tokens;
  o.ppo_epochs = c.ppo_epochs;
  o.mini_batches = c.mini_batches;
  o.max_staleness = c.max_staleness;
  o.allow_missing_logprobs = c.allow_missing_logprobs;
  o.drop_equal_reward_groups = c.drop_equal_reward_groups;
  o.mask_truncated = c.mask_truncated;
  o.kl_coef = c.kl_coef;
  RELAY_ASSIGN_OR_RETURN(o.kl_estimator,
                         parse_kl_estimator(c.kl_estimator, "trainer.kl_estimator"));
  o.sft_coef = c.sft_coef;

  const OptimizerConfig& co = c.optimizer;
  o.optimizer.lr = c.lr;
  o.optimizer.weight_decay = co.weight_decay;
  o.optimizer.beta1 = co.beta1;
  o.optimizer.beta2 = co.beta2;
  o.optimizer.eps = co.eps;
  o.optimizer.max_grad_norm = co.max_grad_norm;
  RELAY_ASSIGN_OR_RETURN(o.optimizer.schedule, parse_schedule(co.schedule));
  o.optimizer.warmup_steps = co.warmup_steps;
  o.optimizer.total_steps = co.total_steps;
  o.optimizer.min_lr_ratio = co.min_lr_ratio;
  o.optimizer.fp32_master_weights = co.fp32_master_weights;
  RELAY_ASSIGN_OR_RETURN(o.autocast, model::parse_autocast(config.run.autocast));
  o.activation_checkpointing = c.activation_checkpointing;
  if (c.router_replay != "off" && c.router_replay != "replay") {
    return InvalidArgumentError(absl::StrCat("trainer.router_replay: unknown mode '",
                                             c.router_replay, "'; known: off, replay"));
  }
  o.router_replay = c.router_replay == "replay";
  return o;
}

}  // namespace relay::trainer
