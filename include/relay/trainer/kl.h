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

namespace relay::trainer {

// With d = logp - ref (log pi_theta - log pi_ref of the sampled token):
enum class KlEstimator {
  kK1,       // "kl" / "k1": d. Unbiased for KL(pi_theta || pi_ref), high variance.
  kAbs,      // "abs": |d|.
  kK2,       // "mse" / "k2": 0.5 d^2. Its gradient is the unbiased KL gradient.
  kK3,       // "low_var_kl" / "k3": exp(-d) - 1 + d, with -d clamped to [-20, 20] and
             // the result clamped to [-10, 10] (as verl). Unbiased, low variance, >= 0.
  kK1Plus,   // "k1+" / "kl+": value of k1, gradient of k2 (straight-through).
  kAbsPlus,  // "abs+": value of |d|, gradient of k2.
  kK3Plus,   // "k3+" / "low_var_kl+": value of k3, gradient of k2.
};

// Parses the names above ("k2+" and "mse+" mean plain k2, as in verl).
// Errors name `field`: "<field>: unknown KL estimator 'x'; expected one of ...".
StatusOr<KlEstimator> parse_kl_estimator(const std::string& name,
                                         const std::string& field = "kl_estimator");
// The canonical name ("k1", "abs", "k2", "k3", "k1+", "abs+", "k3+").
const char* kl_estimator_name(KlEstimator estimator);

// Per-token estimate [B, L], differentiable w.r.t. `logprobs` (`ref_logprobs`
// is treated as data). Not masked: aggregate with aggregate_loss().
// "+" variants: forward value of the base estimator, backward of k2, i.e.
// k2 - sg(k2) + sg(base), so the expected gradient is the KL's.
at::Tensor kl_penalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                      KlEstimator estimator);

enum class KlControllerType { kFixed, kAdaptive };
// "fixed" or "adaptive".
StatusOr<KlControllerType> parse_kl_controller_type(const std::string& name,
                                                    const std::string& field = "kl_ctrl.type");

struct KlControllerOptions {
  KlControllerType type = KlControllerType::kFixed;
  double kl_coef = 0.001;    // initial (fixed: constant) coefficient beta; >= 0.
  double target_kl = 0.1;    // adaptive only: KL the controller steers toward; > 0.
  double horizon = 10000.0;  // adaptive only: steps over which an error is corrected; > 0.
};

// Rejects negative kl_coef, and non-positive target_kl / horizon for the
// adaptive type. Messages name the field: "kl_ctrl.horizon: must be > 0, got 0".
Status validate(const KlControllerOptions& options, const std::string& prefix = "kl_ctrl");

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
