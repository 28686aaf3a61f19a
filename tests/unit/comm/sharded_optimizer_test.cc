// trainer.sharding: optimizer (ZeRO-1/2; src/trainer/sharded_adamw.cc) over
// real Gloo groups of two and three ranks as threads of this process: the
// same training as the replicated optimizer, 1/N of its state per rank, and
// one state layout under every world size and sharding.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "relay/comm/dist/trainer_ranks.h"
#include "relay/model/lora.h"
#include "relay/trainer/trainer.h"
#include "testing/ports.h"
#include "testing/trainer_ranks.h"

namespace relay::comm {
namespace {

using relay::testing::dp_options;
using relay::testing::expect_same_training;
using relay::testing::flat;
using relay::testing::free_port;
using relay::testing::join_loopback;
using relay::testing::make_policy;
using relay::testing::policy_with;
using relay::testing::RankResult;
using relay::testing::relative_difference;
using relay::testing::run_ranks;
using relay::testing::run_single;
using relay::testing::sample_groups;
using relay::testing::with_sharding;
using trainer::Sharding;
using trainer::StepMetrics;
using trainer::Trainer;
using trainer::TrainerOptions;

void expect_equal_params(const RankResult& a, const RankResult& b, const std::string& what) {
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t p = 0; p < a.params.size(); ++p) {
    EXPECT_TRUE(torch::equal(a.params[p], b.params[p])) << what << ": parameter " << p;
  }
}

// Two ranks sum their gradients in the same order either way (a + b), and
// AdamW on a slice is AdamW on the whole tensor: without the clip (whose norm
// sums in another order) the sharded optimizer's weights are the replicated
// one's, bit for bit, through SFT and RL steps with several mini-batches.
TEST(ShardedOptimizerTest, TwoRanksGiveTheReplicatedWeightsBitForBitWithoutClipping) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  TrainerOptions options = dp_options();
  options.optimizer.max_grad_norm = 0;
  options.optimizer.weight_decay = 0.1;
  const std::vector<std::string> calls = {"sft", "step", "step"};
  auto replicated = run_ranks(2, initial, options, groups, calls, 4096);
  auto sharded =
      run_ranks(2, initial, with_sharding(options, Sharding::kOptimizer), groups, calls, 4096);
  expect_equal_params(sharded[0], replicated[0], "sharded vs replicated");
  expect_equal_params(sharded[1], sharded[0], "rank 1 vs rank 0");
  ASSERT_EQ(sharded[0].metrics.size(), replicated[0].metrics.size());
  for (size_t s = 0; s < replicated[0].metrics.size(); ++s) {
    for (const auto& [k, v] : replicated[0].metrics[s]) {
      if (std::isnan(v) || k.rfind("memory/", 0) == 0 || k.rfind("time", 0) == 0) continue;
      ASSERT_TRUE(sharded[0].metrics[s].count(k)) << k;
      // The norm is a sum of squares in another order.
      const double tol = k == "grad_norm" ? 1e-6 * std::abs(v) : 0.0;
      EXPECT_NEAR(sharded[0].metrics[s].at(k), v, tol) << "call " << s << " metric " << k;
    }
  }
}

