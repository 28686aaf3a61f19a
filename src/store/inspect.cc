#include "relay/store/inspect.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "relay/store/trajectory_json.h"

namespace relay::store {
namespace {

nlohmann::json histogram(const std::map<int64_t, int64_t>& h) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, n] : h) out[std::to_string(k)] = n;
  return out;
}

std::string histogram_text(const std::map<int64_t, int64_t>& h) {
  if (h.empty()) return " (none)";
  std::string out;
  for (const auto& [k, n] : h) absl::StrAppend(&out, " ", k, ":", n);
  return out;
}

std::string logprob(float x) { return std::isnan(x) ? "nan" : absl::StrFormat("%.4f", x); }

}  // namespace

StatusOr<StoreReport> build_report(const RolloutStore& store) {
  StoreReport r;
  r.path = store.path();
  RELAY_ASSIGN_OR_RETURN(r.stats, store.stats());
  RELAY_ASSIGN_OR_RETURN(std::vector<StoredGroup> all, store.scan());
  for (const StoredGroup& g : all) {
    r.latest_version = std::max({r.latest_version, g.arrival_version, g.consumed_version});
  }
  for (const StoredGroup& g : all) {
    if (g.state == GroupState::kConsumed) {
      ++r.age_when_trained[g.consumed_version - g.min_version];
      ++r.wait_in_store[g.consumed_version - g.arrival_version];
    } else if (g.state == GroupState::kReady) {
      ++r.ready_age[r.latest_version - g.min_version];
    } else if (g.state == GroupState::kRejected) {
      r.rejected.push_back({g.seq, g.group.group_id, g.consumed_version, g.reject_reason});
    }
  }
  if (!all.empty()) r.sample = all.back();
  return r;
}

std::string report_text(const StoreReport& r) {
  const StoreStats& s = r.stats;
  std::string out =
      absl::StrCat("store ", r.path, "\n", "groups: ", s.ready, " ready, ", s.consumed,
                   " consumed, ", s.expired, " expired, ", s.rejected, " rejected; next seq ",
                   s.next_seq, "; latest version ", r.latest_version, "\n");
  absl::StrAppend(&out, "by oldest token version:\n");
  absl::StrAppend(&out, absl::StrFormat("  %8s %7s %9s %8s %12s %11s\n", "version", "ready",
                                        "consumed", "expired", "trajectories", "reward mean"));
  for (const auto& [v, c] : s.by_min_version) {
    absl::StrAppend(
        &out,
        absl::StrFormat("  %8d %7d %9d %8d %12d %11.4f\n", v, c.ready, c.consumed, c.expired,
                        c.trajectories, c.trajectories > 0 ? c.reward_sum / c.trajectories : 0.0));
  }
  absl::StrAppend(&out, "staleness (versions: groups)\n",
                  "  oldest token when trained:", histogram_text(r.age_when_trained), "\n",
                  "  waited in the store:      ", histogram_text(r.wait_in_store), "\n",
                  "  ready, behind latest:     ", histogram_text(r.ready_age), "\n");
  if (!r.rejected.empty()) {
    absl::StrAppend(&out, "rejected (quarantined; never trained on):\n");
    for (const StoreReport::Rejection& x : r.rejected) {
      absl::StrAppend(&out, "  seq ", x.seq, " '", x.group_id, "' at version ", x.version, ": ",
                      x.reason, "\n");
    }
  }
  if (r.sample) {
    const StoredGroup& g = *r.sample;
    absl::StrAppend(&out, "latest group: seq ", g.seq, " '", g.group.group_id, "' (",
                    group_state_name(g.state), ", ", g.group.trajectories.size(),
                    " trajectories)\n");
    if (!g.group.trajectories.empty()) {
      const rollout::Trajectory& t = g.group.trajectories.front();
      absl::StrAppend(&out, "  trajectory 0: reward ", t.reward, ", ",
                      rollout::finish_reason_name(t.finish_reason), ", prompt ",
                      t.prompt_tokens.size(), " tokens");
      if (!t.turns.empty()) {
        absl::StrAppend(&out, ", ", t.turns.size(), " turns, ", t.num_env_tokens(),
                        " environment tokens");
      }
      if (!t.finish_detail.empty()) absl::StrAppend(&out, " (", t.finish_detail, ")");
      absl::StrAppend(&out, "\n");
      // `src`: who wrote the token, model or env (masked out of the loss);
      // `turn`: the episode turn it belongs to.
      // `teacher`: on-policy distillation's teacher log-prob, when scored.
      const bool teacher = !t.teacher_logprobs.empty();
      absl::StrAppend(
          &out, absl::StrFormat("  %4s %8s %10s %8s %10s %9s %4s %5s %4s%s\n", "j", "token",
                                "behavior", "version", "proximal", "prox_ver", "off", "src", "turn",
                                teacher ? absl::StrFormat(" %10s", "teacher") : ""));
      size_t turn = 0;
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        while (turn + 1 < t.turns.size() && static_cast<int64_t>(j) >= t.turns[turn].env_end) {
          ++turn;
        }
        absl::StrAppend(
            &out, absl::StrFormat(
                      "  %4d %8d %10s %8d %10s %9d %4d %5s %4d%s\n", j, t.response_tokens[j],
                      logprob(t.behavior_logprobs[j]), t.token_versions[j],
                      logprob(t.proximal_logprobs[j]), t.proximal_versions[j], t.offpolicy_mask[j],
                      t.is_env_token(j) ? "env" : "model", turn,
                      teacher ? absl::StrFormat(" %10s", logprob(t.teacher_logprobs[j])) : ""));
      }
    }
  }
  return out;
}

