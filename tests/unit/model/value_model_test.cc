#include "relay/model/value_model.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "relay/model/safetensors.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

namespace fs = std::filesystem;
using relay::testing::AllClose;
using relay::testing::TinyConfig;

class ValueModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::path(::testing::TempDir()) /
        ("value_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  std::string Dir(const std::string& name) { return (root_ / name).string(); }
  // A policy checkpoint of `config`, weights from `seed`.
  std::string PolicyDir(const PolicyConfig& config, uint64_t seed = 1) {
    Policy p(config);
    init_weights(*p, seed);
    const std::string dir = Dir("policy");
    EXPECT_TRUE(save_policy(*p, dir, {}).ok());
    return dir;
  }
  static at::Tensor Ids() { return torch::tensor({{1, 5, 9, 2, 7}, {3, 4, 8, 0, 0}}); }
  static at::Tensor Lengths() { return torch::tensor({5, 3}); }
  fs::path root_;
};

// A critic built from a causal LM: its decoder, a fresh head, and values
// that are the head applied to the policy's final hidden states, 0 at padding.
TEST_F(ValueModelTest, FromAPolicyCheckpointValuesAreTheHeadOnItsHiddenStates) {
  for (const std::string type : {"qwen2", "llama"}) {
    SCOPED_TRACE(type);
    SetUp();
    const PolicyConfig config = TinyConfig(type);  // untied: its lm_head is ignored
    const std::string dir = PolicyDir(config);
    StatusOr<Policy> policy = load_policy(dir);
    ASSERT_TRUE(policy.ok()) << policy.status();
    StatusOr<ValueModel> critic = load_value_model(dir, {}, /*seed=*/3);
    ASSERT_TRUE(critic.ok()) << critic.status();
    auto theirs = (*policy)->named_parameters();
    for (const auto& item : (*critic)->named_parameters()) {
      if (item.key().rfind("score.", 0) == 0) continue;
      ASSERT_NE(theirs.find(item.key()), nullptr) << item.key();
      EXPECT_TRUE(torch::equal(item.value(), theirs[item.key()])) << item.key();
    }
    EXPECT_EQ((*critic)->named_parameters().find("lm_head.weight"), nullptr);
    EXPECT_EQ((*critic)->score->bias.item<float>(), 0.0f);
    EXPECT_GT((*critic)->score->weight.abs().sum().item<float>(), 0.0f);

    torch::NoGradGuard no_grad;
    const at::Tensor v = (*critic)->values(Ids(), Lengths());
    ASSERT_EQ(v.sizes(), (std::vector<int64_t>{2, 4}));
    const at::Tensor hidden = (*policy)->hidden_states(Ids(), Lengths());
    at::Tensor want =
        torch::matmul(hidden.narrow(1, 0, 4), (*critic)->score->weight.t()).squeeze(-1) +
        (*critic)->score->bias;
    want[1][2] = 0;  // row 1 has 3 tokens: positions 0 and 1 score tokens 1 and 2
    want[1][3] = 0;
    EXPECT_TRUE(AllClose(v, want, 1e-6)) << v << want;
    EXPECT_EQ(v.scalar_type(), torch::kFloat32);
  }
}

