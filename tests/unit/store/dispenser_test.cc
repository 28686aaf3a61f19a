#include "relay/store/dispenser.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <thread>

namespace relay::store {
namespace {

rollout::TrajectoryGroup make_group(const std::string& id, int k, int64_t version = 0) {
  rollout::TrajectoryGroup g;
  g.group_id = id;
  for (int j = 0; j < k; ++j) {
    rollout::Trajectory t;
    t.prompt_tokens = {1};
    t.response_tokens = {2};
    t.behavior_logprobs = {-0.5f};
    t.token_versions = {version};
    t.proximal_logprobs = {std::numeric_limits<float>::quiet_NaN()};
    t.proximal_versions = {-1};
    t.offpolicy_mask = {0};
    t.version_digests = {{version, 1}};
    t.reward = j;
    g.trajectories.push_back(t);
  }
  return g;
}

class DispenserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/relay_dispenser_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
           std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    reopen_store();
  }
  void reopen_store() {
    store_.reset();
    StoreOptions o;
    o.path = dir_;
    store_ = RolloutStore::open(o).value();
  }
  std::unique_ptr<PromptDispenser> open(DispenserOptions o) {
    auto d = PromptDispenser::open(store_.get(), o, [this] { return now_; });
    EXPECT_TRUE(d.ok()) << d.status();
    return std::move(*d);
  }

  std::string dir_;
  std::unique_ptr<RolloutStore> store_;
  int64_t now_ = 1000;
};

std::vector<int64_t> prompts(const std::vector<Lease>& leases) {
  std::vector<int64_t> out;
  for (const Lease& l : leases) out.push_back(l.prompt_index);
  return out;
}

