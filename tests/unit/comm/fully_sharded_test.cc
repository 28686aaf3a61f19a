// trainer.sharding: full (ZeRO-3; src/trainer/fully_sharded.h) over real
// Gloo groups of two and three ranks as threads of this process: the
// training of the replicated trainer, 1/N of the weights, gradients and
// optimizer state per rank, ranks with fewer micro-batches than others, a
// sharded KL reference, and one state layout under every world size.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "relay/comm/dist/trainer_ranks.h"
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

// Rank 0 reads the whole weights (its host copy); the others' modules hold
// nothing between passes: their shards are all they keep.
void expect_rank_zero_whole(const std::vector<RankResult>& ranks, size_t num_params) {
  for (const RankResult& r : ranks) ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(ranks[0].params.size(), num_params);
  for (size_t i = 1; i < ranks.size(); ++i) {
    for (const at::Tensor& p : ranks[i].params) EXPECT_EQ(p.numel(), 0) << "rank " << i;
  }
}

// Two and three ranks, the clip on, several micro-batches and mini-batches,
// SFT and RL steps: after one update rank 0's weights are the replicated
// trainer's at the same world size to 1e-6 of their size (after nine, to
// 3e-6), and the metrics are the one-rank trainer's. The gradients are summed per micro-batch and
// layer instead of once, so fp32 additions run in another order; AdamW, dividing by sqrt(v) + eps,
// magnifies that in the update up to lr / eps times, and nine updates compound it (one update alone
// stays within 2e-5 of itself: 5.5e-6 and 1.1e-5 at two and three ranks on an AMD EPYC VM, whose
// OpenBLAS kernels sum in another order than a Xeon's, below 1e-5 on the Xeons).
TEST(FullShardingTest, TwoAndThreeRanksTrainAsTheReplicatedTrainer) {
  model::Policy initial = make_policy(5);
  const auto groups = sample_groups(initial, 3, 4);
  TrainerOptions options = dp_options();
  options.optimizer.max_grad_norm = 0.5;
  options.optimizer.weight_decay = 0.1;
  const std::vector<std::string> calls = {"sft", "step", "step"};
  const RankResult single = run_single(initial, options, groups, calls);
  const size_t num_params = initial->parameters().size();
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    auto replicated = run_ranks(world, initial, options, groups, calls, 1000);
    auto full =
        run_ranks(world, initial, with_sharding(options, Sharding::kFull), groups, calls, 1000);
    expect_rank_zero_whole(full, num_params);
    ASSERT_NO_FATAL_FAILURE(expect_same_training(single, {full[0]}, flat(initial)));
    const double of_update = relative_difference(full[0], replicated[0], flat(initial));
    const double of_weights = relative_difference(full[0], replicated[0], at::Tensor());
    std::printf("%d ranks, 9 updates: full vs replicated %.2e of the update, %.2e of the weights\n",
                world, of_update, of_weights);
    EXPECT_LT(of_update, 5e-5);
    EXPECT_LT(of_weights, 3e-6);
    // One update alone.
    TrainerOptions one = options;
    one.ppo_epochs = 1;
    one.mini_batches = 1;
    auto rep1 = run_ranks(world, initial, one, groups, {"step"}, 1000);
    auto full1 =
        run_ranks(world, initial, with_sharding(one, Sharding::kFull), groups, {"step"}, 1000);
    expect_rank_zero_whole(full1, num_params);
    const double one_update = relative_difference(full1[0], rep1[0], flat(initial));
    std::printf("%d ranks, 1 update: full vs replicated %.2e of the update\n", world, one_update);
    EXPECT_LT(one_update, 2e-5);
    EXPECT_LT(relative_difference(full1[0], rep1[0], at::Tensor()), 1e-6);
  }
}

// One group of three rows on two ranks, a micro-batch a row: rank 0 makes
// two micro-batches and rank 1 one, so rank 1 runs an empty pass in every
// phase; on three ranks with two rows one rank has none at all. Neither
// hangs, and each is the one-rank training.
TEST(FullShardingTest, RanksWithFewerMicroBatchesRunEmptyPasses) {
  model::Policy initial = make_policy(7);
  TrainerOptions options = dp_options();
  options.micro_batch_tokens = 1;  // every row is a micro-batch of its own
  options.mini_batches = 1;
  const size_t num_params = initial->parameters().size();
  for (auto [world, k] : {std::pair{2, 3}, std::pair{3, 2}}) {
    SCOPED_TRACE("world " + std::to_string(world) + ", rows " + std::to_string(k));
    const auto groups = sample_groups(initial, 1, k);
    const std::vector<std::string> calls = {"sft", "step"};
    const RankResult single = run_single(initial, options, groups, calls);
    auto full =
        run_ranks(world, initial, with_sharding(options, Sharding::kFull), groups, calls, 1000);
    expect_rank_zero_whole(full, num_params);
    ASSERT_NO_FATAL_FAILURE(expect_same_training(single, {full[0]}, flat(initial)));
  }
}

