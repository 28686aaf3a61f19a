#include "relay/trainer/kl.h"

#include <torch/torch.h>

#include <algorithm>

namespace relay::trainer {

StatusOr<KlEstimator> parse_kl_estimator(const std::string& name, const std::string& field) {
  if (name == "kl" || name == "k1") return KlEstimator::kK1;
  if (name == "abs") return KlEstimator::kAbs;
  if (name == "mse" || name == "k2" || name == "mse+" || name == "k2+") return KlEstimator::kK2;
  if (name == "low_var_kl" || name == "k3") return KlEstimator::kK3;
  if (name == "kl+" || name == "k1+") return KlEstimator::kK1Plus;
  if (name == "abs+") return KlEstimator::kAbsPlus;
  if (name == "low_var_kl+" || name == "k3+") return KlEstimator::kK3Plus;
  return InvalidArgumentError(
      absl::StrCat(field, ": unknown KL estimator '", name,
                   "'; expected one of kl, k1, abs, mse, k2, low_var_kl, k3, k1+, abs+, k3+"));
}

const char* kl_estimator_name(KlEstimator estimator) {
  switch (estimator) {
    case KlEstimator::kK1:
      return "k1";
    case KlEstimator::kAbs:
      return "abs";
    case KlEstimator::kK2:
      return "k2";
    case KlEstimator::kK3:
      return "k3";
    case KlEstimator::kK1Plus:
      return "k1+";
    case KlEstimator::kAbsPlus:
      return "abs+";
    case KlEstimator::kK3Plus:
      return "k3+";
  }
  return "?";
}

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

StatusOr<KlControllerType> parse_kl_controller_type(const std::string& name,
                                                    const std::string& field) {
  if (name == "fixed") return KlControllerType::kFixed;
  if (name == "adaptive") return KlControllerType::kAdaptive;
  return InvalidArgumentError(
      absl::StrCat(field, ": unknown KL controller '", name, "'; expected fixed or adaptive"));
}

Status validate(const KlControllerOptions& options, const std::string& prefix) {
  if (!(options.kl_coef >= 0.0)) {
    return InvalidArgumentError(
        absl::StrCat(prefix, ".kl_coef: must be >= 0, got ", options.kl_coef));
  }
  if (options.type == KlControllerType::kAdaptive) {
    if (!(options.target_kl > 0.0)) {
      return InvalidArgumentError(
          absl::StrCat(prefix, ".target_kl: must be > 0, got ", options.target_kl));
    }
    if (!(options.horizon > 0.0)) {
      return InvalidArgumentError(
          absl::StrCat(prefix, ".horizon: must be > 0, got ", options.horizon));
    }
  }
  return OkStatus();
}

KlController::KlController(const KlControllerOptions& options)
    : options_(options), value_(options.kl_coef) {
  RELAY_CHECK(validate(options).ok(), "KlController: invalid options");
}

void KlController::update(double current_kl, int64_t n_steps) {
  if (options_.type == KlControllerType::kFixed) return;
  const double error = std::clamp(current_kl / options_.target_kl - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * static_cast<double>(n_steps) / options_.horizon;
}

}  // namespace relay::trainer
