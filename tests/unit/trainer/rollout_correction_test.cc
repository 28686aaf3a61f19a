#include "relay/trainer/rollout_correction.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::AllClose;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

at::Tensor mat(std::initializer_list<std::initializer_list<float>> rows) {
  std::vector<at::Tensor> out;
  for (const auto& r : rows) out.push_back(torch::tensor(std::vector<float>(r)));
  return torch::stack(out);
}
at::Tensor bmask(std::initializer_list<std::initializer_list<float>> rows) {
  return mat(rows).ne(0);
}
float ln(double x) { return static_cast<float>(std::log(x)); }
// k3 = r - 1 - log r
double k3(double r) { return r - 1 - std::log(r); }

// Behavior log-probs -1 everywhere; old = behav + log r, so the ratio
// pi_old / pi_behav of each token is the r written in the test.
RolloutCorrectionInputs with_ratios(const at::Tensor& log_r, const at::Tensor& mask) {
  RolloutCorrectionInputs in;
  in.behavior_logprobs = torch::full(log_r.sizes(), -1.0f);
  in.old_logprobs = in.behavior_logprobs + log_r;
  in.response_mask = mask;
  return in;
}

RolloutCorrectionResult run(const RolloutCorrectionInputs& in, const RolloutCorrectionOptions& o) {
  StatusOr<RolloutCorrectionResult> r = rollout_correction(in, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : RolloutCorrectionResult{};
}

bool contains(const Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// ------------------------------------------------------------- IS weights

TEST(RolloutCorrectionTest, TokenTisTruncatesAtThreshold) {
  // r = [0.5, 1.5, 3, 4], C = 2: w = min(r, C) = [0.5, 1.5, 2, 2].
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(0.5), ln(1.5), ln(3), ln(4)}}), bmask({{1, 1, 1, 1}}));
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{0.5, 1.5, 2, 2}}), 1e-6));
  EXPECT_EQ(r.weights.scalar_type(), torch::kFloat32);
  EXPECT_FALSE(r.weights.requires_grad());
  EXPECT_TRUE(torch::equal(r.response_mask, in.response_mask));
  const RolloutCorrectionMetrics& m = r.metrics;
  EXPECT_NEAR(m.is_truncated_fraction, 0.5, 1e-12);  // 3 and 4 of 4 tokens
  EXPECT_NEAR(m.is_truncated_fraction_upper, 0.5, 1e-12);
  EXPECT_EQ(m.is_truncated_fraction_lower, 0.0);
  EXPECT_NEAR(m.is_weight_mean, 1.5, 1e-6);  // (0.5 + 1.5 + 2 + 2) / 4
  EXPECT_NEAR(m.is_weight_min, 0.5, 1e-6);
  EXPECT_NEAR(m.is_weight_max, 2.0, 1e-6);
  // ESS = (sum w)^2 / (n sum w^2) = 36 / (4 * 10.5)
  EXPECT_NEAR(m.is_weight_ess, 36.0 / 42.0, 1e-6);
  EXPECT_EQ(m.is_batch_norm_factor, 1.0);
  EXPECT_EQ(m.rejected_token_fraction, 0.0);
}

TEST(RolloutCorrectionTest, SequenceWeightIsProductOfTokenRatios) {
  // w_b = min(exp(sum_j log r_bj), C), C = 2, repeated on the row's tokens:
  //   row 0: 2 * 0.5 * 1.5 = 1.5;  row 1: 1.2 * 1 = 1.2 (third token padding, NaN);
  //   row 2: 2 * 2 * 1 = 4 -> 2 (truncated).
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(2), ln(0.5), ln(1.5)}, {ln(1.2), 0, 0}, {ln(2), ln(2), 0}}),
                  bmask({{1, 1, 1}, {1, 1, 0}, {1, 1, 1}}));
  in.behavior_logprobs[1][2] = kNaN;
  in.old_logprobs[1][2] = kNaN;
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kSequence;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{1.5, 1.5, 1.5}, {1.2, 1.2, 0}, {2, 2, 2}}), 1e-6));
  // Units are sequences: 1 of 3 truncated; mean (1.5 + 1.2 + 2) / 3.
  EXPECT_NEAR(r.metrics.is_truncated_fraction_upper, 1.0 / 3, 1e-12);
  EXPECT_NEAR(r.metrics.is_weight_mean, 4.7 / 3, 1e-6);
  EXPECT_NEAR(r.metrics.is_weight_min, 1.2, 1e-6);
}

