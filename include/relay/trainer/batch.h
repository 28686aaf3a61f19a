#pragma once

// Batch building: scored trajectory groups -> padded tensors the algorithm
// core works on (DESIGN.md invariants 4-6).
//
// Two layouts, one batch:
//  * sequence layout, for the model: input_ids [B, T] = prompt + response,
//    right-padded, with lengths [B];
//  * response layout, for the algorithm core: [B, L] with response token j
//    of trajectory b at [b, j] (L = longest response), and response_mask.
// The model's log-prob of response token j sits at position P_b - 1 + j of
// its per-position output (Policy::score); gather_response() moves it into
// the response layout, and nothing else does.
//
// Missing values stay visible: a behavior or proximal log-prob the worker did
// not send is NaN inside the mask. Positions outside the mask (padding) hold
// 0, so masked arithmetic never meets NaN by accident.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"

namespace relay::trainer {

struct BatchOptions {
  // Trainer version the batch is built for, and how many versions older a
  // token may be (invariant 6). A trajectory with any token older than
  // trainer_version - max_staleness is dropped and counted. -1 = no bound.
  int64_t trainer_version = 0;
  int64_t max_staleness = -1;
  int64_t pad_token_id = 0;
};

struct TrainBatch {
  // Sequence layout.
  at::Tensor input_ids;         // [B, T] int64, right-padded with pad_token_id
  at::Tensor lengths;           // [B] int64: P + R
  at::Tensor prompt_lengths;    // [B] int64: P
  at::Tensor response_lengths;  // [B] int64: R
  // Response layout, [B, L].
  at::Tensor response_mask;  // bool: a response token the model sampled (or was forced)
  // bool: a token the environment wrote into an episode (Trajectory::env_mask):
  // in the sequence, out of response_mask and so out of every loss and metric.
  at::Tensor env_mask;
  at::Tensor behavior_logprobs;  // fp32; NaN where the worker sent none
  at::Tensor proximal_logprobs;  // fp32; NaN where unknown
  at::Tensor proximal_versions;  // int64; -1 where unknown (and padding)
  at::Tensor token_versions;     // int64; -1 at padding
  at::Tensor offpolicy_mask;     // bool: forced prefix tokens (LUFFY)
  // fp32: on-policy distillation's log q_teacher(token) (Trajectory::
  // teacher_logprobs); NaN where the trajectory has none.
  at::Tensor teacher_logprobs;
  // Per trajectory, [B].
  at::Tensor rewards;        // fp32
  at::Tensor group_index;    // int64: index into group_ids
  at::Tensor truncated;      // bool: finished by length, not by a stop token
  at::Tensor has_offpolicy;  // bool: any forced token
  // fp32: reward of the group's greedy baseline response (ReMax); NaN for a
  // group without one.
  at::Tensor baseline_rewards;
  // MoE router replay: [B, T, layers, k] int64 in the sequence layout, the
  // experts the engine's router chose at position t (for input token t);
  // -1 where none was recorded (the last token of each row, padding, and
  // rows without routing). Undefined when no row carries routing.
  at::Tensor routed_experts;
  std::vector<std::string> group_ids;
  // Row b of this batch is trajectory `source_rows[b]` of the groups given,
  // counted across groups in order (for error messages and metrics).
  std::vector<int64_t> source_rows;

