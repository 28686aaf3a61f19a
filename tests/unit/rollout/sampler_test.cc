#include "relay/rollout/sampler.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <vector>

#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::AllClose;

at::Tensor Uniforms(std::vector<double> u) { return torch::tensor(u, torch::kFloat64); }

// log of (probabilities 0.5, 0.25, 0.125, 0.125): easy to reason about by hand.
at::Tensor HandLogits() {
  return torch::log(torch::tensor({{0.5, 0.25, 0.125, 0.125}}, torch::kFloat32));
}

TEST(SamplerTest, CheckNamesTheField) {
  SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(check_options(o, "").message(), "temperature: must be > 0, got 0");
  o = {};
  o.top_k = -1;
  EXPECT_EQ(check_options(o, "").message(), "top_k: must be >= 0, got -1");
  o = {};
  o.top_p = 1.5;
  EXPECT_EQ(check_options(o, "").message(), "top_p: must be in (0, 1], got 1.5");
  EXPECT_TRUE(check_options(SamplingOptions{}, "").ok());
}

// Inverse CDF over [0.5, 0.75, 0.875, 1.0]: u picks the first bucket reaching it.
TEST(SamplerTest, InverseCdfPicksTheBucketOfEachUniform) {
  at::Tensor logits = HandLogits().repeat({4, 1});
  SampleResult r = sample(logits, Uniforms({0.1, 0.6, 0.8, 0.99}), SamplingOptions{});
  EXPECT_TRUE(torch::equal(r.tokens, torch::tensor({0, 1, 2, 3}, torch::kInt64)));
  EXPECT_TRUE(AllClose(r.logprobs, torch::log(torch::tensor({0.5f, 0.25f, 0.125f, 0.125f})), 1e-6));
}

// The recorded log-prob is read from the distribution sampled from: with
// temperature 2 the probabilities are softmax(log p / 2), renormalised.
TEST(SamplerTest, RecordsTheTemperatureScaledLogProb) {
  SamplingOptions o;
  o.temperature = 2.0;
  SampleResult r = sample(HandLogits(), Uniforms({0.01}), o);
  // sqrt(p) normalised: sqrt(.5), sqrt(.25), sqrt(.125) x2
  const double z = std::sqrt(0.5) + std::sqrt(0.25) + 2 * std::sqrt(0.125);
  EXPECT_EQ(r.tokens.item<int64_t>(), 0);
  EXPECT_NEAR(r.logprobs.item<double>(), std::log(std::sqrt(0.5) / z), 1e-6);
}

// Under truncation the recorded value is the renormalised truncated log-prob;
// raw_logprobs keeps the model's temperature-1 untruncated value.
TEST(SamplerTest, TruncationRecordsRenormalisedAndRawLogProbs) {
  SamplingOptions o;
  o.top_k = 2;
  o.record_raw_logprobs = true;
  SampleResult r = sample(HandLogits(), Uniforms({0.9}), o);  // kept: 0.5, 0.25 -> 2/3, 1/3
  EXPECT_EQ(r.tokens.item<int64_t>(), 1);
  EXPECT_NEAR(r.logprobs.item<double>(), std::log(1.0 / 3.0), 1e-6);
  EXPECT_NEAR(r.raw_logprobs.item<double>(), std::log(0.25), 1e-6);

  // top_p 0.7: 0.5 < 0.7 so the second token is needed; mass before the third
  // is 0.75 >= 0.7, so it and the fourth are dropped.
  o = {};
  o.top_p = 0.7;
  at::Tensor logp = sampling_logprobs(HandLogits(), o);
  EXPECT_TRUE(AllClose(logp.exp(), torch::tensor({{2.0f / 3, 1.0f / 3, 0.0f, 0.0f}}), 1e-6));
}

TEST(SamplerTest, NeverSamplesARemovedToken) {
  torch::manual_seed(3);
  at::Tensor logits = torch::randn({64, 50});
  SamplingOptions o;
  o.top_k = 5;
  o.top_p = 0.8;
  SequenceRng rng(1);
  for (int round = 0; round < 20; ++round) {
    std::vector<double> u;
    for (int i = 0; i < 64; ++i) u.push_back(rng.uniform());
    SampleResult r = sample(logits, Uniforms(u), o);
    at::Tensor allowed = sampling_logprobs(logits, o).gather(1, r.tokens.unsqueeze(1));
    ASSERT_TRUE(torch::isfinite(allowed).all().item<bool>());
    ASSERT_TRUE(torch::isfinite(r.logprobs).all().item<bool>());
  }
}

// Empirical frequencies follow exp(recorded logp) (a 4-sigma band).
TEST(SamplerTest, FrequenciesMatchTheRecordedDistribution) {
  SamplingOptions o;
  o.temperature = 0.7;
  at::Tensor logits = HandLogits();
  at::Tensor p = sampling_logprobs(logits, o).exp()[0];
  const int n = 20000;
  SequenceRng rng(42);
  std::vector<double> u(n);
  for (double& x : u) x = rng.uniform();
  SampleResult r = sample(logits.repeat({n, 1}), Uniforms(u), o);
  at::Tensor counts = torch::bincount(r.tokens, {}, 4).to(torch::kFloat64) / n;
  for (int k = 0; k < 4; ++k) {
    const double pk = p[k].item<double>();
    EXPECT_NEAR(counts[k].item<double>(), pk, 4 * std::sqrt(pk * (1 - pk) / n)) << k;
  }
}

// The batched ops, as sample() runs them with the fused CPU path off.
SampleResult batched(const at::Tensor& logits, const at::Tensor& uniforms,
                     const SamplingOptions& o) {
  set_fused_sampler(false);
  SampleResult r = sample(logits, uniforms, o);
  set_fused_sampler(true);
  return r;
}

