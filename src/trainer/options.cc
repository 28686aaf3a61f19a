#include "relay/trainer/options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace relay::trainer {
namespace {

// A lower bound given as a value: 0 (= the reciprocal of the upper bound) or in (0, 1).
bool zero_or_unit_interval(double x) { return x == 0 || (x > 0 && x < 1); }

void clip_pair(const GspoOptions& o, Problems p) {
  p.in_range("clip_low", o.clip_low, 0, 1, /*open_hi=*/true);
  p.non_negative("clip_high", o.clip_high);
}

}  // namespace

void check(const AdvantageOptions& o, Problems p) {
  p.positive("epsilon", o.epsilon);
  p.finite("epsilon", o.epsilon);
  p.in_range("gamma", o.gamma, 0, 1);
  p.in_range("lambda", o.lambda, 0, 1);
  p.finite("prefix_reward_weight_alpha", o.prefix_reward_weight_alpha);
  p.finite("prefix_reward_weight_beta", o.prefix_reward_weight_beta);
}

void check(const KlControllerOptions& o, Problems p) {
  p.non_negative("coef", o.kl_coef);
  // Only the adaptive controller reads them, but a config that names them
  // wrongly is wrong whichever controller it picks.
  p.positive("target_kl", o.target_kl);
  p.positive("horizon", o.horizon);
}

void check(const PpoClipOptions& o, Problems p) {
  p.in_range("clip_low", o.clip_low, 0, 1, /*open_hi=*/true);
  p.non_negative("clip_high", o.clip_high);
  p.zero_or_above("clip_c", o.clip_c, 1, "1");
  if (o.clip_high >= 0) {
    p.zero_or_above(
        "clip_delta", o.clip_delta, 1 + o.clip_high,
        absl::StrCat("1 + ", p.path("clip_high"), " (", format_double(1 + o.clip_high), ")"));
  }
  p.non_negative("log_ratio_clamp", o.log_ratio_clamp);
  p.zero_or_above("behav_imp_weight_cap", o.behav_imp_weight_cap, 1, "1");
}

double p_div_p_gamma(OffPolicyShaping shaping, double gamma) {
  switch (shaping) {
    case OffPolicyShaping::kPDivP01:
      return 0.1;
    case OffPolicyShaping::kPDivP03:
      return 0.3;
    case OffPolicyShaping::kPDivP05:
      return 0.5;
    default:
      return gamma;
  }
}

void check(const LuffyOptions& o, Problems p) {
  p.positive("gamma", o.gamma);
  p.positive("reshape_pow_exp", o.pow_exponent);
  p.positive("on_reshape_pow_exp", o.on_policy_pow_exponent);
  p.non_negative("off_max_clip", o.off_max_clip);
  p.non_negative("off_min_clip", o.off_min_clip);
  if (o.off_max_clip > 0 && o.off_min_clip > o.off_max_clip) {
    p.add("off_min_clip",
          absl::StrCat("must be <= ", p.path("off_max_clip"), " (", format_double(o.off_max_clip),
                       ")"),
          o.off_min_clip);
  }
  p.non_negative("clip_upper_bound", o.clip_upper_bound);
  p.non_negative("sft_coef", o.sft_coef);
}

void share_ppo_settings(PolicyLossOptions& o) {
  const PpoClipOptions& ppo = o.ppo;
  o.cispo.agg_mode = ppo.agg_mode;
  o.clip_cov.clip_low = ppo.clip_low;
  o.clip_cov.clip_high = ppo.clip_high;
  o.clip_cov.agg_mode = ppo.agg_mode;
  o.kl_cov.agg_mode = ppo.agg_mode;
  o.luffy.on_policy = ppo;
  o.luffy.on_policy.clip_c = 0;  // LUFFY has no dual clip
}

void check(const EntropyControlOptions& o, Problems p) {
  p.non_negative("coef", o.coef);
  p.non_negative("target", o.target);
  p.finite("target", o.target);
  if (o.target > 0) {
    p.positive("delta", o.delta);
    if (!(o.max_coef >= o.coef)) {
      p.add("max_coef",
            absl::StrCat("must be >= ", p.path("coef"), " (", format_double(o.coef), ")"),
            o.max_coef);
    }
  }
}

