#include "relay/comm/service/submission.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

namespace relay::comm {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Two scored samples of versions 4 and 5 (an update landed mid-response in
// the second), as a worker submits them to a trainer at version 5.
rollout::TrajectoryGroup good_group() {
  rollout::TrajectoryGroup g;
  g.group_id = "arith/7";
  for (int j = 0; j < 2; ++j) {
    rollout::Trajectory t;
    t.prompt_tokens = {1, 2, 3};
    t.response_tokens = {4, 5, 6};
    t.behavior_logprobs = {-0.5f, -1.0f, -0.25f};
    t.raw_logprobs = {-0.4f, -0.9f, -0.2f};
    t.token_versions = {4, 4, j == 0 ? 4 : 5};
    t.proximal_logprobs = {-0.6f, -1.1f, kNaN};
    t.proximal_versions = {5, 5, -1};
    t.offpolicy_mask = {0, 0, 0};
    t.version_digests = {{4, 44}, {5, 55}};
    t.reward = j;
    g.trajectories.push_back(t);
  }
  return g;
}

SubmissionContext context() {
  SubmissionContext c;
  c.k = 2;
  c.trainer_version = 5;
  c.oldest_version = 3;
  return c;
}

TEST(SubmissionTest, AWellFormedGroupPasses) {
  SubmissionLimits l;
  l.vocab_size = 37;
  EXPECT_TRUE(validate_submission(good_group(), context(), l).ok())
      << validate_submission(good_group(), context(), l);
}

// Each case breaks one thing; the message names group, trajectory and field.
TEST(SubmissionTest, EachProblemIsNamed) {
  struct Case {
    const char* name;
    std::function<void(rollout::TrajectoryGroup&, SubmissionContext&)> change;
    const char* message;
  };
  const Case cases[] = {
      {"k", [](auto&, auto& c) { c.k = 4; },
       "group 'arith/7': 2 trajectories for a lease of k = 4"},
      {"no id", [](auto& g, auto&) { g.group_id.clear(); }, "group: group_id: empty"},
      {"+inf", [](auto& g, auto&) { g.trajectories[1].behavior_logprobs[2] = INFINITY; },
       "group 'arith/7' trajectories[1].behavior_logprobs[2]: +inf is not a log-prob (send NaN "
       "if missing)"},
      {"positive", [](auto& g, auto&) { g.trajectories[0].proximal_logprobs[1] = 0.5f; },
       "group 'arith/7' trajectories[0].proximal_logprobs[1]: 0.5 > 0 is not a log-prob"},
      {"raw -inf", [](auto& g, auto&) { g.trajectories[0].raw_logprobs[0] = -INFINITY; },
       "group 'arith/7' trajectories[0].raw_logprobs[0]: -inf is not a log-prob (send NaN if "
       "missing)"},
      {"lengths", [](auto& g, auto&) { g.trajectories[1].token_versions.pop_back(); },
       "group 'arith/7' trajectories[1]: token_versions: 2 entries for 3 response tokens"},
      {"future", [](auto& g, auto& c) { c.trainer_version = 4; },
       "group 'arith/7' trajectories[0].proximal_versions[0]: version 5 is in the future "
       "(trainer at 4)"},
      {"vocab", [](auto& g, auto&) { g.trajectories[1].response_tokens[0] = 99; },
       "group 'arith/7' trajectories[1].response_tokens[0]: token id 99 is outside the "
       "vocabulary [0, 37)"},
      {"prompt",
       [](auto& g, auto&) {
         g.trajectories[1].prompt_tokens = {1, 2};
       },
       "group 'arith/7' trajectories[1]: prompt_tokens: differ from trajectories[0]'s; a group "
       "shares one prompt"},
      {"empty response", [](auto& g, auto&) { g.trajectories[0].response_tokens.clear(); },
       "group 'arith/7' trajectories[0]: response_tokens: empty"},
      {"unscored", [](auto& g, auto&) { g.trajectories[0].reward = NAN; },
       "group 'arith/7' trajectories[0].reward: nan: the trajectory was not scored"},
      {"too long", [](auto& g, auto&) { g.trajectories[0].response_tokens.resize(70, 1); },
       "group 'arith/7' trajectories[0]: 73 prompt + response tokens exceed the limit of 64"},
      {"baseline",
       [](auto& g, auto&) {
         g.baseline = g.trajectories[0];
         g.baseline->reward = NAN;
       },
       "group 'arith/7' baseline.reward: nan: the trajectory was not scored"},
  };
  SubmissionLimits l;
  l.vocab_size = 37;
  l.max_tokens = 64;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rollout::TrajectoryGroup g = good_group();
    SubmissionContext ctx = context();
    c.change(g, ctx);
    Status s = validate_submission(g, ctx, l);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()), c.message);
  }
}