std::vector<double> draws(int n, uint64_t seed) {
  SequenceRng rng(seed);
  std::vector<double> u(static_cast<size_t>(n));
  for (double& x : u) x = rng.uniform();
  return u;
}

// The fused CPU path (no truncation) picks the batched path's tokens and
// records its log-probs to fp32 rounding, raw ones included, and its
// log-probs are what the trainer's tempered_logprobs computes. Vocabularies
// with a remainder past the eight-lane and 64-token blocks, and Qwen's.
TEST(SamplerTest, FusedPathAgreesWithTheBatchedOps) {
  for (int64_t V : {int64_t{5}, int64_t{1003}, int64_t{151936}}) {
    for (double temperature : {1.0, 0.7, 1.3}) {
      SCOPED_TRACE(::testing::Message() << "V " << V << " temperature " << temperature);
      torch::manual_seed(static_cast<uint64_t>(V));
      const int64_t B = V > 10000 ? 4 : 32;
      const at::Tensor logits = 3 * torch::randn({B, V});
      const at::Tensor u = Uniforms(draws(static_cast<int>(B), 7));
      SamplingOptions o;
      o.temperature = temperature;
      o.record_raw_logprobs = true;
      const SampleResult fused = sample(logits, u, o);
      const SampleResult want = batched(logits, u, o);
      EXPECT_TRUE(torch::equal(fused.tokens, want.tokens));
      // Against log-softmax in fp64: the fused sums (fp32 within a block of
      // 64, fp64 across blocks) stay within 1e-6; the batched log_softmax
      // sums V values in fp32 and drifts to ~4e-5 at Qwen's vocabulary.
      const at::Tensor index = fused.tokens.unsqueeze(1);
      const at::Tensor exact =
          torch::log_softmax(logits.to(torch::kFloat64) / temperature, -1).gather(1, index);
      const at::Tensor exact_raw =
          torch::log_softmax(logits.to(torch::kFloat64), -1).gather(1, index);
      EXPECT_TRUE(AllClose(fused.logprobs.to(torch::kFloat64), exact.squeeze(1), 1e-6));
      EXPECT_TRUE(AllClose(fused.raw_logprobs.to(torch::kFloat64), exact_raw.squeeze(1), 1e-6));
      EXPECT_TRUE(AllClose(fused.logprobs, want.logprobs, V > 10000 ? 1e-4 : 1e-6));
      EXPECT_TRUE(
          AllClose(fused.logprobs, tempered_logprobs(logits, fused.tokens, temperature), 1e-6));
    }
  }
}

// Tokens of zero probability (-inf logits) are never drawn, even by a
// uniform near 0 or 1, and a row with one finite logit always draws it.
TEST(SamplerTest, FusedPathNeverDrawsAMaskedToken) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  at::Tensor logits = torch::randn({4, 40});
  logits.narrow(1, 0, 10).fill_(-kInf);   // the first tokens
  logits.narrow(1, 30, 10).fill_(-kInf);  // the last tokens
  logits[3].fill_(-kInf);
  logits[3][17] = 0.5f;
  for (double u : {1e-12, 0.5, 1 - 1e-12}) {
    const SampleResult r = sample(logits, Uniforms({u, u, u, u}), SamplingOptions{});
    for (int64_t b = 0; b < 4; ++b) {
      const int64_t token = r.tokens[b].item<int64_t>();
      EXPECT_GE(token, 10) << "u " << u;
      EXPECT_LT(token, 30) << "u " << u;
    }
    EXPECT_EQ(r.tokens[3].item<int64_t>(), 17);
    EXPECT_FLOAT_EQ(r.logprobs[3].item<float>(), 0.0f);
    EXPECT_TRUE(torch::isfinite(r.logprobs).all().item<bool>());
  }
}

// A row the fused passes cannot decide (all logits -inf, or a NaN) goes to
// the batched ops, whose answer sample() returns as before.
TEST(SamplerTest, FusedPathLeavesNonFiniteRowsToTheBatchedOps) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  at::Tensor logits = torch::randn({2, 16});
  logits[1][3] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor u = Uniforms({0.3, 0.6});
  const SampleResult r = sample(logits, u, SamplingOptions{});
  const SampleResult want = batched(logits, u, SamplingOptions{});
  EXPECT_TRUE(torch::equal(r.tokens, want.tokens));
  EXPECT_TRUE(torch::isnan(r.logprobs[1]).item<bool>());
  logits[1].fill_(-kInf);
  const SampleResult all_masked = sample(logits, u, SamplingOptions{});
  EXPECT_TRUE(torch::equal(all_masked.tokens, batched(logits, u, SamplingOptions{}).tokens));
}

TEST(SamplerTest, GreedyTakesArgmaxAndRecordsTheModelLogProb) {
  SamplingOptions o;
  o.greedy = true;
  o.temperature = 0.5;  // irrelevant to the argmax; recorded value is temperature 1
  SampleResult r = sample(HandLogits(), Uniforms({0.99}), o);
  EXPECT_EQ(r.tokens.item<int64_t>(), 0);
  EXPECT_NEAR(r.logprobs.item<double>(), std::log(0.5), 1e-6);
}

TEST(SamplerTest, SequenceRngIsReproducibleAndInOpenInterval) {
  SequenceRng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.uniform();
    EXPECT_EQ(x, b.uniform());
    EXPECT_GT(x, 0.0);
    EXPECT_LT(x, 1.0);
    differs = differs || x != c.uniform();
  }
  EXPECT_TRUE(differs);
  EXPECT_NE(sequence_seed(0, 0), sequence_seed(0, 1));
  EXPECT_EQ(sequence_seed(5, 3), sequence_seed(5, 3));
}

}  // namespace
}  // namespace relay::rollout