void check(const RolloutCorrectionOptions& o, Problems p) {
  p.positive("log_clamp", o.log_clamp);
  if (!zero_or_unit_interval(o.veto_threshold)) {
    p.add("veto_threshold", "must be 0 (off) or in (0, 1)", o.veto_threshold);
  }
  if (o.is_level != CorrectionLevel::kNone) {
    if (!(o.is_threshold > 1)) p.add("is_threshold", "must be > 1", o.is_threshold);
    if (o.is_mode == IsWeightMode::kClip) {
      if (!zero_or_unit_interval(o.is_threshold_lower)) {
        p.add("is_threshold_lower", "must be 0 (= 1 / is_threshold) or in (0, 1)",
              o.is_threshold_lower);
      }
    } else if (o.is_threshold_lower != 0) {
      // Truncation has no lower bound; a value here means clip was intended.
      p.add("is_threshold_lower", "must be 0 with is_mode truncate (clip uses it)",
            o.is_threshold_lower);
    }
  }
  if (o.rs_level == CorrectionLevel::kNone) return;
  if (o.rs_criterion == RejectionCriterion::kRatio) {
    if (!(o.rs_threshold > 1)) p.add("rs_threshold", "must be > 1", o.rs_threshold);
    if (!zero_or_unit_interval(o.rs_threshold_lower)) {
      p.add("rs_threshold_lower", "must be 0 (= 1 / rs_threshold) or in (0, 1)",
            o.rs_threshold_lower);
    }
    return;
  }
  if (!(o.rs_threshold > 0)) p.add("rs_threshold", "must be > 0", o.rs_threshold);
  if (o.rs_threshold_lower != 0) {
    p.add("rs_threshold_lower",
          absl::StrCat("must be 0 (rs_criterion ", kRejectionCriterionNames.name(o.rs_criterion),
                       " has no lower bound)"),
          o.rs_threshold_lower);
  }
}

void check(const OptimizerOptions& o, Problems p) {
  p.non_negative("weight_decay", o.weight_decay);
  p.in_range("beta1", o.beta1, 0, 1, /*open_hi=*/true);
  p.in_range("beta2", o.beta2, 0, 1, /*open_hi=*/true);
  p.positive("eps", o.eps);
  p.at_least("warmup_steps", o.warmup_steps, 0);
  p.at_least("total_steps", o.total_steps, 0);
  if (o.schedule == LrSchedule::kCosine && o.total_steps == 0) {
    p.add("total_steps", "must be >= 1 with schedule 'cosine'", o.total_steps);
  }
  p.in_range("min_lr_ratio", o.min_lr_ratio, 0, 1);
}

double lr_at(const OptimizerOptions& o, int64_t step) {
  const bool warming = o.warmup_steps > 0 && step < o.warmup_steps;
  const double warm = warming ? static_cast<double>(step + 1) / o.warmup_steps : 1.0;
  switch (o.schedule) {
    case LrSchedule::kConstant:
      return o.lr;
    case LrSchedule::kLinearWarmup:
      return o.lr * warm;
    case LrSchedule::kCosine: {
      if (warming) return o.lr * warm;
      const int64_t span = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
      const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
      return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress)));
    }
  }
  return o.lr;
}

