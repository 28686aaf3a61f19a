#pragma once

// The explicit state of one trainer step. Trainer::step and sft_step
// (trainer.cc) are short sequences of phases; each phase takes the step's
// state, reads what the phases before it filled in and adds its own part, so
// what a phase depends on is a field here rather than a local of a long
// function. Nothing here outlives its step. Private to src/trainer.
//
// An RL step, in order (Trainer::step_unguarded; the file of each phase):
//   prepare_step             trainer_prepare.cc  batch, filters, input checks
//   score_step               trainer_prepare.cc  pre-update pass, missing behavior log-probs
//   correct_rollouts         trainer_prepare.cc  IS weights / rejection, mismatch metrics
//   compute_step_advantages  trainer_prepare.cc  reward KL, advantages, proximal policy
//   data_metrics             trainer_metrics.cc  staleness, rewards, lengths
//   check_derived            trainer_prepare.cc  the last check before anything changes
//   plan_updates             trainer_update.cc   update order, mini-batch count
//   update_minibatch x M     trainer_update.cc   micro-batches' forward/loss/backward, AdamW
//   finish_step              trainer_metrics.cc  sums across ranks, metrics, controllers, version
// Nothing the trainer keeps changes before the first update_minibatch
// applies its update; a failure after that breaks the trainer (Trainer::step).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "relay/trainer/trainer.h"

namespace relay::trainer {

// The pre-update pass's outputs, [B, L] on the host.
struct PreUpdateScores {
  at::Tensor logprobs;  // the trainer's policy at this version (pi_old)
  at::Tensor entropy;
  at::Tensor reference;  // undefined without a reference policy
  at::Tensor values;     // the critic's V before its update; undefined without one
  // MoE batches with routing: response tokens (under the mask) whose
  // distribution came through other experts in some layer than the engine
  // used, and (token, layer) pairs that differ, with their counts.
  double routed_tokens = 0, differing_tokens = 0, differing_layers = 0, routed_layers = 0;
};

// Sums over the micro-batches of every update of a step: this rank's until
// finish_step adds the other ranks'. Per-token means are kept as sums of
// (mean x tokens), divided by the tokens at the end.
struct UpdateSums {
  double loss = 0;                 // the whole loss, summed over micro-batches
  double pg = 0;                   // the policy loss alone
  double kl = 0;                   // the reference KL term, before its coefficient
  double distill = 0;              // distillation's loss term (mode loss), before its coefficient
  double tokens = 0;               // response tokens the losses covered
  double grad_norm = 0;            // summed over updates
  double lr_last = 0;              // the learning rate of the last update
  PolicyLossMetrics loss_metrics;  // each field x tokens
  double critic_loss = 0;          // the critic's value loss, summed over micro-batches
  double critic_tokens = 0;        // response tokens its micro-batches covered
  double critic_clip = 0;          // its vf_clipfrac x tokens
  double critic_value = 0;         // its mean prediction x tokens
  double critic_grad_norm = 0;     // summed over updates
  double critic_lr_last = 0;
  StepMetrics extra;  // the loss's own metrics x tokens
};

// One RL step's state; each group of fields is set by the phase named
// above it and only read after.
struct StepState {
  // prepare_step
  // The process's resident bytes when the step began, less the freed memory
  // malloc keeps for reuse (model/cpu_memory.h): what was in use.
  int64_t rss_at_start = -1;
  StepMetrics metrics;               // filled by every phase; the step's result
  std::vector<uint64_t> reuse_keys;  // the trajectories trained on (trainer.max_reuse)
  TrainBatch batch;  // after the filters; its response_mask becomes train_mask for the updates
  at::Tensor mask;   // the response mask before rollout correction's rejections
  // score_step
  bool skip_pass = false;  // bypass mode without other needs: no pre-update pass
  PreUpdateScores before;  // empty when the pass is skipped
  at::Tensor behavior;     // behavior log-probs; missing ones (when allowed) are pi_old's
  at::Tensor valid;        // response tokens with a recorded behavior log-prob
  // correct_rollouts
  bool correcting = false;  // rollout correction weights or rejects (not bypass)
  at::Tensor anchor;        // the PPO ratio's denominator: behavior, or pi_old when correcting
  at::Tensor is_weights;    // undefined without importance weights
  at::Tensor train_mask;    // mask less the tokens rollout correction rejected
  // compute_step_advantages
  double reward_beta = 0;     // the reward-KL coefficient of this step (0 = off)
  double reward_kl_mean = 0;  // mean per-token KL to the reference, for the controller
  AdvantageOutputs adv;
  at::Tensor proximal;  // the decoupled loss's proximal log-probs; undefined otherwise
  // data_metrics
  double entropy_coef = 0;  // the entropy bonus's coefficient of this step
  // plan_updates
  std::vector<int64_t> order;  // batch rows in update order
  int mini_batches = 1;        // per epoch: trainer.mini_batches, at most one per row
  bool critic_warmup = false;  // trainer.critic.warmup_steps: only the critic trains
  UpdateCount updates;
  UpdateSums sums;
};

// One mini-batch of the update loop.
struct MiniBatch {
  std::vector<int64_t> rows;  // batch rows
  // One normalizer for the whole mini-batch (and one for its forced
  // tokens), counted as a single rank would split it.
  GlobalNormalizer norm, forced_norm;
  std::vector<std::vector<int64_t>> parts;  // this rank's micro-batches
  // Without the pre-update pass, the first mini-batch records pi_old and its
  // entropy for the diagnostics (its forward passes all run before the first
  // update): [B, L] buffers and the rows filled.
  bool record = false;
  at::Tensor seen_logp, seen_entropy, seen_rows;
};

// One sft_step's state: prepare_sft, backward_sft, then the update.
struct SftStepState {
  TrainBatch batch;
  GlobalNormalizer norm;          // over the whole batch, as one rank would split it
  std::vector<TrainBatch> micro;  // this rank's micro-batches
  double loss_sum = 0;            // summed across ranks before the metrics
  double grad_norm = 0;
  UpdateCount updates;
};

// Training mode for the updates; on every exit (an error return or an
// exception included) the mode the policy had before.
class TrainingMode {
 public:
  explicit TrainingMode(torch::nn::Module& model)
      : model_(model), was_training_(model.is_training()) {
    model_.train();
  }
  ~TrainingMode() { model_.train(was_training_); }
  TrainingMode(const TrainingMode&) = delete;
  TrainingMode& operator=(const TrainingMode&) = delete;

