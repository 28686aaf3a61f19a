// What a failed Trainer::step leaves behind (trainer.h): before the first
// optimizer update, exactly the trainer it started from; after one, a broken
// trainer that refuses every later step and checkpoint.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>

#include "relay/rollout/engine.h"
#include "relay/trainer/trainer.h"
#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

model::Policy make_policy(uint64_t seed) {
  model::Policy p(relay::testing::TinyConfig());
  model::init_weights(*p, seed, 0.3);
  p->eval();
  return p;
}

// Three groups of four engine samples (12 batch rows, in group order), each
// group with a learning signal.
std::vector<rollout::TrajectoryGroup> sample_groups(const model::Policy& policy) {
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  auto engine = rollout::Engine::create(model::clone_policy(*policy), eo, 0, 1).value();
  for (int g = 0; g < 3; ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(g);
    pg.prompt = {1, 3 + g, 7};
    pg.k = 4;
    pg.seed = 20 + g;
    EXPECT_TRUE(engine->submit(pg).ok());
  }
  auto groups = engine->run().value();
  std::sort(groups.begin(), groups.end(),
            [](const auto& a, const auto& b) { return a.group_id < b.group_id; });
  for (auto& g : groups) {
    for (size_t i = 0; i < g.trajectories.size(); ++i) g.trajectories[i].reward = i % 2;
  }
  return groups;
}

// Two mini-batches per step (rows 0-5, then 6-11) and no pre-update pass
// (bypass), so each mini-batch's forward pass is the first to see its rows.
// The tests train the same groups in several steps: no staleness bound.
TrainerOptions two_updates() {
  TrainerOptions o;
  o.max_staleness = -1;
  o.optimizer.lr = 1e-2;
  o.mini_batches = 2;
  o.rollout_correction.bypass = true;
  return o;
}

// `groups` with a token id past the embedding table in `group`'s first
// trajectory: nothing checks it before the forward pass, which throws.
std::vector<rollout::TrajectoryGroup> with_bad_token(std::vector<rollout::TrajectoryGroup> groups,
                                                     size_t group) {
  groups.at(group).trajectories.at(0).response_tokens.at(0) = 1 << 30;
  return groups;
}

std::vector<at::Tensor> copy_parameters(const model::Policy& policy) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : policy->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same_parameters(const std::vector<at::Tensor>& a, const model::Policy& policy) {
  const std::vector<at::Tensor> b = policy->parameters();
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

// Every entry of a save_state() archive (the optimizer's moments and step
// counts included), by path; values other than tensors as their text. The
// archive's bytes themselves differ from one save to the next.
void flatten(torch::serialize::InputArchive& archive, const std::string& prefix,
             std::map<std::string, at::Tensor>& tensors, std::map<std::string, std::string>& rest) {
  for (const std::string& key : archive.keys()) {
    const std::string path = prefix + key;
    torch::serialize::InputArchive sub;
    at::Tensor t;
    c10::IValue v;
    if (archive.try_read(key, sub)) {
      flatten(sub, path + "/", tensors, rest);
    } else if (archive.try_read(key, t)) {
      tensors[path] = t;
    } else if (archive.try_read(key, v)) {
      std::ostringstream text;
      text << v;
      rest[path] = text.str();
    }
  }
}

struct SavedState {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> rest;
};

// LibTorch keys the optimizer's state by the address of each parameter's
// tensor: named by the parameter's index instead, two trainers compare.
SavedState by_index(const SavedState& s) {
  const std::string params = "optimizer/param_groups/param_groups/0/params/";
  std::map<std::string, std::string> index;  // address -> index
  for (const auto& [key, value] : s.rest) {
    if (key.rfind(params, 0) == 0) index[value] = key.substr(params.size());
  }
  auto rename = [&](const std::string& key) {
    const std::string state = "optimizer/state/";
    if (key.rfind(state, 0) != 0) return key;
    const size_t end = key.find('/', state.size());
    const std::string address = key.substr(state.size(), end - state.size());
    return state + "param" + index.at(address) + key.substr(end);
  };
  SavedState out;
  for (const auto& [key, t] : s.tensors) out.tensors[rename(key)] = t;
  for (const auto& [key, value] : s.rest) {
    if (key.rfind(params, 0) != 0) out.rest[rename(key)] = value;
  }
  return out;
}

SavedState saved_state(const Trainer& trainer) {
  StatusOr<std::string> bytes = trainer.save_state();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  SavedState s;
  if (!bytes.ok()) return s;
  std::istringstream in(*bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  flatten(archive, "", s.tensors, s.rest);
  return by_index(s);
}

void expect_same_state(const SavedState& a, const SavedState& b) {
  ASSERT_GT(a.tensors.size(), 2u) << "the version, the step count and the moments";
  EXPECT_EQ(a.rest, b.rest);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [key, t] : a.tensors) {
    ASSERT_EQ(b.tensors.count(key), 1u) << key;
    EXPECT_TRUE(torch::equal(t, b.tensors.at(key))) << key;
  }
}

// A failure in the second mini-batch, after the first one's update: the step
// says so (Aborted, with the counts), and the trainer refuses to step, to
// warm-start or to write its half-updated state from then on.
TEST(TrainerFailureTest, AFailureAfterAnUpdateBreaksTheTrainer) {
  model::Policy policy = make_policy(2);
  const auto groups = sample_groups(policy);
  auto trainer = Trainer::create(policy, two_updates()).value();
  const std::vector<at::Tensor> before = copy_parameters(policy);

  auto failed = trainer->step(with_bad_token(groups, 2));  // row 8: the second mini-batch
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kAborted) << failed.status();
  const std::string message(failed.status().message());
  EXPECT_NE(message.find("index out of range"), std::string::npos) << message;
  EXPECT_NE(message.find("after 1 of 2 optimizer updates"), std::string::npos) << message;
  EXPECT_NE(message.find("resume from the last checkpoint"), std::string::npos) << message;
  EXPECT_FALSE(same_parameters(before, policy)) << "the first mini-batch's update is in";
  EXPECT_EQ(trainer->version(), 0);
  EXPECT_FALSE(policy->is_training()) << "the mode the step found";
  EXPECT_TRUE(trainer->step_faults().empty()) << "no group is to blame";

  const std::vector<at::Tensor> half_updated = copy_parameters(policy);
  auto again = trainer->step(groups);
  EXPECT_EQ(again.status(), failed.status());
  auto sft = trainer->sft_step(groups);
  EXPECT_EQ(sft.status(), failed.status());
  auto state = trainer->save_state();
  EXPECT_EQ(state.status(), failed.status());
  EXPECT_EQ(trainer->restore_state("", "x"), failed.status());
  EXPECT_TRUE(same_parameters(half_updated, policy)) << "refused calls change nothing";
  EXPECT_EQ(trainer->version(), 0);
}

