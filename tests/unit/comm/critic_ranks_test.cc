// PPO with a critic (advantage.estimator gae) over real Gloo groups of two
// or three ranks as threads of this process: each rank scores and trains
// the critic on its shard of every mini-batch and the ranks sum its
// gradients (or, fully sharded, reduce-scatter them), so the policy and the
// critic end as one rank's.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <string>
#include <vector>

#include "relay/model/value_model.h"
#include "relay/trainer/trainer.h"
#include "testing/trainer_ranks.h"

namespace relay::comm {
namespace {

using relay::testing::dp_options;
using relay::testing::expect_same_training;
using relay::testing::flat;
using relay::testing::make_policy;
using relay::testing::RankResult;
using relay::testing::run_ranks;
using relay::testing::run_single;
using relay::testing::sample_groups;
using relay::testing::with_sharding;
using trainer::AdvantageEstimator;
using trainer::Sharding;
using trainer::TrainerOptions;

TrainerOptions gae_dp_options() {
  TrainerOptions o = dp_options();
  o.advantage.estimator = AdvantageEstimator::kGae;
  o.critic.optimizer.lr = 1e-2;
  o.critic.optimizer.eps = 1e-3;  // as dp_options' policy optimizer: see there
  return o;
}

// The weights a run starts from, flattened as RankResult::params holds them:
// the policy's, then the default critic's (the policy's decoder and a head
// from seed 0).
at::Tensor initial_flat(const model::Policy& initial) {
  model::ValueModel critic = model::value_model_from_policy(*initial, 0);
  std::vector<at::Tensor> params = initial->parameters();
  for (const at::Tensor& p : critic->parameters()) params.push_back(p);
  return flat(params);
}

TEST(CriticRanksTest, TwoRanksTrainThePolicyAndTheCriticAsOneRankEitherSharding) {
  model::Policy initial = make_policy(5);
  const auto groups = sample_groups(initial, 3, 4);
  const TrainerOptions options = gae_dp_options();
  const RankResult single = run_single(initial, options, groups, {"step", "step"});
  ASSERT_TRUE(single.status.ok()) << single.status;
  ASSERT_GT(single.params.size(), initial->parameters().size()) << "no critic parameters";
  EXPECT_GT(single.metrics.back().at("critic/vf_loss"), 0.0);
  for (Sharding sharding : {Sharding::kNone, Sharding::kOptimizer}) {
    SCOPED_TRACE(static_cast<int>(sharding));
    const std::vector<RankResult> ranks =
        run_ranks(2, initial, with_sharding(options, sharding), groups, {"step", "step"}, 4096);
    ASSERT_NO_FATAL_FAILURE(expect_same_training(single, ranks, initial_flat(initial)));
  }
}

// trainer.sharding: full shards the critic as it shards the policy: its
// layers gathered per pass, its root per phase, its AdamW over this rank's
// range. Two and three ranks, several micro-batches and mini-batches, a
// critic warmup step first: rank 0's policy and critic (gathered by the
// save) are one rank's, and each rank holds its share of the critic.
TEST(CriticRanksTest, FullShardingTrainsTheCriticAsOneRank) {
  model::Policy initial = make_policy(6);
  const auto groups = sample_groups(initial, 3, 4);
  TrainerOptions options = gae_dp_options();
  options.critic.warmup_steps = 1;
  const std::vector<std::string> calls = {"step", "step", "save"};
  const RankResult single = run_single(initial, options, groups, calls);
  ASSERT_TRUE(single.status.ok()) << single.status;
  EXPECT_EQ(single.metrics.front().at("critic/warmup"), 1.0);
  const double whole = single.metrics.back().at("memory/critic_weights_gb");
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const std::vector<RankResult> ranks =
        run_ranks(world, initial, with_sharding(options, Sharding::kFull), groups, calls, 4096);
    ASSERT_EQ(ranks[0].params.size(), single.params.size()) << "rank 0 has no whole critic";
    ASSERT_NO_FATAL_FAILURE(expect_same_training(single, {ranks[0]}, initial_flat(initial)));
    for (const RankResult& r : ranks) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      // Its share: a unit's padding adds at most world - 1 elements.
      EXPECT_NEAR(r.metrics.back().at("memory/critic_weights_gb") * world, whole, 0.02 * whole);
    }
  }
}

// A micro-batch a row and three rows over two ranks: rank 1 pads both the
// critic's pre-update pass and its updates with empty passes, and nothing
// hangs or changes the training.
TEST(CriticRanksTest, FullShardingPadsTheCriticsPassesOnRanksWithFewerRows) {
  model::Policy initial = make_policy(7);
  const auto groups = sample_groups(initial, 1, 3);
  TrainerOptions options = gae_dp_options();
  options.micro_batch_tokens = 1;
  options.mini_batches = 1;
  const std::vector<std::string> calls = {"step", "save"};
  const RankResult single = run_single(initial, options, groups, calls);
  ASSERT_TRUE(single.status.ok()) << single.status;
  const std::vector<RankResult> ranks =
      run_ranks(2, initial, with_sharding(options, Sharding::kFull), groups, calls, 4096);
  ASSERT_EQ(ranks[0].params.size(), single.params.size()) << "rank 0 has no whole critic";
  ASSERT_NO_FATAL_FAILURE(expect_same_training(single, {ranks[0]}, initial_flat(initial)));
}

}  // namespace
}  // namespace relay::comm
