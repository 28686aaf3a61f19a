#pragma once

// One training step: trajectory groups in, an optimizer step and its metrics
// out (DESIGN.md invariants 3-6).
//
// step(groups):
//   1. build the batch (staleness bound, response layout), refuse missing
//      behavior log-probs unless allowed (invariant 5);
//   2. one forward pass without gradients under the weights of this version:
//      the trainer's "old" log-probs, the proximal policy where the worker did
//      not record one, the behavior-vs-trainer mismatch metrics and, when a
//      reference policy is configured, the reference log-probs;
//   3. advantages over the whole batch (after the reward's KL term, if any);
//   4. for each PPO epoch and mini-batch: micro-batches by token budget,
//      gradients accumulated with one global normalizer (so the split does
//      not change the update), global grad-norm clipping, AdamW;
//   5. version + 1.
// Each is a phase over one explicit state value (src/trainer/step_state.h).
//
// The scoring temperature must be the sampling temperature: the behavior
// log-probs were taken at it, and a ratio across two temperatures is wrong
// from the first token.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/model/value_model.h"
#include "relay/rollout/trajectory.h"
#include "relay/trainer/advantages.h"
#include "relay/trainer/batch.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/kl.h"
#include "relay/trainer/options.h"
#include "relay/trainer/policy_loss.h"
#include "relay/trainer/rollout_correction.h"

namespace torch::serialize {
class InputArchive;
}  // namespace torch::serialize

namespace relay::trainer {

// What the update runs on (src/trainer/optimizer.h).
class Optimizer;
// PPO's value model with its optimizer (src/trainer/critic.h).
class Critic;
// A model whose weights the ranks shard (trainer.sharding: full;
// src/trainer/fully_sharded.h).
class FullyShardedModel;

// The state of one step, phase by phase (src/trainer/step_state.h).
struct StepState;
struct SftStepState;
struct MiniBatch;
struct PreUpdateScores;

// Optimizer updates of the step under way: a failure once one has begun
// leaves the policy half-updated (Trainer::step).
struct UpdateCount {
  int planned = 0;
  int applied = 0;  // counted before the optimizer steps, which may fail partway
};

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
  //
  // With advantage.estimator gae the trainer also trains a critic
  // (trainer.critic): `critic` (in place; the policy's architecture, on its
  // device) or, when null, one over a copy of the policy's weights as they
  // are now with a fresh value head (value_model_from_policy, seed 0).
  static StatusOr<std::unique_ptr<Trainer>> create(model::Policy policy, TrainerOptions options,
                                                   int64_t version = 0,
                                                   model::Policy reference = nullptr,
                                                   DataParallel data_parallel = {},
                                                   model::ValueModel critic = nullptr);
  ~Trainer();

  // Failures, and what they leave behind:
  //  * Before the first optimizer update (a bad batch, missing log-probs, no
  //    learning signal, a non-finite gradient norm in the first mini-batch,
  //    a LibTorch exception up to the first update): nothing changes. The
  //    parameters, the optimizer's state, the version, the controllers and
  //    the policy's train/eval mode are as they were, and the caller may step
  //    again. In particular every row's inputs (reward, behavior log-probs)
  //    and then what the step derived from them (the trainer's log-probs,
  //    advantages, the PPO anchor, IS weights) must be finite on its response
  //    tokens: otherwise the step fails (FailedPrecondition) and
  //    step_faults() names the groups to blame, so a caller can quarantine
  //    them and step again without them.
  //  * After at least one optimizer update of the step (a later mini-batch
  //    or PPO epoch fails, or an all-reduce after the updates): the policy is
  //    half-updated and no version describes it. The step returns Aborted
  //    ("...; it failed after K of M optimizer updates of the step, so the
  //    policy is half-updated: ...; resume from the last checkpoint") and the
  //    trainer is broken: every later step(), sft_step(), save_state() and
  //    restore_state() returns that same error, so the half-updated weights
  //    can be neither published as a version nor checkpointed. The process
  //    should exit and resume from its last checkpoint.
  // A LibTorch exception (allocation failure included) becomes a Status,
  // ResourceExhausted for memory and Internal otherwise (Aborted after an
  // update); it never escapes. The policy is in training mode during the
  // updates only: a step leaves its mode as it found it, on every path.
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
  // log-probs are ignored). Counts as a version, and fails as step() does.
  StatusOr<StepMetrics> sft_step(const std::vector<rollout::TrajectoryGroup>& groups);

