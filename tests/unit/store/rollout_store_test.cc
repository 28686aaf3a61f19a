#include "relay/store/rollout_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "store/store_format.h"

namespace relay::store {
namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/relay_store_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// A scored group of `k` one-token trajectories sampled at `version`.
rollout::TrajectoryGroup make_group(const std::string& id, int64_t version, int k = 2,
                                    double reward = 1.0) {
  rollout::TrajectoryGroup g;
  g.group_id = id;
  for (int j = 0; j < k; ++j) {
    rollout::Trajectory t;
    t.prompt_tokens = {1, 2};
    t.response_tokens = {3 + j, 4};
    t.behavior_logprobs = {-0.5f, -0.25f};
    t.token_versions = {version, version};
    t.proximal_logprobs = {std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::quiet_NaN()};
    t.proximal_versions = {-1, -1};
    t.offpolicy_mask = {0, 0};
    t.finish_reason = rollout::FinishReason::kStop;
    t.version_digests = {{version, 100 + static_cast<uint64_t>(version)}};
    t.reward = j == 0 ? reward : 0.0;
    g.trajectories.push_back(t);
  }
  return g;
}

std::unique_ptr<RolloutStore> open_store(const std::string& dir, int64_t retention = 8) {
  StoreOptions o;
  o.path = dir;
  o.retention_versions = retention;
  auto store = RolloutStore::open(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

std::vector<std::string> ids(const std::vector<StoredGroup>& groups) {
  std::vector<std::string> out;
  for (const StoredGroup& g : groups) out.push_back(g.group.group_id);
  return out;
}

TEST(RolloutStoreTest, AppendedGroupsComeBackFifoWithEveryField) {
  const std::string dir = fresh_dir("fifo");
  auto store = open_store(dir);
  EXPECT_EQ(store->append(make_group("a", 0), 0).value(), 1u);
  EXPECT_EQ(store->append(make_group("b", 1), 1).value(), 2u);
  EXPECT_EQ(store->append(make_group("c", 1), 1).value(), 3u);
  EXPECT_EQ(store->count_ready(-1), 3);

  auto first = store->take_ready(2, -1, /*trainer_version=*/1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ids(*first), (std::vector<std::string>{"a", "b"}));
  const StoredGroup& a = (*first)[0];
  EXPECT_EQ(a.seq, 1u);
  EXPECT_EQ(a.state, GroupState::kConsumed);
  EXPECT_EQ(a.consumed_version, 1);
  EXPECT_EQ(a.arrival_version, 0);
  EXPECT_GT(a.arrival_unix_ms, 0);
  EXPECT_EQ(a.group.trajectories.size(), 2u);
  EXPECT_EQ(a.group.trajectories[1].response_tokens, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(a.group.trajectories[0].behavior_logprobs, (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_TRUE(std::isnan(a.group.trajectories[0].proximal_logprobs[0]));

  EXPECT_EQ(ids(store->take_ready(5, -1, 2).value()), (std::vector<std::string>{"c"}));
  EXPECT_TRUE(store->take_ready(5, -1, 2).value().empty()) << "consumed groups are not re-read";
}

// A prepared record is numbered by putting the seq field in front of it:
// byte for byte the record encoded with that number, at every varint width.
TEST(RolloutStoreTest, APreparedRecordNumberedLaterIsTheRecordEncodedWithItsNumber) {
  StoredGroup g;
  g.min_version = 3;
  g.max_version = 4;
  g.arrival_version = 4;
  g.arrival_unix_ms = 1764000000000;
  g.group = make_group("g", 3);
  const std::string unnumbered = encode(g);
  for (uint64_t seq : {uint64_t{1}, uint64_t{127}, uint64_t{128}, uint64_t{300}, uint64_t{1} << 40,
                       ~uint64_t{0}}) {
    StoredGroup numbered = g;
    numbered.seq = seq;
    EXPECT_EQ(seq_field(seq) + unnumbered, encode(numbered)) << seq;
    auto back = decode(seq, seq_field(seq) + unnumbered);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->seq, seq);
    EXPECT_EQ(back->group.trajectories[1].response_tokens, (std::vector<int64_t>{4, 4}));
  }
  // What prepare() refuses, append() refuses, and nothing is written.
  rollout::TrajectoryGroup bad = make_group("bad", 0);
  bad.trajectories[1].token_versions.pop_back();
  const Status refused = RolloutStore::prepare(bad, 0).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.message()).find("group 'bad' trajectory 1: token_versions"),
            std::string::npos)
      << refused;
  const std::string dir = fresh_dir("prepared");
  auto store = open_store(dir);
  EXPECT_EQ(store->append(bad, 0).status(), refused);
  EXPECT_EQ(store->appended(), 0u);
}

TEST(RolloutStoreTest, StaleGroupsExpireInsteadOfBeingTrainedOn) {
  auto store = open_store(fresh_dir("stale"));
  ASSERT_TRUE(store->append(make_group("old", 0), 0).ok());
  ASSERT_TRUE(store->append(make_group("new", 3), 3).ok());
  EXPECT_EQ(store->count_ready(2), 1);
  int64_t expired = 0;
  auto taken = store->take_ready(10, /*min_version=*/2, /*trainer_version=*/4, &expired);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(ids(*taken), (std::vector<std::string>{"new"}));
  EXPECT_EQ(expired, 1);
  EXPECT_EQ(store->get(1).value().state, GroupState::kExpired);
  StoreStats st = store->stats().value();
  EXPECT_EQ(st.ready, 0);
  EXPECT_EQ(st.consumed, 1);
  EXPECT_EQ(st.expired, 1);
}

TEST(RolloutStoreTest, ExpireStaleMarksOnlyReadyGroupsBelowTheBound) {
  auto store = open_store(fresh_dir("expire_stale"));
  ASSERT_TRUE(store->append(make_group("v0", 0), 0).ok());
  ASSERT_TRUE(store->append(make_group("v1", 1), 1).ok());
  ASSERT_TRUE(store->append(make_group("v2", 2), 2).ok());
  EXPECT_EQ(store->expire_stale(/*min_version=*/2, /*trainer_version=*/2).value(), 2);
  EXPECT_EQ(store->expired_total(), 2u);
  EXPECT_EQ(store->get(1).value().state, GroupState::kExpired);
  EXPECT_EQ(store->get(2).value().consumed_version, 2);
  EXPECT_EQ(store->get(3).value().state, GroupState::kReady);
  EXPECT_EQ(store->expire_stale(2, 2).value(), 0) << "idempotent";
  EXPECT_EQ(ids(store->take_ready(5, 2, 2).value()), (std::vector<std::string>{"v2"}));
}

// A trainer resumed from a checkpoint at version 3 cannot use tokens of
// versions 4+ (their weights died with the old process); older READY groups
// stay, consumed ones are untouched.
// A checkpoint records position() at version 4; the run goes on (a group
// arrives, two are trained on, one expires, the dispenser moves); rewinding
// puts back exactly the store the checkpoint saw, durably.
TEST(RolloutStoreTest, RewindPutsTheStoreBackWhereACheckpointSawIt) {
  const std::string dir = fresh_dir("rewind");
  {
    auto store = open_store(dir);
    const std::string before_state = "dispenser@checkpoint";
    ASSERT_TRUE(store->append(make_group("old", 2), 3).ok());                   // seq 1
    ASSERT_TRUE(store->take_ready(1, -1, 3).ok());                              // old consumed at 3
    ASSERT_TRUE(store->append(make_group("a", 4), 4, &before_state).ok());      // seq 2
    ASSERT_TRUE(store->append(make_group("stale", 1), 4, &before_state).ok());  // seq 3
    const StorePosition pos = store->position().value();
    EXPECT_EQ(pos.next_seq, 4u);
    EXPECT_EQ(pos.side_record, before_state);

    // After the checkpoint.
    const std::string after_state = "dispenser@later";
    ASSERT_TRUE(store->append(make_group("late", 4), 4, &after_state).ok());  // seq 4
    ASSERT_EQ(store->take_ready(2, 3, 4).value().size(), 2u);  // a, late; stale expired
    ASSERT_TRUE(store->append(make_group("later", 5), 5, &after_state).ok());  // seq 5
    ASSERT_EQ(store->expire_stale(6, 6).value(), 1);                           // later

    EXPECT_EQ(store->expired_total(), 2u) << "stale and later";
    const RewindStats r = store->rewind(pos, 4).value();
    EXPECT_EQ(r.restored, 2) << "a and stale were READY at the checkpoint";
    EXPECT_EQ(r.dropped, 1) << "late arrived after it (later had already expired)";
  }
  auto store = open_store(dir);  // the rewind is durable
  EXPECT_EQ(store->get(1).value().state, GroupState::kConsumed) << "consumed before: stays";
  EXPECT_EQ(store->get(2).value().state, GroupState::kReady);
  EXPECT_EQ(store->get(2).value().consumed_version, -1);
  EXPECT_EQ(store->get(3).value().state, GroupState::kReady);
  EXPECT_EQ(store->get(4).value().state, GroupState::kExpired);
  EXPECT_EQ(store->get(5).value().state, GroupState::kExpired);
  EXPECT_EQ(store->side_record().value(), "dispenser@checkpoint");
  EXPECT_EQ(store->appended(), 5u) << "arrival numbers are never reused";
  // The dispenser's staleness room counts appended - expired: the three
  // groups the checkpoint saw (old, a, stale), not the dropped ones.
  EXPECT_EQ(store->expired_total(), 2u) << "late and later; stale is READY again";
  EXPECT_EQ(store->appended() - store->expired_total(), 3u);
  // The trainer then takes what it took after the checkpoint the first time.
  EXPECT_EQ(ids(store->take_ready(2, 3, 4).value()), (std::vector<std::string>{"a"}));

  // A position from another store (ahead of this one) is refused.
  StorePosition ahead;
  ahead.next_seq = 99;
  Status bad = store->rewind(ahead, 4).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(bad.message()).find("99"), std::string::npos) << bad;
}

// Dropped groups give their place in the staleness bound back: the
// dispenser's room counts appended - expired, so a rewind that dropped many
// later arrivals without counting them would leave no room at all.
TEST(RolloutStoreTest, RewindCountsDroppedGroupsAsExpired) {
  auto store = open_store(fresh_dir("rewind_count"));
  ASSERT_TRUE(store->append(make_group("a", 0), 0).ok());
  ASSERT_TRUE(store->append(make_group("b", 0), 0).ok());
  const StorePosition pos = store->position().value();
  for (const char* id : {"c", "d", "e"}) ASSERT_TRUE(store->append(make_group(id, 1), 1).ok());
  EXPECT_EQ(store->rewind(pos, 0).value().dropped, 3);
  EXPECT_EQ(store->expired_total(), 3u);
  EXPECT_EQ(store->appended() - store->expired_total(), 2u) << "a and b, as at the checkpoint";
}

// Quarantine: a taken group the trainer cannot train on becomes REJECTED with
// its reason, durably; it is counted, survives compaction, and a rewind to a
// checkpoint taken while it was READY leaves it quarantined (a resumed run
// must not meet it again).
TEST(RolloutStoreTest, RejectedGroupsStayQuarantined) {
  const std::string dir = fresh_dir("reject");
  {
    auto store = open_store(dir, /*retention=*/0);
    auto poison = make_group("poison", 0);
    poison.trajectories[0].behavior_logprobs[0] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE(store->append(poison, 0).ok());                 // seq 1
    ASSERT_TRUE(store->append(make_group("good", 0), 0).ok());  // seq 2
    const StorePosition pos = store->position().value();
    ASSERT_EQ(store->take_ready(2, -1, 0).value().size(), 2u);
    ASSERT_TRUE(store->reject(1, "behavior log-prob missing", 0).ok());
    EXPECT_EQ(store->rejected_total(), 1u);
    const Status twice = store->reject(1, "again", 0);
    EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
    EXPECT_EQ(store->reject(99, "x", 0).code(), absl::StatusCode::kNotFound);
    // The resumed run's rewind: `good` is READY again, `poison` is not.
    const RewindStats r = store->rewind(pos, 0).value();
    EXPECT_EQ(r.restored, 1);
    EXPECT_EQ(ids(store->take_ready(5, -1, 1).value()), (std::vector<std::string>{"good"}));
    EXPECT_EQ(store->compact(100).value(), 1) << "the consumed group goes, the rejected stays";
  }
  auto store = open_store(dir);
  const StoredGroup g = store->get(1).value();
  EXPECT_EQ(g.state, GroupState::kRejected);
  EXPECT_EQ(g.reject_reason, "behavior log-prob missing");
  EXPECT_EQ(g.group.group_id, "poison");
  EXPECT_EQ(store->rejected_total(), 1u) << "the count survives a restart";
  EXPECT_EQ(store->stats().value().rejected, 1);
  EXPECT_STREQ(group_state_name(GroupState::kRejected), "rejected");
}

TEST(RolloutStoreTest, CompactionKeepsWhatARewindNeeds) {
  auto store = open_store(fresh_dir("compact_floor"), /*retention=*/2);
  ASSERT_TRUE(store->append(make_group("a", 0), 0).ok());
  ASSERT_TRUE(store->append(make_group("b", 0), 0).ok());
  ASSERT_EQ(store->take_ready(1, -1, 1).value().size(), 1u);  // a at 1
  ASSERT_EQ(store->take_ready(1, -1, 5).value().size(), 1u);  // b at 5
  // At version 10 the window alone would delete both; a checkpoint at
  // version 5 keeps b (consumed at 5, which a rewind to it makes READY).
  EXPECT_EQ(store->compact(10, /*floor=*/5).value(), 1);
  EXPECT_EQ(store->get(2).value().group.group_id, "b");
  EXPECT_EQ(store->compact(10).value(), 1);
}

// Invariant 7: what was acknowledged survives a restart, in the state it had.
TEST(RolloutStoreTest, ReopenedStoreHoldsEveryAcknowledgedGroup) {
  const std::string dir = fresh_dir("reopen");
  {
    auto store = open_store(dir);
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE(store->append(make_group("g" + std::to_string(i), i), i).ok());
    ASSERT_EQ(store->take_ready(2, -1, 5).value().size(), 2u);
  }
  auto store = open_store(dir);
  EXPECT_EQ(store->count_ready(-1), 3);
  EXPECT_EQ(ids(store->take_ready(10, -1, 6).value()),
            (std::vector<std::string>{"g2", "g3", "g4"}));
  // Arrival numbers continue after the restart.
  EXPECT_EQ(store->append(make_group("g5", 6), 6).value(), 6u);
  StoreStats st = store->stats().value();
  EXPECT_EQ(st.consumed, 5);
  EXPECT_EQ(st.ready, 1);
  EXPECT_EQ(st.next_seq, 7u);
}

// A process that dies right after its appends were acknowledged (no close,
// no destructor: _exit) loses none of them.
TEST(RolloutStoreTest, AcknowledgedGroupsSurviveAProcessThatDies) {
  const std::string dir = fresh_dir("crash");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StoreOptions o;
    o.path = dir;
    auto store = RolloutStore::open(o);
    if (!store.ok()) ::_exit(2);
    for (int i = 0; i < 20; ++i) {
      if (!(*store)->append(make_group("g" + std::to_string(i), 0), 0).ok()) ::_exit(3);
    }
    store->release();  // never closed: the process just ends
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto store = open_store(dir);
  EXPECT_EQ(store->count_ready(-1), 20);
  EXPECT_EQ(store->scan().value().back().group.group_id, "g19");
}

TEST(RolloutStoreTest, CompactDeletesOnlyGroupsPastTheRetentionWindow) {
  auto store = open_store(fresh_dir("compact"), /*retention=*/2);
  ASSERT_TRUE(store->append(make_group("a", 0), 0).ok());
  ASSERT_TRUE(store->append(make_group("b", 0), 0).ok());
  ASSERT_TRUE(store->append(make_group("c", 0), 0).ok());
  ASSERT_EQ(store->take_ready(1, -1, /*trainer_version=*/1).value().size(), 1u);  // a at 1
  ASSERT_EQ(store->take_ready(1, -1, /*trainer_version=*/3).value().size(), 1u);  // b at 3
  // At version 4 the window keeps versions >= 2: a goes, b stays, c is ready.
  EXPECT_EQ(store->compact(4).value(), 1);
  EXPECT_EQ(store->get(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->get(2).value().group.group_id, "b");
  EXPECT_EQ(store->get(3).value().state, GroupState::kReady);
  EXPECT_EQ(store->compact(100).value(), 1) << "ready groups are never compacted";
  EXPECT_EQ(store->scan().value().size(), 1u);
}

TEST(RolloutStoreTest, StatsCountByVersionWithRewardMeans) {
  auto store = open_store(fresh_dir("stats"));
  ASSERT_TRUE(store->append(make_group("a", 2, 2, 1.0), 2).ok());  // rewards 1, 0
  ASSERT_TRUE(store->append(make_group("b", 2, 2, 0.5), 2).ok());  // rewards 0.5, 0
  ASSERT_TRUE(store->append(make_group("c", 3, 3, 1.0), 3).ok());  // rewards 1, 0, 0
  StoreStats st = store->stats().value();
  ASSERT_EQ(st.by_min_version.size(), 2u);
  const VersionCounts& v2 = st.by_min_version.at(2);
  EXPECT_EQ(v2.ready, 2);
  EXPECT_EQ(v2.trajectories, 4);
  EXPECT_DOUBLE_EQ(v2.reward_sum / v2.trajectories, 1.5 / 4);
  EXPECT_EQ(st.by_min_version.at(3).trajectories, 3);
}

TEST(RolloutStoreTest, BadInputIsRefusedAndChangesNothing) {
  auto store = open_store(fresh_dir("bad"));
  rollout::TrajectoryGroup empty;
  empty.group_id = "empty";
  EXPECT_EQ(store->append(empty, 0).status().code(), absl::StatusCode::kInvalidArgument);
  rollout::TrajectoryGroup broken = make_group("broken", 0);
  broken.trajectories[1].token_versions.pop_back();
  auto st = store->append(broken, 0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.status().message()).find("group 'broken' trajectory 1"),
            std::string::npos)
      << st.status();
  EXPECT_EQ(store->stats().value().next_seq, 1u);
  EXPECT_TRUE(store->scan().value().empty());

  StoreOptions o;
  EXPECT_EQ(RolloutStore::open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.path = "/proc/relay_store_cannot_be_here";
  auto bad = RolloutStore::open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find(o.path), std::string::npos);
}

TEST(RolloutStoreTest, ConcurrentAppendsGetDistinctArrivalNumbers) {
  StoreOptions o;
  o.path = fresh_dir("concurrent");
  o.sync_writes = false;
  auto store = RolloutStore::open(o).value();
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&store, w] {
      for (int i = 0; i < 25; ++i) {
        ASSERT_TRUE(
            store->append(make_group("w" + std::to_string(w) + "/" + std::to_string(i), 0), 0)
                .ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  auto all = store->scan().value();
  ASSERT_EQ(all.size(), 100u);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].seq, i + 1);
}

}  // namespace
}  // namespace relay::store
