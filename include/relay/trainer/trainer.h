#pragma once

// One training step: trajectory groups in, an optimizer step and its metrics
// out (DESIGN.md invariants 3-6).
//
// step(groups):
//   1. build the batch (staleness bound, response layout), refuse missing
//      behavior log-probs unless allowed (invariant 5);
//   2. advantages over the whole batch;
//   3. one forward pass without gradients under the weights of this version:
//      the trainer's "old" log-probs, the proximal policy where the worker did
//      not record one, the behavior-vs-trainer mismatch metrics and, when a
//      reference policy is configured, the reference log-probs;
//   4. for each PPO epoch and mini-batch: micro-batches by token budget,
//      gradients accumulated with one global normalizer (so the split does
//      not change the update), global grad-norm clipping, AdamW;
//   5. version + 1.
//
// The scoring temperature must be the sampling temperature: the behavior
// log-probs were taken at it, and a ratio across two temperatures is wrong
// from the first token.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/rollout/trajectory.h"
#include "relay/trainer/advantages.h"
#include "relay/trainer/kl.h"
#include "relay/trainer/policy_loss.h"

namespace torch::optim {
class AdamW;
}

namespace relay::trainer {

enum class PolicyLossKind { kPpo, kDecoupledPpo };
// Where the decoupled loss's proximal log-probs come from.
enum class ProximalSource {
  kRecorded,   // the worker's value where proximal_versions == trainer version, else recompute
  kRecompute,  // the trainer's forward pass before the update
  kLoglinear,  // AReaL's interpolation between behavior and current by version distance
};
enum class LrSchedule { kConstant, kLinearWarmup, kCosine };

struct OptimizerOptions {
  double lr = 1e-5;
  double weight_decay = 0.0;  // decoupled (AdamW)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double max_grad_norm = 1.0;  // global L2 clip; <= 0 = off
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;   // linear warmup from 0 (linear_warmup, cosine)
  int64_t total_steps = 0;    // cosine: steps to decay over
  double min_lr_ratio = 0.0;  // cosine floor, as a fraction of lr
};

// Learning rate at optimizer step `step` (0-based).
double lr_at(const OptimizerOptions& options, int64_t step);

struct TrainerOptions {
  AdvantageOptions advantage;
  PolicyLossKind loss = PolicyLossKind::kPpo;
  ProximalSource proximal = ProximalSource::kRecorded;
  PpoClipOptions ppo;
  double loss_scale_factor = 0;       // seq-mean-token-sum-norm's constant; 0 = response width
  double temperature = 1.0;           // the rollout's sampling temperature
  int64_t micro_batch_tokens = 8192;  // padded tokens per forward/backward pass
  int ppo_epochs = 1;
  int mini_batches = 1;  // optimizer steps per epoch
  int64_t max_staleness = -1;
  bool allow_missing_logprobs = false;    // train NaN behavior tokens on-policy (ratio 1)
  bool drop_equal_reward_groups = false;  // DAPO dynamic sampling
  bool mask_truncated = false;            // overlong filtering
  double kl_coef = 0.0;                   // > 0: KL to the frozen initial policy in the loss
  KlEstimator kl_estimator = KlEstimator::kK3;
  double sft_coef = 0.0;  // > 0: + coef x NLL of the off-policy (forced) tokens
  OptimizerOptions optimizer;
  int64_t pad_token_id = 0;
};

// Every metric a step reports, by name (DESIGN.md's diagnostics).
using StepMetrics = std::map<std::string, double>;

class Trainer {
 public:
  // `policy` is trained in place. With kl_coef > 0 a frozen copy of its
  // current weights becomes the reference policy.
  static StatusOr<std::unique_ptr<Trainer>> create(model::Policy policy, TrainerOptions options,
                                                   int64_t version = 0);
  ~Trainer();

  // Errors before the first optimizer update (bad batch, missing log-probs,
  // no learning signal) change nothing. A non-finite gradient norm skips that
  // mini-batch's update and fails the step without advancing the version;
  // updates of earlier mini-batches of the same step stay applied.
  StatusOr<StepMetrics> step(const std::vector<rollout::TrajectoryGroup>& groups);

  // Supervised warm start: one optimizer step on the negative log-likelihood
  // of the response tokens of `groups` (demonstrations; rewards and
  // log-probs are ignored). Counts as a version, like step().
  StatusOr<StepMetrics> sft_step(const std::vector<rollout::TrajectoryGroup>& groups);

  int64_t version() const { return version_; }
  model::Policy policy() const { return policy_; }
  const TrainerOptions& options() const { return options_; }

 private:
  Trainer(model::Policy policy, TrainerOptions options, int64_t version);
  // Clips, sets the scheduled LR and steps the optimizer; the gradient norm.
  StatusOr<double> apply_gradients();

  model::Policy policy_;
  model::Policy reference_{nullptr};
  TrainerOptions options_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t version_ = 0;
  int64_t optimizer_steps_ = 0;
};

}  // namespace relay::trainer
