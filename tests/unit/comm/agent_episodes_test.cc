// The episodes a worker offers agents (comm/worker/agent_episodes.h): K per
// leased prompt, handed out once each, collected as one group in sample
// order when all K ended; a timed-out episode or a group whose episodes
// started from different prompts is dropped with a reason naming it.

#include "relay/comm/worker/agent_episodes.h"

#include <gtest/gtest.h>

#include <future>
#include <set>
#include <thread>

namespace relay::comm {
namespace {

using std::chrono::milliseconds;

rollout::TaskPrompt prompt(const std::string& id) {
  rollout::TaskPrompt p;
  p.id = id;
  p.reference = "42";
  p.messages = {{"system", "You may call the calculator tool ..."}, {"user", "What is 6*7?"}};
  return p;
}

serve::EndedEpisode ended(const std::string& id, std::vector<int64_t> prompt_tokens,
                          double reward) {
  serve::EndedEpisode e;
  e.id = id;
  e.trajectory.prompt_tokens = std::move(prompt_tokens);
  e.trajectory.response_tokens = {5, 6};
  e.trajectory.reward = reward;
  e.calls = 1;
  return e;
}

serve::EpisodeTicket take(AgentEpisodes& a) {
  StatusOr<std::optional<serve::EpisodeTicket>> t = a.take(milliseconds(0));
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t.ok() && t->has_value());
  return t.ok() && t->has_value() ? **t : serve::EpisodeTicket{};
}

TEST(AgentEpisodesTest, KEpisodesPerLeaseMakeOneGroupInSampleOrder) {
  AgentEpisodesOptions o;
  o.system_prompt = "Be brief.";
  AgentEpisodes a(o);
  a.add_group("g1", 101, prompt("arithmetic/1"), 3, 7);
  std::vector<serve::EpisodeTicket> t;
  for (int i = 0; i < 3; ++i) t.push_back(take(a));
  // Nothing more to hand out: an empty answer after the wait.
  StatusOr<std::optional<serve::EpisodeTicket>> none = a.take(milliseconds(10));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  std::set<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t[i].group_id, "g1");
    EXPECT_EQ(t[i].sample, i);
    EXPECT_EQ(t[i].k, 3);
    EXPECT_EQ(t[i].version, 7);
    EXPECT_EQ(t[i].task_id, "arithmetic/1");
    EXPECT_EQ(t[i].reference, "42");
    // model.system_prompt replaces the task's system message (which lists
    // relay's environment tools; the agent names its own).
    ASSERT_EQ(t[i].messages.size(), 2u);
    EXPECT_EQ(t[i].messages[0].role, "system");
    EXPECT_EQ(t[i].messages[0].content, "Be brief.");
    EXPECT_EQ(t[i].messages[1].content, "What is 6*7?");
    EXPECT_TRUE(a.is_open(t[i].id));
    ids.insert(t[i].id);
  }
  EXPECT_EQ(ids.size(), 3u) << "every episode its own id";
  EXPECT_FALSE(a.is_open("ep-made-up"));
  // Ended out of order; the group keeps sample order.
  a.end(ended(t[2].id, {1, 2, 3}, 1.0));
  a.end(ended(t[0].id, {1, 2, 3}, 0.0));
  EXPECT_FALSE(a.is_open(t[0].id)) << "an ended episode takes no more calls";
  EXPECT_TRUE(a.collect().complete.empty()) << "one episode still open";
  a.end(ended(t[1].id, {1, 2, 3}, std::nan("")));
  a.end(ended(t[1].id, {9}, 1.0));  // twice: ignored
  AgentEpisodes::Collected c = a.collect();
  ASSERT_EQ(c.complete.size(), 1u);
  EXPECT_TRUE(c.dropped.empty());
  const AgentEpisodes::Complete& g = c.complete[0];
  EXPECT_EQ(g.lease_id, 101u);
  EXPECT_EQ(g.group.group_id, "g1");
  EXPECT_EQ(g.prompt.id, "arithmetic/1");
  ASSERT_EQ(g.group.trajectories.size(), 3u);
  EXPECT_EQ(g.group.trajectories[0].reward, 0.0);
  EXPECT_TRUE(std::isnan(g.group.trajectories[1].reward)) << "no reward: the verifier's to give";
  EXPECT_EQ(g.group.trajectories[2].reward, 1.0);
  EXPECT_EQ(a.open_groups(), 0);
}

