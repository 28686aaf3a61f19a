#include "relay/trainer/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "relay/rollout/engine.h"
#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::TinyConfig;

model::Policy make_policy(uint64_t seed) {
  model::Policy p(TinyConfig());
  model::init_weights(*p, seed, 0.3);
  p->eval();
  return p;
}

// Groups sampled by the rollout engine from a copy of `policy`'s weights,
// with rewards 1 for responses containing token 5.
std::vector<rollout::TrajectoryGroup> sample_groups(model::Policy& policy, double temperature,
                                                    int64_t version = 0) {
  model::Policy copy = model::clone_policy(*policy);
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  eo.sampling.temperature = temperature;
  auto engine = rollout::Engine::create(copy, eo, version, 1).value();
  for (int g = 0; g < 3; ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(g);
    pg.prompt = {1, 3 + g, 7};
    pg.k = 4;
    pg.seed = 10 + g;
    EXPECT_TRUE(engine->submit(pg).ok());
  }
  auto groups = engine->run().value();
  for (auto& g : groups) {
    for (auto& t : g.trajectories) {
      t.reward = std::count(t.response_tokens.begin(), t.response_tokens.end(), 5) > 0 ? 1.0 : 0.0;
    }
    // Make sure every group has a learning signal.
    g.trajectories[0].reward = 1.0;
    g.trajectories[1].reward = 0.0;
  }
  return groups;
}

TEST(TrainerTest, LearningRateSchedules) {
  OptimizerOptions o;
  o.lr = 1.0;
  EXPECT_DOUBLE_EQ(lr_at(o, 0), 1.0);
  o.schedule = LrSchedule::kLinearWarmup;
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(lr_at(o, 0), 0.25);  // (step + 1) / warmup
  EXPECT_DOUBLE_EQ(lr_at(o, 2), 0.75);
  EXPECT_DOUBLE_EQ(lr_at(o, 10), 1.0);
  o.schedule = LrSchedule::kCosine;
  o.total_steps = 14;  // 10 decay steps after 4 warmup steps
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(o, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(o, 4), 1.0);                                             // cos(0)
  EXPECT_NEAR(lr_at(o, 9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);  // 0.55
  EXPECT_NEAR(lr_at(o, 14), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(o, 100), 0.1, 1e-12);
}

// Behavior log-probs from the same weights at the same temperature: the
// importance ratio is 1, nothing is clipped, the mismatch is numerics only.
TEST(TrainerTest, OnPolicyStepHasRatioOneAndNoClipping) {
  model::Policy policy = make_policy(1);
  auto groups = sample_groups(policy, 0.8);
  TrainerOptions o;
  o.temperature = 0.8;
  o.optimizer.lr = 1e-2;
  o.micro_batch_tokens = 40;  // several micro-batches
  auto trainer = Trainer::create(policy, o, /*version=*/0).value();
  at::Tensor before = policy->lm_head->weight.detach().clone();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->at("frac_old_logprobs_valid"), 1.0);
  EXPECT_NEAR(m->at("mean_importance_ratio"), 1.0, 1e-5);
  EXPECT_EQ(m->at("clip_fraction"), 0.0);
  EXPECT_LT(m->at("mismatch/logprob_abs_diff_max"), 1e-4);
  EXPECT_LT(m->at("mismatch/k3"), 1e-8);
  EXPECT_NEAR(m->at("is_ratio/ess"), 1.0, 1e-6);
  EXPECT_EQ(m->at("staleness/max"), 0.0);
  EXPECT_EQ(m->at("batch/trajectories"), 12.0);
  EXPECT_EQ(m->at("reward/max"), 1.0);
  EXPECT_GT(m->at("grad_norm"), 0.0);
  EXPECT_EQ(trainer->version(), 1);
  EXPECT_FALSE(torch::equal(before, policy->lm_head->weight)) << "the step changed nothing";
}