  // Resumable state beyond the policy's weights, as the bytes of one torch
  // archive: the version, the optimizer's step count and AdamW moments, the
  // fp32 master weights and the KL/entropy controllers' coefficients. The
  // reuse counter is not kept (the rollout store marks consumed groups).
  // A trainer broken by a failed step (see step()) refuses with its error.
  // The layout is the same under every trainer.sharding and world size.
  // With sharding: optimizer it is a collective: rank 0 tells the other
  // ranks through DataParallel::lead ("save_state"), they call it too and
  // get an empty string, and rank 0 gets the whole state.
  StatusOr<std::string> save_state() const;
  // The same archive streamed into the file `path` as it is serialized
  // (common/file_io.h's AtomicFile: PATH.tmp, fsync, rename), so the state
  // is never held twice in memory: a 0.5B model's AdamW state is 4 GB,
  // and a string grown to that size by realloc peaks near twice it. Rank
  // 0's call (the others take part through save_state()); on any error
  // `path` is left as it was and the error names it.
  Status save_state_to_file(const std::string& path) const;
  // Restores what save_state wrote (`path` names it in errors), for a
  // trainer built with the same options over the policy the checkpoint's
  // weights were loaded into. Checks counts and shapes; on error nothing
  // is changed. Each rank restores alone (a sharded one keeps its part).
  Status restore_state(const std::string& bytes, const std::string& path);
  // restore_state from the file `path`, read by the archive as it loads
  // (the file is not read into memory first). NotFound when it is missing;
  // DataLoss, naming it, when it is empty, cut short or not an archive.
  Status restore_state_from_file(const std::string& path);

  int64_t version() const { return version_; }
  // The coefficients the controllers will use for the next step.
  double reward_kl_coef() const;
  double entropy_coef() const;
  // The policy being trained. With trainer.sharding: full over several
  // ranks its module holds only shards, so this is instead a copy of the
  // whole weights on the host, refreshed by every step: on rank 0 (what
  // publishing, checkpoints and evaluation read); the other ranks get their
  // module, whose parameters are empty between passes.
  model::Policy policy() const { return host_policy_ ? host_policy_ : policy_; }
  const TrainerOptions& options() const { return options_; }
  // The critic being trained (advantage.estimator gae), else null. Under
  // trainer.sharding: full its module holds only shards, so this is rank 0's
  // host copy of the whole critic as of the last save_state() (what a
  // checkpoint writes); null before the first one and on the other ranks.
  model::ValueModel critic() const;

 private:
  Trainer(model::Policy policy, TrainerOptions options, int64_t version, model::Policy reference,
          DataParallel data_parallel);
  // The optimizer, with sharding: full the shards (which free the whole
  // weights), and with gae the critic (`critic`, or one from the policy);
  // the constructor's second half, which can fail.
  Status shard_and_make_optimizer(model::ValueModel critic);

  // save_state's archive, written through `write` (the archive's writer:
  // bytes in, the count taken back, 0 for a failure). A follower of a
  // collective save takes part and writes nothing.
  Status write_state(const std::function<size_t(const void*, size_t)>& write) const;
  // restore_state's second half, on a loaded archive (`path` for errors).
  Status restore_archive(torch::serialize::InputArchive& archive, const std::string& path);

  // The exception boundary of step() and sft_step() (trainer.cc): runs
  // `body`; an exception becomes a Status, and a failure after one of
  // `updates` began breaks the trainer.
  StatusOr<StepMetrics> guarded(const UpdateCount& updates,
                                const std::function<StatusOr<StepMetrics>()>& body);
  // A LibTorch exception out of a step, as a Status; drops partial gradients.
  Status step_exception(const std::string& what, bool out_of_memory);
  // Frees the gradients of micro-batches whose update will not happen.
  void drop_gradients();

  // The phases of step(), in order (src/trainer/step_state.h).
  StatusOr<StepMetrics> step_unguarded(const std::vector<rollout::TrajectoryGroup>& groups,
                                       StepState& s);
  Status prepare_step(const std::vector<rollout::TrajectoryGroup>& groups, StepState& s);
  // The staleness bound, the reuse cap, the log-prob check and the data
  // filters; their counts go to `m`. Rows that cannot be trained on fail it,
  // with their groups in `faults`.
  StatusOr<TrainBatch> prepare_batch(const std::vector<rollout::TrajectoryGroup>& groups,
                                     StepMetrics& m, std::vector<uint64_t>* keys,
                                     std::vector<StepFault>* faults) const;
  // The pre-update pass (unless it can be skipped) and the behavior
  // log-probs with missing ones filled in.
  Status score_step(StepState& s);
  bool can_skip_pass(const TrainBatch& batch) const;
  // No-grad pass over the whole batch: the trainer's log-probs and entropy
  // (and the reference's) in the response layout, on the host.
  StatusOr<PreUpdateScores> score_before_update(const TrainBatch& batch);
  Status correct_rollouts(StepState& s);
  // Rollout correction and the mismatch diagnostics for pi_old = `old_logp`
  // over `rows_mask`.
  Status diagnose(StepState& s, const at::Tensor& old_logp, const at::Tensor& entropy,
                  const at::Tensor& rows_mask);
  Status compute_step_advantages(StepState& s);
  void choose_proximal(StepState& s);
  Status add_distillation(StepState& s);
  Status check_derived(StepState& s);
  void plan_updates(StepState& s) const;
  Status update_minibatch(StepState& s, int epoch, int index);
  MiniBatch plan_minibatch(const StepState& s, int index, bool record) const;
  void backward_micro_batch(StepState& s, MiniBatch& mb, const std::vector<int64_t>& rows);
  // The critic's update on mini-batch `mb`: its value loss over each
  // micro-batch, then its own AdamW step.
  Status update_critic(StepState& s, const MiniBatch& mb);
  Status diagnose_recorded(StepState& s, MiniBatch& mb);
  Status finish_step(StepState& s);
  void update_metrics(const StepState& s, StepMetrics& m) const;
  void commit_step(StepState& s);

