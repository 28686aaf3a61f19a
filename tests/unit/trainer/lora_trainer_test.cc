// The trainer with LoRA adapters (trainer.lora): only the adapters change,
// the base model is the KL reference, and a rollout engine that receives
// only the adapters of each version samples exactly what the trainer scores.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <memory>

#include "relay/model/lora.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/engine.h"
#include "relay/trainer/trainer.h"
#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::TinyConfig;

model::Policy make_policy() {
  model::Policy p(TinyConfig());
  model::init_weights(*p, 11, 0.3);
  p->eval();
  return p;
}

TrainerOptions lora_options() {
  TrainerOptions o;
  o.optimizer.lr = 2e-2;
  o.max_staleness = 0;
  o.kl_coef = 0.05;  // the reference is the base model
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.targets = {"all-linear"};
  return o;
}

// A rollout engine over a copy of `policy` (adapters included), at version 0.
std::unique_ptr<rollout::Engine> engine_for(const model::PolicyImpl& policy) {
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  return rollout::Engine::create(model::clone_policy(policy), eo, 0, 1).value();
}

// Three groups of four from `engine` at its current version, with rewards
// that give every group a learning signal.
std::vector<rollout::TrajectoryGroup> sample(rollout::Engine& engine, int round) {
  for (int g = 0; g < 3; ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(round) + "-" + std::to_string(g);
    pg.prompt = {1, 3 + g, 7};
    pg.k = 4;
    pg.seed = 100 * round + g;
    EXPECT_TRUE(engine.submit(pg).ok());
  }
  auto groups = engine.run().value();
  for (auto& g : groups) {
    for (auto& t : g.trajectories) {
      t.reward = std::count(t.response_tokens.begin(), t.response_tokens.end(), 5) > 0 ? 1.0 : 0.0;
    }
    g.trajectories[0].reward = 1.0;
    g.trajectories[1].reward = 0.0;
  }
  return groups;
}

std::map<std::string, at::Tensor> snapshot(const model::PolicyImpl& p) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : p.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

TEST(LoraTrainerTest, AdaptersTrainTheBaseStaysAndTheEngineAgreesAtEveryVersion) {
  model::Policy policy = make_policy();
  const auto base_before = snapshot(*policy);
  auto trainer = Trainer::create(policy, lora_options()).value();
  ASSERT_TRUE(model::has_lora(*policy));

  // The engine's copy starts with the same adapters; each version then
  // brings only the adapters (and the base's digest).
  auto engine = engine_for(*policy);
  std::optional<uint64_t> base_digest;
  int64_t adapter_bytes = 0, full_bytes = 0;
  for (const auto& item : policy->named_parameters()) {
    full_bytes += item.value().numel() * item.value().element_size();
  }
  for (int round = 0; round < 4; ++round) {
    auto groups = sample(*engine, round);
    StatusOr<StepMetrics> m = trainer->step(groups);
    ASSERT_TRUE(m.ok()) << m.status().message();
    // Same version, same weights: the behavior log-probs are the trainer's.
    EXPECT_LT(m->at("mismatch/k3"), 1e-6) << "round " << round;
    EXPECT_EQ(m->at("memory/reference_gb"), 0.0);  // no second copy
    if (round == 0) {
      EXPECT_EQ(m->at("kl_ref"), 0.0);  // B = 0: the policy is its base
    } else {
      EXPECT_GT(m->at("kl_ref"), 0.0);
    }
    auto published = model::published_weights(*policy, &base_digest).value();
    adapter_bytes = 0;
    for (const auto& [name, t] : published) adapter_bytes += t.numel() * t.element_size();
    const model::WeightManifest manifest =
        model::weight_manifest(published, trainer->version()).value();
    ASSERT_TRUE(engine->update_weights(trainer->version(), manifest.digest, published).ok());
  }
  // Only adapters moved; every base tensor is bit-identical.
  const auto after = snapshot(*policy);
  int changed = 0;
  for (const auto& [name, t] : after) {
    if (name.find(".lora_") != std::string::npos) {
      changed += !torch::equal(t, base_before.count(name) ? base_before.at(name) : t);
      continue;
    }
    EXPECT_TRUE(torch::equal(t, base_before.at(name))) << name;
  }
  const std::vector<std::string> adapters = model::adapter_names(*policy);
  double moved = 0;
  for (const std::string& name : adapters) {
    if (name.find("lora_B") != std::string::npos)
      moved += after.at(name).abs().sum().item<double>();
  }
  EXPECT_GT(moved, 0) << "the adapters never trained";
  EXPECT_LT(adapter_bytes * 4, full_bytes) << "a version should carry far less than the model";
  std::printf("LoRA on the tiny model: a version carries %lld of %lld bytes\n",
              static_cast<long long>(adapter_bytes), static_cast<long long>(full_bytes));
}