TEST(RolloutCorrectionTest, GeometricWeightIsGeoMeanOfTokenRatios) {
  // w_b = min(exp(mean_j log r_bj), C), C = 3:
  //   row 0: (2 * 0.5 * 4)^(1/3) = 4^(1/3) = 1.5874011;  row 1: (4 * 4)^(1/2) = 4 -> 3.
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(2), ln(0.5), ln(4)}, {ln(4), ln(4), 0}}), bmask({{1, 1, 1}, {1, 1, 0}}));
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kGeometric;
  o.is_threshold = 3;
  RolloutCorrectionResult r = run(in, o);
  const float g = static_cast<float>(std::cbrt(4.0));
  EXPECT_TRUE(AllClose(r.weights, mat({{g, g, g}, {3, 3, 0}}), 1e-6));
  EXPECT_NEAR(r.metrics.is_truncated_fraction, 0.5, 1e-12);
}

TEST(RolloutCorrectionTest, ClipModeBandAndFractions) {
  // w = clamp(r, lower, C), C = 2, lower = 1/C = 0.5 by default:
  //   r = [0.25, 0.6, 1, 1.5, 3] -> [0.5, 0.6, 1, 1.5, 2]; 0.25 low, 3 high.
  at::Tensor log_r = mat({{ln(0.25), ln(0.6), ln(1), ln(1.5), ln(3)}});
  RolloutCorrectionInputs in = with_ratios(log_r, bmask({{1, 1, 1, 1, 1}}));
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.is_mode = IsWeightMode::kClip;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{0.5, 0.6, 1, 1.5, 2}}), 1e-6));
  EXPECT_NEAR(r.metrics.is_truncated_fraction_upper, 0.2, 1e-12);
  EXPECT_NEAR(r.metrics.is_truncated_fraction_lower, 0.2, 1e-12);
  EXPECT_NEAR(r.metrics.is_truncated_fraction, 0.4, 1e-12);
  // An explicit lower bound 0.3: [0.3, 0.6, 1, 1.5, 2].
  o.is_threshold_lower = 0.3;
  r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{0.3f, 0.6f, 1, 1.5f, 2}}), 1e-6));
  EXPECT_NEAR(r.metrics.is_truncated_fraction_lower, 0.2, 1e-12);
}

TEST(RolloutCorrectionTest, BatchNormalizationGivesMeanOne) {
  // Token level: truncated w = [0.5, 1, 1.5, 2] (r = 3 -> 2), mean 1.25 -> w / 1.25.
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(0.5), ln(1), 0}, {ln(1.5), ln(3), 0}}), bmask({{1, 1, 0}, {1, 1, 0}}));
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.is_batch_normalize = true;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{0.4, 0.8, 0}, {1.2, 1.6, 0}}), 1e-6));
  EXPECT_NEAR(r.metrics.is_batch_norm_factor, 1.25, 1e-6);
  EXPECT_NEAR(r.weights.sum().item<double>() / r.response_mask.sum().item<double>(), 1.0, 1e-6);
  // Sequence level: the mean runs over sequences, not tokens. Row 0 (3 tokens)
  // w = 1.5, row 1 (1 token) w = 1: mean 1.25 -> 1.2 and 0.8; the token mean
  // (3 * 1.2 + 0.8) / 4 = 1.1 is not 1, the sequence mean is.
  in = with_ratios(mat({{ln(1.5), 0, 0}, {0, 0, 0}}), bmask({{1, 1, 1}, {1, 0, 0}}));
  o.is_level = CorrectionLevel::kSequence;
  r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{1.2, 1.2, 1.2}, {0.8, 0, 0}}), 1e-6));
  EXPECT_NEAR(r.metrics.is_batch_norm_factor, 1.25, 1e-6);
}