// The same with PPO epochs and an error found without an exception: a
// learning rate so large that the first epoch's update overflows the weights,
// so the second epoch's gradient norm is not finite.
TEST(TrainerFailureTest, ANonFiniteGradientInALaterEpochBreaksTheTrainer) {
  model::Policy policy = make_policy(3);
  const auto groups = sample_groups(policy);
  TrainerOptions o;
  o.ppo_epochs = 2;
  o.optimizer.lr = 1e30;
  auto trainer = Trainer::create(policy, o).value();
  auto failed = trainer->step(groups);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kAborted) << failed.status();
  const std::string message(failed.status().message());
  EXPECT_NE(message.find("gradient norm is nan"), std::string::npos) << message;
  EXPECT_NE(message.find("after 1 of 2 optimizer updates"), std::string::npos) << message;
  EXPECT_FALSE(policy->is_training());
  EXPECT_EQ(trainer->step(groups).status(), failed.status());
  EXPECT_EQ(trainer->save_state().status(), failed.status());
}

// A failure before the first update (here an exception in the first
// mini-batch's forward pass, with the policy in training mode) leaves the
// parameters, the optimizer's state, the version and the policy's mode as
// they were: the next step is the one a trainer that never failed takes.
TEST(TrainerFailureTest, AFailureBeforeTheFirstUpdateChangesNothing) {
  model::Policy initial = make_policy(4);
  const auto groups = sample_groups(initial);
  model::Policy a = model::clone_policy(*initial), b = model::clone_policy(*initial);
  auto failing = Trainer::create(a, two_updates()).value();
  auto clean = Trainer::create(b, two_updates()).value();
  ASSERT_TRUE(failing->step(groups).ok());  // AdamW's moments exist now
  ASSERT_TRUE(clean->step(groups).ok());

  const std::vector<at::Tensor> params = copy_parameters(a);
  const SavedState state = saved_state(*failing);
  for (const bool training : {false, true}) {
    a->train(training);
    auto failed = failing->step(with_bad_token(groups, 0));  // row 0: the first mini-batch
    ASSERT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
    EXPECT_EQ(a->is_training(), training);
    EXPECT_TRUE(same_parameters(params, a));
    expect_same_state(state, saved_state(*failing));
    EXPECT_EQ(failing->version(), 1);
  }
  a->eval();

  auto m = failing->step(groups);
  auto want = clean->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(failing->version(), 2);
  EXPECT_EQ(m->at("loss"), want->at("loss"));
  EXPECT_EQ(m->at("grad_norm"), want->at("grad_norm"));
  EXPECT_TRUE(same_parameters(copy_parameters(b), a)) << "the same update as without the failure";
  expect_same_state(saved_state(*clean), saved_state(*failing));
}

}  // namespace
}  // namespace relay::trainer
