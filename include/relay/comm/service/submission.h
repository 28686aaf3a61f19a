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
  // The model's context (max_position_embeddings): prompt + response must fit
  // it, or the trainer could not score the sequence. <= 0 = unchecked.
  int64_t max_context = 0;
  // Response tokens per trajectory (rollout.max_new_tokens): a worker's engine
  // stops there, so a longer response did not come from the run's settings.
  // <= 0 = unchecked.
  int64_t max_response_tokens = 0;
  int64_t max_episode_tokens = 0;  // the same for an episode's (rollout.episode.max_tokens)
  // Invariant 5: with trainer.allow_missing_logprobs off, a sample's behavior
  // log-probs must all be present (not NaN); the trainer would refuse the
  // whole step otherwise. The greedy baseline is never trained on: exempt.
  bool require_behavior_logprobs = false;
  // On-policy distillation (trainer.distill): every sampled model token needs
  // the teacher's log-prob, scored by the worker before it submits.
  bool require_teacher_logprobs = false;
  // Rewards are stored and trained as float: |reward| must fit one, and
  // beyond this magnitude it is a bug in the reward function, not a signal
  // (one such group turns a group-normalised advantage into NaN).
  double max_abs_reward = 1e6;
  // No sampled token has a log-prob below this (probability e^-10000): a
  // value beyond it is garbage, and exp() of a ratio against it overflows.
  double min_logprob = -1e4;
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
  int k = 1;                    // the lease's samples per prompt; <= 0 = any
  int64_t trainer_version = 0;  // no token may come from a later version
  int64_t oldest_version = 0;   // nor from one older than the staleness bound
};

// OK, or InvalidArgument naming the first problem (FailedPrecondition for
// versions older than oldest_version: a stale group, not a malformed one), e.g.
//   "group 'arith/7' trajectories[2].behavior_logprobs[5]: +inf is not a log-prob"
//   "group 'arith/7': 3 trajectories for a lease of k = 4"
// Checks: k trajectories (k <= 0 in the context: any number >= 1); non-empty
// prompt and response; the same prompt in every sample; prompt + response at
// most max_tokens and max_context, response at most max_response_tokens;
// token ids in the vocabulary; every per-token field as long as the response
// and versions consistent (rollout::check_trajectory); behavior, proximal and
// raw log-probs NaN (missing; not for behavior when required) or finite and
// within [min_logprob, tolerance]; token versions >= 0 and within
// [oldest_version, trainer_version]; a finite reward within max_abs_reward;
// the same for the greedy baseline when present (except k and the required
// behavior log-probs).
Status validate_submission(const rollout::TrajectoryGroup& group, const SubmissionContext& context,
                           const SubmissionLimits& limits = {});

// Clamps log-probs in (0, tolerance] to 0 in place (after validation); how
// many were clamped.
int64_t normalize_submission(rollout::TrajectoryGroup& group, const SubmissionLimits& limits = {});

}  // namespace relay::comm
