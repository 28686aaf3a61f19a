#include "relay/trainer/options.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "relay/common/config.h"

namespace relay::trainer {
namespace {

TEST(TrainerOptionsTest, DefaultsMapToTrainerDefaults) {
  StatusOr<TrainerOptions> got = trainer_options(ExperimentConfig{});
  ASSERT_TRUE(got.ok()) << got.status();
  const TrainerOptions want;
  EXPECT_EQ(got->advantage.estimator, want.advantage.estimator);
  EXPECT_EQ(got->advantage.norm_by_std, want.advantage.norm_by_std);
  EXPECT_EQ(got->advantage.std_scale, want.advantage.std_scale);
  EXPECT_EQ(got->advantage.epsilon, want.advantage.epsilon);
  EXPECT_EQ(got->advantage.gamma, want.advantage.gamma);
  EXPECT_EQ(got->advantage.lambda, want.advantage.lambda);
  EXPECT_EQ(got->advantage.prefix_reward_weight_alpha, want.advantage.prefix_reward_weight_alpha);
  EXPECT_EQ(got->advantage.prefix_reward_weight_beta, want.advantage.prefix_reward_weight_beta);
  EXPECT_EQ(got->loss.kind, want.loss.kind);
  EXPECT_EQ(got->proximal, want.proximal);
  EXPECT_EQ(got->loss.ppo.clip_low, want.loss.ppo.clip_low);
  EXPECT_EQ(got->loss.ppo.clip_high, want.loss.ppo.clip_high);
  EXPECT_EQ(got->loss.ppo.clip_c, want.loss.ppo.clip_c);
  EXPECT_EQ(got->loss.ppo.clip_delta, want.loss.ppo.clip_delta);
  EXPECT_EQ(got->loss.ppo.log_ratio_clamp, want.loss.ppo.log_ratio_clamp);
  EXPECT_EQ(got->loss.ppo.behav_imp_weight_cap, want.loss.ppo.behav_imp_weight_cap);
  EXPECT_EQ(got->loss.ppo.agg_mode, want.loss.ppo.agg_mode);
  EXPECT_EQ(got->loss_scale_factor, want.loss_scale_factor);
  EXPECT_EQ(got->temperature, want.temperature);
  EXPECT_EQ(got->micro_batch_tokens, want.micro_batch_tokens);
  EXPECT_EQ(got->ppo_epochs, want.ppo_epochs);
  EXPECT_EQ(got->mini_batches, want.mini_batches);
  // The config's 0 (synchronous) is its own default; TrainerOptions' -1 means
  // "no bound", which a config cannot ask for.
  EXPECT_EQ(got->max_staleness, 0);
  EXPECT_EQ(got->allow_missing_logprobs, want.allow_missing_logprobs);
  EXPECT_EQ(got->drop_equal_reward_groups, want.drop_equal_reward_groups);
  EXPECT_EQ(got->mask_truncated, want.mask_truncated);
  EXPECT_EQ(got->kl_coef, want.kl_coef);
  EXPECT_EQ(got->kl_estimator, want.kl_estimator);
  EXPECT_EQ(got->sft_coef, want.sft_coef);
  EXPECT_EQ(got->optimizer.lr, want.optimizer.lr);
  EXPECT_EQ(got->optimizer.weight_decay, want.optimizer.weight_decay);
  EXPECT_EQ(got->optimizer.beta1, want.optimizer.beta1);
  EXPECT_EQ(got->optimizer.beta2, want.optimizer.beta2);
  EXPECT_EQ(got->optimizer.eps, want.optimizer.eps);
  EXPECT_EQ(got->optimizer.max_grad_norm, want.optimizer.max_grad_norm);
  EXPECT_EQ(got->optimizer.schedule, want.optimizer.schedule);
  EXPECT_EQ(got->optimizer.warmup_steps, want.optimizer.warmup_steps);
  EXPECT_EQ(got->optimizer.total_steps, want.optimizer.total_steps);
  EXPECT_EQ(got->optimizer.min_lr_ratio, want.optimizer.min_lr_ratio);
  EXPECT_EQ(got->optimizer.fp32_master_weights, want.optimizer.fp32_master_weights);
  EXPECT_EQ(got->pad_token_id, want.pad_token_id);
  EXPECT_EQ(got->max_reuse, want.max_reuse);
  EXPECT_EQ(got->entropy.coef, want.entropy.coef);
  EXPECT_EQ(got->entropy.target, want.entropy.target);
  EXPECT_EQ(got->reward_kl.controller.kl_coef, want.reward_kl.controller.kl_coef);
  EXPECT_EQ(got->reward_kl.controller.type, want.reward_kl.controller.type);
  EXPECT_EQ(got->reward_kl.estimator, want.reward_kl.estimator);
  EXPECT_FALSE(got->needs_reference());
  // Each loss's defaults are the loss functions' defaults.
  const PolicyLossOptions defaults;
  EXPECT_EQ(got->loss.gspo.clip_low, defaults.gspo.clip_low);
  EXPECT_EQ(got->loss.gspo.clip_high, defaults.gspo.clip_high);
  EXPECT_EQ(got->loss.gmpo.clip_low, defaults.gmpo.clip_low);
  EXPECT_EQ(got->loss.cispo.clip_high, defaults.cispo.clip_high);
  EXPECT_EQ(got->loss.sapo.tau_pos, defaults.sapo.tau_pos);
  EXPECT_EQ(got->loss.sapo.tau_neg, defaults.sapo.tau_neg);
  EXPECT_EQ(got->loss.clip_cov.clip_cov_ratio, defaults.clip_cov.clip_cov_ratio);
  EXPECT_EQ(got->loss.clip_cov.clip_cov_lb, defaults.clip_cov.clip_cov_lb);
  EXPECT_EQ(got->loss.clip_cov.clip_cov_ub, defaults.clip_cov.clip_cov_ub);
  EXPECT_EQ(got->loss.kl_cov.kl_cov_ratio, defaults.kl_cov.kl_cov_ratio);
  EXPECT_EQ(got->loss.kl_cov.ppo_kl_coef, defaults.kl_cov.ppo_kl_coef);
  EXPECT_EQ(got->loss.luffy.shaping, defaults.luffy.shaping);
  EXPECT_EQ(got->loss.luffy.gamma, defaults.luffy.gamma);
  EXPECT_EQ(got->loss.luffy.off_max_clip, defaults.luffy.off_max_clip);
  EXPECT_EQ(got->loss.luffy.on_policy_shaping, defaults.luffy.on_policy_shaping);
}

TEST(TrainerOptionsTest, EveryFieldMaps) {
  ExperimentConfig config;
  config.rollout.temperature = 0.7;
  TrainerConfig& t = config.trainer;
  t.max_staleness = 3;
  t.lr = 2e-6;
  t.loss = "decoupled_ppo";
  t.proximal = "loglinear";
  t.micro_batch_tokens = 1024;
  t.ppo_epochs = 2;
  t.mini_batches = 4;
  t.allow_missing_logprobs = true;
  t.drop_equal_reward_groups = true;
  t.mask_truncated = true;
  t.kl_coef = 0.01;
  t.kl_estimator = "low_var_kl+";
  t.sft_coef = 0.5;
  t.loss_scale_factor = 512;
  t.advantage.estimator = "grpo_split";
  t.advantage.norm_by_std = false;
  t.advantage.std_scale = "batch";
  t.advantage.epsilon = 1e-4;
  t.advantage.gamma = 0.99;
  t.advantage.lambda = 0.95;
  t.advantage.prefix_reward_weight_alpha = 0.5;
  t.advantage.prefix_reward_weight_beta = 2.0;
  t.ppo.clip_low = 0.1;
  t.ppo.clip_high = 0.28;
  t.ppo.clip_c = 5.0;
  t.ppo.clip_delta = 4.0;
  t.ppo.log_ratio_clamp = 10.0;
  t.ppo.behav_imp_weight_cap = 5.0;
  t.ppo.agg_mode = "seq-mean-token-sum-norm";
  t.optimizer.weight_decay = 0.01;
  t.optimizer.beta1 = 0.8;
  t.optimizer.beta2 = 0.95;
  t.optimizer.eps = 1e-6;
  t.optimizer.max_grad_norm = 0.5;
  t.optimizer.schedule = "cosine";
  t.optimizer.warmup_steps = 10;
  t.optimizer.total_steps = 100;
  t.optimizer.min_lr_ratio = 0.1;
  t.optimizer.fp32_master_weights = false;
  t.max_reuse = 2;
  t.gspo = {1e-3, 2e-3};
  t.gmpo = {0.3, 0.5};
  t.cispo = {0.9, 4.0};
  t.sapo = {0.5, 2.0};
  t.clip_cov = {1e-3, 0.5, 4.0};
  t.kl_cov = {1e-3, 2.0};
  t.luffy.off_policy_reshape = "p_div_p_0.3";
  t.luffy.reshape_weight = 0.2;
  t.luffy.reshape_pow_exp = 0.7;
  t.luffy.off_max_clip = 0.9;
  t.luffy.off_min_clip = 0.05;
  t.luffy.clip_upper_bound = 2.0;
  t.luffy.loss_remove_clip = true;
  t.luffy.on_policy_reshape = "pow";
  t.luffy.on_reshape_weight = 0.4;
  t.luffy.on_reshape_pow_exp = 0.25;
  t.entropy = {1e-3, 0.5, 2e-4, 5e-3};
  t.reward_kl.coef = 0.05;
  t.reward_kl.controller = "adaptive";
  t.reward_kl.target_kl = 0.2;
  t.reward_kl.horizon = 500;
  t.reward_kl.estimator = "k3";
  ASSERT_TRUE(validate(config).ok()) << validate(config);

  StatusOr<TrainerOptions> o = trainer_options(config);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->temperature, 0.7);
  EXPECT_EQ(o->max_staleness, 3);
  EXPECT_EQ(o->optimizer.lr, 2e-6);
  EXPECT_EQ(o->loss.kind, PolicyLossKind::kDecoupledPpo);
  EXPECT_EQ(o->proximal, ProximalSource::kLoglinear);
  EXPECT_EQ(o->micro_batch_tokens, 1024);
  EXPECT_EQ(o->ppo_epochs, 2);
  EXPECT_EQ(o->mini_batches, 4);
  EXPECT_TRUE(o->allow_missing_logprobs);
  EXPECT_TRUE(o->drop_equal_reward_groups);
  EXPECT_TRUE(o->mask_truncated);
  EXPECT_EQ(o->kl_coef, 0.01);
  EXPECT_EQ(o->kl_estimator, KlEstimator::kK3Plus);
  EXPECT_EQ(o->sft_coef, 0.5);
  EXPECT_EQ(o->loss_scale_factor, 512);
  EXPECT_EQ(o->advantage.estimator, AdvantageEstimator::kGrpoSplit);
  EXPECT_FALSE(o->advantage.norm_by_std);
  EXPECT_EQ(o->advantage.std_scale, StdScale::kBatch);
  EXPECT_EQ(o->advantage.epsilon, 1e-4);
  EXPECT_EQ(o->advantage.gamma, 0.99);
  EXPECT_EQ(o->advantage.lambda, 0.95);
  EXPECT_EQ(o->advantage.prefix_reward_weight_alpha, 0.5);
  EXPECT_EQ(o->advantage.prefix_reward_weight_beta, 2.0);
  EXPECT_EQ(o->loss.ppo.clip_low, 0.1);
  EXPECT_EQ(o->loss.ppo.clip_high, 0.28);
  EXPECT_EQ(o->loss.ppo.clip_c, 5.0);
  EXPECT_EQ(o->loss.ppo.clip_delta, 4.0);
  EXPECT_EQ(o->loss.ppo.log_ratio_clamp, 10.0);
  EXPECT_EQ(o->loss.ppo.behav_imp_weight_cap, 5.0);
  EXPECT_EQ(o->loss.ppo.agg_mode, LossAggMode::kSeqMeanTokenSumNorm);
  EXPECT_EQ(o->optimizer.weight_decay, 0.01);
  EXPECT_EQ(o->optimizer.beta1, 0.8);
  EXPECT_EQ(o->optimizer.beta2, 0.95);
  EXPECT_EQ(o->optimizer.eps, 1e-6);
  EXPECT_EQ(o->optimizer.max_grad_norm, 0.5);
  EXPECT_EQ(o->optimizer.schedule, LrSchedule::kCosine);
  EXPECT_EQ(o->optimizer.warmup_steps, 10);
  EXPECT_EQ(o->optimizer.total_steps, 100);
  EXPECT_EQ(o->optimizer.min_lr_ratio, 0.1);
  EXPECT_FALSE(o->optimizer.fp32_master_weights);
  EXPECT_EQ(o->max_reuse, 2);
  EXPECT_EQ(o->loss.gspo.clip_low, 1e-3);
  EXPECT_EQ(o->loss.gspo.clip_high, 2e-3);
  EXPECT_EQ(o->loss.gmpo.clip_low, 0.3);
  EXPECT_EQ(o->loss.gmpo.clip_high, 0.5);
  EXPECT_EQ(o->loss.cispo.clip_low, 0.9);
  EXPECT_EQ(o->loss.cispo.clip_high, 4.0);
  EXPECT_EQ(o->loss.cispo.agg_mode, LossAggMode::kSeqMeanTokenSumNorm);
  EXPECT_EQ(o->loss.sapo.tau_pos, 0.5);
  EXPECT_EQ(o->loss.sapo.tau_neg, 2.0);
  EXPECT_EQ(o->loss.clip_cov.clip_cov_ratio, 1e-3);
  EXPECT_EQ(o->loss.clip_cov.clip_cov_lb, 0.5);
  EXPECT_EQ(o->loss.clip_cov.clip_cov_ub, 4.0);
  EXPECT_EQ(o->loss.clip_cov.clip_low, 0.1) << "clip_cov clips with trainer.ppo's range";
  EXPECT_EQ(o->loss.kl_cov.kl_cov_ratio, 1e-3);
  EXPECT_EQ(o->loss.kl_cov.ppo_kl_coef, 2.0);
  EXPECT_EQ(o->loss.luffy.shaping, OffPolicyShaping::kPDivP);
  EXPECT_EQ(o->loss.luffy.gamma, 0.3) << "p_div_p_0.3 names its gamma";
  EXPECT_EQ(o->loss.luffy.shaping_weight, 0.2);
  EXPECT_EQ(o->loss.luffy.pow_exponent, 0.7);
  EXPECT_EQ(o->loss.luffy.off_max_clip, 0.9);
  EXPECT_EQ(o->loss.luffy.off_min_clip, 0.05);
  EXPECT_EQ(o->loss.luffy.clip_upper_bound, 2.0);
  EXPECT_TRUE(o->loss.luffy.loss_remove_clip);
  EXPECT_EQ(o->loss.luffy.on_policy_shaping, OffPolicyShaping::kPow);
  EXPECT_EQ(o->loss.luffy.on_policy_shaping_weight, 0.4);
  EXPECT_EQ(o->loss.luffy.on_policy_pow_exponent, 0.25);
  EXPECT_EQ(o->loss.luffy.on_policy_gamma, 0.1)
      << "trainer.luffy.gamma; the on-policy name has none";
  EXPECT_EQ(o->loss.luffy.on_policy.clip_high, 0.28);
  EXPECT_EQ(o->loss.luffy.on_policy.clip_c, 0) << "LUFFY has no dual clip";
  EXPECT_EQ(o->entropy.coef, 1e-3);
  EXPECT_EQ(o->entropy.target, 0.5);
  EXPECT_EQ(o->entropy.delta, 2e-4);
  EXPECT_EQ(o->entropy.max_coef, 5e-3);
  EXPECT_EQ(o->reward_kl.controller.kl_coef, 0.05);
  EXPECT_EQ(o->reward_kl.controller.type, KlControllerType::kAdaptive);
  EXPECT_EQ(o->reward_kl.controller.target_kl, 0.2);
  EXPECT_EQ(o->reward_kl.controller.horizon, 500);
  EXPECT_EQ(o->reward_kl.estimator, KlEstimator::kK3);
  EXPECT_TRUE(o->needs_reference());
}

TEST(TrainerOptionsTest, EnumNamesMapThroughTheTrainerParsers) {
  ExperimentConfig config;
  config.trainer.optimizer.schedule = "linear_warmup";
  config.trainer.proximal = "recompute";
  config.trainer.kl_estimator = "mse";
  config.trainer.advantage.estimator = "reinforce_plus_plus_baseline";
  config.trainer.advantage.std_scale = "none";
  config.trainer.ppo.agg_mode = "seq-mean-token-mean";
  StatusOr<TrainerOptions> o = trainer_options(config);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->optimizer.schedule, LrSchedule::kLinearWarmup);
  EXPECT_EQ(o->proximal, ProximalSource::kRecompute);
  EXPECT_EQ(o->kl_estimator, KlEstimator::kK2);
  EXPECT_EQ(o->advantage.estimator, AdvantageEstimator::kReinforcePlusPlusBaseline);
  EXPECT_EQ(o->advantage.std_scale, StdScale::kNone);
  EXPECT_EQ(o->loss.ppo.agg_mode, LossAggMode::kSeqMeanTokenMean);
}