// -------------------------------------------------------- rejection, veto

TEST(RolloutCorrectionTest, TokenRejectionByRatio) {
  // Keep 1/C <= r <= C, C = 2: row 0 r = [0.4, 0.6, 1, 1.9, 2.5] loses 0.4 and 2.5;
  // row 1 is inside the band. Tokens 2 of 10, sequences 1 of 2.
  RolloutCorrectionInputs in = with_ratios(
      mat({{ln(0.4), ln(0.6), ln(1), ln(1.9), ln(2.5)}, {ln(1), ln(1.1), ln(0.9), ln(1), ln(1)}}),
      bmask({{1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}}));
  const at::Tensor input_mask = in.response_mask.clone();
  RolloutCorrectionOptions o;
  o.rs_level = CorrectionLevel::kToken;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{0, 1, 1, 1, 0}, {1, 1, 1, 1, 1}})));
  EXPECT_TRUE(torch::equal(in.response_mask, input_mask));  // input untouched
  // No IS: weight 1 on kept tokens, 0 on rejected ones.
  EXPECT_TRUE(AllClose(r.weights, mat({{0, 1, 1, 1, 0}, {1, 1, 1, 1, 1}})));
  EXPECT_NEAR(r.metrics.rs_rejected_token_fraction, 0.2, 1e-12);
  EXPECT_NEAR(r.metrics.rs_rejected_sequence_fraction, 0.5, 1e-12);
  EXPECT_NEAR(r.metrics.rejected_token_fraction, 0.2, 1e-12);
  EXPECT_NEAR(r.metrics.rejected_sequence_fraction, 0.5, 1e-12);
  // An explicit lower bound 0.3 keeps r = 0.4.
  o.rs_threshold_lower = 0.3;
  r = run(in, o);
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}})));
}

// IcePop: M(k) = k inside [0.5, 5], 0 outside. k = [0.3, 0.51, 1.2, 4, 4.9, 6]:
// weights [0, 0.51, 1.2, 4, 4.9, 0], and the two outside leave the mask.
TEST(RolloutCorrectionTest, IcePopWeightsTokensInsideTheBandAndDropsTheRest) {
  RolloutCorrectionInputs in = with_ratios(
      mat({{ln(0.3), ln(0.51), ln(1.2), ln(4), ln(4.9), ln(6)}}), bmask({{1, 1, 1, 1, 1, 1}}));
  const RolloutCorrectionOptions o = icepop_options();
  EXPECT_TRUE(check_options(o, "rollout_correction").ok());
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(AllClose(r.weights, mat({{0, 0.51f, 1.2f, 4, 4.9f, 0}}), 1e-5)) << r.weights;
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{0, 1, 1, 1, 1, 0}})));
  EXPECT_NEAR(r.metrics.rejected_token_fraction, 2.0 / 6.0, 1e-12);
  EXPECT_EQ(r.metrics.is_truncated_fraction, 0.0);  // the band bounds k before truncation
  // Another band: [0.25, 2] keeps 0.3 and drops 4, 4.9 and 6.
  r = run(in, icepop_options(0.25, 2.0));
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{1, 1, 1, 0, 0, 0}})));
  EXPECT_TRUE(AllClose(r.weights, mat({{0.3f, 0.51f, 1.2f, 0, 0, 0}}), 1e-5));
}

