#include "relay/comm/service/submission.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace relay::comm {
namespace {

Status bad(const std::string& where, const std::string& what) {
  return InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// `env_mask`: an episode's environment tokens, which have no log-prob by
// design (Trajectory::env_mask), so none is required of them.
Status check_logprobs(const std::vector<float>& values, const std::string& where, const char* field,
                      const SubmissionLimits& l, bool required,
                      const std::vector<uint8_t>& env_mask = {}) {
  const double tolerance = l.logprob_tolerance;
  for (size_t j = 0; j < values.size(); ++j) {
    const float lp = values[j];
    if (std::isnan(lp)) {
      if (!required || (j < env_mask.size() && env_mask[j])) continue;
      return bad(absl::StrCat(where, ".", field, "[", j, "]"),
                 "NaN (missing), but trainer.allow_missing_logprobs is off: every sampled "
                 "token needs the log-prob it was sampled with (DESIGN.md invariant 5)");
    }
    if (std::isinf(lp)) {
      return bad(
          absl::StrCat(where, ".", field, "[", j, "]"),
          absl::StrCat(lp > 0 ? "+inf" : "-inf", " is not a log-prob (send NaN if missing)"));
    }
    if (lp > tolerance) {
      return bad(absl::StrCat(where, ".", field, "[", j, "]"),
                 absl::StrCat(lp, " > 0 is not a log-prob"));
    }
    if (lp < l.min_logprob) {
      return bad(absl::StrCat(where, ".", field, "[", j, "]"),
                 absl::StrCat(lp, " is below ", l.min_logprob,
                              ": not the log-prob of a token anyone sampled"));
    }
  }
  return OkStatus();
}

Status check_versions(const std::vector<int64_t>& versions, const std::string& where,
                      const char* field, const SubmissionContext& c, bool allow_missing) {
  for (size_t j = 0; j < versions.size(); ++j) {
    const int64_t v = versions[j];
    if (allow_missing && v == -1) continue;
    if (v < 0) {
      return bad(absl::StrCat(where, ".", field, "[", j, "]"),
                 absl::StrCat("version ", v, " is negative; versions count from 0",
                              allow_missing ? " (-1 = missing)" : ""));
    }
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

// Sizes: what a group shares, and the bounds on how much one trajectory may
// make the trainer process.
Status check_lengths(const rollout::Trajectory& t, const std::string& where,
                     const std::vector<int64_t>& prompt, const SubmissionLimits& l) {
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
  if (l.max_context > 0 && total > l.max_context) {
    return bad(where, absl::StrCat(t.prompt_tokens.size(), " prompt + ", t.response_tokens.size(),
                                   " response tokens exceed the model's context of ", l.max_context,
                                   " (max_position_embeddings)"));
  }
  // An episode's response holds several turns and their observations.
  const bool episode = !t.turns.empty();
  const int64_t limit = episode ? l.max_episode_tokens : l.max_response_tokens;
  if (limit > 0 && static_cast<int64_t>(t.response_tokens.size()) > limit) {
    return bad(absl::StrCat(where, ".response_tokens"),
               absl::StrCat(t.response_tokens.size(), " tokens exceed ",
                            episode ? "the episode budget (rollout.episode.max_tokens) = "
                                    : "rollout.max_new_tokens = ",
                            limit));
  }
  return OkStatus();
}

// An id outside the vocabulary would index past the embedding table.
Status check_token_ids(const rollout::Trajectory& t, const std::string& where,
                       const SubmissionLimits& l) {
  if (l.vocab_size <= 0) return OkStatus();
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
  return OkStatus();
}

// trainer.distill: a sample without the teacher's log-prob of each of its
// model tokens cannot be trained on.
Status check_teacher_scored(const rollout::Trajectory& t, const std::string& where) {
  const std::string field = absl::StrCat(where, ".teacher_logprobs");
  const char* why =
      "trainer.distill is on, and the rollout worker scores every response with "
      "trainer.distill.teacher before it submits";
  if (t.teacher_logprobs.size() != t.response_tokens.size()) {
    return bad(field, absl::StrCat(t.teacher_logprobs.size(), " entries for ",
                                   t.response_tokens.size(), " response tokens; ", why));
  }
  for (size_t j = 0; j < t.teacher_logprobs.size(); ++j) {
    if (std::isnan(t.teacher_logprobs[j]) && !t.is_env_token(j)) {
      return bad(absl::StrCat(field, "[", j, "]"), absl::StrCat("NaN (missing); ", why));
    }
  }
  return OkStatus();
}

// The log-prob fields, then the per-token fields' sizes (check_trajectory).
Status check_logprob_fields(const rollout::Trajectory& t, const std::string& where,
                            const SubmissionLimits& l, bool sampled) {
  RELAY_RETURN_IF_ERROR(check_logprobs(t.behavior_logprobs, where, "behavior_logprobs", l,
                                       sampled && l.require_behavior_logprobs, t.env_mask));
  RELAY_RETURN_IF_ERROR(check_logprobs(t.proximal_logprobs, where, "proximal_logprobs", l, false));
  RELAY_RETURN_IF_ERROR(check_logprobs(t.raw_logprobs, where, "raw_logprobs", l, false));
  RELAY_RETURN_IF_ERROR(check_logprobs(t.teacher_logprobs, where, "teacher_logprobs", l, false));
  if (sampled && l.require_teacher_logprobs) {
    RELAY_RETURN_IF_ERROR(check_teacher_scored(t, where));
  }
  // Behavior log-probs above the tolerance were refused just above, and
  // normalize_submission clamps those within it to 0 before the store checks
  // them against 0.
  if (Status s =
          rollout::check_trajectory(t, std::max(0.0f, static_cast<float>(l.logprob_tolerance)));
      !s.ok()) {
    return bad(where, std::string(s.message()));
  }
  return OkStatus();
}

// Recorded expert routing must fit the model it will be replayed into.
Status check_routing(const rollout::Trajectory& t, const std::string& where,
                     const SubmissionLimits& l) {
  if (l.moe_layers < 0 || t.routed_experts.empty()) return OkStatus();
  if (l.moe_layers == 0) {
    return bad(absl::StrCat(where, ".routed_experts"), "the model has no MoE layers");
  }
  if (t.routing_layers != l.moe_layers || t.routing_top_k != l.moe_top_k) {
    return bad(
        absl::StrCat(where, ".routing_layers"),
        absl::StrCat(t.routing_layers, " layers x ", t.routing_top_k, " experts; the model routes ",
                     l.moe_layers, " layers x ", l.moe_top_k));
  }
  for (size_t i = 0; i < t.routed_experts.size(); ++i) {
    if (t.routed_experts[i] >= l.num_experts) {
      return bad(absl::StrCat(where, ".routed_experts[", i, "]"),
                 absl::StrCat("expert ", t.routed_experts[i], " outside [0, ", l.num_experts, ")"));
    }
  }
  return OkStatus();
}

Status check_reward(const rollout::Trajectory& t, const std::string& where,
                    const SubmissionLimits& l) {
  if (!std::isfinite(t.reward)) {
    return bad(absl::StrCat(where, ".reward"),
               absl::StrCat(t.reward, ": the trajectory was not scored"));
  }
  // Stored and trained as float: 1e300 is finite here and inf there.
  if (std::fabs(t.reward) > std::numeric_limits<float>::max() ||
      std::fabs(t.reward) > l.max_abs_reward) {
    return bad(absl::StrCat(where, ".reward"),
               absl::StrCat(t.reward, ": |reward| above ", l.max_abs_reward,
                            " (a reward function's bug, not a learning signal)"));
  }
  return OkStatus();
}

Status check_trajectory_submission(const rollout::Trajectory& t, const std::string& where,
                                   const std::vector<int64_t>& prompt, const SubmissionContext& c,
                                   const SubmissionLimits& l, bool sampled) {
  RELAY_RETURN_IF_ERROR(check_lengths(t, where, prompt, l));
  RELAY_RETURN_IF_ERROR(check_token_ids(t, where, l));
  RELAY_RETURN_IF_ERROR(check_logprob_fields(t, where, l, sampled));
  RELAY_RETURN_IF_ERROR(check_routing(t, where, l));
  RELAY_RETURN_IF_ERROR(check_versions(t.token_versions, where, "token_versions", c, false));
  RELAY_RETURN_IF_ERROR(check_versions(t.proximal_versions, where, "proximal_versions", c, true));
  return check_reward(t, where, l);
}

}  // namespace

Status validate_submission(const rollout::TrajectoryGroup& group, const SubmissionContext& c,
                           const SubmissionLimits& l) {
  const std::string g = absl::StrCat("group '", group.group_id, "'");
  if (group.group_id.empty()) return bad("group", "group_id: empty");
  if (group.trajectories.empty()) return bad(g, "no trajectories");
  if (c.k > 0 && static_cast<int>(group.trajectories.size()) != c.k) {
    return bad(g,
               absl::StrCat(group.trajectories.size(), " trajectories for a lease of k = ", c.k));
  }
  const std::vector<int64_t>& prompt = group.trajectories.front().prompt_tokens;
  for (size_t i = 0; i < group.trajectories.size(); ++i) {
    RELAY_RETURN_IF_ERROR(check_trajectory_submission(
        group.trajectories[i], absl::StrCat(g, " trajectories[", i, "]"), prompt, c, l, true));
  }
  if (group.baseline) {
    RELAY_RETURN_IF_ERROR(check_trajectory_submission(*group.baseline, absl::StrCat(g, " baseline"),
                                                      prompt, c, l,
                                                      /*sampled=*/false));
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
    clamp(t.teacher_logprobs);
  };
  for (rollout::Trajectory& t : group.trajectories) fix(t);
  if (group.baseline) fix(*group.baseline);
  return n;
}

}  // namespace relay::comm