// What the trainer could not train on under the run's settings is refused at
// the door: each of these was acknowledged once and then stopped the trainer.
TEST(SubmissionTest, WhatTheTrainerCannotTrainOnIsRefused) {
  struct Case {
    const char* name;
    std::function<void(rollout::TrajectoryGroup&)> change;
    const char* message;
  };
  const Case cases[] = {
      {"missing behavior",
       [](auto& g) {
         for (float& lp : g.trajectories[1].behavior_logprobs) lp = kNaN;
       },
       "group 'arith/7' trajectories[1].behavior_logprobs[0]: NaN (missing), but "
       "trainer.allow_missing_logprobs is off: every sampled token needs the log-prob it was "
       "sampled with (DESIGN.md invariant 5)"},
      {"reward beyond float", [](auto& g) { g.trajectories[0].reward = 1e300; },
       "group 'arith/7' trajectories[0].reward: 1e+300: |reward| above 1e+06 (a reward "
       "function's bug, not a learning signal)"},
      {"absurd reward", [](auto& g) { g.trajectories[1].reward = -2e6; },
       "group 'arith/7' trajectories[1].reward: -2e+06: |reward| above 1e+06 (a reward "
       "function's bug, not a learning signal)"},
      {"absurd log-prob", [](auto& g) { g.trajectories[0].proximal_logprobs[0] = -1e30f; },
       "group 'arith/7' trajectories[0].proximal_logprobs[0]: -1e+30 is below -10000: not the "
       "log-prob of a token anyone sampled"},
      {"negative version",
       [](auto& g) {
         g.trajectories[0].token_versions = {-3, -3, -3};
       },
       "group 'arith/7' trajectories[0]: token_versions[0]: -3 is negative; versions count from "
       "0"},
      {"past max_new_tokens",
       [](auto& g) {
         rollout::Trajectory& t = g.trajectories[0];
         t.response_tokens.push_back(7);
         t.behavior_logprobs.push_back(-1);
         t.raw_logprobs.push_back(-1);
         t.token_versions.push_back(5);
         t.proximal_logprobs.push_back(kNaN);
         t.proximal_versions.push_back(-1);
         t.offpolicy_mask.push_back(0);
       },
       "group 'arith/7' trajectories[0].response_tokens: 4 tokens exceed rollout.max_new_tokens "
       "= 3"},
      {"past the context",
       [](auto& g) {
         for (auto& t : g.trajectories) t.prompt_tokens.assign(8, 1);
       },
       "group 'arith/7' trajectories[0]: 8 prompt + 3 response tokens exceed the model's context "
       "of 10 (max_position_embeddings)"},
  };
  SubmissionLimits l;
  l.vocab_size = 37;
  l.max_context = 10;
  l.max_response_tokens = 3;
  l.require_behavior_logprobs = true;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rollout::TrajectoryGroup g = good_group();
    c.change(g);
    Status s = validate_submission(g, context(), l);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()), c.message);
  }
  // The greedy baseline is never trained on: it may lack log-probs.
  rollout::TrajectoryGroup g = good_group();
  g.baseline = g.trajectories[0];
  for (float& lp : g.baseline->behavior_logprobs) lp = kNaN;
  EXPECT_TRUE(validate_submission(g, context(), l).ok()) << validate_submission(g, context(), l);
}

