#include "relay/rollout/eval_metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace relay::rollout {
namespace {

// The estimator against the binomial coefficients written out.
double binomial(int64_t n, int64_t k) {
  if (k < 0 || k > n) return 0;
  double r = 1;
  for (int64_t i = 1; i <= k; ++i) r = r * static_cast<double>(n - k + i) / i;
  return r;
}

TEST(EvalMetricsTest, PassAtKMatchesTheCombinatorialDefinition) {
  for (int64_t n : {1, 2, 5, 8, 16}) {
    for (int64_t c = 0; c <= n; ++c) {
      for (int64_t k = 1; k <= n; ++k) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " c=" << c << " k=" << k);
        EXPECT_NEAR(pass_at_k(n, c, k), 1.0 - binomial(n - c, k) / binomial(n, k), 1e-12);
      }
    }
  }
  EXPECT_DOUBLE_EQ(pass_at_k(8, 0, 4), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(8, 8, 1), 1.0);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 1), 0.25);  // pass@1 is the fraction correct
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 2), 0.5);
  // Large n stays finite (the naive binomials overflow doubles past ~1000).
  EXPECT_NEAR(pass_at_k(5000, 1, 1), 1.0 / 5000, 1e-12);
}

TEST(EvalMetricsTest, KValuesArePowersOfTwoAndN) {
  EXPECT_EQ(pass_at_k_values(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(pass_at_k_values(4), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(pass_at_k_values(6), (std::vector<int64_t>{1, 2, 4, 6}));
}

TEST(EvalMetricsTest, MeanOverPrompts) {
  auto m = mean_pass_at_k({0, 2, 4}, 4);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_DOUBLE_EQ(m[1], (0.0 + 0.5 + 1.0) / 3);
  EXPECT_DOUBLE_EQ(m[4], (0.0 + 1.0 + 1.0) / 3);
  EXPECT_TRUE(mean_pass_at_k({}, 4).empty());
}

TEST(EvalMetricsTest, CorrectIsTheVerifiersSubScoreNotAFormatReward) {
  Score formatted_only;
  formatted_only.reward = 0.2;
  formatted_only.sub_scores = {{"correct", 0.0}, {"formatted", 1.0}};
  EXPECT_FALSE(is_correct(formatted_only));
  Score right;
  right.reward = 0.8;
  right.sub_scores = {{"correct", 1.0}};
  EXPECT_TRUE(is_correct(right));
  Score plain;
  plain.reward = 1.0;
  EXPECT_TRUE(is_correct(plain));
  plain.reward = 0.99;
  EXPECT_FALSE(is_correct(plain));
}

}  // namespace
}  // namespace relay::rollout
