// Data-parallel training over a real c10d Gloo group: two ranks as threads
// of this process, rendezvous through a TCPStore on loopback.

#include "relay/comm/dist/trainer_group.h"
#include "relay/comm/dist/trainer_ranks.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <thread>

#include "relay/rollout/engine.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/trainer.h"
#include "testing/core_share.h"
#include "testing/ports.h"
#include "testing/tensor_testing.h"
#include "testing/trainer_ranks.h"

namespace relay::comm {
namespace {

using relay::testing::dp_options;
using relay::testing::expect_same_training;
using relay::testing::flat;
using relay::testing::free_port;
using relay::testing::join_loopback;
using relay::testing::make_policy;
using relay::testing::RankResult;
using relay::testing::run_ranks;
using relay::testing::run_single;
using relay::testing::sample_groups;
using trainer::StepMetrics;
using trainer::Trainer;
using trainer::TrainerOptions;

std::function<std::optional<std::string>(const std::string&)> env_of(
    std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(TrainerRankTest, ReadsTorchrunStyleEnvironment) {
  auto r = trainer_rank_from_env(4, "",
                                 env_of({{"RANK", "3"},
                                         {"WORLD_SIZE", "4"},
                                         {"LOCAL_RANK", "1"},
                                         {"MASTER_ADDR", "node7"},
                                         {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->host, "node7");
  EXPECT_EQ(r->port, 29500);
  // trainer.rendezvous wins over MASTER_ADDR/PORT; LOCAL_RANK defaults to RANK.
  r = trainer_rank_from_env(2, "10.0.0.1:1234",
                            env_of({{"RANK", "1"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host, "10.0.0.1");
  EXPECT_EQ(r->port, 1234);
  EXPECT_EQ(r->local_rank, 1);
  // A single rank needs nothing.
  r = trainer_rank_from_env(1, "", env_of({}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rank, 0);
}

TEST(TrainerRankTest, BadEnvironmentNamesTheVariable) {
  auto error = [](int world, const std::string& rdv, std::map<std::string, std::string> vars) {
    auto r = trainer_rank_from_env(world, rdv, env_of(std::move(vars)));
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  EXPECT_NE(error(2, "h:1", {{"RANK", "1"}, {"WORLD_SIZE", "3"}}).find("$WORLD_SIZE is 3"),
            std::string::npos);
  EXPECT_NE(error(2, "h:1", {}).find("$RANK must say"), std::string::npos);
  EXPECT_NE(error(2, "h:1", {{"RANK", "2"}}).find("$RANK is 2: must be in [0, 2)"),
            std::string::npos);
  EXPECT_NE(error(2, "h:1", {{"RANK", "one"}}).find("$RANK: not an integer"), std::string::npos);
  EXPECT_NE(error(2, "", {{"RANK", "0"}}).find("$MASTER_ADDR"), std::string::npos);
  EXPECT_NE(error(2, "", {{"RANK", "0"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "99999"}})
                .find("$MASTER_PORT: '99999' is not a port"),
            std::string::npos);
  EXPECT_NE(error(2, "nohost", {{"RANK", "0"}}).find("trainer.rendezvous: expected host:port"),
            std::string::npos);
  EXPECT_NE(error(1, "", {{"RANK", "1"}}).find("trainer.world_size is 1"), std::string::npos);
}

TEST(ShardRowsTest, EveryRowOnceWithBalancedTokens) {
  const std::vector<int64_t> rows = {10, 11, 12, 13, 14, 15, 16};
  const std::vector<int64_t> tokens = {50, 10, 40, 10, 30, 20, 20};
  auto shards = trainer::shard_rows_by_tokens(rows, tokens, 2);
  ASSERT_EQ(shards.size(), 2u);
  std::vector<int64_t> seen;
  int64_t load[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(std::is_sorted(shards[s].begin(), shards[s].end()));
    for (int64_t r : shards[s]) {
      seen.push_back(r);
      load[s] += tokens[static_cast<size_t>(r - 10)];
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, rows);
  EXPECT_EQ(load[0] + load[1], 180);
  EXPECT_LE(std::abs(load[0] - load[1]), 10);  // longest first: 90 / 90 here
  // More shards than rows: the extra shards are empty, nothing is lost.
  shards = trainer::shard_rows_by_tokens({0, 1}, {5, 7}, 4);
  EXPECT_EQ(shards[0], std::vector<int64_t>{1});
  EXPECT_EQ(shards[1], std::vector<int64_t>{0});
  EXPECT_TRUE(shards[2].empty());
  EXPECT_TRUE(shards[3].empty());
}

// The collectives a sharded optimizer stands on (issue 20), on three Gloo
// ranks: all-gather in rank order, and reduce-scatter (emulated on Gloo)
// giving each rank the sum of its slice; mismatched sizes are refused by name.
TEST(TrainerGroupTest, AllGatherAndReduceScatterOnThreeRanks) {
  const int world = 3;
  const int port = free_port();
  std::vector<Status> status(world, OkStatus());
  std::vector<at::Tensor> gathered(world), scattered(world);
  std::vector<std::string> refusal(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      StatusOr<std::shared_ptr<trainer::Collectives>> g = join_loopback(rank, world, port);
      if (!g.ok()) {
        status[rank] = g.status();
        return;
      }
      // Shard r holds r*10 + {0, 1}; the gathered tensor is every shard in order.
      at::Tensor shard = torch::tensor({rank * 10.0f, rank * 10.0f + 1});
      gathered[rank] = torch::zeros({world * 2});
      if (Status s = (*g)->all_gather(shard, gathered[rank]); !s.ok()) status[rank] = s;
      // Rank r contributes (r + 1) * [0, 1, ..., 5]; slice s sums to 6 * [2s, 2s + 1].
      at::Tensor full = torch::arange(world * 2, torch::kFloat32) * (rank + 1);
      scattered[rank] = torch::zeros({2});
      if (Status s = (*g)->reduce_scatter_sum(full, scattered[rank]); !s.ok()) status[rank] = s;
      at::Tensor wrong = torch::zeros({5});
      refusal[rank] = std::string((*g)->reduce_scatter_sum(full, wrong).message());
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    EXPECT_TRUE(
        torch::equal(gathered[rank], torch::tensor({0.0f, 1.0f, 10.0f, 11.0f, 20.0f, 21.0f})))
        << gathered[rank];
    EXPECT_TRUE(torch::equal(scattered[rank], torch::tensor({12.0f * rank, 12.0f * rank + 6})))
        << scattered[rank];
    EXPECT_NE(refusal[rank].find("reduce-scatter: the input must hold world_size x 5"),
              std::string::npos)
        << refusal[rank];
  }
}

TEST(DataParallelTrainerTest, TwoRanksMatchOneRankAndStayBitIdentical) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions options = dp_options();
  const std::vector<std::string> calls = {"sft", "step", "step"};
  RankResult single = run_single(initial, options, groups, calls);
  // A 4 KiB bucket splits the gradients into many buckets (and gives the
  // larger matrices buckets of their own).
  std::vector<RankResult> ranks = run_ranks(2, initial, options, groups, calls, 4096);
  ASSERT_NO_FATAL_FAILURE(expect_same_training(single, ranks, flat(initial)));
  EXPECT_GT(ranks[0].metrics[1].at("optimizer_steps"), 3);
}

TEST(DataParallelTrainerTest, RankWithoutRowsStillTakesPart) {
  // One trajectory, mini-batches of it, two ranks: one rank has no rows in
  // every pass and contributes zeros.
  model::Policy initial = make_policy(4);
  auto groups = sample_groups(initial, 1, 2);
  TrainerOptions options = dp_options();
  options.mini_batches = 2;  // one row each
  const std::vector<std::string> calls = {"step", "sft"};
  RankResult single = run_single(initial, options, groups, calls);
  std::vector<RankResult> ranks = run_ranks(3, initial, options, groups, calls, int64_t{1} << 20);
  ASSERT_NO_FATAL_FAILURE(expect_same_training(single, ranks, flat(initial)));
}

// join_loopback, expected to succeed.
std::shared_ptr<trainer::Collectives> join(int rank, int world, int port) {
  StatusOr<std::shared_ptr<trainer::Collectives>> group = join_loopback(rank, world, port);
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? *group : nullptr;
}

TEST(RankLeaderTest, FollowerMirrorsWarmStartResumeAndSteps) {
  // Rank 0 as relay-trainer drives it: a warm start, then an RL trainer
  // resumed from state that already holds AdamW moments, with an explicit
  // KL reference; the follower starts from other weights and must end with
  // rank 0's, bit for bit.
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  TrainerOptions rl = dp_options();
  rl.kl_coef = 0.1;
  TrainerOptions sft = rl;
  sft.optimizer.lr = 3e-2;
  const int port = free_port();
  model::Policy leader_policy = model::clone_policy(*initial);
  model::Policy follower_policy = make_policy(99);
  Status follower_status = InternalError("not run");
  std::vector<std::string> follower_calls;
  std::thread follower([&] {
    auto group = join(1, 2, port);
    if (!group) return;
    FollowerOptions fo;
    fo.bucket_bytes = 4096;
    fo.options = [&](const std::string& role) -> StatusOr<TrainerOptions> {
      if (role == "sft") return sft;
      return rl;
    };
    fo.on_step = [&](const std::string& call, const StatusOr<StepMetrics>& m) {
      follower_calls.push_back(m.ok() ? call : call + " failed");
    };
    follower_status = follow_rank_leader(group, follower_policy, fo);
  });
  auto group = join(0, 2, port);
  ASSERT_TRUE(group);
  RankLeader leader(group);
  ASSERT_TRUE(leader.start("sft", *leader_policy, 0, nullptr, "").ok());
  {
    auto t = Trainer::create(leader_policy, sft, 0, nullptr, leader.data_parallel(4096)).value();
    ASSERT_TRUE(t->sft_step(groups).ok());
  }
  // "Resume": state from a trainer that has stepped on its own.
  model::Policy reference = make_policy(5);
  std::string state;
  {
    auto alone = Trainer::create(leader_policy, rl, 1, reference).value();
    ASSERT_TRUE(alone->step(groups).ok());
    state = alone->save_state().value();
  }
  auto t = Trainer::create(leader_policy, rl, 1, reference, leader.data_parallel(4096)).value();
  ASSERT_TRUE(t->restore_state(state, "test").ok());
  ASSERT_TRUE(leader.start("rl", *leader_policy, t->version(), reference, state).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(t->step(groups).ok());
  ASSERT_TRUE(leader.stop().ok());
  ASSERT_TRUE(leader.stop().ok());  // a second stop does nothing
  follower.join();
  ASSERT_TRUE(follower_status.ok()) << follower_status;
  EXPECT_EQ(follower_calls, (std::vector<std::string>{"sft_step", "step", "step"}));
  const auto a = leader_policy->parameters();
  const auto b = follower_policy->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    EXPECT_TRUE(torch::equal(a[p], b[p])) << "parameter " << p;
  }
  // After the stop, a step cannot be forwarded any more.
  auto late = t->step(groups);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("other trainer ranks were stopped"), std::string::npos)
      << late.status();
}

// A follower waiting for rank 0's next command marks its process waiting in
// the machine's core share (model/core_share.h), so that the workers beside
// it decode on its cores while rank 0 collects groups; it trains marked
// busy.
TEST(RankLeaderTest, AWaitingFollowerLeavesItsCoresToTheMachine) {
  const relay::testing::InstalledCoreShare cores("follower_cores");
  const auto groups = sample_groups(make_policy(3), 2, 4);
  const TrainerOptions rl = dp_options();
  const int port = free_port();
  Status follower_status = InternalError("not run");
  std::vector<bool> busy_at_steps;
  std::thread follower([&] {
    auto group = join(1, 2, port);
    if (!group) return;
    FollowerOptions fo;
    fo.bucket_bytes = 4096;
    fo.options = [&](const std::string&) -> StatusOr<TrainerOptions> { return rl; };
    fo.on_step = [&](const std::string&, const StatusOr<StepMetrics>&) {
      busy_at_steps.push_back(cores.busy());
    };
    follower_status = follow_rank_leader(group, make_policy(99), fo);
  });
  auto group = join(0, 2, port);
  ASSERT_TRUE(group);
  // Only the follower marks this process here (rank 0's host, which marks
  // it waiting while it collects groups, is not in this test).
  EXPECT_TRUE(cores.marked(false)) << "waiting for rank 0's first command";
  model::Policy leader_policy = make_policy(3);
  RankLeader leader(group);
  ASSERT_TRUE(leader.start("rl", *leader_policy, 0, nullptr, "").ok());
  auto t = Trainer::create(leader_policy, rl, 0, nullptr, leader.data_parallel(4096)).value();
  ASSERT_TRUE(t->step(groups).ok());
  ASSERT_TRUE(leader.stop().ok());
  follower.join();
  ASSERT_TRUE(follower_status.ok()) << follower_status;
  EXPECT_EQ(busy_at_steps, (std::vector<bool>{true})) << "the step ran marked busy";
}

TEST(RankLeaderTest, FollowerReportsRankZeroGone) {
  const int port = free_port();
  Status follower_status = OkStatus();
  std::shared_ptr<trainer::Collectives> leader_group;
  std::thread follower([&] {
    auto group = join(1, 2, port);
    if (!group) return;
    FollowerOptions fo;
    fo.options = [](const std::string&) -> StatusOr<TrainerOptions> { return TrainerOptions{}; };
    follower_status = follow_rank_leader(group, make_policy(1), fo);
  });
  leader_group = join(0, 2, port);
  ASSERT_TRUE(leader_group);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  leader_group.reset();  // rank 0 dies: its store goes with it
  follower.join();
  ASSERT_FALSE(follower_status.ok());
  EXPECT_NE(follower_status.message().find("rank 0 is gone"), std::string::npos) << follower_status;
}

TEST(DataParallelTrainerTest, RendezvousWithoutTheOtherRanksFailsNamingTheEndpoint) {
  TrainerGroupOptions go;
  go.rank.rank = 1;
  go.rank.world_size = 2;
  go.rank.host = "127.0.0.1";
  go.rank.port = free_port();  // nobody listens
  go.timeout = std::chrono::milliseconds(1500);
  auto group = join_trainer_group(go);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(group.status().message().find("rank 1 of 2: rendezvous at 127.0.0.1:"),
            std::string::npos)
      << group.status();
}

}  // namespace
}  // namespace relay::comm