  int64_t size() const { return input_ids.defined() ? input_ids.size(0) : 0; }
  int64_t num_tokens() const;  // response tokens under the mask
};

struct BatchStats {
  int64_t groups = 0;
  int64_t trajectories = 0;    // kept
  int64_t dropped_stale = 0;   // trajectories dropped by the staleness bound
  int64_t dropped_groups = 0;  // groups with no trajectory left
};

// Builds the batch. InvalidArgument (naming group and trajectory) for an
// unscored (NaN) reward, an empty response, per-token fields of the wrong
// size (rollout::check_trajectory), a prompt that differs between the
// samples of one group, or routing of another shape than the batch's other
// rows; FailedPrecondition when nothing is left after the
// staleness filter.
StatusOr<TrainBatch> build_batch(const std::vector<rollout::TrajectoryGroup>& groups,
                                 const BatchOptions& options, BatchStats* stats = nullptr);

// per_position [B, T - 1] (position t scores token t + 1, as Policy::score
// returns) -> [B, L] response layout; 0 outside the mask. Differentiable.
at::Tensor gather_response(const at::Tensor& per_position, const TrainBatch& batch);
// [B, T - 1] bool: the positions gather_response reads (those that score a
// response token under the mask), for ScoreOptions::scored.
at::Tensor response_positions(const TrainBatch& batch);

// Rows `rows` of the batch, trimmed to their own longest sequence and response.
TrainBatch select_rows(const TrainBatch& batch, const std::vector<int64_t>& rows);

// What a micro-batch's token budget counts.
enum class TokenBudget {
  kPadded,  // rows x the micro-batch's longest sequence (rows padded to it)
  kReal,    // the rows' own tokens (sequences packed end to end: pack_rows)
};

// Splits the batch into micro-batches whose size, as `budget` counts it,
// stays within max_tokens, so long and short responses both fit; longest
// first. A single sequence longer than the budget forms a micro-batch of its
// own. Every row appears exactly once.
std::vector<std::vector<int64_t>> split_by_token_budget(const TrainBatch& batch, int64_t max_tokens,
                                                        TokenBudget budget = TokenBudget::kPadded);

// ---- Sequence packing (trainer.pack_sequences).

// A batch's rows laid end to end in fewer rows of `width` tokens, for one
// forward pass without their padding; Policy::score takes input_ids,
// lengths and sequence_starts (ScoreOptions) and scores each sequence as it
// would alone.
struct PackedRows {
  at::Tensor input_ids;        // [R, W] int64, right-padded with the pad id
  at::Tensor lengths;          // [R] int64: tokens in use in each packed row
  at::Tensor sequence_starts;  // [R, W] int64: ScoreOptions::sequence_starts
  at::Tensor routed_experts;   // [R, W, layers, k] like the batch's; undefined when it is
  at::Tensor packed_row;       // [B] int64: the packed row that holds row b
  at::Tensor offset;           // [B] int64: where row b begins in it
};

// Packs the rows first fit, longest first, into rows of `width` tokens
// (at least the longest row's length). Deterministic.
PackedRows pack_rows(const TrainBatch& batch, int64_t width, int64_t pad_token_id);

// A per-position output of packed rows, [R, W] or [R, W - 1] (Policy::score's
// layout), back in the batch's rows: [B, T] or [B, T - 1], 0 (false) where
// Policy::score on the padded rows gives 0 (past each row's length).
// Differentiable.
at::Tensor unpack_positions(const at::Tensor& per_position, const PackedRows& packed,
                            const TrainBatch& batch);
// The other way: [B, T] or [B, T - 1] in the batch's rows -> [R, W] or
// [R, W - 1] of the packed rows, 0 (false) where no row's position lands.
// Not differentiable (for masks such as ScoreOptions::scored).
at::Tensor pack_positions(const at::Tensor& per_position, const PackedRows& packed,
                          const TrainBatch& batch);

// Invariant 5. Fraction of masked tokens with a finite behavior log-prob.
double frac_behavior_logprobs_valid(const TrainBatch& batch);
// OK when every masked behavior log-prob is finite. Otherwise
// FailedPrecondition saying how many are missing, where the first one is,
// and where they should have come from.
Status check_behavior_logprobs(const TrainBatch& batch);

// ---- Reuse cap.

// A 64-bit fingerprint (FNV-1a) of what makes a trajectory the same data: its
// group id, its index in the group, its tokens, token versions and behavior
// log-prob bits. A fresh sample of the same prompt differs in practice; the
// same group handed over twice (or replayed from the store) does not.
uint64_t trajectory_key(const std::string& group_id, size_t index,
                        const rollout::Trajectory& trajectory);

// How many steps each trajectory has been trained in. Not thread-safe; owned
// by the trainer.
class ReuseCounter {
 public:
  int uses(uint64_t key) const;
  // One more use of each key, at trainer version `version`.
  void record(const std::vector<uint64_t>& keys, int64_t version);
  // Forgets keys last used before `version` (they are too stale to come back).
  void forget_before(int64_t version);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    int uses = 0;
    int64_t last_version = 0;
  };
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace relay::trainer
