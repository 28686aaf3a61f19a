// The input checks of the advantage code (advantages_internal.h): shapes,
// element types, finiteness and what each estimator requires, answered as
// InvalidArgument naming the argument.

#include <torch/types.h>
#include <torch/utils.h>

#include <sstream>

#include "trainer/advantages_internal.h"

namespace relay::trainer::internal {
namespace {

std::string dtype_str(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

Status check_kind(const char* name, const at::Tensor& t, Kind kind) {
  const bool ok = kind == Kind::kFloat ? t.is_floating_point()
                  : kind == Kind::kInt
                      ? !t.is_floating_point() && !t.is_complex() && t.scalar_type() != torch::kBool
                  : kind == Kind::kBool ? t.scalar_type() == torch::kBool
                                        : !t.is_complex();
  if (ok) return OkStatus();
  const char* want = kind == Kind::kFloat  ? "floating point"
                     : kind == Kind::kInt  ? "an integer type"
                     : kind == Kind::kBool ? "bool"
                                           : "bool or numeric";
  return InvalidArgumentError(absl::StrCat(name, ": must be ", want, ", got ", dtype_str(t)));
}

Status check_finite(const char* name, const at::Tensor& t) {
  at::Tensor bad = t.isfinite().logical_not().reshape({-1});
  if (!bad.any().item<bool>()) return OkStatus();
  const int64_t at_flat = bad.to(torch::kInt64).argmax().item<int64_t>();
  return InvalidArgumentError(absl::StrCat(name, ": not finite at flat index ", at_flat, " (",
                                           t.reshape({-1})[at_flat].item<double>(), ")"));
}

// A per-token tensor [B, L] shaped like the response mask.
Status check_matrix(const char* name, const at::Tensor& t, const at::Tensor& mask, Kind kind) {
  if (!t.defined()) return InvalidArgumentError(absl::StrCat(name, ": missing"));
  if (t.sizes() != mask.sizes()) {
    return InvalidArgumentError(
        absl::StrCat(name, ": shape ", shape_str(t), " != response_mask's ", shape_str(mask)));
  }
  RELAY_RETURN_IF_ERROR(check_kind(name, t, kind));
  // Padding may hold anything finite; NaN/inf anywhere would leak through 0 * x.
  if (kind == Kind::kFloat) RELAY_RETURN_IF_ERROR(check_finite(name, t));
  return OkStatus();
}

Status require(const char* name, const at::Tensor& t, AdvantageEstimator e) {
  if (t.defined()) return OkStatus();
  return InvalidArgumentError(
      absl::StrCat(name, ": required by ", kAdvantageEstimatorNames.name(e)));
}

bool uses_groups(AdvantageEstimator e) {
  switch (e) {
    case AdvantageEstimator::kGrpo:
    case AdvantageEstimator::kDrGrpo:
    case AdvantageEstimator::kRloo:
    case AdvantageEstimator::kReinforcePlusPlusBaseline:
    case AdvantageEstimator::kOpo:
    case AdvantageEstimator::kGrpoPassK:
    case AdvantageEstimator::kGrpoSplit:
      return true;
    default:
      return false;
  }
}

bool whitens(AdvantageEstimator e) {
  return e == AdvantageEstimator::kReinforcePlusPlus ||
         e == AdvantageEstimator::kReinforcePlusPlusBaseline || e == AdvantageEstimator::kGae;
}

bool takes_token_rewards(AdvantageEstimator e) {
  return e == AdvantageEstimator::kReinforcePlusPlus || e == AdvantageEstimator::kGae ||
         e == AdvantageEstimator::kRemax;
}

}  // namespace

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

Status check_vector(const char* name, const at::Tensor& t, int64_t batch, Kind kind) {
  if (!t.defined()) return InvalidArgumentError(absl::StrCat(name, ": missing"));
  if (t.dim() != 1) {
    return InvalidArgumentError(absl::StrCat(name, ": must be 1-D [B], got shape ", shape_str(t)));
  }
  if (t.size(0) != batch) {
    return InvalidArgumentError(
        absl::StrCat(name, ": ", t.size(0), " entries for ", batch, " trajectories"));
  }
  RELAY_RETURN_IF_ERROR(check_kind(name, t, kind));
  if (kind == Kind::kFloat) RELAY_RETURN_IF_ERROR(check_finite(name, t));
  return OkStatus();
}

Status check_mask(const at::Tensor& mask) {
  if (!mask.defined()) return InvalidArgumentError("response_mask: missing");
  if (mask.dim() != 2) {
    return InvalidArgumentError(
        absl::StrCat("response_mask: must be 2-D [B, L], got shape ", shape_str(mask)));
  }
  return check_kind("response_mask", mask, Kind::kMask);
}

Status validate_inputs(const AdvantageInputs& in, AdvantageEstimator e) {
  RELAY_RETURN_IF_ERROR(check_mask(in.response_mask));
  const at::Tensor& mask = in.response_mask;
  const int64_t batch = mask.size(0);
  if (batch == 0) return InvalidArgumentError("response_mask: empty batch (0 trajectories)");

  // Outcome rewards: everything but REINFORCE++ / GAE / ReMax given token rewards.
  if (!(takes_token_rewards(e) && in.token_rewards.defined())) {
    RELAY_RETURN_IF_ERROR(require("rewards", in.rewards, e));
  }
  if (in.rewards.defined()) {
    RELAY_RETURN_IF_ERROR(check_vector("rewards", in.rewards, batch, Kind::kFloat));
  }
  if (uses_groups(e)) RELAY_RETURN_IF_ERROR(require("group_index", in.group_index, e));
  if (in.group_index.defined()) {
    RELAY_RETURN_IF_ERROR(check_vector("group_index", in.group_index, batch, Kind::kInt));
  }
  if (in.offpolicy.defined()) {
    RELAY_RETURN_IF_ERROR(check_vector("offpolicy", in.offpolicy, batch, Kind::kBool));
  }
  if (in.offpolicy_mask.defined()) {
    RELAY_RETURN_IF_ERROR(check_matrix("offpolicy_mask", in.offpolicy_mask, mask, Kind::kBool));
  }
  if (in.token_rewards.defined()) {
    RELAY_RETURN_IF_ERROR(check_matrix("token_rewards", in.token_rewards, mask, Kind::kFloat));
  }
  if (e == AdvantageEstimator::kGae) RELAY_RETURN_IF_ERROR(require("values", in.values, e));
  if (in.values.defined()) {
    RELAY_RETURN_IF_ERROR(check_matrix("values", in.values, mask, Kind::kFloat));
  }
  if (e == AdvantageEstimator::kRemax) {
    RELAY_RETURN_IF_ERROR(require("baseline_rewards", in.baseline_rewards, e));
  }
  if (in.baseline_rewards.defined()) {
    RELAY_RETURN_IF_ERROR(
        check_vector("baseline_rewards", in.baseline_rewards, batch, Kind::kFloat));
  }

  if (whitens(e)) {
    const int64_t tokens = mask.ne(0).sum().item<int64_t>();
    if (tokens < 2) {
      return InvalidArgumentError(absl::StrCat("response_mask: ", kAdvantageEstimatorNames.name(e),
                                               " whitens over the batch and needs >= 2 response "
                                               "tokens, got ",
                                               tokens));
    }
  }
  if (e == AdvantageEstimator::kGrpoPassK) {
    auto [unique, inverse, counts] =
        at::_unique2(in.group_index.cpu(), /*sorted=*/true, false, /*return_counts=*/true);
    const at::Tensor small = counts.lt(2);
    if (small.any().item<bool>()) {
      const int64_t g = small.to(torch::kInt64).argmax().item<int64_t>();
      return InvalidArgumentError(absl::StrCat("group_index: group ", unique[g].item<int64_t>(),
                                               " has ", counts[g].item<int64_t>(),
                                               " sample; grpo_passk needs >= 2 per group"));
    }
  }
  return OkStatus();
}

}  // namespace relay::trainer::internal