// A mismatched sampling temperature is exactly the bug the mismatch metrics
// exist to expose.
TEST(TrainerTest, TemperatureMismatchShowsInTheMismatchMetrics) {
  model::Policy policy = make_policy(1);
  auto groups = sample_groups(policy, 0.6);
  TrainerOptions o;  // scores at temperature 1
  auto trainer = Trainer::create(policy, o).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->at("mismatch/k3"), 1e-3);
  EXPECT_GT(m->at("mismatch/engine_k3"), 1e-3);  // same version: not staleness
  EXPECT_EQ(m->at("mismatch/staleness_k3"), 0.0);
}

TEST(TrainerTest, MissingBehaviorLogprobsFailUnlessAllowed) {
  model::Policy policy = make_policy(2);
  auto groups = sample_groups(policy, 1.0);
  for (float& lp : groups[1].trajectories[2].behavior_logprobs) lp = NAN;
  TrainerOptions o;
  auto strict = Trainer::create(policy, o).value();
  auto failed = strict->step(groups);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(failed.status().message()).find("behavior log-probs missing"),
            std::string::npos);
  EXPECT_EQ(strict->version(), 0) << "a refused step must not count";

  o.allow_missing_logprobs = true;
  auto lenient = Trainer::create(policy, o).value();
  auto m = lenient->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_LT(m->at("frac_old_logprobs_valid"), 1.0);
  EXPECT_GT(m->at("frac_old_logprobs_valid"), 0.5);
}

TEST(TrainerTest, DecoupledLossUsesRecordedProximalOfTheTrainerVersion) {
  model::Policy policy = make_policy(3);
  auto groups = sample_groups(policy, 1.0, /*version=*/4);
  TrainerOptions o;
  o.loss.kind = PolicyLossKind::kDecoupledPpo;
  o.kl_coef = 0.1;
  auto trainer = Trainer::create(policy, o, /*version=*/4).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  // The engine recorded every token's proximal value under version 4 (the
  // version it finished at), which is the trainer's version.
  EXPECT_DOUBLE_EQ(m->at("proximal/recorded_fraction"), 1.0);
  EXPECT_NEAR(m->at("mean_importance_ratio"), 1.0, 1e-5);
  EXPECT_NEAR(m->at("kl_ref/k3"), 0.0, 1e-9) << "reference = initial weights";
  EXPECT_EQ(trainer->version(), 5);
}

// A warm start: repeated SFT steps on one demonstration raise its likelihood.
TEST(TrainerTest, SftStepsLowerTheDemonstrationsLoss) {
  model::Policy policy = make_policy(5);
  rollout::TrajectoryGroup g;
  g.group_id = "demo";
  rollout::Trajectory t;
  t.prompt_tokens = {1, 4, 9};
  t.response_tokens = {12, 13, 2};
  t.behavior_logprobs.assign(3, NAN);  // demonstrations have no behavior policy
  t.token_versions.assign(3, 0);
  t.proximal_logprobs.assign(3, NAN);
  t.proximal_versions.assign(3, -1);
  t.offpolicy_mask.assign(3, 1);
  t.version_digests = {{0, 0}};
  t.reward = 1.0;
  g.trajectories = {t};
  TrainerOptions o;
  o.optimizer.lr = 3e-2;
  auto trainer = Trainer::create(policy, o).value();
  auto first = trainer->sft_step({g});
  ASSERT_TRUE(first.ok()) << first.status();
  double last = first->at("sft_loss");
  for (int i = 0; i < 10; ++i) last = trainer->sft_step({g})->at("sft_loss");
  EXPECT_LT(last, 0.5 * first->at("sft_loss"));
  EXPECT_EQ(trainer->version(), 11);
}

TEST(TrainerTest, StalenessBoundAndBadOptionsAreErrors) {
  model::Policy policy = make_policy(4);
  auto groups = sample_groups(policy, 1.0, /*version=*/0);
  TrainerOptions o;
  o.max_staleness = 1;
  auto trainer = Trainer::create(policy, o, /*version=*/3).value();
  EXPECT_EQ(trainer->step(groups).status().code(), absl::StatusCode::kFailedPrecondition);
  o.ppo_epochs = 0;
  EXPECT_EQ(Trainer::create(policy, o).status().message(),
            "trainer.ppo_epochs: must be >= 1, got 0");
}

}  // namespace
}  // namespace relay::trainer
