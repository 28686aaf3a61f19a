// The READY groups counted in memory and the wait for them: the signal the
// trainer waits on instead of polling the store (store/ready_counts.h).

#include "relay/store/ready_counts.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <limits>

#include "relay/store/rollout_store.h"

namespace relay::store {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Far beyond any wait these tests expect: only a lost wake-up reaches it.
constexpr auto kGenerous = std::chrono::seconds(60);

// A `stop` for wait() that never stops but tells `looked` when the waiter
// first asked it. The waiter holds the lock from that look until it sleeps,
// so a change made after `looked` is ready happens while it sleeps: the
// wake-up, not the first look, must then end the wait.
struct FirstLook {
  std::promise<void> looked;
  bool told = false;  // only the waiter's thread touches it
  std::atomic<bool> stop{false};
  std::function<bool()> fn() {
    return [this] {
      if (!told) {
        told = true;
        looked.set_value();
      }
      return stop.load();
    };
  }
};

TEST(ReadyCountsTest, CountsGroupsAtOrAboveAVersion) {
  ReadyCounts c;
  c.reset({{0, 2}, {3, 1}});
  EXPECT_EQ(c.count(-1), 3);
  EXPECT_EQ(c.count(0), 3);
  EXPECT_EQ(c.count(1), 1);
  EXPECT_EQ(c.count(4), 0);
  c.change({{0, -2}, {5, 1}});
  c.add(3);
  EXPECT_EQ(c.count(-1), 3);
  EXPECT_EQ(c.count(1), 3);
  EXPECT_EQ(c.count(4), 1);
}

TEST(ReadyCountsTest, AWaiterWakesWhenAnotherThreadAddsGroups) {
  ReadyCounts c;
  FirstLook probe;
  const auto deadline = Clock::now() + kGenerous;
  std::future<int64_t> waited = std::async(std::launch::async, [&] {
    return c.wait(/*want=*/2, /*min_version=*/1, deadline, probe.fn());
  });
  probe.looked.get_future().wait();
  c.add(0);  // too old for the waiter: it sleeps on
  c.add(1);
  c.add(2);
  EXPECT_EQ(waited.get(), 2);
  EXPECT_LT(Clock::now(), deadline);
}

TEST(ReadyCountsTest, AWaiterWakesOnStop) {
  ReadyCounts c;
  FirstLook probe;
  const auto deadline = Clock::now() + kGenerous;
  std::future<int64_t> waited =
      std::async(std::launch::async, [&] { return c.wait(1, -1, deadline, probe.fn()); });
  probe.looked.get_future().wait();
  probe.stop = true;
  c.wake();
  EXPECT_EQ(waited.get(), 0) << "stopped with nothing ready";
  EXPECT_LT(Clock::now(), deadline);
}

TEST(ReadyCountsTest, AWaitWithNothingArrivingEndsAtItsDeadline) {
  ReadyCounts c;
  c.add(0);  // below the waiter's bound: does not count
  const auto t0 = Clock::now();
  EXPECT_EQ(c.wait(1, 1, t0 + milliseconds(200)), 0);
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, milliseconds(200));
  EXPECT_LT(waited, kGenerous);
  // Enough already: no wait at all, whatever the deadline.
  EXPECT_EQ(c.wait(1, 0, Clock::now() + kGenerous), 1);
}

// The store's side: appends and rewinds signal the waiters, and the count
// follows every change of the READY index (as stats() sees it), across a
// reopen too.

rollout::TrajectoryGroup one_group(const std::string& id, int64_t version) {
  rollout::TrajectoryGroup g;
  g.group_id = id;
  rollout::Trajectory t;
  t.prompt_tokens = {1, 2};
  t.response_tokens = {3};
  t.behavior_logprobs = {-0.5f};
  t.token_versions = {version};
  t.proximal_logprobs = {std::numeric_limits<float>::quiet_NaN()};
  t.proximal_versions = {-1};
  t.offpolicy_mask = {0};
  t.version_digests = {{version, 7}};
  t.reward = 1.0;
  g.trajectories.push_back(t);
  return g;
}

