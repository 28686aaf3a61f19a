#pragma once

// Per-token KL estimators between the current policy and a reference policy,
// and the controllers that set the KL coefficient (verl's kl_penalty,
// FixedKLController and AdaptiveKLController; J. Schulman, "Approximating KL
// divergence", 2020, http://joschu.net/blog/kl-approx.html).
//
// Tensors are response-aligned [B, L] fp32 log-probs of the sampled tokens.
// Every function here is pure and thread-compatible.

#include <ATen/core/Tensor.h>

#include <string>

#include "relay/common/status.h"
#include "relay/trainer/options.h"

namespace relay::trainer {

// Per-token estimate [B, L], differentiable w.r.t. `logprobs` (`ref_logprobs`
// is treated as data). Not masked: aggregate with aggregate_loss().
// "+" variants: forward value of the base estimator, backward of k2, i.e.
// k2 - sg(k2) + sg(base), so the expected gradient is the KL's.
at::Tensor kl_penalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                      KlEstimator estimator);

// The KL coefficient beta over training. Fixed: constant. Adaptive (Ziegler et
// al. 2019, arXiv 1909.08593, as verl's AdaptiveKLController):
//   e = clip(current_kl / target_kl - 1, -0.2, 0.2)
//   beta <- beta * (1 + e * n_steps / horizon)
// Not thread-safe; owned by the trainer loop.
class KlController {
 public:
  // REQUIRES: validate(options).ok().
  explicit KlController(const KlControllerOptions& options);

  double value() const { return value_; }
  // Restores a value saved with a checkpoint.
  void set_value(double value) { value_ = value; }
  // `current_kl`: the measured KL of the batch just trained on; `n_steps`:
  // samples (verl: batch size) since the last update. No-op when fixed.
  void update(double current_kl, int64_t n_steps);

 private:
  KlControllerOptions options_;
  double value_;
};

}  // namespace relay::trainer
