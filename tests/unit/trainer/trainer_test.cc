#include "relay/trainer/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <numeric>

#include "relay/rollout/engine.h"
#include "relay/rollout/teacher.h"
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

// run.autocast bfloat16 (on the CPU here; the same guard drives CUDA's):
// the trainer's forward passes run their matrix products in bf16, which
// shows as a small mismatch against fp32 behavior log-probs, while the
// weights stay fp32 and the update stays close to the fp32 one.
TEST(TrainerTest, AutocastRunsTheForwardPassesInLowPrecision) {
  model::Policy initial = make_policy(1);
  auto groups = sample_groups(initial, 1.0);
  TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.optimizer.eps = 1e-3;  // the update a smooth function of the gradient
  o.micro_batch_tokens = 40;
  model::Policy fp32 = model::clone_policy(*initial);
  model::Policy bf16 = model::clone_policy(*initial);
  auto m32 = Trainer::create(fp32, o).value()->step(groups);
  o.autocast = c10::ScalarType::BFloat16;
  auto m16 = Trainer::create(bf16, o).value()->step(groups);
  ASSERT_TRUE(m32.ok()) << m32.status();
  ASSERT_TRUE(m16.ok()) << m16.status();
  EXPECT_LT(m32->at("mismatch/logprob_abs_diff_max"), 1e-4);
  EXPECT_GT(m16->at("mismatch/logprob_abs_diff_max"), 1e-4) << "autocast changed nothing";
  // bf16 keeps 8 bits of mantissa: the largest per-token difference is
  // visible, the average one small.
  EXPECT_LT(m16->at("mismatch/logprob_abs_diff_max"), 0.5);
  EXPECT_LT(m16->at("mismatch/k3"), 1e-3);
  EXPECT_EQ(bf16->lm_head->weight.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(m16->at("grad_norm"), m32->at("grad_norm"), 0.05 * m32->at("grad_norm"));
  const at::Tensor d32 = fp32->lm_head->weight - initial->lm_head->weight;
  const at::Tensor d16 = bf16->lm_head->weight - initial->lm_head->weight;
  // AdamW's first step is about lr x sign(gradient), so compare directions:
  // elements with tiny gradients may flip, the update as a whole may not.
  const double cosine = (d16 * d32).sum().item<double>() / (d16.norm() * d32.norm()).item<double>();
  EXPECT_GT(cosine, 0.9);
  std::printf("autocast: mismatch max %.3g k3 %.3g, grad_norm %.4g vs %.4g, cosine %.4f\n",
              m16->at("mismatch/logprob_abs_diff_max"), m16->at("mismatch/k3"),
              m16->at("grad_norm"), m32->at("grad_norm"), cosine);
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
  EXPECT_NE(std::string(failed.status().message())
                .find("behavior log-prob of response token 0 is nan and "
                      "trainer.allow_missing_logprobs is off"),
            std::string::npos)
      << failed.status();
  EXPECT_EQ(strict->version(), 0) << "a refused step must not count";
  ASSERT_EQ(strict->step_faults().size(), 1u) << "only the group with the missing values";
  EXPECT_EQ(strict->step_faults()[0].group_id, groups[1].group_id);

  o.allow_missing_logprobs = true;
  auto lenient = Trainer::create(policy, o).value();
  auto m = lenient->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_LT(m->at("frac_old_logprobs_valid"), 1.0);
  EXPECT_GT(m->at("frac_old_logprobs_valid"), 0.5);
}

// A reward that is finite as a double but not as a float (1e300) would make
// its group's advantages NaN: the step blames that group alone, changes
// nothing, and goes through once the caller drops it.
TEST(TrainerTest, AGroupThatCannotBeTrainedOnIsBlamedAloneAndNothingChanges) {
  model::Policy policy = make_policy(2);
  auto groups = sample_groups(policy, 1.0);
  ASSERT_GE(groups.size(), 2u);
  groups[0].trajectories[1].reward = 1e300;
  TrainerOptions o;
  auto trainer = Trainer::create(policy, o).value();
  const at::Tensor before = policy->parameters().front().clone();
  auto failed = trainer->step(groups);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition) << failed.status();
  EXPECT_EQ(trainer->version(), 0);
  EXPECT_TRUE(torch::equal(before, policy->parameters().front())) << "no update was applied";
  ASSERT_EQ(trainer->step_faults().size(), 1u);
  EXPECT_EQ(trainer->step_faults()[0].group_id, groups[0].group_id);
  EXPECT_NE(trainer->step_faults()[0].reason.find("reward inf is not a finite float"),
            std::string::npos)
      << trainer->step_faults()[0].reason;
  groups.erase(groups.begin());
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(trainer->step_faults().empty());
  EXPECT_EQ(trainer->version(), 1);
}