TEST(AgentEpisodesTest, AnEpisodeNotEndedInTimeDropsItsGroup) {
  AgentEpisodesOptions o;
  o.episode_timeout = milliseconds(1000);
  AgentEpisodes a(o);
  a.add_group("g1", 5, prompt("p"), 2, 0);
  a.add_group("g2", 6, prompt("q"), 1, 0);
  const serve::EpisodeTicket t0 = take(a);
  const serve::EpisodeTicket t1 = take(a);
  a.end(ended(t0.id, {1}, 1.0));
  const auto now = AgentEpisodes::Clock::now();
  EXPECT_TRUE(a.collect(now).dropped.empty()) << "within the timeout";
  // An episode never handed out holds nothing up: g2's is still queued.
  AgentEpisodes::Collected c = a.collect(now + milliseconds(1500));
  ASSERT_EQ(c.dropped.size(), 1u);
  EXPECT_EQ(c.dropped[0].lease_id, 5u);
  EXPECT_EQ(c.dropped[0].group_id, "g1");
  EXPECT_NE(c.dropped[0].reason.find(t1.id), std::string::npos) << c.dropped[0].reason;
  EXPECT_NE(c.dropped[0].reason.find("rollout.agent.episode_timeout_s"), std::string::npos);
  EXPECT_FALSE(a.is_open(t1.id)) << "a late call under it is refused";
  a.end(ended(t1.id, {1}, 1.0));  // too late: ignored
  EXPECT_TRUE(a.collect().complete.empty());
  EXPECT_EQ(a.open_leases(), std::vector<uint64_t>{6});
}

TEST(AgentEpisodesTest, EpisodesOfAGroupMustStartFromOnePrompt) {
  AgentEpisodes a(AgentEpisodesOptions{});
  a.add_group("g1", 9, prompt("p"), 2, 0);
  const serve::EpisodeTicket t0 = take(a);
  const serve::EpisodeTicket t1 = take(a);
  a.end(ended(t0.id, {1, 2, 3}, 1.0));
  a.end(ended(t1.id, {1, 2, 4}, 1.0));  // another system prompt, say
  AgentEpisodes::Collected c = a.collect();
  EXPECT_TRUE(c.complete.empty());
  ASSERT_EQ(c.dropped.size(), 1u);
  EXPECT_EQ(c.dropped[0].lease_id, 9u);
  EXPECT_NE(c.dropped[0].reason.find("sample 1"), std::string::npos) << c.dropped[0].reason;
}

TEST(AgentEpisodesTest, AWaitingAgentGetsTheNextLeaseAndCloseEndsEveryone) {
  AgentEpisodes a(AgentEpisodesOptions{});
  auto waiting = std::async(std::launch::async, [&] { return a.take(milliseconds(20000)); });
  std::this_thread::sleep_for(milliseconds(50));
  a.add_group("g1", 1, prompt("p"), 1, 3);
  StatusOr<std::optional<serve::EpisodeTicket>> t = waiting.get();
  ASSERT_TRUE(t.ok() && t->has_value()) << t.status();
  EXPECT_EQ((*t)->group_id, "g1");
  a.end(ended((*t)->id, {1}, 1.0));
  EXPECT_EQ(a.collect().complete.size(), 1u);
  // Closing: a waiting agent hears the run is over, and so does every later one.
  auto blocked = std::async(std::launch::async, [&] { return a.take(milliseconds(20000)); });
  std::this_thread::sleep_for(milliseconds(50));
  a.close();
  EXPECT_TRUE(absl::IsOutOfRange(blocked.get().status()));
  EXPECT_TRUE(absl::IsOutOfRange(a.take(milliseconds(0)).status()));
  a.add_group("g2", 2, prompt("p"), 1, 3);  // after close: nothing is offered
  EXPECT_EQ(a.open_groups(), 0);
}

}  // namespace
}  // namespace relay::comm
