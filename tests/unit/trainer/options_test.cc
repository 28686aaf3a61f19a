// The trainer's option rules (relay/trainer/options.h): each is stated once,
// in check(), and reports the YAML key path under whatever prefix the caller
// gives (the config binding uses "trainer", Trainer::create too).

#include "relay/trainer/options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace relay::trainer {
namespace {

std::string message(const TrainerOptions& o) {
  Status s = validate(o);
  return s.ok() ? "" : std::string(s.message());
}

TEST(TrainerOptionsTest, DefaultsPassAndEveryLossKindsDefaultsToo) {
  EXPECT_EQ(message(TrainerOptions{}), "");
  for (const auto& e : kPolicyLossNames.entries()) {
    TrainerOptions o;
    o.loss.kind = e.value;
    share_ppo_settings(o.loss);
    EXPECT_EQ(message(o), "") << e.name;
  }
}

TEST(TrainerOptionsTest, EachRuleNamesItsKey) {
  struct Case {
    void (*set)(TrainerOptions&);
    const char* want;  // the whole message
  };
  const Case cases[] = {
      {[](TrainerOptions& o) { o.ppo_epochs = 0; }, "trainer.ppo_epochs: must be >= 1, got 0"},
      {[](TrainerOptions& o) { o.max_staleness = -2; },
       "trainer.max_staleness: must be >= -1, got -2"},
      {[](TrainerOptions& o) { o.optimizer.lr = 0; }, "trainer.lr: must be > 0, got 0"},
      {[](TrainerOptions& o) { o.temperature = 0; }, "trainer.temperature: must be > 0, got 0"},
      {[](TrainerOptions& o) { o.data_parallel.world_size = 0; },
       "trainer.world_size: must be >= 1, got 0"},
      {[](TrainerOptions& o) { o.loss.ppo.clip_c = 0.5; },
       "trainer.ppo.clip_c: must be 0 (off) or > 1, got 0.5"},
      {[](TrainerOptions& o) { o.loss.ppo.clip_delta = 1.1; },
       "trainer.ppo.clip_delta: must be 0 (off) or > 1 + trainer.ppo.clip_high (1.2), got 1.1"},
      {[](TrainerOptions& o) { o.loss.gspo.clip_low = 1.5; },
       "trainer.gspo.clip_low: must be in [0, 1), got 1.5"},
      {[](TrainerOptions& o) { o.loss.gmpo.clip_high = -0.1; },
       "trainer.gmpo.clip_high: must be >= 0, got -0.1"},
      {[](TrainerOptions& o) { o.loss.cispo.clip_low = 1.0; },
       "trainer.cispo.clip_low: must be in [0, 1), got 1"},
      {[](TrainerOptions& o) { o.loss.sapo.tau_neg = -1; },
       "trainer.sapo.tau_neg: must be > 0, got -1"},
      {[](TrainerOptions& o) { o.loss.clip_cov.clip_cov_ratio = 0; },
       "trainer.clip_cov.ratio: must be in (0, 1], got 0"},
      {[](TrainerOptions& o) { o.loss.kl_cov.ppo_kl_coef = -1; },
       "trainer.kl_cov.coef: must be >= 0, got -1"},
      {[](TrainerOptions& o) { o.loss.luffy.gamma = 0; },
       "trainer.luffy.gamma: must be > 0, got 0"},
      {[](TrainerOptions& o) {
         o.loss.luffy.off_max_clip = 0.5;
         o.loss.luffy.off_min_clip = 0.6;
       },
       "trainer.luffy.off_min_clip: must be <= trainer.luffy.off_max_clip (0.5), got 0.6"},
      {[](TrainerOptions& o) {
         o.overlong_buffer.length = 16;
         o.max_response_length = 16;
       },
       "trainer.overlong_buffer.length: must be < the response budget (rollout.max_new_tokens, "
       "16), got 16"},
      {[](TrainerOptions& o) {
         o.overlong_buffer.length = 4;
         o.advantage.estimator = AdvantageEstimator::kRemax;
       },
       "trainer.overlong_buffer.length: not with advantage.estimator remax: the greedy "
       "baseline's length is not in the batch, so its reward would go unpenalized, got 4"},
      {[](TrainerOptions& o) { o.critic.warmup_steps = -1; },
       "trainer.critic.warmup_steps: must be >= 0, got -1"},
      {[](TrainerOptions& o) { o.critic.loss.clip_range = 0; },
       "trainer.critic.clip_range: must be > 0, got 0"},
      {[](TrainerOptions& o) { o.critic.optimizer.lr = -1; },
       "trainer.critic.lr: must be > 0, got -1"},
      {[](TrainerOptions& o) { o.distill.coef = -1; },
       "trainer.distill.coef: must be >= 0, got -1"},
      {[](TrainerOptions& o) {
         o.distill.coef = 1;
         o.distill.discount = 1.5;
       },
       "trainer.distill.discount: must be in [0, 1], got 1.5"},
      {[](TrainerOptions& o) { o.advantage.estimator = AdvantageEstimator::kNone; },
       "trainer.advantage.estimator: none gives every token advantage 0: it is for pure "
       "distillation and needs trainer.distill.coef > 0"},
      {[](TrainerOptions& o) {
         o.distill.coef = 1;
         o.drop_equal_reward_groups = true;
       },
       "trainer.drop_equal_reward_groups: must be false with trainer.distill (coef > 0): a "
       "group of equal rewards still carries the teacher's per-token signal"},
      {[](TrainerOptions& o) { o.entropy.coef = -0.1; },
       "trainer.entropy.coef: must be >= 0, got -0.1"},
      {[](TrainerOptions& o) {
         o.entropy.target = 1;
         o.entropy.coef = 0.05;
         o.entropy.max_coef = 0.01;
       },
       "trainer.entropy.max_coef: must be >= trainer.entropy.coef (0.05), got 0.01"},
      {[](TrainerOptions& o) { o.reward_kl.controller.horizon = 0; },
       "trainer.reward_kl.horizon: must be > 0, got 0"},
      {[](TrainerOptions& o) { o.advantage.lambda = -0.1; },
       "trainer.advantage.lambda: must be in [0, 1], got -0.1"},
      {[](TrainerOptions& o) {
         o.optimizer.schedule = LrSchedule::kCosine;
         o.optimizer.total_steps = 0;
       },
       "trainer.optimizer.total_steps: must be >= 1 with schedule 'cosine', got 0"},
  };
  for (const Case& c : cases) {
    TrainerOptions o;
    c.set(o);
    EXPECT_EQ(message(o), c.want);
  }
}

TEST(TrainerOptionsTest, AllProblemsAreReportedNotJustTheFirst) {
  TrainerOptions o;
  o.ppo_epochs = 0;
  o.loss.sapo.tau_pos = 0;
  o.optimizer.beta2 = 1;
  EXPECT_EQ(message(o),
            "trainer.ppo_epochs: must be >= 1, got 0\n"
            "trainer.sapo.tau_pos: must be > 0, got 0\n"
            "trainer.optimizer.beta2: must be in [0, 1), got 1");
}

TEST(TrainerOptionsTest, RolloutCorrectionChecksOnlyWhatItsLevelsUse) {
  auto msg = [](const RolloutCorrectionOptions& o) {
    Status s = check_options(o, "rc");
    return s.ok() ? std::string() : std::string(s.message());
  };
  RolloutCorrectionOptions o;
  o.is_threshold = 0.5;  // unused while is_level is none
  EXPECT_EQ(msg(o), "");
  o.is_level = CorrectionLevel::kToken;
  EXPECT_EQ(msg(o), "rc.is_threshold: must be > 1, got 0.5");
  o.is_threshold = 2;
  o.is_threshold_lower = 0.3;  // truncate has no lower bound
  EXPECT_EQ(msg(o),
            "rc.is_threshold_lower: must be 0 with is_mode truncate (clip uses it), got 0.3");
  o.is_mode = IsWeightMode::kClip;
  EXPECT_EQ(msg(o), "");
  o = RolloutCorrectionOptions{};
  o.rs_level = CorrectionLevel::kSequence;
  o.rs_threshold = 1;
  EXPECT_EQ(msg(o), "rc.rs_threshold: must be > 1, got 1");
  o.rs_criterion = RejectionCriterion::kK3;
  o.rs_threshold = 0.01;
  EXPECT_EQ(msg(o), "");  // a divergence bound may be small
  o = RolloutCorrectionOptions{};
  o.veto_threshold = 1.5;
  EXPECT_EQ(msg(o), "rc.veto_threshold: must be 0 (off) or in (0, 1), got 1.5");
  o = RolloutCorrectionOptions{};
  o.log_clamp = std::nan("");
  EXPECT_EQ(msg(o), "rc.log_clamp: must be > 0, got nan");
}

TEST(TrainerOptionsTest, PpoSettingsAreSharedWithTheLossesThatHaveNoKeysForThem) {
  PolicyLossOptions o;
  o.ppo.clip_low = 0.1;
  o.ppo.clip_high = 0.3;
  o.ppo.clip_c = 5;
  o.ppo.agg_mode = LossAggMode::kSeqMeanTokenSum;
  share_ppo_settings(o);
  EXPECT_EQ(o.cispo.agg_mode, LossAggMode::kSeqMeanTokenSum);
  EXPECT_EQ(o.clip_cov.clip_low, 0.1);
  EXPECT_EQ(o.clip_cov.agg_mode, LossAggMode::kSeqMeanTokenSum);
  EXPECT_EQ(o.kl_cov.agg_mode, LossAggMode::kSeqMeanTokenSum);
  EXPECT_EQ(o.luffy.on_policy.clip_high, 0.3);
  EXPECT_EQ(o.luffy.on_policy.clip_c, 0);
  EXPECT_EQ(o.sapo.agg_mode, LossAggMode::kSeqMeanTokenMean);
}

TEST(TrainerOptionsTest, PDivPGammaComesFromTheNameWhenItHasOne) {
  EXPECT_EQ(p_div_p_gamma(OffPolicyShaping::kPDivP, 0.2), 0.2);
  EXPECT_EQ(p_div_p_gamma(OffPolicyShaping::kPDivP01, 0.2), 0.1);
  EXPECT_EQ(p_div_p_gamma(OffPolicyShaping::kPDivP03, 0.2), 0.3);
  EXPECT_EQ(p_div_p_gamma(OffPolicyShaping::kPDivP05, 0.2), 0.5);
  EXPECT_EQ(*kOffPolicyShapingNames.parse("p_div_p_0.5"), OffPolicyShaping::kPDivP05);
}

TEST(TrainerOptionsTest, LearningRateSchedules) {
  OptimizerOptions o;
  o.lr = 1.0;
  o.schedule = LrSchedule::kCosine;
  o.warmup_steps = 2;
  o.total_steps = 12;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(o, 0), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(o, 2), 1.0);
  EXPECT_NEAR(lr_at(o, 7), 0.1 + 0.9 * 0.5, 1e-12);  // halfway through the decay
  EXPECT_DOUBLE_EQ(lr_at(o, 50), 0.1);
}

}  // namespace
}  // namespace relay::trainer