// An exception from LibTorch inside a step (here: a token id past the
// embedding table, which the trainer's inputs never check) is a Status, and
// the trainer steps normally afterwards.
TEST(TrainerTest, ALibTorchExceptionInAStepIsAStatusNotACrash) {
  model::Policy policy = make_policy(2);
  auto groups = sample_groups(policy, 1.0);
  auto bad = groups;
  bad[0].trajectories[0].response_tokens[0] = 1 << 30;
  auto trainer = Trainer::create(policy, TrainerOptions{}).value();
  auto failed = trainer->step(bad);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_EQ(std::string(failed.status().message()).find("Exception raised from"), std::string::npos)
      << "no C++ stack trace in the message: " << failed.status();
  EXPECT_EQ(trainer->version(), 0);
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
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

// Every trainer.loss runs a full step on engine-sampled groups: finite loss
// and gradient, the version advances, the weights move.
TEST(TrainerTest, EveryPolicyLossTrains) {
  for (PolicyLossKind kind :
       {PolicyLossKind::kPpo, PolicyLossKind::kDecoupledPpo, PolicyLossKind::kGspo,
        PolicyLossKind::kGmpo, PolicyLossKind::kCispo, PolicyLossKind::kSapo,
        PolicyLossKind::kClipCov, PolicyLossKind::kKlCov, PolicyLossKind::kGpg,
        PolicyLossKind::kReinforce, PolicyLossKind::kLuffy}) {
    SCOPED_TRACE(kPolicyLossNames.name(kind));
    model::Policy policy = make_policy(6);
    auto groups = sample_groups(policy, 1.0);
    // LUFFY's off-policy part needs forced tokens: mark the first two of one
    // trajectory as guidance.
    groups[0].trajectories[2].offpolicy_mask[0] = 1;
    groups[0].trajectories[2].offpolicy_mask[1] = 1;
    TrainerOptions o;
    o.loss.kind = kind;
    o.optimizer.lr = 1e-2;
    auto trainer = Trainer::create(policy, o).value();
    at::Tensor before = policy->lm_head->weight.detach().clone();
    auto m = trainer->step(groups);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(std::isfinite(m->at("loss")));
    EXPECT_GT(m->at("grad_norm"), 0.0);
    EXPECT_EQ(trainer->version(), 1);
    EXPECT_FALSE(torch::equal(before, policy->lm_head->weight));
    if (kind == PolicyLossKind::kLuffy) {
      EXPECT_GT(m->at("luffy/off_policy_fraction"), 0.0);
      EXPECT_GT(m->at("luffy/off_policy_prob"), 0.0);
    }
  }
}

// Groups whose behavior log-probs are those of another temperature: a real
// gap between the sampler and the trainer for the correction to act on.
TEST(TrainerTest, RolloutCorrectionWeightsRejectsAndReports) {
  model::Policy policy = make_policy(7);
  auto groups = sample_groups(policy, 0.7);  // trainer scores at 1.0
  TrainerOptions o;
  o.rollout_correction.is_level = CorrectionLevel::kToken;
  o.rollout_correction.is_threshold = 1.5;
  o.rollout_correction.rs_level = CorrectionLevel::kToken;
  o.rollout_correction.rs_threshold = 4.0;
  auto trainer = Trainer::create(model::clone_policy(*policy), o).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->at("rollout_corr/all/k3"), 1e-3);
  EXPECT_EQ(m->at("rollout_corr/all/k3"), m->at("mismatch/k3"));
  EXPECT_EQ(m->at("rollout_corr/staleness/num_tokens"), 0.0);
  EXPECT_GT(m->at("rollout_corr/is_truncated_fraction"), 0.0);
  EXPECT_LE(m->at("rollout_corr/is_weight/max"), 1.5);
  // The PPO anchor is now pi_old itself: the first (only) update's ratio is 1.
  EXPECT_NEAR(m->at("mean_importance_ratio"), 1.0, 1e-5);

  // Without correction the anchor is the behavior policy: ratio != 1.
  auto plain = Trainer::create(model::clone_policy(*policy), TrainerOptions{}).value();
  auto pm = plain->step(groups);
  ASSERT_TRUE(pm.ok()) << pm.status();
  EXPECT_GT(std::abs(pm->at("mean_importance_ratio") - 1.0), 1e-3);
  EXPECT_EQ(pm->count("rollout_corr/is_weight/mean"), 0u);

  // Rejecting nearly everything by a tight ratio band leaves fewer tokens.
  o.rollout_correction.rs_threshold = 1.01;
  auto strict = Trainer::create(model::clone_policy(*policy), o).value();
  auto sm = strict->step(groups);
  ASSERT_TRUE(sm.ok()) << sm.status();
  EXPECT_GT(sm->at("rollout_corr/rejected_token_fraction"),
            m->at("rollout_corr/rejected_token_fraction"));
}

// Bypass mode trains against the behavior log-probs without the pre-update
// pass, so it must give exactly the update of the default mode.
TEST(TrainerTest, BypassSkipsThePassAndGivesTheSameUpdate) {
  model::Policy policy = make_policy(8);
  auto groups = sample_groups(policy, 0.9);
  TrainerOptions o;
  o.temperature = 0.9;
  o.optimizer.lr = 1e-2;
  o.micro_batch_tokens = 40;
  model::Policy a = model::clone_policy(*policy), b = model::clone_policy(*policy);
  auto plain = Trainer::create(a, o).value();
  o.rollout_correction.bypass = true;
  o.rollout_correction.is_level = CorrectionLevel::kToken;  // ignored in bypass
  auto bypass = Trainer::create(b, o).value();
  auto pm = plain->step(groups);
  auto bm = bypass->step(groups);
  ASSERT_TRUE(pm.ok()) << pm.status();
  ASSERT_TRUE(bm.ok()) << bm.status();
  EXPECT_EQ(pm->at("pass/skipped"), 0.0);
  EXPECT_EQ(bm->at("pass/skipped"), 1.0);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::allclose(item.value(), pb[item.key()], 0, 1e-6)) << item.key();
  }
  // With one mini-batch, the diagnostics from the training pass cover the
  // whole batch and equal the pre-update pass's.
  EXPECT_NEAR(bm->at("mismatch/k3"), pm->at("mismatch/k3"), 1e-9);
  EXPECT_NEAR(bm->at("entropy"), pm->at("entropy"), 1e-6);
}

// The entropy metric is the mean over response tokens of the trainer's
// next-token entropy, and the bonus alone (all rewards equal: zero
// advantages) raises it.
TEST(TrainerTest, EntropyMetricAndBonus) {
  model::Policy policy = make_policy(9);
  auto groups = sample_groups(policy, 1.0);
  for (auto& g : groups) {
    for (auto& t : g.trajectories) t.reward = 1.0;
  }
  // Expected metric: mean entropy at the positions that score response
  // tokens (P - 1 + j), computed here one trajectory at a time.
  double sum = 0, n = 0;
  {
    torch::NoGradGuard g;
    for (const auto& group : groups) {
      for (const auto& t : group.trajectories) {
        std::vector<int64_t> ids = t.prompt_tokens;
        ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
        at::Tensor x = torch::tensor(ids, torch::kInt64).view({1, -1});
        at::Tensor h = policy->score_with_entropy(x).entropy[0];
        const auto P = static_cast<int64_t>(t.prompt_tokens.size());
        const auto R = static_cast<int64_t>(t.response_tokens.size());
        sum += h.narrow(0, P - 1, R).sum().item<double>();
        n += static_cast<double>(R);
      }
    }
  }
  TrainerOptions o;
  o.max_staleness = -1;  // the same groups are trained on at every step
  o.entropy.coef = 1.0;
  o.optimizer.lr = 1e-2;
  auto trainer = Trainer::create(policy, o).value();
  auto first = trainer->step(groups);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NEAR(first->at("entropy"), sum / n, 1e-5);
  EXPECT_EQ(first->at("entropy/coef"), 1.0);
  EXPECT_EQ(first->at("advantages/max"), 0.0);
  double last = first->at("entropy");
  for (int i = 0; i < 5; ++i) last = trainer->step(groups)->at("entropy");
  EXPECT_GT(last, first->at("entropy") + 1e-3);
}