std::string report_json(const StoreReport& r) {
  const StoreStats& s = r.stats;
  nlohmann::json by_version = nlohmann::json::object();
  for (const auto& [v, c] : s.by_min_version) {
    by_version[std::to_string(v)] = {
        {"ready", c.ready},
        {"consumed", c.consumed},
        {"expired", c.expired},
        {"rejected", c.rejected},
        {"trajectories", c.trajectories},
        {"reward_mean", c.trajectories > 0 ? c.reward_sum / c.trajectories : 0.0}};
  }
  nlohmann::json j = {{"path", r.path},
                      {"ready", s.ready},
                      {"consumed", s.consumed},
                      {"expired", s.expired},
                      {"rejected", s.rejected},
                      {"next_seq", s.next_seq},
                      {"latest_version", r.latest_version},
                      {"by_min_version", by_version},
                      {"staleness",
                       {{"age_when_trained", histogram(r.age_when_trained)},
                        {"wait_in_store", histogram(r.wait_in_store)},
                        {"ready_age", histogram(r.ready_age)}}}};
  nlohmann::json rejected = nlohmann::json::array();
  for (const StoreReport::Rejection& x : r.rejected) {
    rejected.push_back(
        {{"seq", x.seq}, {"group_id", x.group_id}, {"version", x.version}, {"reason", x.reason}});
  }
  j["rejected_groups"] = rejected;
  if (r.sample && !r.sample->group.trajectories.empty()) {
    const StoredGroup& g = *r.sample;
    const rollout::Trajectory& t = g.group.trajectories.front();
    j["sample"] = {
        {"seq", g.seq},
        {"group_id", g.group.group_id},
        {"state", group_state_name(g.state)},
        {"reward", std::isfinite(t.reward) ? nlohmann::json(t.reward) : nlohmann::json()},
        {"prompt_tokens", t.prompt_tokens},
        {"response_tokens", t.response_tokens},
        {"behavior_logprobs", nullable_floats(t.behavior_logprobs)},
        {"token_versions", t.token_versions},
        {"proximal_logprobs", nullable_floats(t.proximal_logprobs)},
        {"proximal_versions", t.proximal_versions},
        {"offpolicy_mask", t.offpolicy_mask},
        {"env_mask", t.env_mask},
        {"finish_reason", rollout::finish_reason_name(t.finish_reason)}};
    j["sample"]["turns"] = episode_turns_json(t.turns);
    if (!t.teacher_logprobs.empty()) {
      j["sample"]["teacher_logprobs"] = nullable_floats(t.teacher_logprobs);
      j["sample"]["teacher_digest"] = t.teacher_digest;
    }
  }
  return j.dump(2);
}

}  // namespace relay::store
