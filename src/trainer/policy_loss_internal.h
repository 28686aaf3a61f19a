#pragma once

// What the policy losses share (private to src/trainer): masked statistics,
// the rollout-correction weighting, PPO's clipped surrogate and its metrics.
// Defined in policy_loss.cc; each loss family's file (ratio_losses.cc,
// luffy_loss.cc) builds on them.

#include <ATen/core/Tensor.h>

#include "relay/trainer/policy_loss.h"

namespace relay::trainer::internal {

// `mask` as bool (a float mask: nonzero = set).
at::Tensor as_bool(const at::Tensor& mask);
// x where `mask`, 0 elsewhere (NaN outside the mask does not leak).
at::Tensor zeros_where_not(const at::Tensor& mask, const at::Tensor& x);
// Mean of x over the true entries of `mask` (bool); 0 when there are none.
double masked_mean(const at::Tensor& x, const at::Tensor& mask);
// Share of the masked entries where `flag` is set.
double fraction(const at::Tensor& flag, const at::Tensor& mask);
// The per-token loss times the rollout-correction weights, when given.
at::Tensor is_weighted(const PolicyLossInputs& in, const at::Tensor& loss_mat);
// `global` when it is counted (> 0), else the local count (at least 1).
double denominator(double global, const at::Tensor& local_count);

// The PPO clipped surrogate around `anchor` (old or proximal log-probs).
struct Surrogate {
  at::Tensor loss;  // [B, L] per-token loss.
  at::Tensor log_ratio;
  at::Tensor ratio;
  at::Tensor clipped;  // l2 > l1 (the clip is active).
  at::Tensor dual;     // A < 0 and the dual or delta cap is active.
};
// The ratio is clipped to [1 - o.clip_low, upper].
Surrogate clipped_surrogate(const at::Tensor& logp, const at::Tensor& anchor, const at::Tensor& adv,
                            const PpoClipOptions& o, double upper);
// The clip fractions, ppo_kl and mean ratio of `s` over the mask `m`.
void fill_clip_metrics(const Surrogate& s, const at::Tensor& adv, const at::Tensor& m,
                       PolicyLossMetrics* out);

}  // namespace relay::trainer::internal
