#include "relay/trainer/options.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace relay::trainer {
namespace {

// Prefixes a parser's error with the YAML path it came from.
Status at_path(const std::string& path, const Status& status) {
  return Status(status.code(), absl::StrCat(path, ": ", std::string(status.message())));
}

StatusOr<PolicyLossKind> parse_loss(const std::string& name) {
  if (name == "ppo") return PolicyLossKind::kPpo;
  if (name == "decoupled_ppo") return PolicyLossKind::kDecoupledPpo;
  return InvalidArgumentError(
      absl::StrCat("trainer.loss: unknown policy loss '", name, "'; known: ppo, decoupled_ppo"));
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

  RELAY_ASSIGN_OR_RETURN(o.loss, parse_loss(c.loss));
  RELAY_ASSIGN_OR_RETURN(o.proximal, parse_proximal(c.proximal));

  const PpoConfig& cp = c.ppo;
  o.ppo.clip_low = cp.clip_low;
  o.ppo.clip_high = cp.clip_high;
  o.ppo.clip_c = cp.clip_c;
  o.ppo.clip_delta = cp.clip_delta;
  o.ppo.log_ratio_clamp = cp.log_ratio_clamp;
  o.ppo.behav_imp_weight_cap = cp.behav_imp_weight_cap;
  RELAY_ASSIGN_OR_RETURN(o.ppo.agg_mode, parse_loss_agg_mode(cp.agg_mode, "trainer.ppo.agg_mode"));

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
  return o;
}

}  // namespace relay::trainer
