#include "relay/rollout/generate.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::TinyConfig;

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    policy_ = model::Policy(TinyConfig());
    model::init_weights(*policy_, 13);
    policy_->eval();
  }
  model::Policy policy_{nullptr};
};

// DESIGN.md invariants 1 and 4 at the model level: each sampled token's
// recorded log-prob (KV-cache path) equals the scoring path's value for
// prompt + response at position P - 1 + j.
TEST_F(GenerateTest, RecordedLogProbsEqualScoringAtShiftedPositions) {
  const std::vector<std::vector<int64_t>> prompts = {{3, 7, 1}, {9, 2, 2, 5, 30, 6}};
  GenerateOptions opts;
  opts.max_new_tokens = 10;
  opts.seed = 5;
  opts.sampling.temperature = 0.8;
  opts.sampling.record_raw_logprobs = true;
  auto result = generate(policy_, prompts, opts);
  ASSERT_TRUE(result.ok()) << result.status();
  torch::NoGradGuard g;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Generation& gen = (*result)[i];
    ASSERT_EQ(gen.tokens.size(), 10u);
    std::vector<int64_t> seq = prompts[i];
    seq.insert(seq.end(), gen.tokens.begin(), gen.tokens.end());
    at::Tensor ids = torch::tensor(seq).view({1, -1});
    model::ScoreOptions at_temperature;
    at_temperature.temperature = 0.8;
    at::Tensor scored = policy_->score(ids, {}, at_temperature)[0];
    at::Tensor raw = policy_->score(ids)[0];
    const int64_t P = static_cast<int64_t>(prompts[i].size());
    for (size_t j = 0; j < gen.tokens.size(); ++j) {
      EXPECT_NEAR(gen.logprobs[j], scored[P - 1 + j].item<float>(), 1e-4) << i << "," << j;
      EXPECT_NEAR(gen.raw_logprobs[j], raw[P - 1 + j].item<float>(), 1e-4) << i << "," << j;
    }
  }
}

// Same seed, same weights -> same tokens, whatever else is in the batch.
TEST_F(GenerateTest, SeededSamplingIsReproducibleAndBatchIndependent) {
  GenerateOptions opts;
  opts.max_new_tokens = 8;
  opts.seed = 99;
  auto alone = generate(policy_, {{4, 4, 1}}, opts);
  auto again = generate(policy_, {{4, 4, 1}}, opts);
  auto batched = generate(policy_, {{4, 4, 1}, {8, 8, 8, 8, 8}}, opts);
  ASSERT_TRUE(alone.ok() && again.ok() && batched.ok());
  EXPECT_EQ((*alone)[0].tokens, (*again)[0].tokens);
  EXPECT_EQ((*alone)[0].tokens, (*batched)[0].tokens);
  opts.seed = 100;
  auto other = generate(policy_, {{4, 4, 1}}, opts);
  EXPECT_NE((*alone)[0].tokens, (*other)[0].tokens);
}

TEST_F(GenerateTest, StopTokenEndsOnlyItsSequence) {
  GenerateOptions opts;
  opts.max_new_tokens = 6;
  opts.sampling.greedy = true;
  auto free_run = generate(policy_, {{5, 6}, {1, 2, 3}}, opts);
  ASSERT_TRUE(free_run.ok());
  // Stop on the token the first sequence produces second.
  const int64_t stop = (*free_run)[0].tokens[1];
  opts.stop_tokens = {stop};
  auto stopped = generate(policy_, {{5, 6}, {1, 2, 3}}, opts);
  ASSERT_TRUE(stopped.ok());
  const Generation& first = (*stopped)[0];
  EXPECT_EQ(first.finish_reason, FinishReason::kStop);
  EXPECT_EQ(first.tokens.back(), stop);
  EXPECT_LE(first.tokens.size(), 2u);
  const auto& other = (*free_run)[1].tokens;
  if (std::find(other.begin(), other.end(), stop) == other.end()) {
    EXPECT_EQ((*stopped)[1].tokens, other);
    EXPECT_EQ((*stopped)[1].finish_reason, FinishReason::kLength);
  }
}

TEST_F(GenerateTest, StopsAtTheModelContext) {
  GenerateOptions opts;
  opts.max_new_tokens = 100;
  opts.sampling.greedy = true;
  std::vector<int64_t> prompt(60, 3);  // max_position_embeddings is 64
  auto r = generate(policy_, {prompt}, opts);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].tokens.size(), 4u);
  EXPECT_EQ((*r)[0].finish_reason, FinishReason::kLength);
}

TEST_F(GenerateTest, BadInputIsAnErrorNamingTheField) {
  GenerateOptions opts;
  auto r = generate(policy_, {{1, 2}, {1, 99}}, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "prompts[1][1]: token id 99 outside the vocabulary [0, 37)");
  r = generate(policy_, {{}}, opts);
  EXPECT_EQ(r.status().message(), "prompts[0]: empty");
  opts.max_new_tokens = 0;
  r = generate(policy_, {{1}}, opts);
  EXPECT_EQ(r.status().message(), "max_new_tokens: must be >= 1, got 0");
  opts.max_new_tokens = 4;
  opts.sampling.top_p = 0;
  r = generate(policy_, {{1}}, opts);
  EXPECT_EQ(r.status().message(), "top_p: must be in (0, 1], got 0");
}

}  // namespace
}  // namespace relay::rollout