// Each of three ranks holds a third of the weights, of AdamW's moments and
// of the gradients' accumulators, and with a KL term a third of the
// reference (sharded too); the training is the replicated one's.
TEST(FullShardingTest, EachRankHoldsItsShareOfWeightsStateAndReference) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  TrainerOptions options = dp_options();
  options.kl_coef = 0.05;
  auto replicated = run_ranks(3, initial, options, groups, {"step", "step"}, 4096);
  auto full = run_ranks(3, initial, with_sharding(options, Sharding::kFull), groups,
                        {"step", "step"}, 4096);
  ASSERT_TRUE(replicated[0].status.ok()) << replicated[0].status;
  expect_rank_zero_whole(full, initial->parameters().size());
  const StepMetrics& rep = replicated[0].metrics[0];
  for (const char* key : {"memory/weights_gb", "memory/optimizer_gb", "memory/reference_gb"}) {
    const double whole = rep.at(key);
    ASSERT_GT(whole, 0) << key;
    double sum = 0;
    for (const RankResult& r : full) {
      const double mine = r.metrics[0].at(key);
      // A unit's last shard is padded to the others' size.
      EXPECT_LE(mine, whole / 3 * 1.05) << key;
      sum += mine;
    }
    EXPECT_NEAR(sum, whole, whole * 0.02) << key;
  }
  const StepMetrics& m = full[0].metrics[0];
  // Two layers: in each pass's forward layer 1 was prefetched while layer 0
  // ran, in each backward layer 0 while layer 1 did; layer 0 of a forward
  // and layer 1 of a backward were gathered when they were needed.
  EXPECT_DOUBLE_EQ(m.at("sharding/prefetched_fraction"), 0.5);
  // At a pass's peak the root and two layers are whole on top of the
  // shards: with two layers, the whole model.
  EXPECT_NEAR(m.at("memory/weights_peak_gb") - m.at("memory/weights_gb"),
              rep.at("memory/weights_gb"), 1e-12);
  // The second step's KL: the policy has moved off the reference.
  const StepMetrics& rep2 = replicated[0].metrics[1];
  ASSERT_GT(rep2.at("kl_ref"), 0);
  EXPECT_NEAR(full[0].metrics[1].at("kl_ref"), rep2.at("kl_ref"), 1e-4 * rep2.at("kl_ref"));
  // Eight updates: how far AdamW magnifies the fp32 summation-order
  // differences (see TwoAndThreeRanksTrainAsTheReplicatedTrainer) depends on
  // the sampled groups: below 5e-6 of the weights' size before the sampler's
  // decode attention read the cache in place, 5.2e-6 since (its sums run in
  // another order, so the groups differ in their last bits).
  EXPECT_LT(relative_difference(full[0], replicated[0], at::Tensor()), 1e-5);
}

// bf16 weights with fp32 master copies (each rank keeps those of its range;
// Gloo carries the bf16 shards as fp32): the weights come out as the
// replicated trainer's but for bf16 roundings of fp32 sums that straddle a
// boundary.
TEST(FullShardingTest, Bf16WeightsKeepFp32MasterCopiesOfTheirRangeOnly) {
  model::Policy initial = make_policy(7);
  const auto groups = sample_groups(initial, 2, 4);
  initial->to(torch::kBFloat16);
  TrainerOptions options = dp_options();
  options.optimizer.max_grad_norm = 0;
  const std::vector<std::string> calls = {"step", "step"};
  auto replicated = run_ranks(2, initial, options, groups, calls, 4096);
  auto full = run_ranks(2, initial, with_sharding(options, Sharding::kFull), groups, calls, 4096);
  ASSERT_TRUE(replicated[0].status.ok()) << replicated[0].status;
  expect_rank_zero_whole(full, initial->parameters().size());
  EXPECT_EQ(full[0].params.front().scalar_type(), torch::kBFloat16);
  const at::Tensor a = flat(full[0].params), b = flat(replicated[0].params);
  const double mismatch = a.ne(b).to(torch::kFloat32).mean().item<double>();
  EXPECT_LT(mismatch, 0.01) << "fraction of weights that differ";
  EXPECT_LT((a - b).abs().max().item<double>(), 0.02 * b.abs().max().item<double>());
  const StepMetrics& rep = replicated[0].metrics.back();
  ASSERT_GT(rep.at("memory/master_weights_gb"), 0) << "the weights were not bf16";
  for (const RankResult& r : full) {
    EXPECT_NEAR(r.metrics.back().at("memory/master_weights_gb"),
                rep.at("memory/master_weights_gb") / 2, rep.at("memory/master_weights_gb") * 0.05);
  }
}