void check(const TrainerOptions& o, Problems p) {
  p.at_least("max_staleness", o.max_staleness, -1);
  p.positive("lr", o.optimizer.lr);
  p.at_least("micro_batch_tokens", o.micro_batch_tokens, 1);
  p.in_range("lm_head_keep_mb", static_cast<double>(o.lm_head_keep_mb), 0, 1 << 24);  // 16 TiB
  p.at_least("ppo_epochs", o.ppo_epochs, 1);
  p.at_least("mini_batches", o.mini_batches, 1);
  p.non_negative("kl_coef", o.kl_coef);
  p.non_negative("sft_coef", o.sft_coef);
  p.non_negative("loss_scale_factor", o.loss_scale_factor);
  p.at_least("max_reuse", o.max_reuse, 0);
  p.at_least("max_extra_batches", o.max_extra_batches, 0);
  p.at_least("world_size", o.data_parallel.world_size, 1);
  p.at_least("allreduce_bucket_mb", o.data_parallel.allreduce_bucket_mb, 1);
  p.positive("collective_timeout_s", o.data_parallel.collective_timeout_s);
  p.positive("temperature", o.temperature);  // rollout.temperature, checked there in configs
  {
    Problems ob = p.at("overlong_buffer");
    ob.at_least("length", o.overlong_buffer.length, 0);
    if (o.overlong_buffer.length > 0) {
      ob.positive("penalty_factor", o.overlong_buffer.penalty_factor);
      // A run's config bounds it by rollout.max_new_tokens (config rules);
      // in code the caller sets max_response_length.
      if (o.max_response_length > 0 && o.overlong_buffer.length >= o.max_response_length) {
        ob.add("length",
               absl::StrCat("must be < the response budget (rollout.max_new_tokens, ",
                            o.max_response_length, ")"),
               o.overlong_buffer.length);
      }
      if (o.advantage.estimator == AdvantageEstimator::kRemax) {
        ob.add("length",
               "not with advantage.estimator remax: the greedy baseline's length is not in the "
               "batch, so its reward would go unpenalized",
               o.overlong_buffer.length);
      }
    }
  }

  const PolicyLossOptions& loss = o.loss;
  check(loss.ppo, p.at("ppo"));
  clip_pair(loss.gspo, p.at("gspo"));
  Problems gmpo = p.at("gmpo");
  gmpo.non_negative("clip_low", loss.gmpo.clip_low);
  gmpo.non_negative("clip_high", loss.gmpo.clip_high);
  clip_pair(GspoOptions{loss.cispo.clip_low, loss.cispo.clip_high}, p.at("cispo"));
  Problems sapo = p.at("sapo");
  sapo.positive("tau_pos", loss.sapo.tau_pos);
  sapo.positive("tau_neg", loss.sapo.tau_neg);
  Problems clip_cov = p.at("clip_cov");
  if (!(loss.clip_cov.clip_cov_ratio > 0 && loss.clip_cov.clip_cov_ratio <= 1)) {
    clip_cov.add("ratio", "must be in (0, 1]", loss.clip_cov.clip_cov_ratio);
  }
  if (!(loss.clip_cov.clip_cov_lb < loss.clip_cov.clip_cov_ub)) {
    clip_cov.add("lb",
                 absl::StrCat("must be < ", clip_cov.path("ub"), " (",
                              format_double(loss.clip_cov.clip_cov_ub), ")"),
                 loss.clip_cov.clip_cov_lb);
  }
  Problems kl_cov = p.at("kl_cov");
  if (!(loss.kl_cov.kl_cov_ratio > 0 && loss.kl_cov.kl_cov_ratio <= 1)) {
    kl_cov.add("ratio", "must be in (0, 1]", loss.kl_cov.kl_cov_ratio);
  }
  kl_cov.non_negative("coef", loss.kl_cov.ppo_kl_coef);
  check(loss.luffy, p.at("luffy"));

  check(o.entropy, p.at("entropy"));
  check(o.reward_kl.controller, p.at("reward_kl"));
  check(o.advantage, p.at("advantage"));
  check(o.rollout_correction, p.at("rollout_correction"));
  check(o.optimizer, p.at("optimizer"));
  {
    Problems critic = p.at("critic");
    critic.positive("lr", o.critic.optimizer.lr);
    critic.positive("clip_range", o.critic.loss.clip_range);
    critic.at_least("warmup_steps", o.critic.warmup_steps, 0);
    check(o.critic.optimizer, critic.at("optimizer"));
  }
  if (o.advantage.estimator == AdvantageEstimator::kNone && !o.distill.enabled()) {
    p.at("advantage")
        .add("estimator",
             "none gives every token advantage 0: it is for pure distillation and "
             "needs trainer.distill.coef > 0");
  }
  if (o.drop_equal_reward_groups && o.distill.enabled()) {
    // The filter reads rewards alone. Under distillation a group whose
    // rewards are all equal still carries the teacher's per-token term (all
    // of the signal with advantage.estimator none), which dropping it loses.
    p.add("drop_equal_reward_groups",
          "must be false with trainer.distill (coef > 0): a group of equal rewards still "
          "carries the teacher's per-token signal");
  }
  {
    Problems distill = p.at("distill");
    distill.non_negative("coef", o.distill.coef);
    if (!(o.distill.discount >= 0 && o.distill.discount <= 1)) {
      distill.add("discount", "must be in [0, 1]", o.distill.discount);
    }
  }
  model::check(o.lora, p.at("lora"));
  if (o.lora.enabled() && o.lora.dropout > 0 && o.activation_checkpointing) {
    // The checkpointed forward runs without gradients, hence without
    // dropout, and its recompute with a fresh mask: the two would disagree.
    p.at("lora").add("dropout",
                     "must be 0 with trainer.activation_checkpointing (the recompute would draw "
                     "another dropout mask)",
                     o.lora.dropout);
  }
}

Status validate(const TrainerOptions& options) { return check_options(options, "trainer"); }

}  // namespace relay::trainer
