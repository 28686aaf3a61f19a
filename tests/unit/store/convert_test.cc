#include "relay/store/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "relay/v1/trajectory.pb.h"

namespace relay::store {
namespace {

rollout::Trajectory sample_trajectory() {
  rollout::Trajectory t;
  t.prompt_tokens = {1, 2, 3};
  t.response_tokens = {7, 8, 9};
  t.behavior_logprobs = {-0.5f, std::numeric_limits<float>::quiet_NaN(), -1.25f};
  t.raw_logprobs = {-0.4f, -2.0f, -1.0f};
  t.token_versions = {3, 4, 4};
  t.proximal_logprobs = {-0.6f, -2.1f, std::numeric_limits<float>::quiet_NaN()};
  t.proximal_versions = {4, 4, -1};
  t.offpolicy_mask = {1, 0, 0};
  t.finish_reason = rollout::FinishReason::kStop;
  t.interrupt_policy = rollout::InterruptPolicy::kRecompute;
  t.interruptions = 1;
  t.stale_kv = false;
  t.restarts = 2;
  t.prefix_ratio = 0.25;
  t.version_digests = {{3, 33}, {4, 44}};
  t.admitted_s = 0.5;
  t.first_token_s = 0.75;
  t.finished_s = 1.5;
  t.reward = 0.1;  // not representable in float: double survives exactly
  t.sub_scores = {{"format", 1.0}, {"answer", 0.0}};
  t.teacher_logprobs = {-0.7f, -3.5f, -0.01f};
  t.teacher_digest = 0xfedcba9876543210ull;  // all 64 bits survive
  return t;
}

void expect_same(const rollout::Trajectory& a, const rollout::Trajectory& b) {
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.response_tokens, b.response_tokens);
  ASSERT_EQ(a.behavior_logprobs.size(), b.behavior_logprobs.size());
  for (size_t i = 0; i < a.behavior_logprobs.size(); ++i) {
    if (std::isnan(a.behavior_logprobs[i])) {
      EXPECT_TRUE(std::isnan(b.behavior_logprobs[i])) << "NaN must stay NaN at " << i;
    } else {
      EXPECT_EQ(a.behavior_logprobs[i], b.behavior_logprobs[i]);
    }
  }
  EXPECT_EQ(a.raw_logprobs, b.raw_logprobs);
  EXPECT_EQ(a.teacher_logprobs, b.teacher_logprobs);
  EXPECT_EQ(a.teacher_digest, b.teacher_digest);
  EXPECT_EQ(a.token_versions, b.token_versions);
  EXPECT_EQ(a.proximal_versions, b.proximal_versions);
  EXPECT_EQ(a.offpolicy_mask, b.offpolicy_mask);
  EXPECT_EQ(a.finish_reason, b.finish_reason);
  EXPECT_EQ(a.interrupt_policy, b.interrupt_policy);
  EXPECT_EQ(a.interruptions, b.interruptions);
  EXPECT_EQ(a.stale_kv, b.stale_kv);
  EXPECT_EQ(a.restarts, b.restarts);
  EXPECT_EQ(a.prefix_ratio, b.prefix_ratio);
  EXPECT_EQ(a.version_digests, b.version_digests);
  EXPECT_EQ(a.admitted_s, b.admitted_s);
  EXPECT_EQ(a.first_token_s, b.first_token_s);
  EXPECT_EQ(a.finished_s, b.finished_s);
  EXPECT_EQ(a.reward, b.reward);
  EXPECT_EQ(a.sub_scores, b.sub_scores);
  EXPECT_EQ(a.env_mask, b.env_mask);
  ASSERT_EQ(a.turns.size(), b.turns.size());
  for (size_t i = 0; i < a.turns.size(); ++i) {
    EXPECT_EQ(a.turns[i].model_end, b.turns[i].model_end);
    EXPECT_EQ(a.turns[i].env_end, b.turns[i].env_end);
    EXPECT_TRUE(a.turns[i].reward == b.turns[i].reward ||
                (std::isnan(a.turns[i].reward) && std::isnan(b.turns[i].reward)));
    EXPECT_EQ(a.turns[i].tool_calls, b.turns[i].tool_calls);
    EXPECT_EQ(a.turns[i].tool_errors, b.turns[i].tool_errors);
  }
  EXPECT_EQ(a.finish_detail, b.finish_detail);
}

TEST(ConvertTest, GroupRoundTripsEveryFieldThroughBytes) {
  rollout::TrajectoryGroup g;
  g.group_id = "arithmetic/7@3";
  g.trajectories = {sample_trajectory(), sample_trajectory()};
  g.trajectories[1].finish_reason = rollout::FinishReason::kLength;
  g.trajectories[1].interrupt_policy = rollout::InterruptPolicy::kKeep;
  g.trajectories[1].stale_kv = true;
  g.baseline = sample_trajectory();
  g.baseline->reward = std::numeric_limits<double>::quiet_NaN();

  v1::TrajectoryGroup wire;
  to_proto(g, &wire);
  v1::TrajectoryGroup parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire.SerializeAsString()));
  StatusOr<rollout::TrajectoryGroup> back = from_proto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->group_id, g.group_id);
  ASSERT_EQ(back->trajectories.size(), 2u);
  expect_same(g.trajectories[0], back->trajectories[0]);
  expect_same(g.trajectories[1], back->trajectories[1]);
  ASSERT_TRUE(back->baseline.has_value());
  EXPECT_TRUE(std::isnan(back->baseline->reward));

  // No baseline stays no baseline.
  g.baseline.reset();
  to_proto(g, &wire);
  EXPECT_FALSE(from_proto(wire)->baseline.has_value());
}

