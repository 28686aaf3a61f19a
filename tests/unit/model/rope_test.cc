#include "relay/model/rope.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <vector>

#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

using relay::testing::AllClose;

// Every expected value below is computed here in double from the formulas
// (modeling_rope_utils.py), independently of rope.cc's fp32 operations.

PolicyConfig Config(int64_t head_dim, double theta, int64_t max_pos) {
  PolicyConfig c = relay::testing::TinyConfig();
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.max_position_embeddings = max_pos;
  return c;
}

std::vector<double> Plain(int64_t d, double theta) {
  std::vector<double> f;
  for (int64_t i = 0; i < d; i += 2) f.push_back(1.0 / std::pow(theta, double(i) / double(d)));
  return f;
}

at::Tensor AsTensor(const std::vector<double>& v) {
  return torch::tensor(v, torch::kFloat64).to(torch::kFloat32);
}

TEST(RopeTest, DefaultIsThetaToTheMinusTwoIOverD) {
  const RopeFrequencies f = rope_frequencies(Config(128, 1e6, 4096));
  EXPECT_EQ(f.attention_scaling, 1.0);
  EXPECT_TRUE(AllClose(f.inv_freq, AsTensor(Plain(128, 1e6)), 0, 2e-7));
}

TEST(RopeTest, LinearDividesEveryFrequencyByTheFactor) {
  PolicyConfig c = Config(64, 10000, 2048);
  c.rope_scaling.rope_type = "linear";
  c.rope_scaling.factor = 4;
  std::vector<double> want = Plain(64, 10000);
  for (double& x : want) x /= 4;
  EXPECT_TRUE(AllClose(rope_frequencies(c).inv_freq, AsTensor(want), 0, 2e-7));
}

// Llama 3.1's published settings: factor 8, low 1, high 4, 8192 original.
TEST(RopeTest, Llama3KeepsHighFrequenciesScalesLowOnesAndBlendsBetween) {
  PolicyConfig c = Config(128, 500000, 131072);
  RopeScaling& r = c.rope_scaling;
  r.rope_type = "llama3";
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 8192;
  std::vector<double> want = Plain(128, 500000);
  int kept = 0, scaled = 0, blended = 0;
  for (double& f : want) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 8192.0 / 4) {
      ++kept;
    } else if (wavelen > 8192.0 / 1) {
      f /= 8;
      ++scaled;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      f = (1 - smooth) * f / 8 + smooth * f;
      ++blended;
    }
  }
  // The three regimes all occur at these settings.
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(blended, 0);
  const RopeFrequencies got = rope_frequencies(c);
  EXPECT_TRUE(AllClose(got.inv_freq, AsTensor(want), 0, 1e-6));
  EXPECT_EQ(got.attention_scaling, 1.0);
}

TEST(RopeTest, DynamicIsPlainWithinTheContextAndNtkScaledPastIt) {
  PolicyConfig c = Config(64, 10000, 1024);
  c.rope_scaling.rope_type = "dynamic";
  c.rope_scaling.factor = 2;
  EXPECT_TRUE(AllClose(rope_frequencies(c, 1024).inv_freq, AsTensor(Plain(64, 10000)), 0, 2e-7));
  EXPECT_TRUE(AllClose(rope_frequencies(c, 10).inv_freq, AsTensor(Plain(64, 10000)), 0, 2e-7));
  const double base = 10000 * std::pow(2.0 * 3000 / 1024 - 1, 64.0 / 62.0);
  EXPECT_TRUE(AllClose(rope_frequencies(c, 3000).inv_freq, AsTensor(Plain(64, base)), 0, 2e-6));
}

// YaRN as transformers v5 computes it, with Qwen's long-context settings.
std::vector<double> Yarn(int64_t d, double theta, double factor, double original, double fast,
                         double slow, bool truncate) {
  auto dim_of = [&](double rotations) {
    return d * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = dim_of(fast), high = dim_of(slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(d - 1));
  if (low == high) high += 0.001;
  std::vector<double> out;
  const std::vector<double> plain = Plain(d, theta);
  for (size_t i = 0; i < plain.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1 - ramp;
    out.push_back(plain[i] / factor * (1 - extrapolation) + plain[i] * extrapolation);
  }
  return out;
}

TEST(RopeTest, YarnBlendsInterpolationAndExtrapolationOverTheCorrectionRange) {
  PolicyConfig c = Config(128, 1e6, 131072);
  RopeScaling& r = c.rope_scaling;
  r.rope_type = "yarn";
  r.factor = 4;
  r.original_max_position_embeddings = 32768;
  const RopeFrequencies got = rope_frequencies(c);
  EXPECT_TRUE(AllClose(got.inv_freq, AsTensor(Yarn(128, 1e6, 4, 32768, 32, 1, true)), 0, 1e-6));
  EXPECT_NEAR(got.attention_scaling, 0.1 * std::log(4.0) + 1, 1e-12);
  // The first frequencies are extrapolated (kept), the last interpolated.
  EXPECT_NEAR(got.inv_freq[0].item<float>(), 1.0, 1e-7);
  EXPECT_NEAR(got.inv_freq[63].item<double>(), Plain(128, 1e6)[63] / 4, 1e-12);

  r.truncate = false;
  EXPECT_TRUE(AllClose(rope_frequencies(c).inv_freq,
                       AsTensor(Yarn(128, 1e6, 4, 32768, 32, 1, false)), 0, 1e-6));
  // mscale / mscale_all_dim (DeepSeek style) set the attention factor.
  r.mscale = 1.0;
  r.mscale_all_dim = 0.707;
  EXPECT_NEAR(rope_frequencies(c).attention_scaling,
              (0.1 * std::log(4.0) + 1) / (0.1 * 0.707 * std::log(4.0) + 1), 1e-12);
  r.attention_factor = 1.25;
  EXPECT_EQ(rope_frequencies(c).attention_scaling, 1.25);
}

TEST(RopeTest, AttentionScalingMultipliesTheRotation) {
  torch::manual_seed(0);
  at::Tensor x = torch::randn({1, 2, 3, 8});
  at::Tensor pos = torch::tensor({{0, 4, 9}}, torch::kInt64);
  at::Tensor inv = AsTensor(Plain(8, 10000));
  EXPECT_TRUE(AllClose(apply_rope(x, pos, inv, 1.5), 1.5 * apply_rope(x, pos, inv), 1e-6));
  // Position 0 is the identity, scaled.
  EXPECT_TRUE(
      AllClose(apply_rope(x, torch::zeros({1, 3}, torch::kInt64), inv, 1.5), 1.5 * x, 1e-6));
}

}  // namespace
}  // namespace relay::model
