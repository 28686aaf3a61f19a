#include "relay/rollout/trajectory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace relay::rollout {
namespace {

Trajectory valid() {
  Trajectory t;
  t.prompt_tokens = {1, 2};
  t.response_tokens = {5, 6, 7};
  t.behavior_logprobs = {-1.0f, -0.5f, -2.0f};
  t.token_versions = {0, 1, 1};
  t.proximal_logprobs = {-1.1f, NAN, -2.1f};
  t.proximal_versions = {1, -1, 1};
  t.offpolicy_mask = {1, 0, 0};
  t.version_digests = {{0, 10}, {1, 11}};
  return t;
}

TEST(TrajectoryTest, CheckAcceptsAConsistentTrajectory) {
  EXPECT_TRUE(check_trajectory(valid()).ok()) << check_trajectory(valid());
  Trajectory missing = valid();
  missing.behavior_logprobs[0] = NAN;  // missing is allowed here; the trainer decides
  EXPECT_TRUE(check_trajectory(missing).ok());
  EXPECT_EQ(valid().num_forced(), 1);
}

TEST(TrajectoryTest, CheckNamesTheFirstViolation) {
  struct Case {
    std::function<void(Trajectory&)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](Trajectory& t) { t.token_versions.pop_back(); },
       "token_versions: 2 entries for 3 response tokens"},
      {[](Trajectory& t) { t.raw_logprobs = {0.0f}; },
       "raw_logprobs: 1 entries for 3 response tokens"},
      {[](Trajectory& t) { t.behavior_logprobs[1] = -INFINITY; },
       "behavior_logprobs[1]: must be finite and <= 0 (or NaN if missing), got -inf"},
      {[](Trajectory& t) { t.behavior_logprobs[2] = 0.5f; },
       "behavior_logprobs[2]: must be finite and <= 0 (or NaN if missing), got 0.5"},
      {[](Trajectory& t) {
         t.token_versions = {1, 0, 1};
       },
       "token_versions[1]: 0 breaks the non-decreasing order (after 1)"},
      {[](Trajectory& t) {
         t.token_versions = {-2, 0, 1};
       },
       "token_versions[0]: -2 is negative; versions count from 0"},
      {[](Trajectory& t) { t.proximal_versions[1] = 2; },
       "proximal_versions[1]: 2 does not fit token version 1 and proximal log-prob nan"},
      {[](Trajectory& t) { t.proximal_versions[0] = 3; },
       "proximal_versions[0]: 3 does not fit token version 0 and proximal log-prob -1.1"},
      {[](Trajectory& t) {
         t.version_digests = {{0, 10}};
       },
       "version_digests: no digest for version 1"},
  };
  for (const Case& c : cases) {
    Trajectory t = valid();
    c.change(t);
    Status s = check_trajectory(t);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(std::string(s.message()), c.message);
  }
}

// A caller that refused log-probs above its rounding tolerance itself
// passes it as the ceiling (comm::validate_submission).
TEST(TrajectoryTest, BehaviorLogprobCeilingIsTheCallers) {
  Trajectory t = valid();
  t.behavior_logprobs[1] = 5e-5f;
  EXPECT_EQ(std::string(check_trajectory(t).message()),
            "behavior_logprobs[1]: must be finite and <= 0 (or NaN if missing), got 5e-05");
  EXPECT_TRUE(check_trajectory(t, 1e-4f).ok()) << check_trajectory(t, 1e-4f);
  t.behavior_logprobs[1] = 2e-4f;
  EXPECT_EQ(std::string(check_trajectory(t, 1e-4f).message()),
            "behavior_logprobs[1]: must be finite and <= 0.0001 (or NaN if missing), got 0.0002");
  t.behavior_logprobs[1] = INFINITY;
  EXPECT_FALSE(check_trajectory(t, INFINITY).ok());
}