// An episode's turns, its environment tokens and how it ended survive the
// wire, every new finish reason included.
TEST(ConvertTest, EpisodesRoundTrip) {
  rollout::Trajectory t = sample_trajectory();
  t.behavior_logprobs[1] = std::numeric_limits<float>::quiet_NaN();
  t.raw_logprobs.clear();  // NaN would not compare equal in expect_same
  t.proximal_logprobs[1] = std::numeric_limits<float>::quiet_NaN();
  t.proximal_versions[1] = -1;
  t.env_mask = {0, 1, 0};
  t.turns = {{1, 2, 0.5, 2, 1}, {3, 3, std::numeric_limits<double>::quiet_NaN()}};
  for (rollout::FinishReason r :
       {rollout::FinishReason::kToolBudget, rollout::FinishReason::kEnvDone,
        rollout::FinishReason::kEnvError}) {
    t.finish_reason = r;
    t.finish_detail = r == rollout::FinishReason::kEnvError ? "environment at :7070 hung up" : "";
    rollout::TrajectoryGroup g;
    g.group_id = "agent/3";
    g.trajectories = {t};
    v1::TrajectoryGroup wire;
    to_proto(g, &wire);
    StatusOr<rollout::TrajectoryGroup> back = from_proto(wire);
    ASSERT_TRUE(back.ok()) << back.status();
    expect_same(t, back->trajectories.at(0));
  }
}

TEST(ConvertTest, BadRecordsNameTheTrajectoryAndField) {
  rollout::TrajectoryGroup g;
  g.group_id = "g1";
  g.trajectories = {sample_trajectory(), sample_trajectory()};
  v1::TrajectoryGroup wire;
  to_proto(g, &wire);
  wire.mutable_trajectories(1)->mutable_token_versions()->RemoveLast();
  StatusOr<rollout::TrajectoryGroup> back = from_proto(wire);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(back.status().message());
  EXPECT_EQ(msg.rfind("group 'g1' trajectories[1]: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("token_versions"), std::string::npos) << msg;

  to_proto(g, &wire);
  wire.mutable_trajectories(0)->set_finish_reason(v1::FINISH_REASON_UNSPECIFIED);
  back = from_proto(wire);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(std::string(back.status().message()).find("finish_reason"), std::string::npos);
}

}  // namespace
}  // namespace relay::store