// KL folded into the reward: r - beta sum_t kl_t moves the advantages, and
// the adaptive controller moves beta after the step.
TEST(TrainerTest, RewardKlShapesRewardsAndAdapts) {
  model::Policy policy = make_policy(10);
  auto groups = sample_groups(policy, 1.0);
  TrainerOptions o;
  o.reward_kl.controller.kl_coef = 0.5;
  o.reward_kl.controller.type = KlControllerType::kAdaptive;
  o.reward_kl.controller.target_kl = 1e-6;
  o.reward_kl.controller.horizon = 10;
  ASSERT_TRUE(o.needs_reference());
  // A reference that differs from the policy.
  model::Policy reference = make_policy(11);
  auto trainer = Trainer::create(policy, o, 0, reference).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->at("reward_kl/coef"), 0.5);
  EXPECT_NE(m->at("reward_kl/kl"), 0.0);
  EXPECT_NE(m->at("kl_ref/k1"), 0.0);
  // KL above target: beta grows by (1 + 0.2 * n / horizon), n = 12 samples.
  EXPECT_NEAR(trainer->reward_kl_coef(), 0.5 * (1 + 0.2 * 12 / 10.0), 1e-12);

  // A reference of another shape is refused, naming it.
  model::PolicyConfig other = TinyConfig();
  other.hidden_size = 16;
  other.intermediate_size = 24;
  model::Policy wrong(other);
  auto bad = Trainer::create(policy, o, 0, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("trainer.reference"), std::string::npos);
}

TEST(TrainerTest, ReuseCapDropsTrajectoriesTrainedBefore) {
  model::Policy policy = make_policy(12);
  auto groups = sample_groups(policy, 1.0);
  TrainerOptions o;
  o.max_reuse = 1;
  auto trainer = Trainer::create(policy, o).value();
  auto first = trainer->step(groups);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->at("batch/dropped_reused"), 0.0);
  auto again = trainer->step(groups);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(again.status().message()).find("max_reuse"), std::string::npos);
  EXPECT_EQ(trainer->version(), 1) << "a refused step must not count";
  // One fresh group among the used ones: only the used ones are dropped.
  auto fresh = sample_groups(policy, 1.0, /*version=*/1);
  fresh[0].group_id = "fresh";
  std::vector<rollout::TrajectoryGroup> mixed = {groups[1], fresh[0]};
  auto m = trainer->step(mixed);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->at("batch/dropped_reused"), 4.0);
  EXPECT_EQ(m->at("batch/trajectories"), 4.0);
}

// bf16 parameters: an AdamW step of lr 1e-4 is below bf16's spacing for
// weights of magnitude ~0.3, so without fp32 master copies nothing moves.
TEST(TrainerTest, Fp32MasterWeightsKeepSmallUpdatesOfBf16Parameters) {
  auto fraction_changed = [](bool master) {
    model::Policy policy = make_policy(13);
    auto groups = sample_groups(policy, 1.0);
    policy->to(torch::kBFloat16);
    TrainerOptions o;
    o.max_staleness = -1;  // the same groups are trained on at every step
    o.optimizer.lr = 1e-4;
    o.optimizer.fp32_master_weights = master;
    o.allow_missing_logprobs = true;
    auto trainer = Trainer::create(policy, o).value();
    at::Tensor before = policy->lm_head->weight.detach().clone();
    for (int i = 0; i < 8; ++i) {
      auto m = trainer->step(groups);
      EXPECT_TRUE(m.ok()) << m.status();
    }
    EXPECT_EQ(policy->lm_head->weight.scalar_type(), torch::kBFloat16);
    return policy->lm_head->weight.ne(before).to(torch::kFloat64).mean().item<double>();
  };
  const double with_master = fraction_changed(true);
  const double without = fraction_changed(false);
  EXPECT_GT(with_master, 0.5);
  EXPECT_LT(without, 0.5 * with_master);
}

// ReMax: A = r - r(greedy), read from each group's baseline; a group without
// one is refused, naming it.
TEST(TrainerTest, RemaxUsesTheGreedyBaselineReward) {
  model::Policy policy = make_policy(14);
  auto groups = sample_groups(policy, 1.0);
  TrainerOptions o;
  o.advantage.estimator = AdvantageEstimator::kRemax;
  auto trainer = Trainer::create(policy, o).value();
  auto missing = trainer->step(groups);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("group '0' has none"), std::string::npos)
      << missing.status();
  for (auto& g : groups) {
    g.baseline = g.trajectories[0];
    g.baseline->reward = 0.25;
  }
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  // Rewards are 0 or 1: advantages are -0.25 or 0.75.
  EXPECT_DOUBLE_EQ(m->at("advantages/max"), 0.75);
  EXPECT_DOUBLE_EQ(m->at("advantages/min"), -0.25);
}