// With the clip on, three ranks, buckets that cut parameters in pieces and
// ranges that end inside a matrix: the update is the single rank's.
TEST(ShardedOptimizerTest, ThreeRanksWithClippingMatchOneRank) {
  model::Policy initial = make_policy(5);
  const auto groups = sample_groups(initial, 3, 4);
  TrainerOptions options = dp_options();
  options.optimizer.max_grad_norm = 0.5;
  const std::vector<std::string> calls = {"sft", "step", "step"};
  RankResult single = run_single(initial, options, groups, calls);
  auto replicated = run_ranks(3, initial, options, groups, calls, 1000);
  auto sharded =
      run_ranks(3, initial, with_sharding(options, Sharding::kOptimizer), groups, calls, 1000);
  ASSERT_NO_FATAL_FAILURE(expect_same_training(single, sharded, flat(initial)));
  // Against the replicated optimizer on the same three ranks only the order
  // of additions differs: three ranks sum in another order than two (the all-reduce's ring and
  // the reduce-scatter's buckets differ), and AdamW, which divides by
  // sqrt(v) + eps, magnifies a rounding difference of a small summed
  // gradient up to lr / eps times: the weights agree to 1e-6 of their size,
  // the updates to 2e-5 of theirs. How far six updates drift depends on the
  // trajectory: 4.1e-6 with the LM head scoring every position, 1.4e-5
  // scoring the response positions only (ScoreOptions::scored), whose
  // products round otherwise; one update, 6.1e-6 either way, and 1.2e-5
  // once the engine's decode kernels and sampler (which make the groups)
  // rounded otherwise (2026-11-29). The same bound as six updates, then.
  const double vs_replicated = relative_difference(sharded[0], replicated[0], flat(initial));
  const double of_weights = relative_difference(sharded[0], replicated[0], at::Tensor());
  std::printf(
      "three ranks, 6 updates: sharded vs replicated %.2e of the update, %.2e of the "
      "weights\n",
      vs_replicated, of_weights);
  EXPECT_LT(vs_replicated, 2e-5);
  EXPECT_LT(of_weights, 1e-6);
  // One update alone, likewise.
  TrainerOptions single_update = options;
  single_update.ppo_epochs = 1;
  single_update.mini_batches = 1;
  auto rep1 = run_ranks(3, initial, single_update, groups, {"step"}, 1000);
  auto sh1 = run_ranks(3, initial, with_sharding(single_update, Sharding::kOptimizer), groups,
                       {"step"}, 1000);
  const double one_update = relative_difference(sh1[0], rep1[0], flat(initial));
  std::printf("three ranks, 1 update: sharded vs replicated %.2e of the update\n", one_update);
  EXPECT_LT(one_update, 2e-5);
  EXPECT_LT(relative_difference(sh1[0], rep1[0], at::Tensor()), 1e-6);
}

// bf16 weights with fp32 master copies: each rank keeps the master copy of
// its range only, and the weights come out as the replicated optimizer's.
TEST(ShardedOptimizerTest, Bf16WeightsKeepFp32MasterCopiesOfTheirRangeOnly) {
  model::Policy initial = make_policy(7);
  const auto groups = sample_groups(initial, 2, 4);
  initial->to(torch::kBFloat16);
  TrainerOptions options = dp_options();
  options.optimizer.max_grad_norm = 0;
  const std::vector<std::string> calls = {"step", "step"};
  auto replicated = run_ranks(2, initial, options, groups, calls, 4096);
  auto sharded =
      run_ranks(2, initial, with_sharding(options, Sharding::kOptimizer), groups, calls, 4096);
  ASSERT_TRUE(replicated[0].status.ok()) << replicated[0].status;
  ASSERT_TRUE(sharded[0].status.ok()) << sharded[0].status;
  expect_equal_params(sharded[1], sharded[0], "rank 1 vs rank 0");
  // The master copies step alike; their bf16 roundings may differ by one
  // unit in the last place where the two sums' fp32 values straddle a
  // rounding boundary, and only there.
  const at::Tensor a = flat(sharded[0].params), b = flat(replicated[0].params);
  const double mismatch = a.ne(b).to(torch::kFloat32).mean().item<double>();
  EXPECT_LT(mismatch, 0.01) << "fraction of weights that differ";
  EXPECT_LT((a - b).abs().max().item<double>(), 0.02 * b.abs().max().item<double>());
  const StepMetrics& rep = replicated[0].metrics.back();
  ASSERT_GT(rep.at("memory/master_weights_gb"), 0) << "the weights were not bf16";
  for (const RankResult& r : sharded) {
    const StepMetrics& m = r.metrics.back();
    EXPECT_NEAR(m.at("memory/master_weights_gb"), rep.at("memory/master_weights_gb") / 2,
                rep.at("memory/master_weights_gb") * 0.05);
    EXPECT_NEAR(m.at("memory/optimizer_gb"), rep.at("memory/optimizer_gb") / 2,
                rep.at("memory/optimizer_gb") * 0.05);
  }
}

// Each of three ranks holds a third of AdamW's moments, and together exactly
// what one replica holds.
TEST(ShardedOptimizerTest, EachRankHoldsItsShareOfTheMoments) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions options = dp_options();
  auto replicated = run_ranks(3, initial, options, groups, {"step"}, 4096);
  auto sharded =
      run_ranks(3, initial, with_sharding(options, Sharding::kOptimizer), groups, {"step"}, 4096);
  ASSERT_TRUE(replicated[0].status.ok()) << replicated[0].status;
  const double whole = replicated[0].metrics[0].at("memory/optimizer_gb");
  ASSERT_GT(whole, 0);
  double sum = 0;
  for (const RankResult& r : sharded) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    const double mine = r.metrics[0].at("memory/optimizer_gb");
    EXPECT_LE(mine, whole / 3 * 1.05);
    sum += mine;
  }
  EXPECT_NEAR(sum, whole, whole * 1e-9);
}

