#pragma once

// The options of trainer.rollout_correction: importance weights, rejection
// and veto of tokens whose sampler (behavior) log-prob disagrees with the
// trainer's pi_old, and the bypass that makes pi_old := pi_behav. Split from
// options.h, which includes it; the rules they obey are in options.cc.

#include "relay/common/name_table.h"
#include "relay/common/problems.h"

namespace relay::trainer {

// For IS weights and the ratio criterion, with n_b the masked tokens of b:
//   token:     r_bj = exp(log r_bj)
//   sequence:  r_b = exp(sum_j log r_bj)          (the sequence's likelihood ratio)
//   geometric: r_b = exp(sum_j log r_bj / n_b)    (geo-mean, length-independent)
// For the divergence criteria, the per-token divergence d_bj is aggregated the
// same way: token d_bj, sequence sum_j d_bj, geometric sum_j d_bj / n_b.
enum class CorrectionLevel { kNone, kToken, kSequence, kGeometric };
inline const NameTable<CorrectionLevel> kCorrectionLevelNames{
    "correction level",
    {{"none", CorrectionLevel::kNone},
     {"token", CorrectionLevel::kToken},
     {"sequence", CorrectionLevel::kSequence},
     {"geometric", CorrectionLevel::kGeometric}}};

// What is done to an IS weight outside the band.
enum class IsWeightMode {
  kTruncate,  // "truncate" (TIS): w = min(w, is_threshold).
  kClip,      // "clip": w = clamp(w, is_threshold_lower, is_threshold).
};
inline const NameTable<IsWeightMode> kIsWeightModeNames{
    "IS weight mode", {{"truncate", IsWeightMode::kTruncate}, {"clip", IsWeightMode::kClip}}};

// The statistic a rejection test looks at. With l = log r (raw) and
// c = clamp(l, -log_clamp, log_clamp), per token (verl's token_k* estimators;
// all three estimate KL(pi_behav || pi_old), since tokens were drawn from
// pi_behav):
enum class RejectionCriterion {
  kRatio,  // "ratio": the aggregated ratio; rejected outside [rs_threshold_lower, rs_threshold].
  kK1,     // "k1": d = -l = log(pi_behav / pi_old). Signed, so rejected where
           //       |aggregate| > rs_threshold (a symmetric band in log space).
  kK2,     // "k2": d = l^2 / 2. Rejected where aggregate > rs_threshold.
  kK3,     // "k3": d = exp(c) - 1 - c >= 0. Rejected where aggregate > rs_threshold.
};
inline const NameTable<RejectionCriterion> kRejectionCriterionNames{
    "rejection criterion",
    {{"ratio", RejectionCriterion::kRatio},
     {"k1", RejectionCriterion::kK1},
     {"k2", RejectionCriterion::kK2},
     {"k3", RejectionCriterion::kK3}}};

struct RolloutCorrectionOptions {
  // Importance weights. kNone: every weight is 1 (rejection and veto still run).
  CorrectionLevel is_level = CorrectionLevel::kNone;
  IsWeightMode is_mode = IsWeightMode::kTruncate;
  double is_threshold = 2.0;  // upper bound C; > 1.
  // Clip mode's lower bound; 0 = 1 / is_threshold, else in (0, 1).
  double is_threshold_lower = 0;
  // Divide the weights by their mean over the kept units (tokens for the
  // token level, sequences otherwise), so the mean weight is exactly 1 and the
  // loss scale does not drift with the mismatch. Weights may then exceed C.
  bool is_batch_normalize = false;

  // Rejection: failing tokens (token level) or whole sequences (sequence,
  // geometric) leave the response mask. kNone = off.
  CorrectionLevel rs_level = CorrectionLevel::kNone;
  RejectionCriterion rs_criterion = RejectionCriterion::kRatio;
  // ratio: upper ratio bound, > 1. k1 / k2 / k3: divergence bound, > 0.
  double rs_threshold = 2.0;
  // ratio only: lower ratio bound; 0 = 1 / rs_threshold, else in (0, 1).
  // Must stay 0 for k1 / k2 / k3, which have no lower bound.
  double rs_threshold_lower = 0;

  // Catastrophic-token veto: a sequence with any masked token whose ratio
  // r < veto_threshold is rejected whole, whatever rs_level says (one token
  // the trainer finds near-impossible poisons the sequence's gradient).
  // 0 = off, else in (0, 1) (verl suggests 1e-4).
  double veto_threshold = 0;

  // Bypass: skip the trainer's recompute pass and use pi_old := pi_behav, so
  // the PPO ratio pi_theta / pi_behav does the correction itself. Then every
  // weight is 1, nothing is rejected or vetoed (log r = 0 by definition), and
  // old_logprobs may be undefined. is_* / rs_* / veto_threshold are ignored.
  bool bypass = false;

  // Safety bound: the argument of every exp() (token or aggregated log ratio)
  // is clamped to [-log_clamp, log_clamp] (verl: 20, e^20 ~ 4.9e8). > 0.
  double log_clamp = 20.0;
};
// IcePop (Ring-1T, arXiv 2510.18855): each token's loss is multiplied by
// M(k) = k inside [lower, upper] and 0 outside, k = pi_old / pi_behav, the
// trainer's over the sampler's probability of the token (paper: 0.5, 5). As
// rollout correction: token IS weights (truncated at `upper`, which the band
// already bounds) and token rejection by the ratio with the same band. One
// difference: rejected tokens leave the mask, so a token-mean loss divides
// by the tokens kept, where the paper's objective still counts them.
inline RolloutCorrectionOptions icepop_options(double lower = 0.5, double upper = 5.0) {
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.is_mode = IsWeightMode::kTruncate;
  o.is_threshold = upper;
  o.rs_level = CorrectionLevel::kToken;
  o.rs_criterion = RejectionCriterion::kRatio;
  o.rs_threshold = upper;
  o.rs_threshold_lower = lower;
  return o;
}

// Checks the fields in use (is_* when is_level != none, rs_* when rs_level != none).
void check(const RolloutCorrectionOptions& options, Problems problems);

}  // namespace relay::trainer