TEST(RolloutCorrectionTest, SequenceRejectionByK3) {
  // k3 = r - 1 - log r per token:
  //   row 0 r = [2, 0.5]:   0.3068528 + 0.1931472 = 0.5        (mean 0.25)
  //   row 1 r = [1.1, 0.9]: 0.0046898 + 0.0053605 = 0.0100503  (mean 0.0050252)
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(2), ln(0.5)}, {ln(1.1), ln(0.9)}}), bmask({{1, 1}, {1, 1}}));
  RolloutCorrectionOptions o;
  o.rs_level = CorrectionLevel::kSequence;
  o.rs_criterion = RejectionCriterion::kK3;
  o.rs_threshold = 0.3;  // sequence: sum; 0.5 > 0.3 rejects row 0 whole.
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{0, 0}, {1, 1}})));
  EXPECT_NEAR(r.metrics.rs_rejected_sequence_fraction, 0.5, 1e-12);
  EXPECT_NEAR(r.metrics.rs_rejected_token_fraction, 0.5, 1e-12);
  // Geometric: the mean 0.25 <= 0.3 keeps it.
  o.rs_level = CorrectionLevel::kGeometric;
  r = run(in, o);
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{1, 1}, {1, 1}})));
  // Token level with 0.25: only the r = 2 token (0.307) goes.
  o.rs_level = CorrectionLevel::kToken;
  o.rs_threshold = 0.25;
  r = run(in, o);
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{0, 1}, {1, 1}})));
  // The mismatch diagnostics are over the input mask: (0.5 + 0.0100503) / 4.
  EXPECT_NEAR(r.metrics.all.k3, (k3(2) + k3(0.5) + k3(1.1) + k3(0.9)) / 4, 1e-6);
}

TEST(RolloutCorrectionTest, K1IsSignedAndK2IsSquared) {
  // k1 = -log r: row 0 r = [2, 0.5] sums to 0 and passes any bound at the
  // sequence level; per token |k1| = ln 2 = 0.693 > 0.6 rejects both.
  // k2 = (log r)^2 / 2: row 1 r = [1.1, 1.5]: 0.0045421, 0.0822050.
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(2), ln(0.5)}, {ln(1.1), ln(1.5)}}), bmask({{1, 1}, {1, 1}}));
  RolloutCorrectionOptions o;
  o.rs_level = CorrectionLevel::kSequence;
  o.rs_criterion = RejectionCriterion::kK1;
  o.rs_threshold = 0.6;  // row 1: |-(ln 1.1 + ln 1.5)| = 0.5008 passes
  EXPECT_TRUE(torch::equal(run(in, o).response_mask, bmask({{1, 1}, {1, 1}})));
  o.rs_level = CorrectionLevel::kToken;
  EXPECT_TRUE(torch::equal(run(in, o).response_mask, bmask({{0, 0}, {1, 1}})));
  o.rs_criterion = RejectionCriterion::kK2;
  o.rs_threshold = 0.05;  // k2(2) = 0.2402 and k2(1.5) = 0.0822 go
  EXPECT_TRUE(torch::equal(run(in, o).response_mask, bmask({{0, 0}, {1, 0}})));
}

TEST(RolloutCorrectionTest, VetoRejectsWholeSequence) {
  // veto 1e-3: row 0 has r = 1e-4 < 1e-3 and goes whole; row 1's r = 0.01 does not veto.
  RolloutCorrectionInputs in =
      with_ratios(mat({{0, ln(1e-4), 0}, {0, ln(0.01), 0}}), bmask({{1, 1, 1}, {1, 1, 1}}));
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.veto_threshold = 1e-3;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(torch::equal(r.response_mask, bmask({{0, 0, 0}, {1, 1, 1}})));
  EXPECT_TRUE(AllClose(r.weights, mat({{0, 0, 0}, {1, 0.01f, 1}}), 1e-6));
  EXPECT_NEAR(r.metrics.veto_fraction, 0.5, 1e-12);
  EXPECT_NEAR(r.metrics.catastrophic_token_fraction, 1.0 / 6, 1e-12);
  EXPECT_NEAR(r.metrics.rejected_token_fraction, 0.5, 1e-12);
  EXPECT_NEAR(r.metrics.rejected_sequence_fraction, 0.5, 1e-12);
  EXPECT_EQ(r.metrics.rs_rejected_token_fraction, 0.0);  // the veto is not the rejection test
  // IS metrics cover the kept tokens only: (1 + 0.01 + 1) / 3.
  EXPECT_NEAR(r.metrics.is_weight_mean, 2.01 / 3, 1e-6);
}

