#pragma once

// The critic's loss for PPO with a value model, and its diagnostics. Pure
// functions over response-aligned [B, L] tensors, the conventions of
// policy_loss.h: `values` is the critic's prediction now and the only input
// differentiated through; old values (the critic's before the update) and
// returns (GAE's targets, advantages.h) are data.

#include <ATen/core/Tensor.h>

#include "relay/trainer/critic_options.h"
#include "relay/trainer/policy_loss.h"

namespace relay::trainer {

struct ValueLossResult {
  at::Tensor loss;           // 0-dim, differentiable w.r.t. values
  double clip_fraction = 0;  // vf_clipfrac: tokens where the clipped term is the larger
  double value_mean = 0;     // vpred_mean: mean prediction over the mask
};

// verl's compute_value_loss (PPO's clipped value loss):
//   V_c = clamp(V, V_old - clip_range, V_old + clip_range)
//   l = max((V - R)^2, (V_c - R)^2)
//   loss = 0.5 * aggregate_loss(l, mask, options.agg_mode, normalizer)
// clip_fraction = share of masked tokens with (V_c - R)^2 > (V - R)^2.
ValueLossResult value_loss(const at::Tensor& values, const at::Tensor& old_values,
                           const at::Tensor& returns, const at::Tensor& response_mask,
                           const ValueLossOptions& options,
                           const GlobalNormalizer& normalizer = {});

// 1 - Var(returns - values) / Var(returns) over the masked tokens (verl's
// critic/vf_explained_var, with its unbiased variances): 1 is a perfect
// critic, 0 no better than the mean, negative worse. NaN when fewer than two
// tokens are masked or the returns do not vary.
double explained_variance(const at::Tensor& values, const at::Tensor& returns,
                          const at::Tensor& response_mask);

}  // namespace relay::trainer
