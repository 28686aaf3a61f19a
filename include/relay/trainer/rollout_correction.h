#pragma once

// Rollout correction: importance weights, rejection and veto for the gap
// between the policy that sampled a batch (pi_behav, the rollout worker) and
// the policy the trainer holds before the update (pi_old), plus diagnostics
// of that gap split by where it comes from. The counterpart of verl's
// rollout_correction (rollout_corr_helper.py; Liu, Li et al. 2025, "When
// Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
// Mismatch", https://richardli.xyz/rl-collapse).
//
// Why: the PPO ratio pi_theta / pi_old corrects for the update, not for the
// sampler. pi_behav differs from pi_old because the engine computes with other
// kernels and precision (same weights: "engine" mismatch) and because
// asynchronous rollouts sample with older weights ("staleness"). The gradient
// is then biased; per-token weights w ~ pi_old / pi_behav remove the bias,
// truncation bounds their variance, and rejection drops the samples whose
// ratio says the sampler and the trainer disagree too much to learn from.
//
// Conventions (as policy_loss.h): response layout [B, L], token j of
// trajectory b at [b, j]; log r = old - behav per token, r = pi_old / pi_behav.
// Everything runs in fp64 on detached inputs and nothing here is
// differentiable. Pure function, thread-compatible. Call it once per step on
// the whole batch: batch normalization and the metrics are over what it sees.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "relay/common/status.h"
#include "relay/trainer/options.h"

namespace relay::trainer {

// How token log-ratios are aggregated before a weight or a rejection test.

struct RolloutCorrectionInputs {
  at::Tensor old_logprobs;       // [B, L] floating: pi_old. May be undefined in bypass mode.
  at::Tensor behavior_logprobs;  // [B, L] floating: pi_behav, finite inside the mask.
  at::Tensor response_mask;      // [B, L] bool (or 0/1 numeric).
  // [B, L] integer: the weights version that sampled each token (-1 at
  // padding). Every masked token must have 0 <= version <= trainer_version.
  // Undefined: every token counts as sampled at trainer_version (synchronous).
  at::Tensor token_versions;
  int64_t trainer_version = 0;  // the version of pi_old.
};

// The gap between pi_behav and pi_old over a set of masked tokens (before any
// rejection). With l = log r raw and c = clamp(l, +-log_clamp):
struct MismatchStats {
  int64_t num_tokens = 0;
  double k1 = 0;                  // mean(-l): naive estimate of KL(pi_behav || pi_old).
  double k3 = 0;                  // mean(exp(c) - 1 - c): same KL, low variance, >= 0.
  double abs_log_ratio_mean = 0;  // mean |l|
  double abs_log_ratio_max = 0;   // max |l|
  double ratio_mean = 0;          // mean exp(c); 1 when unbiased.
};

// Fractions are 0 (and stats 0) over an empty set.
struct RolloutCorrectionMetrics {
  // Totals, rejection and veto together, over the input mask: tokens removed,
  // and sequences (with at least one masked token) that lost any token.
  double rejected_token_fraction = 0;
  double rejected_sequence_fraction = 0;
  // The rejection criterion alone (before the veto), same denominators.
  double rs_rejected_token_fraction = 0;
  double rs_rejected_sequence_fraction = 0;
  // Veto: sequences vetoed / sequences; tokens with r < veto_threshold / tokens.
  double veto_fraction = 0;
  double catastrophic_token_fraction = 0;

  // IS weights over the kept units (tokens for is_level token, sequences for
  // sequence / geometric, tokens when is_level is none), after truncation and
  // before batch normalization. Truncated = the raw weight was above C (upper)
  // or below the clip mode's lower bound (lower).
  double is_truncated_fraction = 0;  // upper + lower
  double is_truncated_fraction_upper = 0;
  double is_truncated_fraction_lower = 0;
  double is_weight_mean = 0;
  double is_weight_min = 0;
  double is_weight_max = 0;
  // Normalized effective sample size (sum w)^2 / (n sum w^2), in (0, 1].
  double is_weight_ess = 0;
  double is_batch_norm_factor = 1;  // what the weights were divided by (1 = off).

  // Diagnostics over the input mask (before rejection), also in bypass mode
  // when old_logprobs is given; all zero when it is undefined.
  MismatchStats all;
  MismatchStats engine;     // token_versions == trainer_version: same weights, other numerics.
  MismatchStats staleness;  // token_versions < trainer_version: older weights.
  // trainer_version - token_versions over the masked tokens (always computed).
  double version_lag_mean = 0;
  double version_lag_max = 0;
};

struct RolloutCorrectionResult {
  // [B, L] fp32, detached: the weight to multiply each token's loss by; 1
  // where no IS correction applies, 0 outside `response_mask`. Sequence and
  // geometric levels repeat the sequence's weight on each kept token.
  at::Tensor weights;
  // [B, L] bool: the input mask minus rejected tokens and sequences; train
  // (and count normalizers) on this one. The input is not modified.
  at::Tensor response_mask;
  // The log-probs to take the PPO ratio against: behavior_logprobs in bypass
  // mode, old_logprobs otherwise (the input tensor itself, not a copy).
  at::Tensor anchor_logprobs;
  RolloutCorrectionMetrics metrics;
};

// Order of operations (not bypass): log r = old - behav; rejection on the
// input mask; veto on the input mask; IS weights, from the input mask's
// aggregates (a sequence weight is the likelihood ratio of the whole sampled
// sequence even if some of its tokens were rejected); truncation; batch
// normalization over the kept mask; zero outside the kept mask.
// InvalidArgument, naming the argument, for invalid options, shapes or dtypes
// that do not match [B, L], non-finite masked log-probs, or masked token
// versions outside [0, trainer_version].
StatusOr<RolloutCorrectionResult> rollout_correction(const RolloutCorrectionInputs& in,
                                                     const RolloutCorrectionOptions& options);

// Writes the metrics into `out` under stable names, `prefix` first:
//   rejected_token_fraction, rejected_sequence_fraction,
//   rs/rejected_token_fraction, rs/rejected_sequence_fraction,
//   veto_fraction, catastrophic_token_fraction,
//   is_truncated_fraction, is_truncated_fraction/upper, is_truncated_fraction/lower,
//   is_weight/{mean,min,max,ess,batch_norm_factor},
//   {all,engine,staleness}/{num_tokens,k1,k3,abs_log_ratio_mean,abs_log_ratio_max,ratio_mean},
//   version_lag/{mean,max}.
void append_metrics(const RolloutCorrectionMetrics& metrics, std::map<std::string, double>& out,
                    const std::string& prefix = "rollout_corr/");

}  // namespace relay::trainer