TEST_F(ValueModelTest, SavedCriticLoadsBackWithItsHeadAsATokenClassifier) {
  const std::string dir = PolicyDir(TinyConfig("qwen2"));
  ValueModel critic = load_value_model(dir, {}, /*seed=*/3).value();
  {
    torch::NoGradGuard no_grad;
    critic->score->bias.fill_(0.25);
  }
  const std::string saved = Dir("critic");
  ASSERT_TRUE(save_value_model(*critic, saved).ok());
  std::ifstream in(saved + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["architectures"][0], "Qwen2ForTokenClassification");
  EXPECT_EQ(config["num_labels"], 1);
  EXPECT_EQ(config["model_type"], "qwen2");
  auto tensors = CheckpointTensors::open(saved);
  ASSERT_TRUE(tensors.ok());
  EXPECT_TRUE(tensors->contains("score.weight"));
  EXPECT_TRUE(tensors->contains("score.bias"));
  EXPECT_FALSE(tensors->contains("lm_head.weight"));
  // Another seed does not replace a head the directory has.
  ValueModel back = load_value_model(saved, {}, /*seed=*/99).value();
  auto theirs = back->named_parameters();
  for (const auto& item : critic->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), theirs[item.key()])) << item.key();
  }
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(critic->values(Ids(), Lengths()), back->values(Ids(), Lengths())));
  // An existing directory is kept unless overwritten.
  EXPECT_EQ(save_value_model(*critic, saved).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(ValueModelTest, GradientsReachTheHeadAndTheDecoder) {
  ValueModel critic(TinyConfig("qwen2"));
  init_value_head(*critic, 1);
  for (auto& item : critic->model->named_parameters()) {
    torch::NoGradGuard no_grad;
    item.value().normal_(0, 0.05);
  }
  critic->values(Ids(), Lengths()).pow(2).sum().backward();
  EXPECT_GT(critic->score->weight.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_GT(critic->score->bias.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_GT(critic->model->embed_tokens->weight.grad().abs().sum().item<float>(), 0.0f);
}

// Two sequences laid end to end in one row give each its own values.
TEST_F(ValueModelTest, PackedRowsGiveTheValuesOfEachSequence) {
  ValueModel critic = load_value_model(PolicyDir(TinyConfig("qwen2")), {}, 3).value();
  torch::NoGradGuard no_grad;
  const at::Tensor single = critic->values(Ids(), Lengths());
  const at::Tensor packed_ids = torch::tensor({{1, 5, 9, 2, 7, 3, 4, 8}});
  const at::Tensor starts = torch::tensor({{0, 0, 0, 0, 0, 5, 5, 5}});
  const at::Tensor packed = critic->values(packed_ids, torch::tensor({8}), starts);
  EXPECT_TRUE(AllClose(packed.narrow(1, 0, 4), single.narrow(0, 0, 1), 1e-5));
  EXPECT_EQ(packed[0][4].item<float>(), 0.0f);  // the first sequence's last token
  EXPECT_TRUE(AllClose(packed.narrow(1, 5, 2), single.narrow(0, 1, 1).narrow(1, 0, 2), 1e-5));
}

TEST_F(ValueModelTest, ErrorsNameTheDirectoryAndTheTensor) {
  EXPECT_EQ(load_value_model(Dir("nowhere")).status().code(), absl::StatusCode::kNotFound);
  const std::string dir = PolicyDir(TinyConfig("qwen2"));
  auto tensors = CheckpointTensors::open(dir);
  ASSERT_TRUE(tensors.ok());
  // The policy's tensors plus `extra`, in a directory of their own.
  int n = 0;
  auto load_with = [&](std::vector<std::pair<std::string, at::Tensor>> extra) {
    std::vector<std::pair<std::string, at::Tensor>> all;
    for (const std::string& name : tensors->names()) all.emplace_back(name, *tensors->tensor(name));
    for (auto& e : extra) all.push_back(std::move(e));
    const std::string out = Dir("case" + std::to_string(n++));
    fs::create_directories(out);
    fs::copy_file(dir + "/config.json", out + "/config.json");
    EXPECT_TRUE(write_checkpoint_tensors(out, all).ok());
    return std::string(load_value_model(out).status().message());
  };
  // A head of two labels does not fit a critic.
  EXPECT_NE(load_with({{"score.weight", torch::zeros({2, 32})}})
                .find("tensor 'score.weight' has shape [2, 32], config.json implies [1, 32]"),
            std::string::npos);
  EXPECT_NE(
      load_with({{"score.weight", torch::zeros({1, 32})}, {"classifier.weight", torch::zeros({2})}})
          .find("tensors a qwen2 critic does not have: classifier.weight"),
      std::string::npos);
  // A reward model's head (no bias) loads; its bias stays 0.
  EXPECT_EQ(load_with({{"score.weight", torch::full({1, 32}, 0.5f)}}), "");
}

}  // namespace
}  // namespace relay::model