// Capacity = (max_staleness + version + 1) x B - accepted - in flight.
TEST_F(DispenserTest, StalenessCapacityBoundsLeases) {
  DispenserOptions o;
  o.groups_per_step = 2;
  o.k = 2;
  auto d = open(o);
  EXPECT_EQ(d->capacity(0), 2);  // (0 + 0 + 1) x 2
  auto first = d->lease("w1", 5, 0).value();
  EXPECT_EQ(prompts(first), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(d->capacity(0), 0);
  EXPECT_TRUE(d->lease("w2", 1, 0).value().empty()) << "synchronous: wait for the next version";
  EXPECT_EQ(d->submit(first[0].id, make_group("p0", 2), 0).value(), 1u);
  EXPECT_EQ(d->submit(first[1].id, make_group("p1", 2), 0).value(), 2u);
  EXPECT_EQ(d->capacity(0), 0);  // 2 accepted
  EXPECT_EQ(d->capacity(1), 2);  // (0 + 1 + 1) x 2 - 2
  EXPECT_EQ(store_->count_ready(-1), 2);

  o.max_staleness = 2;
  auto relaxed = open(o);
  EXPECT_EQ(relaxed->capacity(1), 6);  // (2 + 1 + 1) x 2 - 2 accepted

  // After a warm start of 100 versions the bound counts RL steps, not
  // versions: at version 101 one step has been taken, as at version 1.
  o.max_staleness = 0;
  o.base_version = 100;
  auto warm = open(o);
  EXPECT_EQ(warm->capacity(100), 0);  // (0 + 0 + 1) x 2 - 2 accepted
  EXPECT_EQ(warm->capacity(101), 2);
}

TEST_F(DispenserTest, ExpiredLeaseIsReleasedFirstAndItsLateSubmissionRefused) {
  DispenserOptions o;
  o.groups_per_step = 4;
  o.lease_timeout_ms = 100;
  auto d = open(o);
  auto first = d->lease("dead-worker", 2, 0).value();
  ASSERT_EQ(first.size(), 2u);
  now_ += 101;  // both deadlines passed
  auto again = d->lease("w2", 3, 0).value();
  // The two expired prompts come back first (attempt 1), then a fresh one.
  EXPECT_EQ(prompts(again), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(again[0].attempt, 1);
  EXPECT_EQ(again[2].attempt, 0);
  EXPECT_EQ(again[0].worker_id, "w2");
  EXPECT_EQ(d->stats().expired_leases, 2);

  auto late = d->submit(first[0].id, make_group("late", 1), 0);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(late.status().message()).find("not accepted"), std::string::npos);
  EXPECT_EQ(d->stats().rejected_late, 1);
  EXPECT_EQ(d->stats().accepted, 0) << "a late submission is not counted";
  EXPECT_EQ(store_->appended(), 0u);

  // A lease whose deadline passed but was not re-leased yet is refused too.
  now_ += 101;
  auto stale = d->submit(again[2].id, make_group("stale", 1), 0);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DispenserTest, WrongGroupSizeIsRefusedAndTheLeaseKept) {
  DispenserOptions o;
  o.k = 4;
  auto d = open(o);
  auto l = d->lease("w", 1, 0).value();
  auto bad = d->submit(l[0].id, make_group("g", 3), 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("3 trajectories for a lease of k = 4"),
            std::string::npos);
  EXPECT_EQ(d->leases().size(), 1u);
  EXPECT_TRUE(d->submit(l[0].id, make_group("g", 4), 0).ok());
  EXPECT_TRUE(d->leases().empty());
  // The same lease cannot be used twice.
  EXPECT_EQ(d->submit(l[0].id, make_group("g", 4), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The bound, the cursor and the live leases survive a trainer restart.
TEST_F(DispenserTest, ReopenedDispenserRestoresLeasesCursorAndAcceptedCount) {
  DispenserOptions o;
  o.groups_per_step = 3;
  o.max_staleness = 1;
  std::vector<Lease> held;
  {
    auto d = open(o);
    held = d->lease("w", 4, 0).value();
    ASSERT_EQ(held.size(), 4u);
    ASSERT_TRUE(d->submit(held[0].id, make_group("p0", 1), 0).ok());
  }
  reopen_store();
  auto d = open(o);
  DispenserStats st = d->stats();
  EXPECT_EQ(st.accepted, 1);
  EXPECT_EQ(st.in_flight, 3);
  EXPECT_EQ(st.next_prompt, 4);
  EXPECT_EQ(d->capacity(0), 2);  // (1 + 0 + 1) x 3 - 1 - 3
  EXPECT_TRUE(d->submit(held[2].id, make_group("p2", 1), 0).ok()) << "a restored lease is valid";
  EXPECT_EQ(prompts(d->lease("w", 9, 0).value()), (std::vector<int64_t>{4, 5}));
}

// A refused group's lease is released at once: capacity comes back and the
// prompt is leased again, even across a restart.
TEST_F(DispenserTest, ReleasedLeaseFreesCapacityAndRequeuesThePrompt) {
  DispenserOptions o;
  o.groups_per_step = 2;
  std::vector<Lease> held;
  {
    auto d = open(o);
    held = d->lease("w", 2, 0).value();
    EXPECT_EQ(d->capacity(0), 0);
    ASSERT_TRUE(d->release(held[1].id).ok());
    EXPECT_EQ(d->capacity(0), 1);
    EXPECT_EQ(d->release(held[1].id).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(d->submit(held[1].id, make_group("late", 1), 0).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(d->stats().released, 1);
  }
  reopen_store();
  auto d = open(o);
  auto again = d->lease("w2", 5, 0).value();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].prompt_index, held[1].prompt_index);
  EXPECT_EQ(again[0].attempt, 1);
}

// A group accepted after its step's batch was full expires in the store
// untrained; its place in the bound comes back (else a synchronous run stalls).
TEST_F(DispenserTest, ExpiredGroupsGiveTheirPlaceBack) {
  DispenserOptions o;
  o.groups_per_step = 2;
  auto d = open(o);
  auto l = d->lease("w", 2, 0).value();
  ASSERT_TRUE(d->submit(l[0].id, make_group("a", 1, 0), 0).ok());
  ASSERT_TRUE(d->submit(l[1].id, make_group("b", 1, 0), 0).ok());
  // The trainer (version 1 now) finds both too old: they expire.
  int64_t expired = 0;
  EXPECT_TRUE(store_->take_ready(2, /*min_version=*/1, /*trainer_version=*/1, &expired)->empty());
  EXPECT_EQ(expired, 2);
  EXPECT_EQ(store_->expired_total(), 2u);
  EXPECT_EQ(d->capacity(1), 4) << "(0 + 1 + 1) x 2 - (2 accepted - 2 expired)";
  reopen_store();
  EXPECT_EQ(store_->expired_total(), 2u) << "the count survives a restart";
}

// A finite task wraps at its size, but every lease serves its own position
// in the prompt stream (occurrence): two leases of prompt 0 in flight at once
// are different groups. A re-lease keeps the occurrence, and so does a
// reopened dispenser.
TEST_F(DispenserTest, FiniteTasksWrapAroundWithAnOccurrencePerLease) {
  DispenserOptions o;
  o.groups_per_step = 8;
  o.num_prompts = 3;
  auto d = open(o);
  auto leased = d->lease("w", 5, 0).value();
  EXPECT_EQ(prompts(leased), (std::vector<int64_t>{0, 1, 2, 0, 1}));
  std::vector<int64_t> occurrences;
  for (const Lease& l : leased) occurrences.push_back(l.occurrence);
  EXPECT_EQ(occurrences, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  ASSERT_TRUE(d->release(leased[3].id).ok());
  auto again = d->lease("w", 1, 0).value();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].prompt_index, 0);
  EXPECT_EQ(again[0].occurrence, 3) << "the released lease's position, not a new one";
  EXPECT_EQ(again[0].attempt, 1);
  d.reset();
  auto reopened = open(o);
  std::vector<int64_t> live;
  for (const Lease& l : reopened->leases()) live.push_back(l.occurrence);
  std::sort(live.begin(), live.end());
  EXPECT_EQ(live, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  auto next = reopened->lease("w", 1, 0).value();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].occurrence, 5);
  EXPECT_EQ(next[0].prompt_index, 2);
}

// A group the trainer quarantined was never trained on: like an expired one,
// it gives its place in the staleness bound back.
TEST_F(DispenserTest, RejectedGroupsGiveTheirPlaceBack) {
  DispenserOptions o;
  o.groups_per_step = 2;
  auto d = open(o);
  auto l = d->lease("w", 2, 0).value();
  const uint64_t a = d->submit(l[0].id, make_group("a", 1, 0), 0).value();
  ASSERT_TRUE(d->submit(l[1].id, make_group("b", 1, 0), 0).ok());
  EXPECT_EQ(d->capacity(0), 0);
  ASSERT_TRUE(store_->reject(a, "reward inf is not a finite float", 0).ok());
  EXPECT_EQ(d->capacity(0), 1) << "(0 + 0 + 1) x 2 - (2 accepted - 1 rejected)";
}

// Group commit: many workers leasing and submitting at once. Every group is
// accepted exactly once with its own arrival number, and a dispenser reopened
// on the store finds exactly the state the last one had in memory.
TEST_F(DispenserTest, ConcurrentLeasesAndSubmissionsStayExactAcrossAReopen) {
  DispenserOptions o;
  o.groups_per_step = 1000;  // the bound never makes anyone wait
  constexpr int kWorkers = 6, kRounds = 12, kPerRound = 3;
  std::vector<uint64_t> seqs;
  std::vector<Lease> unsubmitted;
  DispenserStats before;
  {
    auto d = open(o);
    std::mutex mu;
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&, w] {
        for (int r = 0; r < kRounds; ++r) {
          auto leases = d->lease("w" + std::to_string(w), kPerRound, 0);
          ASSERT_TRUE(leases.ok()) << leases.status();
          ASSERT_EQ(leases->size(), static_cast<size_t>(kPerRound));
          for (size_t i = 0; i < leases->size(); ++i) {
            const Lease& l = (*leases)[i];
            if (i == 0 && r % 4 == 0) {  // some leases stay in flight
              std::lock_guard<std::mutex> lock(mu);
              unsubmitted.push_back(l);
              continue;
            }
            auto seq = d->submit(l.id, make_group("g" + std::to_string(l.occurrence), 1), 0);
            ASSERT_TRUE(seq.ok()) << seq.status();
            EXPECT_EQ(d->submit(l.id, make_group("again", 1), 0).status().code(),
                      absl::StatusCode::kFailedPrecondition);
            std::lock_guard<std::mutex> lock(mu);
            seqs.push_back(*seq);
          }
        }
      });
    }
    for (auto& t : workers) t.join();
    before = d->stats();
  }
  const size_t submitted = kWorkers * kRounds * kPerRound - unsubmitted.size();
  ASSERT_EQ(seqs.size(), submitted);
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(std::adjacent_find(seqs.begin(), seqs.end()), seqs.end()) << "an arrival number twice";
  EXPECT_EQ(seqs.front(), 1u);
  EXPECT_EQ(seqs.back(), submitted);
  EXPECT_EQ(before.accepted, static_cast<int64_t>(submitted));
  EXPECT_EQ(before.in_flight, static_cast<int64_t>(unsubmitted.size()));
  // Six workers submitting while an fsync is in progress: their groups share
  // writes (one WAL sync each). One at a time, this would be `submitted`.
  EXPECT_LT(store_->append_writes(), submitted) << "no group commit";
  EXPECT_GT(store_->append_writes(), 0u);

  reopen_store();
  auto d = open(o);
  const DispenserStats after = d->stats();
  EXPECT_EQ(after.accepted, before.accepted);
  EXPECT_EQ(after.in_flight, before.in_flight);
  EXPECT_EQ(after.next_prompt, kWorkers * kRounds * kPerRound);
  EXPECT_EQ(store_->appended(), submitted);
  for (const Lease& l : unsubmitted) EXPECT_TRUE(d->find_lease(l.id).ok()) << l.id;
}