// trainer.overlong_buffer: a response's reward loses (R - (L_max - buffer)) /
// buffer over the last `buffer` tokens of the budget; L_max is required.
TEST(TrainerTest, OverlongBufferPenalizesTheRewardOfLongResponses) {
  model::Policy policy = make_policy(15);
  auto groups = sample_groups(policy, 1.0);
  int64_t longest = 0;
  std::vector<int64_t> lengths;
  for (const auto& g : groups) {
    for (const auto& t : g.trajectories) {
      lengths.push_back(static_cast<int64_t>(t.response_tokens.size()));
      longest = std::max(longest, lengths.back());
    }
  }
  ASSERT_GE(longest, 2);
  TrainerOptions o;
  o.overlong_buffer.length = 2;
  EXPECT_NE(std::string(Trainer::create(policy, o).status().message())
                .find("trainer.overlong_buffer.length: needs the response budget"),
            std::string::npos);
  // L_max = longest + 1: responses of `longest` tokens lose 1/2, one shorter none.
  o.max_response_length = longest + 1;
  double want = 0, penalized = 0;
  for (int64_t n : lengths) {
    const double p = std::min(0.0, -static_cast<double>(n - (longest - 1)) / 2.0);
    want += p;
    penalized += p < 0 ? 1 : 0;
  }
  want /= static_cast<double>(lengths.size());
  auto trainer = Trainer::create(policy, o).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR(m->at("reward/overlong_penalty"), want, 1e-6);
  EXPECT_LT(m->at("reward/overlong_penalty"), 0.0);
  EXPECT_NEAR(m->at("reward/overlong_penalized_fraction"),
              penalized / static_cast<double>(lengths.size()), 1e-9);
}

// ---- PPO with a critic (advantage.estimator gae).

TrainerOptions gae_options() {
  TrainerOptions o;
  o.advantage.estimator = AdvantageEstimator::kGae;
  o.optimizer.lr = 1e-3;
  o.critic.optimizer.lr = 1e-2;
  o.critic.loss.clip_range = 10;  // lets the values move far enough to see the fit
  o.max_staleness = -1;           // the same groups again and again
  return o;
}

at::Tensor flat_params(torch::nn::Module& m) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& p : m.parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

// GAE with gamma = lambda = 1 has returns = the outcome reward on every token
// whatever the values, so steps on one batch fit the critic to it: the value
// loss falls, the explained variance rises, and the policy trains as well.
TEST(TrainerTest, GaeTrainsACriticBesideThePolicyOnItsValues) {
  model::Policy policy = make_policy(21);
  auto groups = sample_groups(policy, 1.0);
  auto trainer = Trainer::create(policy, gae_options()).value();
  ASSERT_TRUE(trainer->critic());
  const at::Tensor critic_before = flat_params(*trainer->critic());
  const at::Tensor policy_before = flat_params(*policy);
  std::vector<StepMetrics> m;
  for (int i = 0; i < 8; ++i) {
    auto step = trainer->step(groups);
    ASSERT_TRUE(step.ok()) << step.status();
    m.push_back(*step);
  }
  for (const char* k : {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean",
                        "critic/grad_norm", "critic/lr", "critic/vf_explained_var",
                        "critic/values/mean", "critic/returns/mean", "memory/critic_weights_gb"}) {
    EXPECT_TRUE(m.back().count(k)) << k;
  }
  EXPECT_LT(m.back().at("critic/vf_loss"), 0.5 * m.front().at("critic/vf_loss"));
  EXPECT_GT(m.back().at("critic/vf_explained_var"), m.front().at("critic/vf_explained_var"));
  EXPECT_DOUBLE_EQ(m.back().at("critic/lr"), 1e-2);
  // Returns are the rewards: their mean over tokens is the token-weighted reward.
  EXPECT_NEAR(m.front().at("critic/returns/mean"), m.back().at("critic/returns/mean"), 1e-6);
  EXPECT_NEAR(m.front().at("advantages/mean"), 0.0, 1e-5);  // whitened
  EXPECT_FALSE(torch::equal(critic_before, flat_params(*trainer->critic())));
  EXPECT_FALSE(torch::equal(policy_before, flat_params(*policy)));
}

// A critic need not be the policy's size (verl's critic may be another
// model of the family): a narrower one trains beside the policy. One whose
// vocabulary misses some of the policy's token ids is refused, naming both.
TEST(TrainerTest, ACriticOfAnotherWidthTrainsAndOneWithFewerTokensIsRefused) {
  model::Policy policy = make_policy(23);
  auto groups = sample_groups(policy, 1.0);
  model::PolicyConfig narrow = TinyConfig();
  narrow.hidden_size /= 2;
  narrow.intermediate_size /= 2;
  model::Policy small(narrow);
  model::init_weights(*small, 3, 0.3);
  auto trainer = Trainer::create(model::clone_policy(*policy), gae_options(), 0, nullptr, {},
                                 model::value_model_from_policy(*small, 0));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->critic()->config().hidden_size, narrow.hidden_size);
  std::vector<StepMetrics> m;
  for (int i = 0; i < 12; ++i) {
    auto step = (*trainer)->step(groups);
    ASSERT_TRUE(step.ok()) << step.status();
    m.push_back(*step);
  }
  EXPECT_LT(m.back().at("critic/vf_loss"), 0.5 * m.front().at("critic/vf_loss"));
  EXPECT_GT(m.back().at("critic/vf_explained_var"), 0.3);

  model::PolicyConfig fewer = TinyConfig();
  fewer.vocab_size -= 1;
  model::Policy short_vocab(fewer);
  auto refused = Trainer::create(model::clone_policy(*policy), gae_options(), 0, nullptr, {},
                                 model::value_model_from_policy(*short_vocab, 0));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  EXPECT_NE(message.find("trainer.critic"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(fewer.vocab_size) + " entries and the policy's " +
                         std::to_string(TinyConfig().vocab_size)),
            std::string::npos)
      << message;
}

