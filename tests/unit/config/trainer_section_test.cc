// The `trainer:` section binds straight to relay::trainer::TrainerOptions:
// every key lands in its field, enums go through their NameTables, the
// trainer's own check() supplies the rules (with YAML paths), and the
// resolved config reads back unchanged.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "relay/config/config.h"
#include "relay/trainer/options.h"

namespace relay::trainer {
namespace {

StatusOr<ExperimentConfig> parse(const std::string& yaml) { return parse_config(yaml, "t.yaml"); }

TEST(TrainerSectionTest, DefaultsAreTheTrainersOwn) {
  StatusOr<ExperimentConfig> config = parse("");
  ASSERT_TRUE(config.ok()) << config.status();
  const TrainerOptions& got = config->trainer;
  const TrainerOptions want;
  EXPECT_EQ(got.max_staleness, 0);  // synchronous unless the config says otherwise
  EXPECT_EQ(got.loss.kind, want.loss.kind);
  EXPECT_EQ(got.optimizer.lr, want.optimizer.lr);
  EXPECT_EQ(got.kl_estimator, KlEstimator::kK3);
  EXPECT_EQ(got.reward_kl.estimator, KlEstimator::kK1);
  EXPECT_EQ(got.reward_kl.controller.kl_coef, 0);
  EXPECT_FALSE(got.needs_reference());
  EXPECT_TRUE(validate(got).ok()) << validate(got);
}

TEST(TrainerSectionTest, EveryKeyLandsInItsField) {
  StatusOr<ExperimentConfig> config = parse(R"(
trainer:
  max_staleness: 3
  lr: 2.0e-6
  loss: decoupled_ppo
  proximal: loglinear
  micro_batch_tokens: 1024
  ppo_epochs: 2
  mini_batches: 4
  kl_coef: 0.01
  kl_estimator: low_var_kl+
  world_size: 2
  rendezvous: "10.0.0.1:29500"
  router_replay: replay
  advantage: {estimator: grpo_split, std_scale: batch, gamma: 0.99}
  ppo: {clip_low: 0.1, clip_high: 0.28, agg_mode: seq-mean-token-sum-norm}
  clip_cov: {ratio: 0.001, lb: 0.5, ub: 4.0}
  kl_cov: {ratio: 0.002, coef: 2.0}
  luffy: {off_policy_reshape: p_div_p_0.3, gamma: 0.2, on_policy_reshape: pow}
  reward_kl: {coef: 0.05, controller: adaptive, estimator: mse}
  rollout_correction: {is_level: sequence, is_mode: clip, rs_level: token, rs_criterion: k3, rs_threshold: 0.5}
  optimizer: {schedule: cosine, total_steps: 100, warmup_steps: 10}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  const TrainerOptions& o = config->trainer;
  EXPECT_EQ(o.max_staleness, 3);
  EXPECT_EQ(o.optimizer.lr, 2e-6);
  EXPECT_EQ(o.loss.kind, PolicyLossKind::kDecoupledPpo);
  EXPECT_EQ(o.proximal, ProximalSource::kLoglinear);
  EXPECT_EQ(o.micro_batch_tokens, 1024);
  EXPECT_EQ(o.ppo_epochs, 2);
  EXPECT_EQ(o.mini_batches, 4);
  EXPECT_EQ(o.kl_estimator, KlEstimator::kK3Plus);
  EXPECT_EQ(o.data_parallel.world_size, 2);
  EXPECT_EQ(o.data_parallel.rendezvous, "10.0.0.1:29500");
  EXPECT_EQ(o.router_replay, RouterReplay::kReplay);
  EXPECT_EQ(o.advantage.estimator, AdvantageEstimator::kGrpoSplit);
  EXPECT_EQ(o.advantage.std_scale, StdScale::kBatch);
  EXPECT_EQ(o.advantage.gamma, 0.99);
  EXPECT_EQ(o.loss.ppo.clip_high, 0.28);
  EXPECT_EQ(o.loss.ppo.agg_mode, LossAggMode::kSeqMeanTokenSumNorm);
  EXPECT_EQ(o.loss.clip_cov.clip_cov_ratio, 0.001);
  EXPECT_EQ(o.loss.clip_cov.clip_cov_ub, 4.0);
  EXPECT_EQ(o.loss.kl_cov.ppo_kl_coef, 2.0);
  EXPECT_EQ(o.loss.luffy.shaping, OffPolicyShaping::kPDivP03);
  EXPECT_EQ(p_div_p_gamma(o.loss.luffy.shaping, o.loss.luffy.gamma), 0.3)
      << "LUFFY's p_div_p_0.3 carries its gamma";
  EXPECT_EQ(o.loss.luffy.on_policy_shaping, OffPolicyShaping::kPow);
  EXPECT_EQ(o.reward_kl.controller.kl_coef, 0.05);
  EXPECT_EQ(o.reward_kl.controller.type, KlControllerType::kAdaptive);
  EXPECT_EQ(o.reward_kl.estimator, KlEstimator::kK2);
  EXPECT_EQ(o.rollout_correction.is_level, CorrectionLevel::kSequence);
  EXPECT_EQ(o.rollout_correction.is_mode, IsWeightMode::kClip);
  EXPECT_EQ(o.rollout_correction.rs_criterion, RejectionCriterion::kK3);
  EXPECT_EQ(o.optimizer.schedule, LrSchedule::kCosine);
  EXPECT_EQ(o.optimizer.total_steps, 100);
  EXPECT_TRUE(o.needs_reference());
}

TEST(TrainerSectionTest, PpoSettingsReachTheLossesWithoutKeysOfTheirOwn) {
  StatusOr<ExperimentConfig> config = parse(
      "trainer:\n  ppo: {clip_low: 0.1, clip_high: 0.3, clip_c: 4, agg_mode: "
      "seq-mean-token-mean}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  const PolicyLossOptions& l = config->trainer.loss;
  EXPECT_EQ(l.cispo.agg_mode, LossAggMode::kSeqMeanTokenMean);
  EXPECT_EQ(l.kl_cov.agg_mode, LossAggMode::kSeqMeanTokenMean);
  EXPECT_EQ(l.clip_cov.clip_low, 0.1);
  EXPECT_EQ(l.clip_cov.clip_high, 0.3);
  EXPECT_EQ(l.luffy.on_policy.clip_high, 0.3);
  EXPECT_EQ(l.luffy.on_policy.clip_c, 0) << "LUFFY has no dual clip";
  EXPECT_EQ(l.sapo.agg_mode, LossAggMode::kSeqMeanTokenMean) << "SAPO fixes its own";
}

TEST(TrainerSectionTest, UnknownEnumNamesListTheKnownOnesWithTheLine) {
  struct Case {
    std::string yaml, want;
  };
  const std::vector<Case> cases = {
      {"trainer:\n  loss: dapo\n",
       "t.yaml:2: trainer.loss: must be one of ppo, decoupled_ppo, gspo, gmpo, cispo, sapo, "
       "clip_cov, kl_cov, gpg, reinforce, luffy, got 'dapo'"},
      {"trainer:\n  advantage:\n    estimator: ppo\n", "t.yaml:3: trainer.advantage.estimator:"},
      {"trainer:\n  kl_estimator: k4\n", "t.yaml:2: trainer.kl_estimator: must be one of k1,"},
      {"trainer:\n  luffy:\n    off_policy_reshape: p_div_q\n",
       "t.yaml:3: trainer.luffy.off_policy_reshape: must be one of p_div_p, p_div_p_0.1,"},
      {"trainer:\n  optimizer: {schedule: step}\n", "t.yaml:2: trainer.optimizer.schedule:"},
      {"trainer:\n  loss: [ppo]\n", "t.yaml:2: trainer.loss: expected one of ppo,"},
  };
  for (const Case& c : cases) {
    StatusOr<ExperimentConfig> config = parse(c.yaml);
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_EQ(std::string(config.status().message()).rfind(c.want, 0), 0u)
        << config.status().message();
  }
}

TEST(TrainerSectionTest, TheTrainersRulesReportYamlPathsOnce) {
  StatusOr<ExperimentConfig> config = parse(
      "trainer:\n  ppo_epochs: 0\n  ppo: {clip_low: 2}\n  clip_cov: {lb: 6}\n"
      "  rollout_correction: {rs_level: token, rs_criterion: k1, rs_threshold_lower: 0.5}\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "t.yaml: trainer.ppo_epochs: must be >= 1, got 0\n"
            "t.yaml: trainer.ppo.clip_low: must be in [0, 1), got 2\n"
            "t.yaml: trainer.clip_cov.lb: must be < trainer.clip_cov.ub (5), got 6\n"
            "t.yaml: trainer.rollout_correction.rs_threshold_lower: must be 0 (rs_criterion k1 "
            "has no lower bound), got 0.5");
  // Trainer::create runs the same check on options built in code.
  TrainerOptions o;
  o.ppo_epochs = 0;
  EXPECT_EQ(validate(o).message(), "trainer.ppo_epochs: must be >= 1, got 0");
}

TEST(TrainerSectionTest, ResolvedConfigReadsBackUnchanged) {
  StatusOr<ExperimentConfig> config = parse(
      "trainer:\n  loss: luffy\n  kl_estimator: low_var_kl\n  luffy: {on_policy_reshape: "
      "p_div_p_0.5}\n  router_replay: replay\n");
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string yaml = to_yaml(*config);
  EXPECT_NE(yaml.find("kl_estimator: k3"), std::string::npos) << "canonical name";
  StatusOr<ExperimentConfig> again = parse(yaml);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(to_yaml(*again), yaml);
  EXPECT_EQ(again->trainer.loss.luffy.on_policy_shaping, OffPolicyShaping::kPDivP05);
}

TEST(TrainerSectionTest, EveryEnumValueHasAName) {
  for (const auto& e : kPolicyLossNames.entries()) {
    EXPECT_EQ(*kPolicyLossNames.parse(kPolicyLossNames.name(e.value)), e.value);
  }
  for (const auto& e : kKlEstimatorNames.entries()) {
    EXPECT_STRNE(kKlEstimatorNames.name(e.value), "?");
  }
  EXPECT_STREQ(kAdvantageEstimatorNames.name(AdvantageEstimator::kGae), "gae");
  EXPECT_STREQ(kOffPolicyShapingNames.name(OffPolicyShaping::kPow), "pow");
  EXPECT_STREQ(kRejectionCriterionNames.name(RejectionCriterion::kK3), "k3");
  EXPECT_STREQ(kLrScheduleNames.name(LrSchedule::kLinearWarmup), "linear_warmup");
}

}  // namespace
}  // namespace relay::trainer
