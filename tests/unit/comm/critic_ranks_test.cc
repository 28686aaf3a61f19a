// PPO with a critic (advantage.estimator gae) over real Gloo groups of two
// ranks as threads of this process: each rank scores and trains the critic
// on its shard of every mini-batch and the ranks sum its gradients, so the
// policy and the critic end as one rank's.

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
    expect_same_training(single, ranks, initial_flat(initial));
  }
}

TEST(CriticRanksTest, FullShardingRefusesACriticByName) {
  model::Policy initial = make_policy(6);
  const auto groups = sample_groups(initial, 2, 2);
  const std::vector<RankResult> ranks = run_ranks(
      2, initial, with_sharding(gae_dp_options(), Sharding::kFull), groups, {"step"}, 4096);
  for (const RankResult& r : ranks) {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnimplemented) << r.status;
    EXPECT_NE(std::string(r.status.message()).find("does not shard a critic"), std::string::npos);
  }
}

}  // namespace
}  // namespace relay::comm
