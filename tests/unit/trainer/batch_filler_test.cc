#include "relay/trainer/batch_filler.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace relay::trainer {
namespace {

// A scored group whose trajectories carry `rewards` (one trajectory each).
rollout::TrajectoryGroup group(const std::string& id, std::vector<double> rewards) {
  rollout::TrajectoryGroup g;
  g.group_id = id;
  for (double r : rewards) {
    rollout::Trajectory t;
    t.prompt_tokens = {1, 2};
    t.response_tokens = {3};
    t.reward = r;
    g.trajectories.push_back(t);
  }
  return g;
}

std::vector<std::string> ids(const std::vector<rollout::TrajectoryGroup>& groups) {
  std::vector<std::string> out;
  for (const auto& g : groups) out.push_back(g.group_id);
  return out;
}

TEST(HasLearningSignalTest, EqualRewardsHaveNoneOneDifferingRewardHasSome) {
  EXPECT_FALSE(has_learning_signal(group("eq", {1.0, 1.0, 1.0})));
  EXPECT_FALSE(has_learning_signal(group("zeros", {0.0, 0.0})));
  // Only the last one differs from the first.
  EXPECT_TRUE(has_learning_signal(group("last", {1.0, 1.0, 0.0})));
  // Only a middle one differs.
  EXPECT_TRUE(has_learning_signal(group("mid", {0.5, 0.25, 0.5})));
  // A group of one never has a signal; neither has an empty group.
  EXPECT_FALSE(has_learning_signal(group("one", {1.0})));
  EXPECT_FALSE(has_learning_signal(group("empty", {})));
}

TEST(HasLearningSignalTest, UnscoredGroupOfOneHasNoSignal) {
  // A group of one never has a signal, whatever its reward.
  EXPECT_FALSE(has_learning_signal(group("nan", {std::numeric_limits<double>::quiet_NaN()})));
  // In a larger group an unscored reward differs: the group is kept, and
  // build_batch reports it instead of it being dropped silently.
  EXPECT_TRUE(has_learning_signal(group("nan2", {1.0, std::numeric_limits<double>::quiet_NaN()})));
}

TEST(BatchFillerTest, WithoutDroppingKeepsUpToGroupsPerBatchAndCountsSurplus) {
  BatchFillerOptions o;
  o.groups_per_batch = 3;
  BatchFiller filler(o);
  EXPECT_FALSE(filler.full());
  // Equal-reward groups count when dropping is off.
  filler.add({group("a", {1, 1}), group("b", {0, 1})});
  EXPECT_FALSE(filler.full());  // 2 < 3
  filler.add({group("c", {0, 0}), group("d", {1, 0}), group("e", {1, 1})});
  EXPECT_TRUE(filler.full());  // 3 kept
  BatchFillerStats st;
  std::vector<rollout::TrajectoryGroup> got = filler.take(&st);
  EXPECT_EQ(ids(got), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(st.generated_batches, 2);
  EXPECT_EQ(st.groups_seen, 5);           // 2 + 3
  EXPECT_EQ(st.dropped_equal_reward, 0);  // dropping off
  EXPECT_EQ(st.surplus, 2);               // d, e: 5 seen - 3 kept
}

TEST(BatchFillerTest, WithDroppingSkipsEqualRewardGroupsAndCountsThem) {
  BatchFillerOptions o;
  o.groups_per_batch = 2;
  o.drop_equal_reward_groups = true;
  o.max_extra_batches = 5;
  BatchFiller filler(o);
  filler.add({group("eq1", {1, 1}), group("s1", {0, 1}), group("eq2", {0, 0, 0})});
  EXPECT_FALSE(filler.full());  // 1 kept of 2
  filler.add({group("one", {1}), group("s2", {1, 0.5}), group("s3", {0, 1})});
  EXPECT_TRUE(filler.full());
  BatchFillerStats st;
  auto got = filler.take(&st);
  EXPECT_EQ(ids(got), (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(st.generated_batches, 2);
  EXPECT_EQ(st.groups_seen, 6);
  EXPECT_EQ(st.dropped_equal_reward, 3);  // eq1, eq2 and the group of one
  EXPECT_EQ(st.surplus, 1);               // s3: has signal but the batch was full
}

TEST(BatchFillerTest, WantsMoreWhileNotFullAndWithinTheExtraBatchBudget) {
  BatchFillerOptions o;
  o.groups_per_batch = 2;
  o.drop_equal_reward_groups = true;
  o.max_extra_batches = 2;  // at most 1 + 2 = 3 generation batches
  BatchFiller filler(o);
  EXPECT_TRUE(filler.wants_more());  // nothing yet: 0 < 3
  filler.add({group("eq", {1, 1})});
  EXPECT_TRUE(filler.wants_more());  // 1 batch < 3, 0 kept
  filler.add({group("s1", {0, 1})});
  EXPECT_TRUE(filler.wants_more());  // 2 batches < 3, 1 kept
  filler.add({group("eq2", {0, 0})});
  EXPECT_FALSE(filler.full());
  EXPECT_FALSE(filler.wants_more());  // 3 batches = 1 + max_extra_batches: budget spent
  BatchFillerStats st;
  auto got = filler.take(&st);
  EXPECT_EQ(ids(got), (std::vector<std::string>{"s1"}));  // fewer than groups_per_batch
  EXPECT_EQ(st.generated_batches, 3);
  EXPECT_EQ(st.dropped_equal_reward, 2);
  // The budget is per step: after take() it starts over.
  EXPECT_TRUE(filler.wants_more());
}

TEST(BatchFillerTest, NoExtraBatchesMeansOneGenerationBatchAndFullStopsEarly) {
  BatchFillerOptions o;
  o.groups_per_batch = 1;
  o.drop_equal_reward_groups = true;
  BatchFiller none(o);  // max_extra_batches 0: 1 + 0 batches
  EXPECT_TRUE(none.wants_more());
  none.add({group("eq", {2, 2})});
  EXPECT_FALSE(none.wants_more());  // 1 batch, budget 1
  EXPECT_TRUE(none.take().empty());

  o.max_extra_batches = 10;
  BatchFiller early(o);
  early.add({group("s", {0, 1})});
  EXPECT_TRUE(early.full());
  EXPECT_FALSE(early.wants_more());  // full: 1 batch < 11 does not matter
}

TEST(BatchFillerTest, TakeReturnsKeptGroupsInOrderAndResets) {
  BatchFillerOptions o;
  o.groups_per_batch = 4;
  BatchFiller filler(o);
  filler.add({group("x", {0, 1}), group("y", {1, 0})});
  filler.add({group("z", {0.5, 0})});
  BatchFillerStats st;
  auto got = filler.take(&st);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(ids(got), (std::vector<std::string>{"x", "y", "z"}));
  // The groups come back whole.
  EXPECT_EQ(got[2].trajectories.size(), 2u);
  EXPECT_EQ(got[2].trajectories[0].reward, 0.5);
  EXPECT_EQ(st.generated_batches, 2);
  EXPECT_EQ(st.groups_seen, 3);
  EXPECT_EQ(st.surplus, 0);

  // A second take is empty, with zero stats.
  BatchFillerStats again{7, 7, 7, 7};
  EXPECT_TRUE(filler.take(&again).empty());
  EXPECT_EQ(again.generated_batches, 0);
  EXPECT_EQ(again.groups_seen, 0);
  EXPECT_EQ(again.dropped_equal_reward, 0);
  EXPECT_EQ(again.surplus, 0);
  EXPECT_FALSE(filler.full());

  // And the filler collects the next step from scratch.
  filler.add({group("w", {1, 0})});
  auto next = filler.take(&st);
  EXPECT_EQ(ids(next), (std::vector<std::string>{"w"}));
  EXPECT_EQ(st.generated_batches, 1);
  EXPECT_EQ(st.groups_seen, 1);
}

}  // namespace
}  // namespace relay::trainer