TEST(RolloutCorrectionTest, BypassGivesUnitWeightsAndNoRejection) {
  // Ratios that every test would act on; bypass ignores them.
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(0.1), ln(5), 0}, {ln(1e-5), 0, 0}}), bmask({{1, 1, 1}, {1, 1, 0}}));
  RolloutCorrectionOptions o;
  o.bypass = true;
  o.is_level = CorrectionLevel::kSequence;
  o.is_batch_normalize = true;
  o.rs_level = CorrectionLevel::kToken;
  o.veto_threshold = 1e-3;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_TRUE(torch::equal(r.weights, mat({{1, 1, 1}, {1, 1, 0}})));
  EXPECT_TRUE(torch::equal(r.response_mask, in.response_mask));
  EXPECT_TRUE(r.anchor_logprobs.is_same(in.behavior_logprobs));
  EXPECT_EQ(r.metrics.rejected_token_fraction, 0.0);
  EXPECT_EQ(r.metrics.veto_fraction, 0.0);
  EXPECT_EQ(r.metrics.is_weight_mean, 1.0);
  EXPECT_EQ(r.metrics.is_batch_norm_factor, 1.0);
  // old given: the diagnostics still measure the gap (5 masked tokens).
  EXPECT_EQ(r.metrics.all.num_tokens, 5);
  // Without old_logprobs (no recompute pass) it runs too; no diagnostics.
  in.old_logprobs = at::Tensor();
  r = run(in, o);
  EXPECT_TRUE(torch::equal(r.weights, mat({{1, 1, 1}, {1, 1, 0}})));
  EXPECT_EQ(r.metrics.all.num_tokens, 0);
  EXPECT_EQ(r.metrics.all.k3, 0.0);
  // Not bypassed, the anchor is old_logprobs.
  in = with_ratios(mat({{0, 0, 0}, {0, 0, 0}}), bmask({{1, 1, 1}, {1, 1, 0}}));
  EXPECT_TRUE(run(in, RolloutCorrectionOptions{}).anchor_logprobs.is_same(in.old_logprobs));
}

TEST(RolloutCorrectionTest, LogClampKeepsEverythingFinite) {
  // log r = +1000 (row 0) and -1000 (row 1); exp(1000) is inf even in fp64.
  // With log_clamp 20: c = +-20, r = e^+-20.
  RolloutCorrectionInputs in;
  in.old_logprobs = mat({{0}, {-1000}});
  in.behavior_logprobs = mat({{-1000}, {0}});
  in.response_mask = bmask({{1}, {1}});
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.is_batch_normalize = true;
  RolloutCorrectionResult r = run(in, o);
  ASSERT_TRUE(r.weights.isfinite().all().item<bool>());
  // w = [min(e^20, 2), e^-20], divided by their mean (2 + e^-20) / 2.
  const double e20 = std::exp(20.0), mean = (2 + 1 / e20) / 2;
  EXPECT_TRUE(AllClose(r.weights,
                       mat({{static_cast<float>(2 / mean)}, {static_cast<float>(1 / e20 / mean)}}),
                       1e-6, 1e-6));
  const MismatchStats& a = r.metrics.all;
  EXPECT_NEAR(a.ratio_mean, (e20 + 1 / e20) / 2, 1e-6 * e20);
  // k3 = mean(e^c - 1 - c) = ((e^20 - 21) + (e^-20 + 19)) / 2
  EXPECT_NEAR(a.k3, (e20 - 21 + 1 / e20 + 19) / 2, 1e-6 * e20);
  EXPECT_NEAR(a.k1, 0.0, 1e-9);                  // mean(-l), raw: (-1000 + 1000) / 2
  EXPECT_NEAR(a.abs_log_ratio_max, 1000, 1e-9);  // raw, no exp involved
  // Sequence level in clip mode too.
  o.is_level = CorrectionLevel::kSequence;
  o.is_mode = IsWeightMode::kClip;
  r = run(in, o);
  ASSERT_TRUE(r.weights.isfinite().all().item<bool>());
  EXPECT_TRUE(std::isfinite(r.metrics.is_weight_ess));
}

