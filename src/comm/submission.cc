#include "relay/comm/submission.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace relay::comm {
namespace {

Status bad(const std::string& where, const std::string& what) {
  return InvalidArgumentError(absl::StrCat(where, ": ", what));
}

Status check_logprobs(const std::vector<float>& values, const std::string& where, const char* field,
                      double tolerance) {
  for (size_t j = 0; j < values.size(); ++j) {
    const float lp = values[j];
    if (std::isnan(lp)) continue;
    if (std::isinf(lp)) {
      return bad(
          absl::StrCat(where, ".", field, "[", j, "]"),
          absl::StrCat(lp > 0 ? "+inf" : "-inf", " is not a log-prob (send NaN if missing)"));
    }
    if (lp > tolerance) {
      return bad(absl::StrCat(where, ".", field, "[", j, "]"),
                 absl::StrCat(lp, " > 0 is not a log-prob"));
    }
  }
  return OkStatus();
}

Status check_versions(const std::vector<int64_t>& versions, const std::string& where,
                      const char* field, const SubmissionContext& c, bool allow_missing) {
  for (size_t j = 0; j < versions.size(); ++j) {
    const int64_t v = versions[j];
    if (allow_missing && v == -1) continue;
    if (v > c.trainer_version) {
      return bad(
          absl::StrCat(where, ".", field, "[", j, "]"),
          absl::StrCat("version ", v, " is in the future (trainer at ", c.trainer_version, ")"));
    }
    if (v < c.oldest_version) {
      // Stale, not malformed: the trainer moved on while it was generated.
      return FailedPreconditionError(absl::StrCat(where, ".", field, "[", j, "]: version ", v,
                                                  " is older than the staleness bound (",
                                                  c.oldest_version, ")"));
    }
  }
  return OkStatus();
}

Status check_trajectory_submission(const rollout::Trajectory& t, const std::string& where,
                                   const std::vector<int64_t>& prompt, const SubmissionContext& c,
                                   const SubmissionLimits& l) {
  if (t.prompt_tokens.empty()) return bad(where, "prompt_tokens: empty");
  if (t.response_tokens.empty()) return bad(where, "response_tokens: empty");
  if (t.prompt_tokens != prompt) {
    return bad(where, "prompt_tokens: differ from trajectories[0]'s; a group shares one prompt");
  }
  const auto total = static_cast<int64_t>(t.prompt_tokens.size() + t.response_tokens.size());
  if (total > l.max_tokens) {
    return bad(where,
               absl::StrCat(total, " prompt + response tokens exceed the limit of ", l.max_tokens));
  }
  if (l.vocab_size > 0) {
    for (const auto* field : {&t.prompt_tokens, &t.response_tokens}) {
      for (size_t j = 0; j < field->size(); ++j) {
        const int64_t id = (*field)[j];
        if (id < 0 || id >= l.vocab_size) {
          return bad(
              absl::StrCat(where, ".",
                           field == &t.prompt_tokens ? "prompt_tokens" : "response_tokens", "[", j,
                           "]"),
              absl::StrCat("token id ", id, " is outside the vocabulary [0, ", l.vocab_size, ")"));
        }
      }
    }
  }
  RELAY_RETURN_IF_ERROR(
      check_logprobs(t.behavior_logprobs, where, "behavior_logprobs", l.logprob_tolerance));
  RELAY_RETURN_IF_ERROR(
      check_logprobs(t.proximal_logprobs, where, "proximal_logprobs", l.logprob_tolerance));
  RELAY_RETURN_IF_ERROR(check_logprobs(t.raw_logprobs, where, "raw_logprobs", l.logprob_tolerance));
  // check_trajectory wants behavior log-probs <= 0: test a clamped copy, so
  // rounding within the tolerance is not refused here.
  rollout::Trajectory clamped = t;
  for (float& lp : clamped.behavior_logprobs) {
    if (lp > 0) lp = 0;
  }
  if (Status s = rollout::check_trajectory(clamped); !s.ok()) {
    return bad(where, std::string(s.message()));
  }
  if (l.moe_layers >= 0 && !t.routed_experts.empty()) {
    if (l.moe_layers == 0) {
      return bad(absl::StrCat(where, ".routed_experts"), "the model has no MoE layers");
    }
    if (t.routing_layers != l.moe_layers || t.routing_top_k != l.moe_top_k) {
      return bad(
          absl::StrCat(where, ".routing_layers"),
          absl::StrCat(t.routing_layers, " layers x ", t.routing_top_k,
                       " experts; the model routes ", l.moe_layers, " layers x ", l.moe_top_k));
    }
    for (size_t i = 0; i < t.routed_experts.size(); ++i) {
      if (t.routed_experts[i] >= l.num_experts) {
        return bad(
            absl::StrCat(where, ".routed_experts[", i, "]"),
            absl::StrCat("expert ", t.routed_experts[i], " outside [0, ", l.num_experts, ")"));
      }
    }
  }
  RELAY_RETURN_IF_ERROR(check_versions(t.token_versions, where, "token_versions", c, false));
  RELAY_RETURN_IF_ERROR(check_versions(t.proximal_versions, where, "proximal_versions", c, true));
  if (!std::isfinite(t.reward)) {
    return bad(absl::StrCat(where, ".reward"),
               absl::StrCat(t.reward, ": the trajectory was not scored"));
  }
  return OkStatus();
}

}  // namespace

Status validate_submission(const rollout::TrajectoryGroup& group, const SubmissionContext& c,
                           const SubmissionLimits& l) {
  const std::string g = absl::StrCat("group '", group.group_id, "'");
  if (group.group_id.empty()) return bad("group", "group_id: empty");
  if (static_cast<int>(group.trajectories.size()) != c.k) {
    return bad(g,
               absl::StrCat(group.trajectories.size(), " trajectories for a lease of k = ", c.k));
  }
  const std::vector<int64_t>& prompt = group.trajectories.front().prompt_tokens;
  for (size_t i = 0; i < group.trajectories.size(); ++i) {
    RELAY_RETURN_IF_ERROR(check_trajectory_submission(
        group.trajectories[i], absl::StrCat(g, " trajectories[", i, "]"), prompt, c, l));
  }
  if (group.baseline) {
    RELAY_RETURN_IF_ERROR(
        check_trajectory_submission(*group.baseline, absl::StrCat(g, " baseline"), prompt, c, l));
  }
  return OkStatus();
}

int64_t normalize_submission(rollout::TrajectoryGroup& group, const SubmissionLimits& l) {
  int64_t n = 0;
  auto clamp = [&](std::vector<float>& v) {
    for (float& lp : v) {
      if (lp > 0 && lp <= l.logprob_tolerance) {
        lp = 0;
        ++n;
      }
    }
  };
  auto fix = [&](rollout::Trajectory& t) {
    clamp(t.behavior_logprobs);
    clamp(t.proximal_logprobs);
    clamp(t.raw_logprobs);
  };
  for (rollout::Trajectory& t : group.trajectories) fix(t);
  if (group.baseline) fix(*group.baseline);
  return n;
}

}  // namespace relay::comm
