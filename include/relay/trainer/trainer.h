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
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/rollout/trajectory.h"
#include "relay/trainer/advantages.h"
#include "relay/trainer/batch.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/kl.h"
#include "relay/trainer/options.h"
#include "relay/trainer/policy_loss.h"
#include "relay/trainer/rollout_correction.h"

namespace torch::optim {
class AdamW;
}

namespace relay::trainer {


// Every metric a step reports, by name (DESIGN.md's diagnostics).
using StepMetrics = std::map<std::string, double>;

class Trainer {
 public:
  // `policy` is trained in place. When the options need a reference policy
  // (needs_reference()), it is `reference` (frozen here; it must have the
  // policy's architecture) or, when null, a frozen copy of `policy` as it is now.
  // With `data_parallel` active, this is one rank of a group whose ranks all
  // make the same calls with the same groups and hold the same weights
  // (data_parallel.h); each computes its shard and the results are summed.
  static StatusOr<std::unique_ptr<Trainer>> create(model::Policy policy, TrainerOptions options,
                                                   int64_t version = 0,
                                                   model::Policy reference = nullptr,
                                                   DataParallel data_parallel = {});
  ~Trainer();

  // Errors before the first optimizer update (bad batch, missing log-probs,
  // no learning signal) change nothing. A non-finite gradient norm skips that
  // mini-batch's update and fails the step without advancing the version;
  // updates of earlier mini-batches of the same step stay applied.
  // Before any update, every row's inputs (reward, behavior log-probs) and
  // then what the step derived from them (the trainer's log-probs,
  // advantages, the PPO anchor, IS weights) must be finite on its response
  // tokens: otherwise the step fails (FailedPrecondition) having changed
  // nothing, and step_faults() names the groups to blame, so a caller can
  // quarantine them and step again without them. A LibTorch exception
  // (allocation failure included) becomes a Status: ResourceExhausted for
  // memory, Internal otherwise; it never escapes.
  StatusOr<StepMetrics> step(const std::vector<rollout::TrajectoryGroup>& groups);

  // The groups the last failed step() blamed (empty after a success or a
  // failure no group explains).
  struct StepFault {
    std::string group_id;
    std::string reason;
  };
  const std::vector<StepFault>& step_faults() const { return step_faults_; }

  // Supervised warm start: one optimizer step on the negative log-likelihood
  // of the response tokens of `groups` (demonstrations; rewards and
  // log-probs are ignored). Counts as a version, like step().
  StatusOr<StepMetrics> sft_step(const std::vector<rollout::TrajectoryGroup>& groups);

  // Resumable state beyond the policy's weights, as the bytes of one torch
  // archive: the version, the optimizer's step count and AdamW moments, the
  // fp32 master weights and the KL/entropy controllers' coefficients. The
  // reuse counter is not kept (the rollout store marks consumed groups).
  StatusOr<std::string> save_state() const;
  // Restores what save_state wrote (`path` names it in errors), for a
  // trainer built with the same options over the policy the checkpoint's
  // weights were loaded into. Checks counts and shapes; on error nothing
  // is changed.
  Status restore_state(const std::string& bytes, const std::string& path);

  int64_t version() const { return version_; }
  // The coefficients the controllers will use for the next step.
  double reward_kl_coef() const;
  double entropy_coef() const;
  model::Policy policy() const { return policy_; }
  const TrainerOptions& options() const { return options_; }

 private:
  struct Scores;
  StatusOr<StepMetrics> step_unguarded(const std::vector<rollout::TrajectoryGroup>& groups);
  StatusOr<StepMetrics> sft_step_unguarded(const std::vector<rollout::TrajectoryGroup>& groups);
  // A LibTorch exception out of a step, as a Status; drops partial gradients.
  Status step_exception(const std::string& what, bool out_of_memory);
  Trainer(model::Policy policy, TrainerOptions options, int64_t version, model::Policy reference,
          DataParallel data_parallel);
  // This rank's rows of `rows` (all of them on a single rank).
  std::vector<int64_t> my_shard(const TrainBatch& batch, const std::vector<int64_t>& rows) const;
  // This rank's micro-batches of `rows`: its shard, split by the token budget.
  std::vector<std::vector<int64_t>> my_micro_batches(const TrainBatch& batch,
                                                     const std::vector<int64_t>& rows) const;
  // The staleness bound, the reuse cap, the log-prob check and the data
  // filters; their counts go to `m`. Rows that cannot be trained on fail it,
  // with their groups in `faults`.
  StatusOr<TrainBatch> prepare_batch(const std::vector<rollout::TrajectoryGroup>& groups,
                                     StepMetrics& m, std::vector<uint64_t>* keys,
                                     std::vector<StepFault>* faults) const;
  // No-grad pass over the whole batch: the trainer's log-probs and entropy
  // (and the reference's) in the response layout, on the host.
  StatusOr<Scores> score_before_update(const TrainBatch& batch);
  bool can_skip_pass(const TrainBatch& batch) const;
  // Clips, sets the scheduled LR and steps the optimizer, then frees the
  // gradients; the gradient norm.
  StatusOr<double> apply_gradients();
  // Scoring options for `mb`: the temperature, the support and, for an MoE
  // batch with routing, `routing` set to compare with (and, with
  // router_replay, replay) the recorded experts.
  model::ScoreOptions score_options(const TrainBatch& mb, model::MoeRouting* routing) const;
  // The memory/* metrics: bytes of weights, gradients, optimizer state,
  // master copies and the reference, and the process's resident set.
  void memory_metrics(StepMetrics& m, int64_t rss_at_start) const;

  model::Policy policy_;
  model::Policy reference_{nullptr};
  TrainerOptions options_;
  DataParallel dp_;
  // The tensors AdamW steps: the parameters, or their fp32 master copies.
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> master_;  // empty unless master weights are in use
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<KlController> reward_kl_;
  std::unique_ptr<EntropyController> entropy_;
  ReuseCounter reuse_;
  double last_entropy_ = std::numeric_limits<double>::quiet_NaN();
  int64_t version_ = 0;
  int64_t optimizer_steps_ = 0;
  std::vector<StepFault> step_faults_;
};

}  // namespace relay::trainer
