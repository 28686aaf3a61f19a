#include "relay/rollout/trajectory.h"

#include <algorithm>
#include <cmath>

namespace relay::rollout {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kToolBudget:
      return "tool_budget";
    case FinishReason::kEnvDone:
      return "env_done";
    case FinishReason::kEnvError:
      return "env_error";
  }
  return "?";
}

int64_t Trajectory::num_forced() const {
  return std::count(offpolicy_mask.begin(), offpolicy_mask.end(), 1);
}

int64_t Trajectory::num_env_tokens() const {
  return std::count(env_mask.begin(), env_mask.end(), 1);
}

std::vector<int64_t> Trajectory::answer_tokens() const {
  if (turns.empty()) return response_tokens;
  const int64_t begin = turns.size() > 1 ? turns[turns.size() - 2].env_end : 0;
  const int64_t end =
      std::min<int64_t>(turns.back().model_end, static_cast<int64_t>(response_tokens.size()));
  if (begin >= end) return {};
  return std::vector<int64_t>(response_tokens.begin() + begin, response_tokens.begin() + end);
}

double Trajectory::environment_reward() const {
  double sum = 0.0;
  for (const EpisodeTurn& turn : turns) {
    if (std::isfinite(turn.reward)) sum += turn.reward;
  }
  return sum;
}

namespace {

// env_mask and turns: environment tokens carry nothing sampled, and the
// turns tile the response, model tokens first in each.
Status check_episode(const Trajectory& t) {
  const auto n = static_cast<int64_t>(t.response_tokens.size());
  if (!t.env_mask.empty() && static_cast<int64_t>(t.env_mask.size()) != n) {
    return InvalidArgumentError(
        absl::StrCat("env_mask: ", t.env_mask.size(), " entries for ", n, " response tokens"));
  }
  for (int64_t j = 0; j < static_cast<int64_t>(t.env_mask.size()); ++j) {
    if (t.env_mask[j] > 1) {
      return InvalidArgumentError(
          absl::StrCat("env_mask[", j, "]: must be 0 or 1, got ", int{t.env_mask[j]}));
    }
    if (!t.env_mask[j]) continue;
    if (!std::isnan(t.behavior_logprobs[j]) ||
        (!t.raw_logprobs.empty() && !std::isnan(t.raw_logprobs[j])) ||
        t.proximal_versions[j] != -1 || t.offpolicy_mask[j]) {
      return InvalidArgumentError(absl::StrCat(
          "env_mask[", j, "]: an environment token must have NaN log-probs, proximal version -1 ",
          "and no offpolicy_mask, got behavior log-prob ", t.behavior_logprobs[j]));
    }
  }
  if (t.turns.empty()) {
    if (t.num_env_tokens() > 0) {
      return InvalidArgumentError("turns: empty, but env_mask marks environment tokens");
    }
    return OkStatus();
  }
  int64_t start = 0;
  for (size_t i = 0; i < t.turns.size(); ++i) {
    const EpisodeTurn& turn = t.turns[i];
    if (turn.model_end < start || turn.env_end < turn.model_end || turn.env_end > n) {
      return InvalidArgumentError(absl::StrCat("turns[", i, "]: model_end ", turn.model_end,
                                               ", env_end ", turn.env_end, " must satisfy ", start,
                                               " <= model_end <= env_end <= ", n));
    }
    if (turn.tool_calls < 0 || turn.tool_errors < 0) {
      return InvalidArgumentError(absl::StrCat("turns[", i, "]: tool_calls ", turn.tool_calls,
                                               " and tool_errors ", turn.tool_errors,
                                               " must be >= 0"));
    }
    for (int64_t j = start; j < turn.env_end; ++j) {
      const bool env = t.is_env_token(static_cast<size_t>(j));
      if (env != (j >= turn.model_end)) {
        return InvalidArgumentError(absl::StrCat("env_mask[", j, "]: ", env ? 1 : 0,
                                                 " disagrees with turns[", i, "] (model tokens [",
                                                 start, ", ", turn.model_end, "), environment [",
                                                 turn.model_end, ", ", turn.env_end, "))"));
      }
    }
    start = turn.env_end;
  }
  if (start != n) {
    return InvalidArgumentError(
        absl::StrCat("turns: end at token ", start, " of a response of ", n));
  }
  return OkStatus();
}

}  // namespace

Status check_trajectory(const Trajectory& t, float max_behavior_logprob) {
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
  if (!t.teacher_logprobs.empty()) {
    RELAY_RETURN_IF_ERROR(sized(t.teacher_logprobs.size(), "teacher_logprobs"));
  }
  // The versions that need a digest, collected where they change and sorted
  // once: token versions are non-decreasing and a proximal version is v or
  // v + 1, so a response usually adds a handful (at most two a token, when
  // proximal versions alternate). A set insert per token cost validation
  // ~10% of a group's ingest CPU.
  std::vector<int64_t> used;
  auto use = [&used](int64_t v) {
    if (used.empty() || used.back() != v) used.push_back(v);
  };
  for (size_t j = 0; j < n; ++j) {
    // NaN = missing (invariant 5: the trainer counts and refuses them); any
    // other value must be a log-prob.
    const float lp = t.behavior_logprobs[j];
    if (!std::isnan(lp) && (std::isinf(lp) || lp > max_behavior_logprob)) {
      return InvalidArgumentError(absl::StrCat("behavior_logprobs[", j,
                                               "]: must be finite and <= ", max_behavior_logprob,
                                               " (or NaN if missing), got ", lp));
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
    use(v);
    const int64_t pv = t.proximal_versions[j];
    const bool known = std::isfinite(t.proximal_logprobs[j]);
    if (pv == -1 ? known : (!known || (pv != v && pv != v + 1))) {
      return InvalidArgumentError(absl::StrCat("proximal_versions[", j, "]: ", pv,
                                               " does not fit token version ", v,
                                               " and proximal log-prob ", t.proximal_logprobs[j]));
    }
    if (pv >= 0) use(pv);
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  RELAY_RETURN_IF_ERROR(check_episode(t));
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