// The state is saved in the single-rank layout: a fully sharded run's
// checkpoint resumes on the same two ranks bit for bit, and as the same
// training on one replicated rank, on three fully sharded ranks and on two
// with sharding: optimizer.
TEST(FullShardingTest, StateResumesUnderAnotherWorldSizeAndSharding) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions none = dp_options();
  const TrainerOptions full = with_sharding(none, Sharding::kFull);

  auto through = run_ranks(2, initial, full, groups, {"step", "step"}, 4096);
  auto first = run_ranks(2, initial, full, groups, {"step", "save"}, 4096);
  ASSERT_TRUE(first[0].status.ok()) << first[0].status;
  ASSERT_FALSE(first[0].saved.empty());
  EXPECT_TRUE(first[1].saved.empty()) << "rank 1's part went to rank 0";
  const model::Policy after_one = policy_with(initial, first[0].params);
  const std::string& state = first[0].saved;

  auto resumed = run_ranks(2, after_one, full, groups, {"step"}, 4096, state);
  ASSERT_TRUE(resumed[0].status.ok()) << resumed[0].status;
  ASSERT_TRUE(through[0].status.ok()) << through[0].status;
  for (size_t p = 0; p < through[0].params.size(); ++p) {
    EXPECT_TRUE(torch::equal(resumed[0].params[p], through[0].params[p])) << "parameter " << p;
  }
  EXPECT_EQ(resumed[0].metrics[0].at("version"), 2);

  RankResult one = run_single(after_one, none, groups, {"step"}, state);
  EXPECT_LT(relative_difference(one, through[0], flat(after_one)), 1e-4);
  auto three = run_ranks(3, after_one, full, groups, {"step"}, 4096, state);
  ASSERT_TRUE(three[0].status.ok()) << three[0].status;
  EXPECT_LT(relative_difference(three[0], through[0], flat(after_one)), 1e-4);
  auto zero1 = run_ranks(2, after_one, with_sharding(none, Sharding::kOptimizer), groups, {"step"},
                         4096, state);
  ASSERT_TRUE(zero1[0].status.ok()) << zero1[0].status;
  EXPECT_LT(relative_difference(zero1[0], through[0], flat(after_one)), 1e-4);
}

// An MoE model (Qwen3-MoE shape): experts are a layer's parameters like any
// other, and one that no token of a real pass reached on any rank is not
// stepped (no weight decay either), as the replicated trainer leaves it.
TEST(FullShardingTest, MoeExpertsTrainAsTheReplicatedTrainer) {
  model::PolicyConfig c = relay::testing::TinyConfig("qwen3_moe");
  c.head_dim = 8;
  c.num_experts = 8;
  c.num_experts_per_tok = 1;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  model::Policy initial(c);
  model::init_weights(*initial, 5, 0.4);
  initial->eval();
  // Three rows on two ranks, a micro-batch each: rank 1 also runs an empty
  // pass, whose two tokens reach some experts; they must not count.
  const auto groups = sample_groups(initial, 1, 3);
  TrainerOptions options = dp_options();
  options.optimizer.weight_decay = 0.1;
  options.micro_batch_tokens = 1;
  options.mini_batches = 1;
  options.ppo_epochs = 1;
  auto replicated = run_ranks(2, initial, options, groups, {"step"}, 4096);
  auto full =
      run_ranks(2, initial, with_sharding(options, Sharding::kFull), groups, {"step"}, 4096);
  ASSERT_TRUE(replicated[0].status.ok()) << replicated[0].status;
  expect_rank_zero_whole(full, initial->parameters().size());
  EXPECT_LT(relative_difference(full[0], replicated[0], flat(initial)), 5e-5);
  EXPECT_LT(relative_difference(full[0], replicated[0], at::Tensor()), 1e-6);
  // The parameters the replicated step left alone, the sharded one did too.
  const auto before = initial->parameters();
  int untouched = 0;
  for (size_t p = 0; p < before.size(); ++p) {
    const bool same = torch::equal(replicated[0].params[p], before[p]);
    untouched += same;
    EXPECT_EQ(torch::equal(full[0].params[p], before[p]), same) << "parameter " << p;
  }
  std::printf("MoE: %d of %zu parameters had no gradient anywhere\n", untouched, before.size());
}

