#include "relay/rollout/trajectory.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace relay::rollout {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "?";
}

int64_t Trajectory::num_forced() const {
  return std::count(offpolicy_mask.begin(), offpolicy_mask.end(), 1);
}

Status check_trajectory(const Trajectory& t) {
  const size_t n = t.response_tokens.size();
  auto sized = [&](size_t got, const char* field) -> Status {
    if (got == n) return OkStatus();
    return InvalidArgumentError(
        absl::StrCat(field, ": ", got, " entries for ", n, " response tokens"));
  };
  RELAY_RETURN_IF_ERROR(sized(t.behavior_logprobs.size(), "behavior_logprobs"));
  RELAY_RETURN_IF_ERROR(sized(t.token_versions.size(), "token_versions"));
  RELAY_RETURN_IF_ERROR(sized(t.proximal_logprobs.size(), "proximal_logprobs"));
  RELAY_RETURN_IF_ERROR(sized(t.proximal_versions.size(), "proximal_versions"));
  RELAY_RETURN_IF_ERROR(sized(t.offpolicy_mask.size(), "offpolicy_mask"));
  if (!t.raw_logprobs.empty()) RELAY_RETURN_IF_ERROR(sized(t.raw_logprobs.size(), "raw_logprobs"));
  std::set<int64_t> used;
  for (size_t j = 0; j < n; ++j) {
    // NaN = missing (invariant 5: the trainer counts and refuses them); any
    // other value must be a log-prob.
    const float lp = t.behavior_logprobs[j];
    if (!std::isnan(lp) && (std::isinf(lp) || lp > 0)) {
      return InvalidArgumentError(absl::StrCat(
          "behavior_logprobs[", j, "]: must be finite and <= 0 (or NaN if missing), got ", lp));
    }
    const int64_t v = t.token_versions[j];
    if (v < 0) {
      return InvalidArgumentError(
          absl::StrCat("token_versions[", j, "]: ", v, " is negative; versions count from 0"));
    }
    if (j > 0 && v < t.token_versions[j - 1]) {
      return InvalidArgumentError(absl::StrCat("token_versions[", j, "]: ", v,
                                               " breaks the non-decreasing order (after ",
                                               t.token_versions[j - 1], ")"));
    }
    used.insert(v);
    const int64_t pv = t.proximal_versions[j];
    const bool known = std::isfinite(t.proximal_logprobs[j]);
    if (pv == -1 ? known : (!known || (pv != v && pv != v + 1))) {
      return InvalidArgumentError(absl::StrCat("proximal_versions[", j, "]: ", pv,
                                               " does not fit token version ", v,
                                               " and proximal log-prob ", t.proximal_logprobs[j]));
    }
    if (pv >= 0) used.insert(pv);
  }
  if (!t.routed_experts.empty() || t.routing_layers != 0 || t.routing_top_k != 0) {
    if (t.routing_layers < 1 || t.routing_top_k < 1) {
      return InvalidArgumentError(absl::StrCat("routing_layers / routing_top_k: must be >= 1 with ",
                                               "routed_experts, got ", t.routing_layers, " / ",
                                               t.routing_top_k));
    }
    const size_t positions = t.prompt_tokens.size() + n - 1;
    const size_t want = positions * t.routing_layers * t.routing_top_k;
    if (t.routed_experts.size() != want) {
      return InvalidArgumentError(
          absl::StrCat("routed_experts: ", t.routed_experts.size(), " entries; ", positions,
                       " positions (prompt + response - 1) x ", t.routing_layers, " layers x ",
                       t.routing_top_k, " experts need ", want));
    }
    for (size_t i = 0; i < t.routed_experts.size(); ++i) {
      if (t.routed_experts[i] < 0) {
        return InvalidArgumentError(absl::StrCat(
            "routed_experts[", i, "]: expert id must be >= 0, got ", t.routed_experts[i]));
      }
    }
  }
  for (int64_t v : used) {
    bool found = std::any_of(t.version_digests.begin(), t.version_digests.end(),
                             [v](const auto& d) { return d.first == v; });
    if (!found)
      return InvalidArgumentError(absl::StrCat("version_digests: no digest for version ", v));
  }
  return OkStatus();
}

}  // namespace relay::rollout