// An fp32 trainer with adapters feeding an engine in bf16 (rollout.dtype):
// the engine converts base and adapters, checks each version's base digest
// against the fp32 base it was created from, and samples from the bf16
// model, whose log-probs the trainer measures as an engine mismatch, small
// but not zero.
TEST(LoraTrainerTest, ABf16EngineTakesTheAdaptersOfAnFp32Trainer) {
  model::Policy policy = make_policy();
  auto trainer = Trainer::create(policy, lora_options()).value();
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  eo.dtype = rollout::EngineDtype::kBFloat16;
  auto created = rollout::Engine::create(model::clone_policy(*policy), eo, 0, 1);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<rollout::Engine> engine = std::move(created).value();
  std::optional<uint64_t> base_digest;
  for (int round = 0; round < 3; ++round) {
    auto groups = sample(*engine, round);
    for (const auto& g : groups) {
      for (const auto& t : g.trajectories) {
        for (int64_t v : t.token_versions) EXPECT_EQ(v, trainer->version()) << "round " << round;
      }
    }
    StatusOr<StepMetrics> m = trainer->step(groups);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_GT(m->at("mismatch/k3"), 1e-9) << "round " << round << ": not a bf16 model's log-probs";
    EXPECT_LT(m->at("mismatch/k3"), 1e-2) << "round " << round;
    auto published = model::published_weights(*policy, &base_digest).value();
    const model::WeightManifest manifest =
        model::weight_manifest(published, trainer->version()).value();
    ASSERT_TRUE(engine->update_weights(trainer->version(), manifest.digest, published).ok());
  }
}

// PPO with a critic under LoRA: the adapters train the policy, the critic
// is a whole model trained beside it from the base's weights, and the base
// stays bit-identical.
TEST(LoraTrainerTest, GaeTrainsAWholeCriticBesideTheAdapters) {
  model::Policy policy = make_policy();
  const auto base_before = snapshot(*policy);
  TrainerOptions o = lora_options();
  o.kl_coef = 0;
  o.max_staleness = -1;  // the same groups again
  o.advantage.estimator = AdvantageEstimator::kGae;
  o.critic.optimizer.lr = 1e-2;
  o.critic.loss.clip_range = 10;
  auto trainer = Trainer::create(policy, o).value();
  ASSERT_TRUE(model::has_lora(*policy));
  ASSERT_TRUE(trainer->critic());
  EXPECT_TRUE(torch::equal(trainer->critic()->model->embed_tokens->weight,
                           base_before.at("model.embed_tokens.weight")));
  for (const at::Tensor& p : trainer->critic()->parameters()) EXPECT_TRUE(p.requires_grad());
  auto engine = engine_for(*policy);
  const auto groups = sample(*engine, 0);
  std::vector<StepMetrics> m;
  for (int i = 0; i < 6; ++i) {
    StatusOr<StepMetrics> step = trainer->step(groups);
    ASSERT_TRUE(step.ok()) << step.status().message();
    m.push_back(*step);
  }
  EXPECT_LT(m.back().at("critic/vf_loss"), 0.5 * m.front().at("critic/vf_loss"));
  EXPECT_GT(m.front().at("memory/critic_weights_gb"), m.front().at("memory/trainable_weights_gb"));
  for (const auto& [name, t] : snapshot(*policy)) {
    if (name.find(".lora_") == std::string::npos) {
      EXPECT_TRUE(torch::equal(t, base_before.at(name))) << name;
    }
  }
  double moved = 0;
  for (const std::string& name : model::adapter_names(*policy)) {
    if (name.find("lora_B") != std::string::npos) {
      moved += snapshot(*policy).at(name).abs().sum().item<double>();
    }
  }
  EXPECT_GT(moved, 0) << "the adapters never trained";
  EXPECT_FALSE(torch::equal(trainer->critic()->model->embed_tokens->weight,
                            base_before.at("model.embed_tokens.weight")));
}