TEST(TrainerOptionsTest, BadEnumNamesNameThePath) {
  struct Case {
    const char* path;
    std::function<void(TrainerConfig&)> change;
  };
  const Case cases[] = {
      {"trainer.loss: ", [](TrainerConfig& t) { t.loss = "grpo"; }},
      {"trainer.proximal: ", [](TrainerConfig& t) { t.proximal = "behavior"; }},
      {"trainer.kl_estimator: ", [](TrainerConfig& t) { t.kl_estimator = "k4"; }},
      {"trainer.advantage.estimator: ", [](TrainerConfig& t) { t.advantage.estimator = "ppo"; }},
      {"trainer.advantage.std_scale: ", [](TrainerConfig& t) { t.advantage.std_scale = "all"; }},
      {"trainer.ppo.agg_mode: ", [](TrainerConfig& t) { t.ppo.agg_mode = "sum"; }},
      {"trainer.optimizer.schedule: ", [](TrainerConfig& t) { t.optimizer.schedule = "step"; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    ExperimentConfig config;
    c.change(config.trainer);
    StatusOr<TrainerOptions> o = trainer_options(config);
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(o.status().message());
    EXPECT_EQ(message.rfind(c.path, 0), 0u) << message;
  }
}

TEST(TrainerOptionsTest, ValidatorAndParsersAgreeOnEnumNames) {
  // Every name the config validator accepts must parse (config.cc lists them
  // without the trainer library).
  for (const char* name : {"k1", "abs", "k2", "k3", "k1+", "abs+", "k3+", "kl", "mse", "low_var_kl",
                           "kl+", "mse+", "k2+", "low_var_kl+"}) {
    ExperimentConfig config;
    config.trainer.kl_estimator = name;
    EXPECT_TRUE(validate(config).ok()) << name;
    EXPECT_TRUE(trainer_options(config).ok()) << name;
  }
  for (const char* name : {"ppo", "decoupled_ppo", "gspo", "gmpo", "cispo", "sapo", "clip_cov",
                           "kl_cov", "gpg", "reinforce", "luffy"}) {
    ExperimentConfig config;
    config.trainer.loss = name;
    EXPECT_TRUE(validate(config).ok()) << name;
    StatusOr<TrainerOptions> o = trainer_options(config);
    ASSERT_TRUE(o.ok()) << name;
    EXPECT_EQ(std::string(policy_loss_kind_name(o->loss.kind)), name);
  }
  for (const char* name : {"p_div_p", "p_div_p_0.1", "p_div_p_0.3", "p_div_p_0.5", "no_reshape",
                           "logp", "p_logp", "square_root", "pow"}) {
    ExperimentConfig config;
    config.trainer.luffy.off_policy_reshape = name;
    EXPECT_TRUE(validate(config).ok()) << name;
    EXPECT_TRUE(trainer_options(config).ok()) << name;
  }
  for (const char* name :
       {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
        "grpo_passk", "grpo_split", "remax", "gae"}) {
    ExperimentConfig config;
    config.trainer.advantage.estimator = name;
    EXPECT_TRUE(validate(config).ok()) << name;
    EXPECT_TRUE(trainer_options(config).ok()) << name;
  }
}

}  // namespace
}  // namespace relay::trainer