// LoRA is not sharded this way: refused by name on every rank.
TEST(FullShardingTest, LoraIsRefusedByName) {
  model::Policy initial = make_policy(3);
  TrainerOptions options = with_sharding(dp_options(), Sharding::kFull);
  options.lora.rank = 4;
  auto ranks = run_ranks(2, initial, options, {}, {}, 4096);
  for (const RankResult& r : ranks) {
    ASSERT_FALSE(r.status.ok());
    EXPECT_NE(r.status.message().find("trainer.sharding: full"), std::string::npos) << r.status;
    EXPECT_NE(r.status.message().find("trainer.lora"), std::string::npos) << r.status;
  }
}

// Through relay-trainer's protocol: the follower shards its trainer too,
// rank 0's policy() is the whole weights after every step (what it
// publishes and checkpoints), and save_state() gathers the follower's part.
TEST(FullShardingTest, RankZeroPublishesWholeWeightsThroughTheProtocol) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions options = with_sharding(dp_options(), Sharding::kFull);
  const int port = free_port();
  model::Policy leader_policy = model::clone_policy(*initial);
  Status follower_status = InternalError("not run");
  std::thread follower = relay::testing::follow_on_thread(port, options, follower_status);
  auto group = join_loopback(0, 2, port);
  ASSERT_TRUE(group.ok()) << group.status();
  RankLeader leader(*group);
  ASSERT_TRUE(leader.start("rl", *leader_policy, 0, nullptr, "").ok());
  auto t = Trainer::create(leader_policy, options, 0, nullptr, leader.data_parallel(4096)).value();
  const model::Policy published = t->policy();
  EXPECT_TRUE(torch::equal(flat(published), flat(initial)));
  ASSERT_TRUE(t->step(groups).ok());
  EXPECT_FALSE(torch::equal(flat(published), flat(initial))) << "the host copy was not refreshed";
  StatusOr<std::string> state = t->save_state();
  ASSERT_TRUE(state.ok()) << state.status();
  const model::Policy after_one = model::clone_policy(*published);
  ASSERT_TRUE(t->step(groups).ok());
  ASSERT_TRUE(leader.stop().ok());
  follower.join();
  ASSERT_TRUE(follower_status.ok()) << follower_status;
  RankResult two;
  for (const at::Tensor& p : t->policy()->parameters()) two.params.push_back(p.detach().clone());
  RankResult one = run_single(after_one, dp_options(), groups, {"step"}, *state);
  EXPECT_LT(relative_difference(one, two, flat(after_one)), 1e-4);
}

// relay-trainer's warm start: an SFT trainer, then an RL trainer over what
// it left. Rank 0's module comes back whole from its host copy when the SFT
// trainer goes; the follower's stays empty, and its next start takes rank
// 0's weights into a new module. The RL step is the one-rank step from the
// SFT-trained weights.
TEST(FullShardingTest, AnotherTrainerFollowsAWarmStartOnEveryRank) {
  model::Policy initial = make_policy(3);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions options = with_sharding(dp_options(), Sharding::kFull);
  const int port = free_port();
  model::Policy policy = model::clone_policy(*initial);
  Status follower_status = InternalError("not run");
  std::thread follower = relay::testing::follow_on_thread(port, options, follower_status);
  auto group = join_loopback(0, 2, port);
  ASSERT_TRUE(group.ok()) << group.status();
  RankLeader leader(*group);
  ASSERT_TRUE(leader.start("sft", *policy, 0, nullptr, "").ok());
  {
    auto sft = Trainer::create(policy, options, 0, nullptr, leader.data_parallel(4096)).value();
    ASSERT_TRUE(sft->sft_step(groups).ok());
    EXPECT_EQ(policy->parameters().front().numel(), 0) << "rank 0's module kept whole weights";
  }
  ASSERT_GT(policy->parameters().front().numel(), 0) << "the SFT trainer did not give it back";
  const model::Policy after_sft = model::clone_policy(*policy);
  EXPECT_FALSE(torch::equal(flat(after_sft), flat(initial)));
  ASSERT_TRUE(leader.start("rl", *policy, 1, nullptr, "").ok());
  auto rl = Trainer::create(policy, options, 1, nullptr, leader.data_parallel(4096)).value();
  ASSERT_TRUE(rl->step(groups).ok());
  RankResult two;
  for (const at::Tensor& p : rl->policy()->parameters()) two.params.push_back(p.detach().clone());
  ASSERT_TRUE(leader.stop().ok());
  follower.join();
  ASSERT_TRUE(follower_status.ok()) << follower_status;
  RankResult one = run_single(after_sft, dp_options(), groups, {"step"}, "", 1);
  EXPECT_LT(relative_difference(one, two, flat(after_sft)), 1e-4);
}

}  // namespace
}  // namespace relay::comm
