#pragma once

// Validation of a trajectory group that arrives from a rollout worker, before
// it may reach the store (DESIGN.md "Wire API"). One bad group is refused on
// its own; the message names the group, the trajectory and the field, so the
// worker's log says what to fix.

#include <cstdint>
#include <string>

#include "relay/common/status.h"
#include "relay/rollout/trajectory.h"

namespace relay::comm {

struct SubmissionLimits {
  int64_t vocab_size = -1;                // token ids must lie in [0, vocab_size); <= 0 = unchecked
  int64_t max_tokens = int64_t{1} << 20;  // prompt + response tokens per trajectory
  // Log-probs above 0 by at most this much are floating-point rounding of a
  // near-certain token (another sampler's log_softmax) and are clamped to 0
  // by normalize_submission(); beyond it they are refused.
  double logprob_tolerance = 1e-4;
  // MoE routing (Trajectory::routed_experts) must have the model's shape:
  // moe_layers layers of moe_top_k ids in [0, num_experts). moe_layers 0 = a
  // dense model, which takes no routing; -1 = unchecked.
  int64_t moe_layers = -1;
  int64_t moe_top_k = 0;
  int64_t num_experts = 0;
};

struct SubmissionContext {
  int k = 1;                    // the lease's samples per prompt
  int64_t trainer_version = 0;  // no token may come from a later version
  int64_t oldest_version = 0;   // nor from one older than the staleness bound
};

// OK, or InvalidArgument naming the first problem (FailedPrecondition for
// versions older than oldest_version: a stale group, not a malformed one), e.g.
//   "group 'arith/7' trajectories[2].behavior_logprobs[5]: +inf is not a log-prob"
//   "group 'arith/7': 3 trajectories for a lease of k = 4"
// Checks: k trajectories; non-empty prompt and response; the same prompt in
// every sample; at most max_tokens; token ids in the vocabulary; every
// per-token field as long as the response and versions consistent
// (rollout::check_trajectory); behavior, proximal and raw log-probs NaN
// (missing) or finite and <= tolerance; token and proximal versions within
// [oldest_version, trainer_version]; a finite reward; the same for the
// greedy baseline when present (except k).
Status validate_submission(const rollout::TrajectoryGroup& group, const SubmissionContext& context,
                           const SubmissionLimits& limits = {});

// Clamps log-probs in (0, tolerance] to 0 in place (after validation); how
// many were clamped.
int64_t normalize_submission(rollout::TrajectoryGroup& group, const SubmissionLimits& limits = {});

}  // namespace relay::comm