TEST(LoraTrainerTest, TheOptimizerHoldsStateForTheAdaptersOnly) {
  model::Policy policy = make_policy();
  TrainerOptions o = lora_options();
  o.kl_coef = 0;
  auto trainer = Trainer::create(policy, o).value();
  auto engine = engine_for(*policy);
  StatusOr<StepMetrics> m = trainer->step(sample(*engine, 0));
  ASSERT_TRUE(m.ok()) << m.status().message();
  double adapter_gb = 0;
  for (const auto& item : policy->named_parameters()) {
    if (item.value().requires_grad()) {
      adapter_gb += static_cast<double>(item.value().numel() * 4) / (1ull << 30);
    }
  }
  EXPECT_NEAR(m->at("memory/trainable_weights_gb"), adapter_gb, 1e-12);
  EXPECT_NEAR(m->at("memory/optimizer_gb"), 2 * adapter_gb, 1e-12);  // two AdamW moments
  EXPECT_LT(m->at("memory/trainable_weights_gb"), m->at("memory/weights_gb") / 4);
}

// bf16 weights: the adapters are bf16 like the base, and only they get fp32
// master copies (4 bytes each) and moments; the frozen bf16 base stays put.
TEST(LoraTrainerTest, Bf16WeightsKeepFp32MastersOfTheAdaptersOnly) {
  model::Policy policy = make_policy();
  policy->to(torch::kBFloat16);
  const auto base_before = snapshot(*policy);
  TrainerOptions o = lora_options();
  o.kl_coef = 0;
  auto trainer = Trainer::create(policy, o).value();
  auto engine = engine_for(*policy);
  StatusOr<StepMetrics> m = trainer->step(sample(*engine, 0));
  ASSERT_TRUE(m.ok()) << m.status().message();
  double adapter_params = 0;
  for (const auto& item : policy->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
    if (item.value().requires_grad()) {
      adapter_params += static_cast<double>(item.value().numel());
    } else {
      EXPECT_TRUE(torch::equal(item.value(), base_before.at(item.key()))) << item.key();
    }
  }
  constexpr double kGiB = 1ull << 30;
  EXPECT_NEAR(m->at("memory/master_weights_gb"), adapter_params * 4 / kGiB, 1e-12);
  EXPECT_NEAR(m->at("memory/optimizer_gb"), adapter_params * 8 / kGiB, 1e-12);
  double moved = 0;
  for (const std::string& name : model::adapter_names(*policy)) {
    if (name.find("lora_B") != std::string::npos) {
      moved += policy->named_parameters()[name].to(torch::kFloat32).abs().sum().item<double>();
    }
  }
  EXPECT_GT(moved, 0) << "the bf16 adapters never trained";
}

TEST(LoraTrainerTest, APolicyWithOtherAdaptersIsRefused) {
  model::Policy policy = make_policy();
  model::LoraConfig other;
  other.rank = 2;
  ASSERT_TRUE(model::attach_lora(*policy, other, 0).ok());
  StatusOr<std::unique_ptr<Trainer>> t = Trainer::create(policy, lora_options());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("trainer.lora"), std::string::npos)
      << t.status().message();
  TrainerOptions none = lora_options();
  none.lora.rank = 0;
  t = Trainer::create(policy, none);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("trainer.lora.rank is 0"), std::string::npos)
      << t.status().message();
}

TEST(LoraTrainerTest, DropoutWithActivationCheckpointingIsRefusedByName) {
  TrainerOptions o = lora_options();
  o.lora.dropout = 0.1;
  o.activation_checkpointing = true;
  const Status s = validate(o);
  EXPECT_NE(std::string(s.message()).find("trainer.lora.dropout"), std::string::npos) << s;
  o.activation_checkpointing = false;
  EXPECT_TRUE(validate(o).ok());
}

}  // namespace
}  // namespace relay::trainer