// ------------------------------------------------------------- diagnostics

TEST(RolloutCorrectionTest, EngineAndStalenessSplit) {
  // trainer_version 5. Row 0 was sampled at version 5 (engine), r = [1.1, 0.9];
  // row 1 at versions 3 and 4 (staleness), r = [2, 0.5]; padding version -1.
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(1.1), ln(0.9), 0}, {ln(2), ln(0.5), 0}}), bmask({{1, 1, 0}, {1, 1, 0}}));
  in.token_versions = torch::tensor({5, 5, -1, 3, 4, -1}, torch::kLong).view({2, 3});
  in.trainer_version = 5;
  RolloutCorrectionResult r = run(in, RolloutCorrectionOptions{});
  const RolloutCorrectionMetrics& m = r.metrics;
  EXPECT_EQ(m.engine.num_tokens, 2);
  EXPECT_EQ(m.staleness.num_tokens, 2);
  EXPECT_EQ(m.all.num_tokens, 4);
  // engine k3 = (k3(1.1) + k3(0.9)) / 2 = 0.0050252; staleness (k3(2) + k3(0.5)) / 2 = 0.25
  EXPECT_NEAR(m.engine.k3, (k3(1.1) + k3(0.9)) / 2, 1e-6);
  EXPECT_NEAR(m.staleness.k3, 0.25, 1e-6);
  EXPECT_NEAR(m.all.k3, (k3(1.1) + k3(0.9) + 0.5) / 4, 1e-6);
  // k1 = mean(-log r): engine -(ln 1.1 + ln 0.9) / 2 = 0.0050252; staleness 0.
  EXPECT_NEAR(m.engine.k1, -(std::log(1.1) + std::log(0.9)) / 2, 1e-6);
  EXPECT_NEAR(m.staleness.k1, 0.0, 1e-6);
  EXPECT_NEAR(m.engine.ratio_mean, 1.0, 1e-6);      // (1.1 + 0.9) / 2
  EXPECT_NEAR(m.staleness.ratio_mean, 1.25, 1e-6);  // (2 + 0.5) / 2
  EXPECT_NEAR(m.staleness.abs_log_ratio_mean, std::log(2.0), 1e-6);
  EXPECT_NEAR(m.engine.abs_log_ratio_max, std::log(1 / 0.9), 1e-6);
  // Lag 5 - v over masked tokens: (0 + 0 + 2 + 1) / 4, max 2.
  EXPECT_NEAR(m.version_lag_mean, 0.75, 1e-12);
  EXPECT_EQ(m.version_lag_max, 2.0);

  // Masked versions outside [0, trainer_version] are errors naming the argument.
  in.token_versions[0][1] = 6;
  StatusOr<RolloutCorrectionResult> bad = rollout_correction(in, RolloutCorrectionOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status(), "token_versions: masked token at [0, 1] has version 6"))
      << bad.status();
  in.token_versions[0][1] = -1;
  bad = rollout_correction(in, RolloutCorrectionOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status(), "token_versions")) << bad.status();
}