// The state is saved in the replicated layout: a sharded run's checkpoint
// resumes bit for bit under the same world size, and, as the same training,
// on one replicated rank and on three sharded ones; a replicated run's
// checkpoint resumes sharded.
TEST(ShardedOptimizerTest, StateResumesUnderAnotherWorldSizeAndSharding) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions none = dp_options();
  const TrainerOptions sharded = with_sharding(none, Sharding::kOptimizer);

  auto through = run_ranks(2, initial, sharded, groups, {"step", "step"}, 4096);
  auto first = run_ranks(2, initial, sharded, groups, {"step", "save"}, 4096);
  ASSERT_TRUE(first[0].status.ok()) << first[0].status;
  ASSERT_FALSE(first[0].saved.empty());
  EXPECT_TRUE(first[1].saved.empty()) << "rank 1's part went to rank 0";
  const model::Policy after_one = policy_with(initial, first[0].params);
  const std::string& state = first[0].saved;

  auto resumed = run_ranks(2, after_one, sharded, groups, {"step"}, 4096, state);
  expect_equal_params(resumed[0], through[0], "resumed on two sharded ranks");
  EXPECT_EQ(resumed[0].metrics[0].at("version"), 2);
  EXPECT_EQ(resumed[0].metrics[0].at("optimizer_steps"),
            through[0].metrics[1].at("optimizer_steps"));

  RankResult one = run_single(after_one, none, groups, {"step"}, state);
  EXPECT_LT(relative_difference(one, through[0], flat(after_one)), 1e-4);
  auto three = run_ranks(3, after_one, sharded, groups, {"step"}, 4096, state);
  ASSERT_TRUE(three[0].status.ok()) << three[0].status;
  EXPECT_LT(relative_difference(three[0], through[0], flat(after_one)), 1e-4);

  // Replicated state into a sharded trainer: the continuation is the
  // replicated one's (two ranks, no clip: bit for bit).
  TrainerOptions none_noclip = none;
  none_noclip.optimizer.max_grad_norm = 0;
  auto rep = run_ranks(2, initial, none_noclip, groups, {"step", "save", "step"}, 4096);
  auto rep_first = run_ranks(2, initial, none_noclip, groups, {"step"}, 4096);
  ASSERT_TRUE(rep[0].status.ok()) << rep[0].status;
  const model::Policy rep_after = policy_with(initial, rep_first[0].params);
  auto into_sharded = run_ranks(2, rep_after, with_sharding(none_noclip, Sharding::kOptimizer),
                                groups, {"step"}, 4096, rep[0].saved);
  expect_equal_params(into_sharded[0], rep[0], "replicated state resumed sharded");
}

// A state that does not fit (another model's) is refused by name, and the
// sharded trainer is unchanged: its next step is a fresh trainer's.
TEST(ShardedOptimizerTest, StateOfAnotherModelIsRefusedAndChangesNothing) {
  model::PolicyConfig wide = testing::TinyConfig();
  wide.intermediate_size = 64;
  model::Policy other(wide);
  model::init_weights(*other, 1, 0.3);
  const auto groups_other = sample_groups(other, 1, 2);
  std::string foreign;
  {
    auto t = Trainer::create(other, dp_options()).value();
    ASSERT_TRUE(t->step(groups_other).ok());
    foreign = t->save_state().value();
  }
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 2, 4);
  const TrainerOptions sharded = with_sharding(dp_options(), Sharding::kOptimizer);
  const int port = free_port();
  std::vector<Status> refused(2, OkStatus());
  std::vector<RankResult> after(2), fresh(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto group = join_loopback(rank, 2, port);
      if (!group.ok()) {
        refused[rank] = group.status();
        return;
      }
      trainer::DataParallel dp;
      dp.group = *group;
      auto t = Trainer::create(model::clone_policy(*initial), sharded, 0, nullptr, dp).value();
      refused[rank] = t->restore_state(foreign, "other/trainer_state.pt");
      relay::testing::run_calls(*t, groups, {"step"}, after[rank]);
    });
  }
  for (auto& t : threads) t.join();
  auto baseline = run_ranks(2, initial, sharded, groups, {"step"}, int64_t{25} << 20);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_FALSE(refused[rank].ok());
    EXPECT_NE(refused[rank].message().find("other/trainer_state.pt"), std::string::npos)
        << refused[rank];
    expect_equal_params(after[rank], baseline[rank], "after a refused restore");
  }
}