// The critic's optimizer state is part of the trainer state: a trainer
// restored from it over the same weights takes the same next step.
TEST(TrainerTest, CriticStateResumesAndAStateWithoutOneIsRefused) {
  model::Policy policy = make_policy(22);
  auto groups = sample_groups(policy, 1.0);
  auto a = Trainer::create(policy, gae_options()).value();
  ASSERT_TRUE(a->step(groups).ok());
  const std::string state = a->save_state().value();
  model::Policy policy_b = model::clone_policy(*policy);
  model::ValueModel critic_b = model::value_model_from_policy(*policy_b, 0);
  {
    torch::NoGradGuard no_grad;
    auto mine = critic_b->parameters();
    auto theirs = a->critic()->parameters();
    for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_(theirs[i]);
  }
  auto b = Trainer::create(policy_b, gae_options(), 0, nullptr, {}, critic_b).value();
  ASSERT_TRUE(b->restore_state(state, "state").ok());
  auto ma = a->step(groups);
  auto mb = b->step(groups);
  ASSERT_TRUE(ma.ok() && mb.ok());
  EXPECT_TRUE(torch::equal(flat_params(*a->critic()), flat_params(*b->critic())));
  EXPECT_EQ(ma->at("critic/vf_loss"), mb->at("critic/vf_loss"));

  TrainerOptions plain;
  plain.max_staleness = -1;
  auto without = Trainer::create(model::clone_policy(*policy), plain).value();
  ASSERT_TRUE(without->step(groups).ok());
  const Status refused = b->restore_state(without->save_state().value(), "old.pt");
  EXPECT_NE(std::string(refused.message()).find("old.pt: has no critic state"), std::string::npos)
      << refused;
}

// A state whose policy part fits and whose critic part does not (a critic
// of another depth: the hidden size matches, the parameters do not) is
// refused, and neither optimizer changes: the next step is a fresh
// trainer's, bit for bit.
TEST(TrainerTest, ACriticStateThatDoesNotFitLeavesThePolicysOptimizerAsItWas) {
  model::Policy policy = make_policy(25);
  auto groups = sample_groups(policy, 1.0);
  auto a = Trainer::create(model::clone_policy(*policy), gae_options()).value();
  ASSERT_TRUE(a->step(groups).ok());
  const std::string state = a->save_state().value();

  model::PolicyConfig deeper = TinyConfig();
  deeper.num_hidden_layers += 1;
  model::Policy other(deeper);
  auto make = [&] {
    model::Policy p = model::clone_policy(*policy);
    return Trainer::create(p, gae_options(), 0, nullptr, {},
                           model::value_model_from_policy(*other, 0))
        .value();
  };
  auto b = make();
  auto fresh = make();
  const Status refused = b->restore_state(state, "state");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.message()).find("state (critic)"), std::string::npos) << refused;
  EXPECT_EQ(b->version(), 0);
  ASSERT_TRUE(b->step(groups).ok());
  ASSERT_TRUE(fresh->step(groups).ok());
  EXPECT_TRUE(torch::equal(flat_params(*b->policy()), flat_params(*fresh->policy())));
  EXPECT_TRUE(torch::equal(flat_params(*b->critic()), flat_params(*fresh->critic())));
}

// trainer.critic.warmup_steps (verl's critic_warmup): the first steps train
// the critic alone and leave the policy as it was; the count is part of the
// trainer state.
TEST(TrainerTest, CriticWarmupTrainsTheCriticAloneForItsSteps) {
  model::Policy policy = make_policy(24);
  auto groups = sample_groups(policy, 1.0);
  TrainerOptions o = gae_options();
  o.critic.warmup_steps = 2;
  auto t = Trainer::create(policy, o).value();
  const at::Tensor policy_before = flat_params(*policy);
  const at::Tensor critic_before = flat_params(*t->critic());
  auto m1 = t->step(groups);
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ(m1->at("critic/warmup"), 1.0);
  EXPECT_EQ(m1->at("optimizer_steps"), 0.0);
  EXPECT_EQ(m1->count("pg_loss"), 0u);
  EXPECT_GT(m1->at("critic/vf_loss"), 0.0);
  EXPECT_TRUE(torch::equal(policy_before, flat_params(*policy)));
  EXPECT_FALSE(torch::equal(critic_before, flat_params(*t->critic())));
  EXPECT_EQ(t->version(), 1);
  const std::string after_one = t->save_state().value();
  EXPECT_EQ(t->step(groups)->at("critic/warmup"), 1.0);
  EXPECT_TRUE(torch::equal(policy_before, flat_params(*policy)));
  auto m3 = t->step(groups);
  ASSERT_TRUE(m3.ok()) << m3.status();
  EXPECT_EQ(m3->at("critic/warmup"), 0.0);
  EXPECT_TRUE(m3->count("pg_loss"));
  EXPECT_FALSE(torch::equal(policy_before, flat_params(*policy)));
  // Restored after the first step: one warmup step is left.
  auto b = Trainer::create(model::clone_policy(*policy), o).value();
  ASSERT_TRUE(b->restore_state(after_one, "state").ok());
  EXPECT_EQ(b->step(groups)->at("critic/warmup"), 1.0);
  EXPECT_EQ(b->step(groups)->at("critic/warmup"), 0.0);
}