  // The phases of sft_step().
  StatusOr<StepMetrics> sft_step_unguarded(const std::vector<rollout::TrajectoryGroup>& groups,
                                           SftStepState& s);
  Status prepare_sft(const std::vector<rollout::TrajectoryGroup>& groups, SftStepState& s) const;
  void backward_sft(SftStepState& s);

  // The response log-probs of `mb` with gradients (and its entropy when
  // `with_entropy`); autocast covers the forward pass only.
  std::pair<at::Tensor, at::Tensor> forward_with_grad(const TrainBatch& mb, bool with_entropy);
  // Clips, sets the scheduled LR and steps the optimizer, then frees the
  // gradients; the gradient norm. `updates` counts the update as it begins.
  StatusOr<double> apply_gradients(UpdateCount& updates);
  // This rank's rows of `rows` (all of them on a single rank).
  std::vector<int64_t> my_shard(const TrainBatch& batch, const std::vector<int64_t>& rows) const;
  // This rank's micro-batches of `rows`: its shard, split by the token budget.
  std::vector<std::vector<int64_t>> my_micro_batches(const TrainBatch& batch,
                                                     const std::vector<int64_t>& rows) const;
  // Scoring options for `mb`: the temperature, the support and, for an MoE
  // batch with routing, `routing` set to compare with (and, with
  // router_replay, replay) the recorded experts.
  model::ScoreOptions score_options(const TrainBatch& mb, model::MoeRouting* routing) const;
  // The micro-batch `mb` scored by `model` with `so` (score_options'),
  // padded or, with pack_sequences, packed and unpacked again: Policy::score's
  // [B, T - 1] log-probs (and entropy), and routing's per-position outputs
  // in mb's rows.
  model::ScoreOutput score_rows(model::PolicyImpl& model, const TrainBatch& mb,
                                model::ScoreOptions so, bool with_entropy) const;
  // What a micro-batch's token budget counts under these options.
  TokenBudget token_budget() const;
  // The memory/* metrics: bytes of weights, gradients, optimizer state,
  // master copies and the reference, and the process's resident set.
  void memory_metrics(StepMetrics& m, int64_t rss_at_start) const;

  // trainer.sharding: full over several ranks: the most micro-batches any
  // rank makes of `rows` (each rank computes every rank's split; 0 without
  // it). A rank with fewer runs empty passes up to it, since every pass
  // gathers each layer from all ranks.
  size_t most_micro_batches(const TrainBatch& batch, const std::vector<int64_t>& rows) const;
  // An empty pass: two tokens through `model` (with gradients: a zero loss
  // back-propagated), taking part in its layers' collectives and adding
  // nothing. Does nothing without sharding.
  void empty_pass(model::PolicyImpl& model, bool with_grad);
  // Rank 0's host copy of the weights, gathered from the shards.
  Status refresh_host_policy();

  model::Policy policy_;
  model::Policy reference_{nullptr};
  // LoRA without a configured reference: reference_ is policy_ itself,
  // scored with its adapters off (the base model), not a second copy.
  bool reference_is_base_ = false;
  TrainerOptions options_;
  DataParallel dp_;
  // trainer.sharding: full over several ranks: the shards of policy_ (and
  // of the reference), and rank 0's host copy of the whole policy.
  std::unique_ptr<FullyShardedModel> sharded_;
  std::unique_ptr<FullyShardedModel> sharded_reference_;
  model::Policy host_policy_{nullptr};
  // AdamW over the policy's parameters (trainer.sharding).
  std::unique_ptr<Optimizer> optimizer_;
  // advantage.estimator gae: the value model and its optimizer.
  std::unique_ptr<Critic> critic_;
  std::unique_ptr<KlController> reward_kl_;
  std::unique_ptr<EntropyController> entropy_;
  ReuseCounter reuse_;
  double last_entropy_ = std::numeric_limits<double>::quiet_NaN();
  int64_t version_ = 0;
  int64_t optimizer_steps_ = 0;
  std::vector<StepFault> step_faults_;
  // Not OK once a step failed after an optimizer update: the error every
  // later step, sft_step and save_state returns (see step()).
  Status broken_;
};

}  // namespace relay::trainer