TEST(RolloutCorrectionTest, PaddingHasZeroWeightAndFalseMask) {
  // Padding holds NaN log-probs and version -1; it must not leak anywhere.
  RolloutCorrectionInputs in = with_ratios(mat({{ln(1.5), kNaN, kNaN}, {ln(0.8), ln(1.2), kNaN}}),
                                           bmask({{1, 0, 0}, {1, 1, 0}}));
  in.token_versions = torch::tensor({2, -1, -1, 1, 2, -1}, torch::kLong).view({2, 3});
  in.trainer_version = 2;
  for (CorrectionLevel level : {CorrectionLevel::kNone, CorrectionLevel::kToken,
                                CorrectionLevel::kSequence, CorrectionLevel::kGeometric}) {
    RolloutCorrectionOptions o;
    o.is_level = level;
    o.is_batch_normalize = true;
    o.rs_level = CorrectionLevel::kGeometric;
    o.rs_criterion = RejectionCriterion::kK3;
    o.rs_threshold = 1;
    o.veto_threshold = 1e-4;
    RolloutCorrectionResult r = run(in, o);
    EXPECT_TRUE(torch::equal(r.response_mask, in.response_mask))
        << kCorrectionLevelNames.name(level);
    at::Tensor pad = in.response_mask.logical_not();
    EXPECT_EQ(r.weights.masked_select(pad).abs().sum().item<float>(), 0.0f);
    EXPECT_TRUE(r.weights.isfinite().all().item<bool>()) << kCorrectionLevelNames.name(level);
    EXPECT_TRUE(std::isfinite(r.metrics.all.k3));
  }
}

TEST(RolloutCorrectionTest, IdenticalPoliciesGiveUnitWeights) {
  // old == behav: log r = 0 exactly, so every weight is exp(0) = 1, nothing is
  // rejected, and every divergence is 0.
  RolloutCorrectionInputs in;
  in.behavior_logprobs = mat({{-0.3f, -2.5f, -1}, {-4, -0.01f, 0}});
  in.old_logprobs = in.behavior_logprobs.clone();
  in.response_mask = bmask({{1, 1, 1}, {1, 1, 0}});
  for (CorrectionLevel level :
       {CorrectionLevel::kToken, CorrectionLevel::kSequence, CorrectionLevel::kGeometric}) {
    RolloutCorrectionOptions o;
    o.is_level = level;
    o.is_batch_normalize = true;
    o.rs_level = level;
    o.veto_threshold = 0.5;
    RolloutCorrectionResult r = run(in, o);
    EXPECT_TRUE(torch::equal(r.weights, mat({{1, 1, 1}, {1, 1, 0}})))
        << kCorrectionLevelNames.name(level);
    EXPECT_TRUE(torch::equal(r.response_mask, in.response_mask));
    const RolloutCorrectionMetrics& m = r.metrics;
    EXPECT_EQ(m.rejected_token_fraction, 0.0);
    EXPECT_EQ(m.veto_fraction, 0.0);
    EXPECT_EQ(m.is_truncated_fraction, 0.0);
    EXPECT_EQ(m.is_weight_ess, 1.0);
    EXPECT_EQ(m.all.k3, 0.0);
    EXPECT_EQ(m.all.k1, 0.0);
    EXPECT_EQ(m.all.ratio_mean, 1.0);
    EXPECT_EQ(m.all.abs_log_ratio_max, 0.0);
  }
}

TEST(RolloutCorrectionTest, EmptyMaskGivesZeros) {
  RolloutCorrectionInputs in = with_ratios(mat({{ln(3), 0}}), bmask({{0, 0}}));
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kSequence;
  o.is_batch_normalize = true;
  o.rs_level = CorrectionLevel::kToken;
  RolloutCorrectionResult r = run(in, o);
  EXPECT_EQ(r.weights.abs().sum().item<float>(), 0.0f);
  EXPECT_FALSE(r.response_mask.any().item<bool>());
  EXPECT_EQ(r.metrics.rejected_token_fraction, 0.0);
  EXPECT_EQ(r.metrics.is_weight_mean, 0.0);
  EXPECT_EQ(r.metrics.all.num_tokens, 0);
}

