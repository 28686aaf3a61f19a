#include "relay/comm/worker/agent_episodes.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "relay/serve/openai_api.h"

namespace relay::comm {

AgentEpisodes::AgentEpisodes(AgentEpisodesOptions options) : options_(options) {}

void AgentEpisodes::add_group(const std::string& group_id, uint64_t lease_id,
                              const rollout::TaskPrompt& prompt, int k, int64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    Group& g = groups_[group_id];
    g.lease_id = lease_id;
    g.prompt = prompt;
    g.version = version;
    g.episodes.assign(static_cast<size_t>(k), Episode{});
    g.ended = 0;
    for (int i = 0; i < k; ++i) queue_.emplace_back(group_id, i);
  }
  offered_.notify_all();
}

StatusOr<std::optional<serve::EpisodeTicket>> AgentEpisodes::take(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + wait;
  for (;;) {
    if (closed_) return OutOfRangeError("the run is over: no more episodes");
    while (!queue_.empty()) {
      auto [group_id, sample] = queue_.front();
      queue_.pop_front();
      auto it = groups_.find(group_id);
      if (it == groups_.end()) continue;  // dropped meanwhile
      Group& g = it->second;
      Episode& e = g.episodes[static_cast<size_t>(sample)];
      e.id = serve::random_id("ep-");
      e.deadline = Clock::now() + options_.episode_timeout;
      open_[e.id] = {group_id, sample};
      serve::EpisodeTicket t;
      t.id = e.id;
      t.task_id = g.prompt.id;
      if (!options_.system_prompt.empty()) t.messages.push_back({"system", options_.system_prompt});
      for (const model::ChatMessage& m : g.prompt.messages) {
        if (m.role != "system") t.messages.push_back(m);
      }
      t.reference = g.prompt.reference;
      t.group_id = group_id;
      t.sample = sample;
      t.k = static_cast<int>(g.episodes.size());
      t.version = g.version;
      return std::optional<serve::EpisodeTicket>(std::move(t));
    }
    if (offered_.wait_until(lock, deadline) == std::cv_status::timeout && queue_.empty()) {
      return closed_ ? StatusOr<std::optional<serve::EpisodeTicket>>(
                           OutOfRangeError("the run is over: no more episodes"))
                     : std::optional<serve::EpisodeTicket>();
    }
  }
}

bool AgentEpisodes::is_open(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_.count(id) > 0;
}

void AgentEpisodes::end(serve::EndedEpisode episode) {
  std::lock_guard<std::mutex> lock(mu_);
  auto o = open_.find(episode.id);
  if (o == open_.end()) return;  // dropped with its group meanwhile
  const auto [group_id, sample] = o->second;
  open_.erase(o);
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return;
  Group& g = it->second;
  g.episodes[static_cast<size_t>(sample)].trajectory = std::move(episode.trajectory);
  ++g.ended;
}

AgentEpisodes::Collected AgentEpisodes::collect(Clock::time_point now) {
  Collected out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& g = it->second;
    std::string why;
    for (size_t i = 0; i < g.episodes.size() && why.empty(); ++i) {
      const Episode& e = g.episodes[i];
      if (!e.id.empty() && !e.trajectory && now >= e.deadline) {
        why = absl::StrCat("episode ", e.id, " (sample ", i, ") was not ended within ",
                           options_.episode_timeout.count() / 1000.0,
                           " s (rollout.agent.episode_timeout_s)");
      }
    }
    if (why.empty() && g.ended == static_cast<int>(g.episodes.size())) {
      // A group shares one prompt: the trainer compares every trajectory's
      // with the first's.
      const std::vector<int64_t>& first = g.episodes.front().trajectory->prompt_tokens;
      for (size_t i = 1; i < g.episodes.size() && why.empty(); ++i) {
        if (g.episodes[i].trajectory->prompt_tokens != first) {
          why = absl::StrCat("episode ", g.episodes[i].id, " (sample ", i,
                             ") started from other prompt tokens than sample 0's; every episode "
                             "of a group must start with the same messages (the ticket's)");
        }
      }
      if (why.empty()) {
        Complete c;
        c.lease_id = g.lease_id;
        c.prompt = std::move(g.prompt);
        c.group.group_id = it->first;
        for (Episode& e : g.episodes) c.group.trajectories.push_back(std::move(*e.trajectory));
        out.complete.push_back(std::move(c));
        it = groups_.erase(it);
        continue;
      }
    }
    if (!why.empty()) {
      for (const Episode& e : g.episodes) open_.erase(e.id);
      out.dropped.push_back({g.lease_id, it->first, std::move(why)});
      it = groups_.erase(it);
      continue;
    }
    ++it;
  }
  return out;
}

std::vector<uint64_t> AgentEpisodes::open_leases() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out;
  for (const auto& [id, g] : groups_) out.push_back(g.lease_id);
  return out;
}

int AgentEpisodes::open_groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(groups_.size());
}

void AgentEpisodes::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    groups_.clear();
    queue_.clear();
    open_.clear();
  }
  offered_.notify_all();
}

}  // namespace relay::comm