std::unique_ptr<RolloutStore> open_store(const std::string& dir) {
  StoreOptions o;
  o.path = dir;
  o.sync_writes = false;
  return RolloutStore::open(o).value();
}

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/relay_ready_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(RolloutStoreWaitTest, AppendAndRewindWakeAWaiter) {
  auto store = open_store(fresh_dir("wake"));
  {
    FirstLook probe;
    const auto deadline = Clock::now() + kGenerous;
    std::future<int64_t> waited = std::async(
        std::launch::async, [&] { return store->wait_for_ready(1, -1, deadline, probe.fn()); });
    probe.looked.get_future().wait();
    ASSERT_TRUE(store->append(one_group("a", 0), 0).ok());
    EXPECT_EQ(waited.get(), 1);
    EXPECT_LT(Clock::now(), deadline);
  }
  const StorePosition pos = store->position().value();
  ASSERT_EQ(store->take_ready(1, -1, 1).value().size(), 1u);
  EXPECT_EQ(store->count_ready(-1), 0);
  {
    FirstLook probe;
    const auto deadline = Clock::now() + kGenerous;
    std::future<int64_t> waited = std::async(
        std::launch::async, [&] { return store->wait_for_ready(1, -1, deadline, probe.fn()); });
    probe.looked.get_future().wait();
    ASSERT_EQ(store->rewind(pos, 1).value().restored, 1);  // `a` is READY again
    EXPECT_EQ(waited.get(), 1);
    EXPECT_LT(Clock::now(), deadline);
  }
  {
    FirstLook probe;
    const auto deadline = Clock::now() + kGenerous;
    std::future<int64_t> waited = std::async(
        std::launch::async, [&] { return store->wait_for_ready(2, -1, deadline, probe.fn()); });
    probe.looked.get_future().wait();
    probe.stop = true;
    store->wake_waiters();
    EXPECT_EQ(waited.get(), 1);
    EXPECT_LT(Clock::now(), deadline);
  }
}

TEST(RolloutStoreWaitTest, TheCountFollowsEveryChangeOfTheReadyIndex) {
  const std::string dir = fresh_dir("follow");
  auto ready_in_stats = [](const RolloutStore& s) { return s.stats().value().ready; };
  {
    auto store = open_store(dir);
    for (int v = 0; v < 6; ++v) {
      ASSERT_TRUE(store->append(one_group("g" + std::to_string(v), v), v).ok());
    }
    const StorePosition pos = store->position().value();
    EXPECT_EQ(store->count_ready(-1), 6);
    EXPECT_EQ(store->count_ready(4), 2);
    ASSERT_EQ(store->expire_stale(1, 6).value(), 1);  // g0
    EXPECT_EQ(store->count_ready(-1), ready_in_stats(*store));
    ASSERT_TRUE(store->reject(2, "quarantined while READY", 6).ok());  // g1
    EXPECT_EQ(store->count_ready(-1), ready_in_stats(*store));
    int64_t expired = 0;
    ASSERT_EQ(store->take_ready(1, 3, 6, &expired).value().size(), 1u);  // g3; g2 expires
    EXPECT_EQ(expired, 1);
    EXPECT_EQ(store->count_ready(-1), 2);
    EXPECT_EQ(store->count_ready(-1), ready_in_stats(*store));
    ASSERT_TRUE(store->append(one_group("late", 6), 6).ok());
    ASSERT_EQ(store->rewind(pos, 6).value().dropped, 1);  // late; g0, g2, g3 READY again
    EXPECT_EQ(store->count_ready(-1), 5);
    EXPECT_EQ(store->count_ready(-1), ready_in_stats(*store));
  }
  auto store = open_store(dir);
  EXPECT_EQ(store->count_ready(-1), 5);
  EXPECT_EQ(store->count_ready(3), 3) << "g3, g4, g5";
}

}  // namespace
}  // namespace relay::store