TEST(RolloutCorrectionTest, AppendMetricsUsesStableNames) {
  RolloutCorrectionInputs in =
      with_ratios(mat({{ln(1.1), ln(0.9), 0}, {ln(2), ln(0.5), 0}}), bmask({{1, 1, 0}, {1, 1, 0}}));
  in.token_versions = torch::tensor({5, 5, -1, 3, 4, -1}, torch::kLong).view({2, 3});
  in.trainer_version = 5;
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.is_threshold = 1.5;  // truncates r = 2: 1 of 4 tokens
  RolloutCorrectionResult r = run(in, o);
  std::map<std::string, double> out;
  append_metrics(r.metrics, out);
  for (const char* name : {"rollout_corr/rejected_token_fraction",
                           "rollout_corr/rejected_sequence_fraction",
                           "rollout_corr/rs/rejected_token_fraction",
                           "rollout_corr/rs/rejected_sequence_fraction",
                           "rollout_corr/veto_fraction",
                           "rollout_corr/catastrophic_token_fraction",
                           "rollout_corr/is_truncated_fraction",
                           "rollout_corr/is_truncated_fraction/upper",
                           "rollout_corr/is_truncated_fraction/lower",
                           "rollout_corr/is_weight/mean",
                           "rollout_corr/is_weight/min",
                           "rollout_corr/is_weight/max",
                           "rollout_corr/is_weight/ess",
                           "rollout_corr/is_weight/batch_norm_factor",
                           "rollout_corr/all/k3",
                           "rollout_corr/engine/num_tokens",
                           "rollout_corr/engine/k1",
                           "rollout_corr/engine/k3",
                           "rollout_corr/engine/abs_log_ratio_mean",
                           "rollout_corr/engine/abs_log_ratio_max",
                           "rollout_corr/engine/ratio_mean",
                           "rollout_corr/staleness/k3",
                           "rollout_corr/version_lag/mean",
                           "rollout_corr/version_lag/max"}) {
    EXPECT_EQ(out.count(name), 1u) << name;
  }
  EXPECT_EQ(out.size(), 34u);
  EXPECT_NEAR(out["rollout_corr/staleness/k3"], 0.25, 1e-6);
  EXPECT_NEAR(out["rollout_corr/is_truncated_fraction"], 0.25, 1e-12);
  std::map<std::string, double> other;
  append_metrics(r.metrics, other, "rc/");
  EXPECT_EQ(other.count("rc/engine/k3"), 1u);
}

// --------------------------------------------------------- validation, names

TEST(RolloutCorrectionTest, RejectsBadInputsNamingTheArgument) {
  RolloutCorrectionInputs good = with_ratios(mat({{0, 0}}), bmask({{1, 1}}));
  auto error_of = [](const RolloutCorrectionInputs& in,
                     const RolloutCorrectionOptions& o = RolloutCorrectionOptions{}) {
    StatusOr<RolloutCorrectionResult> r = rollout_correction(in, o);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  RolloutCorrectionInputs in = good;
  in.old_logprobs = torch::zeros({1, 3});
  EXPECT_EQ(error_of(in).rfind("old_logprobs: shape", 0), 0u) << error_of(in);
  in = good;
  in.old_logprobs = at::Tensor();  // required unless bypass
  EXPECT_EQ(error_of(in).rfind("old_logprobs", 0), 0u);
  in = good;
  in.response_mask = bmask({{1}});
  EXPECT_EQ(error_of(in).rfind("response_mask", 0), 0u);
  in = good;
  in.behavior_logprobs = torch::zeros({2});
  EXPECT_EQ(error_of(in).rfind("behavior_logprobs", 0), 0u);
  in = good;
  in.behavior_logprobs = mat({{0, kNaN}});
  EXPECT_EQ(error_of(in), "behavior_logprobs: 1 masked entries are not finite (first at [0, 1])");
  in = good;
  in.old_logprobs = mat({{-std::numeric_limits<float>::infinity(), 0}});
  EXPECT_EQ(error_of(in).rfind("old_logprobs: 1 masked entries", 0), 0u);
  in = good;
  in.token_versions = torch::zeros({1, 2});  // float
  EXPECT_EQ(error_of(in).rfind("token_versions: must be an integer tensor", 0), 0u);
  RolloutCorrectionOptions o;
  o.is_level = CorrectionLevel::kToken;
  o.is_threshold = 1;
  EXPECT_EQ(error_of(good, o).rfind("rollout_correction.is_threshold", 0), 0u);
}

}  // namespace
}  // namespace relay::trainer
