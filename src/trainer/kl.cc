#include "relay/trainer/kl.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

namespace relay::trainer {

namespace {

at::Tensor forward_estimate(const at::Tensor& logprobs, const at::Tensor& ref, KlEstimator e) {
  switch (e) {
    case KlEstimator::kK1:
    case KlEstimator::kK1Plus:
      return logprobs - ref;
    case KlEstimator::kAbs:
    case KlEstimator::kAbsPlus:
      return (logprobs - ref).abs();
    case KlEstimator::kK2:
      return 0.5 * (logprobs - ref).square();
    case KlEstimator::kK3:
    case KlEstimator::kK3Plus: {
      // log(pi_ref / pi_theta), clamped so exp() stays finite.
      at::Tensor kl = (ref - logprobs).clamp(-20.0, 20.0);
      return (kl.exp() - kl - 1.0).clamp(-10.0, 10.0);
    }
  }
  return at::Tensor();
}

}  // namespace

at::Tensor kl_penalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                      KlEstimator estimator) {
  at::Tensor ref = ref_logprobs.detach();
  at::Tensor value = forward_estimate(logprobs, ref, estimator);
  if (estimator != KlEstimator::kK1Plus && estimator != KlEstimator::kAbsPlus &&
      estimator != KlEstimator::kK3Plus) {
    return value;
  }
  at::Tensor k2 = 0.5 * (logprobs - ref).square();
  return k2 - k2.detach() + value.detach();
}

KlController::KlController(const KlControllerOptions& options)
    : options_(options), value_(options.kl_coef) {
  RELAY_CHECK(check_options(options, "kl_ctrl").ok(), "KlController: invalid options");
}

void KlController::update(double current_kl, int64_t n_steps) {
  if (options_.type == KlControllerType::kFixed) return;
  const double error = std::clamp(current_kl / options_.target_kl - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * static_cast<double>(n_steps) / options_.horizon;
}

}  // namespace relay::trainer
