#pragma once

// The episodes a rollout worker offers agents (rollout.agent; docs/serve.md,
// "Inside training"): each prompt leased from the trainer becomes K
// episodes, handed out one by one through POST /v1/episodes. When all K
// have ended (the agent posted .../end), they are one TrajectoryGroup for
// the lease, in sample order, each with the reward its agent posted (NaN
// when none: the worker's verifier scores it then).
//
// A group is dropped, and its lease is for the worker to give back, when
// one of its episodes is not ended within episode_timeout of being handed
// out (the agent died or hung), or when its episodes did not all start from
// the same prompt tokens (the trainer would refuse it: a group shares one
// prompt). Ids of dropped or ended episodes are no longer open, so a late
// call under one is refused.
//
// Thread-safe: the HTTP server's threads take and end episodes, the
// worker's loop adds leases and collects groups.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "relay/rollout/task.h"
#include "relay/rollout/trajectory.h"
#include "relay/serve/episode_source.h"

namespace relay::comm {

struct AgentEpisodesOptions {
  // An episode handed out and not ended within this drops its group.
  std::chrono::milliseconds episode_timeout{std::chrono::minutes(10)};
  // model.system_prompt: the system message of every ticket. A task's own
  // system message also lists task.environment's tools (for relay's own
  // episodes); an agent names its tools in its requests instead, and the
  // chat template lists them, so the ticket leaves that message out.
  std::string system_prompt;
};

class AgentEpisodes final : public serve::EpisodeSource {
 public:
  using Clock = std::chrono::steady_clock;
  explicit AgentEpisodes(AgentEpisodesOptions options);

  // A leased prompt: k episodes to hand out; `version` the policy version now.
  void add_group(const std::string& group_id, uint64_t lease_id, const rollout::TaskPrompt& prompt,
                 int k, int64_t version);

  struct Complete {
    uint64_t lease_id = 0;
    rollout::TaskPrompt prompt;
    rollout::TrajectoryGroup group;
  };
  struct Dropped {
    uint64_t lease_id = 0;
    std::string group_id;
    std::string reason;
  };
  struct Collected {
    std::vector<Complete> complete;
    std::vector<Dropped> dropped;
  };
  // Groups whose episodes all ended, and groups dropped, since the last call
  // (`now` decides the timeouts). Both leave this object.
  Collected collect(Clock::time_point now = Clock::now());
  // Leases of the groups not collected yet (to give back when stopping).
  std::vector<uint64_t> open_leases() const;
  int open_groups() const;
  // No more episodes: take() answers OutOfRange from now on, and every group
  // is forgotten.
  void close();

  // serve::EpisodeSource
  StatusOr<std::optional<serve::EpisodeTicket>> take(std::chrono::milliseconds wait) override;
  bool is_open(const std::string& id) const override;
  void end(serve::EndedEpisode episode) override;

 private:
  struct Episode {
    std::string id;  // "" until handed out
    Clock::time_point deadline;
    std::optional<rollout::Trajectory> trajectory;  // set when it ended
  };
  struct Group {
    uint64_t lease_id = 0;
    rollout::TaskPrompt prompt;
    int64_t version = 0;
    std::vector<Episode> episodes;
    int ended = 0;
  };

  const AgentEpisodesOptions options_;
  mutable std::mutex mu_;
  std::condition_variable offered_;  // an episode to take, or closed
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  // Episodes not handed out yet, in lease order: (group id, sample).
  std::deque<std::pair<std::string, int>> queue_ ABSL_GUARDED_BY(mu_);
  // Handed-out, open episodes: id -> (group id, sample).
  std::map<std::string, std::pair<std::string, int>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace relay::comm