TEST(TrainerTest, CriticGoesWithGaeAndThePolicysArchitecture) {
  model::Policy policy = make_policy(23);
  TrainerOptions o;  // grpo
  EXPECT_NE(std::string(Trainer::create(policy, o, 0, nullptr, {},
                                        model::value_model_from_policy(*policy, 0))
                            .status()
                            .message())
                .find("a critic was given, and trainer.advantage.estimator is not gae"),
            std::string::npos);
  EXPECT_FALSE(Trainer::create(policy, o).value()->critic());
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

// ---- Real-model concerns: MoE router replay, memory, the vocabulary support.

model::PolicyConfig MoeConfig() {
  model::PolicyConfig c = TinyConfig("qwen3_moe");
  c.head_dim = 8;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  return c;
}

// One group of k per prompt, sampled by a copy of `policy` (routing
// recorded for an MoE one) with seeds first_seed, first_seed + 1, ...; each
// group's first response is rewarded 1, the others 0.
std::vector<rollout::TrajectoryGroup> sample_first_rewarded(
    model::Policy& policy, const std::vector<std::vector<int64_t>>& prompts, int k,
    uint64_t first_seed) {
  model::Policy copy = model::clone_policy(*policy);
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  auto engine = rollout::Engine::create(copy, eo, 0, 1).value();
  for (size_t g = 0; g < prompts.size(); ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(g);
    pg.prompt = prompts[g];
    pg.k = k;
    pg.seed = first_seed + g;
    EXPECT_TRUE(engine->submit(pg).ok());
  }
  auto groups = engine->run().value();
  for (auto& g : groups) {
    for (size_t i = 0; i < g.trajectories.size(); ++i) g.trajectories[i].reward = i == 0;
  }
  return groups;
}

// Groups an MoE engine sampled (with routing recorded).
std::vector<rollout::TrajectoryGroup> sample_moe_groups(model::Policy& policy) {
  return sample_first_rewarded(policy, {{1, 3, 7, 2}, {1, 4, 7, 2}, {1, 5, 7, 2}}, 4, 30);
}

// A copy of `policy` whose MoE routers drifted (perturbed gates, as after
// updates an engine has not seen).
model::Policy with_drifted_routers(const model::Policy& policy) {
  model::Policy p = model::clone_policy(*policy);
  torch::NoGradGuard g;
  at::Generator gen = at::detail::createCPUGenerator(9);
  for (auto& item : p->named_parameters()) {
    if (item.key().find("mlp.gate.weight") != std::string::npos) {
      item.value().add_(torch::empty(item.value().sizes()).normal_(0.0, 0.05, gen));
    }
  }
  return p;
}

// The trainer's routers drift from the engine's (here: perturbed gates, as
// after updates the engine has not seen). Without replay some tokens go to
// other experts and their log-probs jump; with replay the trainer uses the
// engine's experts and only the gate weights over them differ.
TEST(TrainerTest, RouterReplayUsesTheEnginesExpertsAndReportsTheMismatch) {
  model::Policy engine_policy(MoeConfig());
  model::init_weights(*engine_policy, 5, 0.4);
  auto groups = sample_moe_groups(engine_policy);
  ASSERT_FALSE(groups[0].trajectories[0].routed_experts.empty());
  auto drifted = [&] { return with_drifted_routers(engine_policy); };
  TrainerOptions o;
  o.optimizer.lr = 1e-3;
  o.micro_batch_tokens = 64;
  auto off = Trainer::create(drifted(), o).value()->step(groups);
  o.router_replay = RouterReplay::kReplay;
  auto replay = Trainer::create(drifted(), o).value()->step(groups);
  ASSERT_TRUE(off.ok()) << off.status();
  ASSERT_TRUE(replay.ok()) << replay.status();
  // Both report how often the trainer's own routers would choose otherwise
  // (not the same figure: with replay the later layers see the hidden states
  // the replayed experts made).
  EXPECT_GT(off->at("router/mismatch_token_fraction"), 0.02);
  EXPECT_GT(replay->at("router/mismatch_token_fraction"), 0.02);
  EXPECT_LE(off->at("router/mismatch_layer_fraction"), off->at("router/mismatch_token_fraction"));
  EXPECT_EQ(off->at("router/replay"), 0);
  EXPECT_EQ(replay->at("router/replay"), 1);
  // Replay brings the trainer's log-probs back toward the engine's.
  EXPECT_LT(replay->at("mismatch/k3"), 0.5 * off->at("mismatch/k3"));
  // Same weights as the engine: no mismatch to report.
  auto same = Trainer::create(model::clone_policy(*engine_policy), o).value()->step(groups);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->at("router/mismatch_token_fraction"), 0.0);
  EXPECT_LT(same->at("mismatch/k3"), 1e-8);
}