// trainer.distill: every sampled model token needs the teacher's log-prob;
// environment tokens and the greedy baseline go without.
TEST(SubmissionTest, DistillationNeedsTheTeachersLogprobs) {
  SubmissionLimits l;
  l.require_teacher_logprobs = true;
  rollout::TrajectoryGroup g = good_group();
  for (auto& t : g.trajectories) t.teacher_logprobs.assign(t.response_tokens.size(), -1.5f);
  g.baseline = g.trajectories[0];
  g.baseline->teacher_logprobs.clear();
  EXPECT_TRUE(validate_submission(g, context(), l).ok()) << validate_submission(g, context(), l);

  rollout::TrajectoryGroup none = g;
  none.trajectories[1].teacher_logprobs.clear();
  Status s = validate_submission(none, context(), l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message())
                .find("group 'arith/7' trajectories[1].teacher_logprobs: 0 "
                      "entries for 3 response tokens; trainer.distill is on"),
            std::string::npos)
      << s;
  rollout::TrajectoryGroup hole = g;
  hole.trajectories[0].teacher_logprobs[2] = kNaN;
  s = validate_submission(hole, context(), l);
  EXPECT_NE(std::string(s.message()).find("trajectories[0].teacher_logprobs[2]: NaN (missing)"),
            std::string::npos)
      << s;
  hole.trajectories[0].env_mask = {0, 0, 1};  // an environment token has none
  hole.trajectories[0].behavior_logprobs[2] = kNaN;
  hole.trajectories[0].proximal_logprobs[2] = kNaN;
  hole.trajectories[0].raw_logprobs[2] = kNaN;
  hole.trajectories[0].proximal_versions[2] = -1;
  hole.trajectories[0].turns = {{2, 3}};
  EXPECT_TRUE(validate_submission(hole, context(), l).ok())
      << validate_submission(hole, context(), l);
  rollout::TrajectoryGroup positive = g;
  positive.trajectories[0].teacher_logprobs[0] = 0.5f;
  s = validate_submission(positive, context(), l);
  EXPECT_NE(std::string(s.message()).find("trajectories[0].teacher_logprobs[0]: 0.5 > 0"),
            std::string::npos)
      << s;
  // Off: a trajectory without teacher log-probs is fine.
  EXPECT_TRUE(validate_submission(none, context(), SubmissionLimits{}).ok());
}

// Recorded expert routing is replayed into the trainer's model, so it must
// have that model's shape and expert range.
TEST(SubmissionTest, RoutingMustFitTheModel) {
  rollout::TrajectoryGroup g = good_group();
  rollout::Trajectory& t = g.trajectories[0];
  t.routing_layers = 2;  // 5 positions (prompt + response - 1) x 2 layers x 1 expert
  t.routing_top_k = 1;
  t.routed_experts = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1};
  SubmissionLimits l;
  l.moe_layers = 2;
  l.moe_top_k = 1;
  l.num_experts = 4;
  EXPECT_TRUE(validate_submission(g, context(), l).ok()) << validate_submission(g, context(), l);
  struct Case {
    const char* name;
    std::function<void(rollout::Trajectory&, SubmissionLimits&)> change;
    const char* message;
  };
  const Case cases[] = {
      {"dense model", [](auto&, auto& l) { l.moe_layers = 0; },
       "group 'arith/7' trajectories[0].routed_experts: the model has no MoE layers"},
      {"other shape", [](auto&, auto& l) { l.moe_layers = 3; },
       "group 'arith/7' trajectories[0].routing_layers: 2 layers x 1 experts; the model routes 3 "
       "layers x 1"},
      {"expert out of range", [](auto& t, auto&) { t.routed_experts[7] = 4; },
       "group 'arith/7' trajectories[0].routed_experts[7]: expert 4 outside [0, 4)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rollout::TrajectoryGroup changed = g;
    SubmissionLimits limits = l;
    c.change(changed.trajectories[0], limits);
    Status s = validate_submission(changed, context(), limits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()), c.message);
  }
}

// Another sampler's log_softmax may round a near-certain token to a tiny
// positive value: within the tolerance it passes and is clamped to 0.
// A group older than the staleness bound is stale, not malformed.
TEST(SubmissionTest, StaleVersionsAreAPreconditionFailure) {
  SubmissionContext c = context();
  c.oldest_version = 5;
  Status s = validate_submission(good_group(), c);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(s.message()),
            "group 'arith/7' trajectories[0].token_versions[0]: version 4 is older than the "
            "staleness bound (5)");
}

TEST(SubmissionTest, RoundingWithinTheToleranceIsClampedNotRefused) {
  rollout::TrajectoryGroup g = good_group();
  g.trajectories[0].behavior_logprobs[1] = 3e-7f;
  g.trajectories[1].raw_logprobs[0] = 5e-5f;
  ASSERT_TRUE(validate_submission(g, context()).ok()) << validate_submission(g, context());
  EXPECT_EQ(normalize_submission(g), 2);
  EXPECT_EQ(g.trajectories[0].behavior_logprobs[1], 0.0f);
  EXPECT_EQ(g.trajectories[1].raw_logprobs[0], 0.0f);
  EXPECT_EQ(g.trajectories[0].behavior_logprobs[0], -0.5f) << "others untouched";
  EXPECT_TRUE(std::isnan(g.trajectories[0].proximal_logprobs[2])) << "NaN stays NaN";
  EXPECT_TRUE(rollout::check_trajectory(g.trajectories[0]).ok());
}

}  // namespace
}  // namespace relay::comm