// Submissions begun one after another on one thread, before any wait
// (a SubmitGroups stream's read-ahead), are made durable by one write; each
// wait() then returns its own arrival number. A Submission dropped without
// wait() still writes its group: the reopened store has every group.
TEST_F(DispenserTest, SubmissionsBegunBeforeAnyWaitShareOneWrite) {
  DispenserOptions o;
  o.groups_per_step = 100;
  auto d = open(o);
  auto leases = d->lease("w", 8, 0).value();
  ASSERT_EQ(leases.size(), 8u);
  std::vector<rollout::TrajectoryGroup> groups;
  for (int i = 0; i < 8; ++i) groups.push_back(make_group("g" + std::to_string(i), 1));
  const uint64_t writes_before = store_->append_writes();
  std::vector<std::unique_ptr<PromptDispenser::Submission>> begun;
  for (size_t i = 0; i < 7; ++i) {
    auto s = d->begin_submit(leases[i].id, groups[i], 0);
    ASSERT_TRUE(s.ok()) << s.status();
    begun.push_back(std::move(*s));
  }
  EXPECT_EQ(store_->append_writes(), writes_before) << "begin_submit does not write";
  EXPECT_EQ(d->stats().accepted, 7) << "applied in memory at once";
  EXPECT_EQ(d->begin_submit(leases[0].id, groups[0], 0).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "the lease is retired at begin";
  std::vector<uint64_t> seqs;
  for (size_t i = 0; i < 6; ++i) {
    auto seq = begun[i]->wait();
    ASSERT_TRUE(seq.ok()) << seq.status();
    seqs.push_back(*seq);
  }
  EXPECT_EQ(store_->append_writes(), writes_before + 1) << "seven groups, one write";
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
  // The seventh is durable already (the same write); its Submission is
  // dropped unwaited. The eighth is begun and dropped: the destructor writes.
  begun.clear();
  ASSERT_TRUE(d->begin_submit(leases[7].id, groups[7], 0).ok());
  EXPECT_EQ(store_->append_writes(), writes_before + 2);
  d.reset();
  reopen_store();
  d = open(o);
  EXPECT_EQ(d->stats().accepted, 8);
  EXPECT_EQ(d->stats().in_flight, 0);
  EXPECT_EQ(store_->appended(), 8u);
}

// A write that fails fails its change and leaves the dispenser exactly as
// durable (here: every write fails, the store being open read-only).
TEST_F(DispenserTest, AFailedWriteLeavesTheDurableStateInMemory) {
  DispenserOptions o;
  o.groups_per_step = 10;
  std::vector<Lease> held;
  {
    auto d = open(o);
    held = d->lease("w", 2, 0).value();
  }
  store_.reset();
  StoreOptions ro;
  ro.path = dir_;
  ro.read_only = true;
  store_ = RolloutStore::open(ro).value();
  auto d = open(o);
  EXPECT_EQ(d->lease("w", 3, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->submit(held[0].id, make_group("g", 1), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->release(held[1].id).code(), absl::StatusCode::kFailedPrecondition);
  const DispenserStats st = d->stats();
  EXPECT_EQ(st.in_flight, 2);
  EXPECT_EQ(st.next_prompt, 2);
  EXPECT_EQ(st.accepted, 0);
  EXPECT_EQ(st.retry_queue, 0);
  EXPECT_TRUE(d->find_lease(held[0].id).ok()) << "the lease is back";
}

TEST(DispenserOptionsTest, ValidateNamesTheField) {
  DispenserOptions o;
  o.groups_per_step = 0;
  EXPECT_EQ(validate(o).message(), "dispenser.groups_per_step: must be >= 1, got 0");
  o = DispenserOptions{};
  o.max_staleness = -1;
  EXPECT_EQ(validate(o).message(), "dispenser.max_staleness: must be >= 0, got -1");
  o = DispenserOptions{};
  o.k = 0;
  EXPECT_EQ(validate(o).message(), "dispenser.k: must be >= 1, got 0");
  EXPECT_EQ(PromptDispenser::open(nullptr, DispenserOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace relay::store