TEST(TrainerTest, StepReportsMemoryPerComponent) {
  model::Policy policy = make_policy(1);
  auto groups = sample_groups(policy, 1.0);
  TrainerOptions o;
  o.kl_coef = 0.1;  // a reference policy
  auto trainer = Trainer::create(policy, o).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  double params = 0;
  for (const at::Tensor& p : policy->parameters()) params += p.numel() * 4.0;
  const double gib = 1ull << 30;
  EXPECT_NEAR(m->at("memory/weights_gb"), params / gib, 1e-12);
  EXPECT_NEAR(m->at("memory/gradients_gb"), params / gib, 1e-12);
  EXPECT_NEAR(m->at("memory/optimizer_gb"), 2 * params / gib, 1e-12);  // AdamW's two moments
  EXPECT_NEAR(m->at("memory/reference_gb"), params / gib, 1e-12);
  EXPECT_EQ(m->at("memory/master_weights_gb"), 0.0);
  EXPECT_GT(m->at("memory/rss_gb"), 0.0);
  EXPECT_GE(m->at("memory/rss_peak_gb"), m->at("memory/rss_gb") - 1e-3);
  // Gradients are freed once the update is applied.
  for (const at::Tensor& p : policy->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(TrainerTest, ScoresOverTheVocabularySupportTheEngineSampledFrom) {
  model::Policy policy = make_policy(2);
  {
    torch::NoGradGuard g;
    policy->lm_head->weight.narrow(0, 30, 7).mul_(20.0);
  }
  model::Policy copy = model::clone_policy(*policy);
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  eo.vocab_limit = 30;
  auto engine = rollout::Engine::create(copy, eo, 0, 1).value();
  rollout::PromptGroup pg;
  pg.group_id = "g";
  pg.prompt = {1, 4, 7};
  pg.k = 4;
  pg.seed = 3;
  ASSERT_TRUE(engine->submit(pg).ok());
  auto groups = engine->run().value();
  for (auto& t : groups[0].trajectories) t.reward = 0;
  groups[0].trajectories[0].reward = 1;
  TrainerOptions o;
  o.vocab_limit = 30;
  auto same = Trainer::create(model::clone_policy(*policy), o).value()->step(groups);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_LT(same->at("mismatch/k3"), 1e-8);
  // Scoring over the whole padded vocabulary would disagree with the sampler.
  o.vocab_limit = 0;
  auto full = Trainer::create(model::clone_policy(*policy), o).value()->step(groups);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_GT(full->at("mismatch/logprob_abs_diff_max"), 1e-2);
}

TEST(TrainerTest, ActivationCheckpointingGivesTheSameUpdate) {
  model::Policy initial = make_policy(3);
  auto groups = sample_groups(initial, 1.0);
  TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.micro_batch_tokens = 40;
  model::Policy a = model::clone_policy(*initial), b = model::clone_policy(*initial);
  auto ma = Trainer::create(a, o).value()->step(groups);
  o.activation_checkpointing = true;
  auto mb = Trainer::create(b, o).value()->step(groups);
  ASSERT_TRUE(ma.ok()) << ma.status();
  ASSERT_TRUE(mb.ok()) << mb.status();
  EXPECT_NEAR(ma->at("grad_norm"), mb->at("grad_norm"), 1e-6 * ma->at("grad_norm"));
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(relay::testing::AllClose(item.value(), pb[item.key()], 1e-6)) << item.key();
  }
}

// Groups whose rows differ in length (prompts of 1, 12, 2 and 14 tokens),
// sampled by `policy` (routing recorded for an MoE one), with a learning
// signal. Each half of the batch (groups 0-1, 2-3) mixes short and long
// rows, so two short rows pack into one of the long one's length.
std::vector<rollout::TrajectoryGroup> sample_uneven_groups(model::Policy& policy) {
  std::vector<std::vector<int64_t>> prompts;
  for (int g = 0; g < 4; ++g) {
    const int prompt_len = std::vector<int>{1, 12, 2, 14}[static_cast<size_t>(g)];
    prompts.emplace_back();
    for (int t = 0; t < prompt_len; ++t) prompts.back().push_back(1 + (3 * t + g) % 20);
  }
  return sample_first_rewarded(policy, prompts, 3, 50);
}

// trainer.pack_sequences: the same step as padded rows, through the
// pre-update pass, the reference's pass, the entropy bonus and two
// mini-batches, with one micro-batch or several (the budget then counts
// real tokens, so the split differs; token-mean losses do not depend on it).
TEST(TrainerTest, PackedSequencesGiveThePaddedStep) {
  model::Policy initial = make_policy(3);
  auto groups = sample_uneven_groups(initial);
  // Both mini-batches (the halves) pack, and so do their micro-batches of
  // at most 40 real tokens.
  const TrainBatch batch = build_batch(groups, {}).value();
  const int64_t B = batch.size();
  for (int64_t half = 0; half < 2; ++half) {
    std::vector<int64_t> rows(static_cast<size_t>(B / 2));
    std::iota(rows.begin(), rows.end(), half * B / 2);
    const TrainBatch mini = select_rows(batch, rows);
    ASSERT_LT(pack_rows(mini, mini.input_ids.size(1), 0).input_ids.size(0), mini.size())
        << "nothing to pack in mini-batch " << half;
    int64_t saved = 0;
    for (const auto& part : split_by_token_budget(mini, 40, TokenBudget::kReal)) {
      const TrainBatch micro = select_rows(mini, part);
      saved += micro.size() - pack_rows(micro, micro.input_ids.size(1), 0).input_ids.size(0);
    }
    ASSERT_GT(saved, 0) << "nothing to pack in mini-batch " << half << "'s micro-batches";
  }
  for (int64_t budget : {4096, 40}) {
    TrainerOptions o;
    o.optimizer.lr = 1e-2;
    o.micro_batch_tokens = budget;
    o.mini_batches = 2;
    o.kl_coef = 0.05;
    o.entropy.coef = 0.01;
    // Another split sums the gradients in another order; a larger eps keeps
    // AdamW from magnifying that rounding for gradients near zero.
    o.optimizer.eps = 1e-3;
    model::Policy a = model::clone_policy(*initial), b = model::clone_policy(*initial);
    auto padded = Trainer::create(a, o).value()->step(groups);
    o.pack_sequences = true;
    auto packed = Trainer::create(b, o).value()->step(groups);
    ASSERT_TRUE(padded.ok()) << padded.status();
    ASSERT_TRUE(packed.ok()) << packed.status();
    for (const auto& [k, v] : *padded) {
      if (std::isnan(v) || k.rfind("time", 0) == 0 || k.rfind("memory/", 0) == 0) continue;
      ASSERT_TRUE(packed->count(k)) << k;
      EXPECT_NEAR(packed->at(k), v, 1e-5 * std::max(1.0, std::abs(v)))
          << "budget " << budget << " metric " << k;
    }
    // The same micro-batches (budget 4096) give the same sums to fp32
    // rounding; other micro-batches (40: the padded path fits 2 rows of 20
    // tokens, the packed one 40 real tokens) add the gradients in another
    // order.
    const double atol = budget == 4096 ? 1e-6 : 1e-5;
    auto pa = a->named_parameters(), pb = b->named_parameters();
    for (const auto& item : pa) {
      EXPECT_TRUE(relay::testing::AllClose(item.value(), pb[item.key()], atol))
          << "budget " << budget << " " << item.key();
    }
  }
}

// MoE with router replay: packed rows carry each row's recorded experts to
// its new place, and the routing mismatch is counted per row as before.
TEST(TrainerTest, PackedSequencesKeepRouterReplay) {
  model::Policy engine_policy(MoeConfig());
  model::init_weights(*engine_policy, 5, 0.4);
  auto groups = sample_uneven_groups(engine_policy);
  ASSERT_FALSE(groups[0].trajectories[0].routed_experts.empty());
  const model::Policy drifted = with_drifted_routers(engine_policy);
  TrainerOptions o;
  o.optimizer.lr = 1e-3;
  o.router_replay = RouterReplay::kReplay;
  auto padded = Trainer::create(model::clone_policy(*drifted), o).value()->step(groups);
  o.pack_sequences = true;
  auto packed = Trainer::create(model::clone_policy(*drifted), o).value()->step(groups);
  ASSERT_TRUE(padded.ok()) << padded.status();
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_GT(padded->at("router/mismatch_token_fraction"), 0.0);
  for (const char* k : {"router/mismatch_token_fraction", "router/mismatch_layer_fraction",
                        "mismatch/k3", "grad_norm", "loss"}) {
    EXPECT_NEAR(packed->at(k), padded->at(k), 1e-5 * std::max(1.0, std::abs(padded->at(k)))) << k;
  }
}

// ---- On-policy distillation (trainer.distill).

// The student's groups with every reward equal (GRPO's advantages are 0,
// so the teacher is the only signal), scored by `teacher`.
std::vector<rollout::TrajectoryGroup> distill_groups(model::Policy& student,
                                                     model::Policy& teacher) {
  auto groups = sample_groups(student, 1.0);
  for (auto& g : groups) {
    for (auto& t : g.trajectories) t.reward = 1.0;
  }
  rollout::Teacher scorer(model::clone_policy(*teacher).ptr(), 7, {});
  EXPECT_TRUE(scorer.score(groups).ok());
  return groups;
}

// Mean |log pi(x_t) - log q(x_t)| over the groups' response tokens, by the
// two models' scoring passes.
double mean_gap(model::Policy& student, model::Policy& teacher,
                const std::vector<rollout::TrajectoryGroup>& groups) {
  torch::NoGradGuard no_grad;
  double sum = 0, n = 0;
  for (const auto& g : groups) {
    for (const auto& t : g.trajectories) {
      std::vector<int64_t> seq = t.prompt_tokens;
      seq.insert(seq.end(), t.response_tokens.begin(), t.response_tokens.end());
      const at::Tensor ids = torch::tensor(seq).view({1, -1});
      const at::Tensor s = student->score(ids)[0], q = teacher->score(ids)[0];
      const auto P = static_cast<int64_t>(t.prompt_tokens.size());
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        const int64_t pos = P - 1 + static_cast<int64_t>(j);
        sum += std::fabs(s[pos].item<double>() - q[pos].item<double>());
        ++n;
      }
    }
  }
  return sum / n;
}