 private:
  torch::nn::Module& model_;
  const bool was_training_;
};

// ---- helpers shared by the phases' files

// The group of batch row `row`.
const std::string& row_group(const TrainBatch& b, int64_t row);
// One fault per group, the first reason found; in row order.
void add_fault(std::vector<Trainer::StepFault>& faults, const std::string& group,
               std::string reason);
// "group 'a' (reason); group 'b' (reason)".
std::string describe(const std::vector<Trainer::StepFault>& faults);

// Masked statistics of a [B, L] tensor (or [B] with an all-true mask).
struct Summary {
  double mean = 0, std = 0, min = 0, max = 0;
};
Summary summarize(const at::Tensor& values, const at::Tensor& mask);
// prefix/mean, prefix/std, prefix/min, prefix/max.
void put(StepMetrics& m, const std::string& prefix, const Summary& s);
// The sampler-vs-trainer diagnostics: the raw token ratios pi_old / pi_behav
// over `valid`, and the mismatch split by source (rollout_correction.h).
void mismatch_metrics(const at::Tensor& old_logp, const at::Tensor& behavior,
                      const at::Tensor& valid, const RolloutCorrectionMetrics& rc, StepMetrics& m);
// Staleness (against the trainer's `version`), advantages, reward, response
// lengths and batch sizes.
void data_metrics(const StepState& s, int64_t version, StepMetrics& m);
// One micro-batch's loss metrics, weighted by its `tokens`, into `sums`.
void add_loss_metrics(const PolicyLossMetrics& metrics, double tokens, UpdateSums& sums);
// Every rank's sums added together, on every rank.
Status sum_across_ranks(Collectives& group, UpdateSums& sums);

c10::DeviceType device_type_of(const model::Policy& policy);
at::Tensor index_of(const std::vector<int64_t>& rows);
// [rows, w] -> the rows' places in a [B, L] host tensor.
void scatter_rows(at::Tensor& out, const std::vector<int64_t>& rows, const at::Tensor& part);

}  // namespace relay::trainer