// Through relay-trainer's protocol: rank 0's save_state() tells the follower
// to take part, and the gathered state resumes a single-rank trainer on
// the training the two ranks go on with.
TEST(ShardedOptimizerTest, RankZeroGathersTheFollowersPartsThroughTheProtocol) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions options = with_sharding(dp_options(), Sharding::kOptimizer);
  const int port = free_port();
  model::Policy leader_policy = model::clone_policy(*initial);
  Status follower_status = InternalError("not run");
  std::thread follower = relay::testing::follow_on_thread(port, options, follower_status);
  auto group = join_loopback(0, 2, port);
  ASSERT_TRUE(group.ok()) << group.status();
  RankLeader leader(*group);
  ASSERT_TRUE(leader.start("rl", *leader_policy, 0, nullptr, "").ok());
  auto t = Trainer::create(leader_policy, options, 0, nullptr, leader.data_parallel(4096)).value();
  ASSERT_TRUE(t->step(groups).ok());
  StatusOr<std::string> state = t->save_state();
  ASSERT_TRUE(state.ok()) << state.status();
  const model::Policy after_one = model::clone_policy(*leader_policy);
  ASSERT_TRUE(t->step(groups).ok());
  ASSERT_TRUE(leader.stop().ok());
  follower.join();
  ASSERT_TRUE(follower_status.ok()) << follower_status;
  RankResult two;
  for (const at::Tensor& p : leader_policy->parameters()) two.params.push_back(p.detach().clone());
  RankResult one = run_single(after_one, dp_options(), groups, {"step"}, *state);
  EXPECT_LT(relative_difference(one, two, flat(after_one)), 1e-4);
}

}  // namespace
}  // namespace relay::comm

namespace relay::comm {
namespace {

// trainer.lora on two ranks, replicated and sharded: the ranks reduce the
// adapters' gradients only (the base has none), the optimizer's ranges cut
// the adapters alone, and the update is the one-rank update; the base, the
// KL reference on every rank, never moves.
TEST(ShardedOptimizerTest, LoraAdaptersTrainOnTwoRanksAsOnOneEitherSharding) {
  model::Policy initial = relay::testing::make_policy(5);
  TrainerOptions options = relay::testing::dp_options();
  options.lora.rank = 4;
  options.lora.alpha = 8;
  options.lora.targets = {"all-linear"};
  options.kl_coef = 0.05;
  ASSERT_TRUE(model::attach_lora(*initial, options.lora, 3).ok());
  {
    // Adapters as after some training, so the first step's gradients reach A too.
    torch::NoGradGuard no_grad;
    for (auto& item : initial->named_parameters()) {
      if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0, 0.05);
    }
  }
  const auto groups = relay::testing::sample_groups(initial, 3, 4);
  const std::vector<std::string> calls = {"sft", "step", "step"};
  const relay::testing::RankResult single =
      relay::testing::run_single(initial, options, groups, calls);
  for (Sharding sharding : {Sharding::kNone, Sharding::kOptimizer}) {
    TrainerOptions o = options;
    o.sharding = sharding;
    auto ranks = relay::testing::run_ranks(2, initial, o, groups, calls, 1000);
    ASSERT_NO_FATAL_FAILURE(
        relay::testing::expect_same_training(single, ranks, relay::testing::flat(initial)));
    const auto before = initial->parameters();
    ASSERT_EQ(ranks[0].params.size(), before.size());
    int frozen = 0;
    for (size_t p = 0; p < before.size(); ++p) {
      if (before[p].requires_grad()) continue;
      ++frozen;
      EXPECT_TRUE(torch::equal(ranks[0].params[p], before[p])) << "base parameter " << p;
    }
    EXPECT_GT(frozen, 0);
    EXPECT_GT(ranks[0].metrics.back().at("kl_ref"), 0);
  }
}

}  // namespace
}  // namespace relay::comm