// Mean over the groups' response tokens of f(behavior, teacher).
double token_mean(const std::vector<rollout::TrajectoryGroup>& groups,
                  const std::function<double(double, double)>& f) {
  double sum = 0, n = 0;
  for (const auto& g : groups) {
    for (const auto& t : g.trajectories) {
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        sum += f(t.behavior_logprobs[j], t.teacher_logprobs[j]);
        ++n;
      }
    }
  }
  return sum / n;
}

TrainerOptions distill_options(DistillMode mode) {
  TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.max_staleness = -1;  // the same groups again
  o.distill.mode = mode;
  o.distill.coef = 1.0;
  return o;
}

// Advantage mode (Thinking Machines): with rewards that teach nothing, the
// advantages are -(behavior - teacher) per token, and steps on the batch
// pull the student's log-prob of each sampled token towards the teacher's.
TEST(TrainerTest, DistillAdvantagesPullTheStudentTowardsTheTeacher) {
  model::Policy student = make_policy(31);
  model::Policy teacher = make_policy(32);
  auto groups = distill_groups(student, teacher);
  const double gap_before = mean_gap(student, teacher, groups);
  auto trainer = Trainer::create(student, distill_options(DistillMode::kAdvantage)).value();
  auto first = trainer->step(groups);
  ASSERT_TRUE(first.ok()) << first.status();
  const double reverse_kl = token_mean(groups, [](double b, double q) { return b - q; });
  EXPECT_NEAR(first->at("distill/reverse_kl"), reverse_kl, 1e-5);
  EXPECT_NEAR(first->at("distill/advantage_mean"), -reverse_kl, 1e-5);
  EXPECT_NEAR(first->at("advantages/mean"), -reverse_kl, 1e-5);
  EXPECT_NEAR(first->at("distill/teacher_logprob"),
              token_mean(groups, [](double, double q) { return q; }), 1e-5);
  EXPECT_FALSE(first->count("distill/loss"));
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(trainer->step(groups).ok());
  EXPECT_LT(mean_gap(student, teacher, groups), 0.8 * gap_before);
}

// Loss mode: coef x token-mean of k2 = 0.5 (log pi - log q)^2, whose
// gradient alone (the advantages are 0) closes the gap the same way.
TEST(TrainerTest, DistillLossAddsTheTeacherKlToTheLoss) {
  model::Policy student = make_policy(33);
  model::Policy teacher = make_policy(34);
  auto groups = distill_groups(student, teacher);
  const double gap_before = mean_gap(student, teacher, groups);
  auto trainer = Trainer::create(student, distill_options(DistillMode::kLoss)).value();
  auto first = trainer->step(groups);
  ASSERT_TRUE(first.ok()) << first.status();
  // The student before its first update is the behavior policy.
  EXPECT_NEAR(first->at("distill/loss"),
              token_mean(groups, [](double b, double q) { return 0.5 * (b - q) * (b - q); }), 1e-4);
  EXPECT_NEAR(first->at("advantages/mean"), 0.0, 1e-7);
  EXPECT_FALSE(first->count("distill/advantage_mean"));
  EXPECT_NEAR(first->at("loss"), first->at("pg_loss") + first->at("distill/loss"), 1e-5);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(trainer->step(groups).ok());
  EXPECT_LT(mean_gap(student, teacher, groups), 0.8 * gap_before);
}

// A group the teacher did not score cannot be distilled: the step is refused
// before anything changes, naming the group.
TEST(TrainerTest, DistillRefusesGroupsWithoutTeacherLogprobs) {
  model::Policy student = make_policy(35);
  model::Policy teacher = make_policy(36);
  auto groups = distill_groups(student, teacher);
  groups[1].trajectories[2].teacher_logprobs.clear();
  auto trainer = Trainer::create(student, distill_options(DistillMode::kAdvantage)).value();
  const at::Tensor before = flat_params(*student);
  auto m = trainer->step(groups);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(m.status().message());
  EXPECT_NE(msg.find("group '" + groups[1].group_id + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("teacher log-prob of response token 0"), std::string::npos) << msg;
  EXPECT_EQ(trainer->version(), 0);
  EXPECT_TRUE(torch::equal(before, flat_params(*student)));
}

}  // namespace
}  // namespace relay::trainer