// Proximal versions v + 1 interleave with token versions v: every version
// either field uses needs its digest, however they alternate.
TEST(TrajectoryTest, EveryVersionUsedNeedsADigestHoweverTheyInterleave) {
  Trajectory t;
  t.prompt_tokens = {1};
  t.response_tokens = {5, 6, 7, 8, 9};
  t.behavior_logprobs = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
  t.token_versions = {0, 0, 1, 1, 3};
  t.proximal_logprobs = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
  t.proximal_versions = {1, 0, 2, 1, 3};
  t.offpolicy_mask = {0, 0, 0, 0, 0};
  t.version_digests = {{3, 13}, {1, 11}, {0, 10}};
  EXPECT_EQ(std::string(check_trajectory(t).message()), "version_digests: no digest for version 2");
  t.version_digests.push_back({2, 12});
  EXPECT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  t.version_digests.erase(t.version_digests.begin());  // version 3's
  EXPECT_EQ(std::string(check_trajectory(t).message()), "version_digests: no digest for version 3");
}

// An episode of two turns: model [0, 2), environment [2, 4), model [4, 5).
Trajectory episode() {
  Trajectory t;
  t.prompt_tokens = {1, 2};
  t.response_tokens = {5, 6, 20, 21, 7};
  t.behavior_logprobs = {-1.0f, -0.5f, NAN, NAN, -2.0f};
  t.token_versions = {0, 0, 1, 1, 1};
  t.proximal_logprobs = {-1.1f, -0.4f, NAN, NAN, -2.0f};
  t.proximal_versions = {1, 1, -1, -1, 1};
  t.offpolicy_mask = {0, 0, 0, 0, 0};
  t.env_mask = {0, 0, 1, 1, 0};
  t.turns = {{2, 4, 0.0}, {5, 5, 1.0}};
  t.finish_reason = FinishReason::kStop;
  t.version_digests = {{0, 10}, {1, 11}};
  return t;
}

TEST(TrajectoryTest, EpisodesTileTheResponseWithTurns) {
  EXPECT_TRUE(check_trajectory(episode()).ok()) << check_trajectory(episode());
  EXPECT_EQ(episode().num_env_tokens(), 2);
  EXPECT_TRUE(episode().is_env_token(3));
  EXPECT_FALSE(episode().is_env_token(4));
  EXPECT_FALSE(valid().is_env_token(0));  // no mask: every token is the model's
  struct Case {
    std::function<void(Trajectory&)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](Trajectory& t) { t.env_mask.pop_back(); }, "env_mask: 4 entries for 5 response tokens"},
      {[](Trajectory& t) { t.behavior_logprobs[2] = -0.3f; },
       "env_mask[2]: an environment token must have NaN log-probs, proximal version -1 and no "
       "offpolicy_mask, got behavior log-prob -0.3"},
      {[](Trajectory& t) { t.turns.clear(); },
       "turns: empty, but env_mask marks environment tokens"},
      {[](Trajectory& t) { t.turns[0].env_end = 3; },
       "env_mask[3]: 1 disagrees with turns[1] (model tokens [3, 5), environment [5, 5))"},
      {[](Trajectory& t) { t.turns.pop_back(); }, "turns: end at token 4 of a response of 5"},
      {[](Trajectory& t) { t.turns[1].model_end = 3; },
       "turns[1]: model_end 3, env_end 5 must satisfy 4 <= model_end <= env_end <= 5"},
      {[](Trajectory& t) { t.env_mask[0] = 2; }, "env_mask[0]: must be 0 or 1, got 2"},
  };
  for (const Case& c : cases) {
    Trajectory t = episode();
    c.change(t);
    Status s = check_trajectory(t);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(std::string(s.message()), c.message);
  }
}

TEST(TrajectoryTest, FinishReasonNames) {
  EXPECT_STREQ(finish_reason_name(FinishReason::kToolBudget), "tool_budget");
  EXPECT_STREQ(finish_reason_name(FinishReason::kEnvDone), "env_done");
  EXPECT_STREQ(finish_reason_name(FinishReason::kEnvError), "env_error");
}

TEST(TrajectoryTest, PolicyNamesRoundTrip) {
  for (InterruptPolicy p : {InterruptPolicy::kRecompute, InterruptPolicy::kKeep,
                            InterruptPolicy::kFinish, InterruptPolicy::kRestart}) {
    auto parsed = kInterruptPolicyNames.parse(kInterruptPolicyNames.name(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_FALSE(kInterruptPolicyNames.parse("Recompute").ok());
  EXPECT_EQ(std::string(finish_reason_name(FinishReason::kAborted)), "aborted");
}

}  // namespace
}  // namespace relay::rollout
