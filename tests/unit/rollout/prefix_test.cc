#include "relay/rollout/prefix.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "relay/rollout/options.h"

namespace relay::rollout {
namespace {

PrefixOptions options(PrefixStrategy strategy, int n_prefix, double lo = 0.0, double hi = 0.8) {
  PrefixOptions o;
  o.strategy = strategy;
  o.n_prefix = n_prefix;
  o.min_ratio = lo;
  o.max_ratio = hi;
  o.steps = 100;
  return o;
}

// Largest and smallest ratio of the prefixed samples over many groups.
std::pair<double, double> range_at(const PrefixOptions& o, int64_t step) {
  double lo = 1e9, hi = -1e9;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    for (double r : prefix_ratios(o, 4, step, seed)) {
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
  }
  return {lo, hi};
}

TEST(PrefixTest, OnlyTheFirstNPrefixSamplesGetAPrefix) {
  auto r = prefix_ratios(options(PrefixStrategy::kRandom, 2, 0.2, 0.6), 5, 0, 1);
  ASSERT_EQ(r.size(), 5u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(r[i], 0.2);
    EXPECT_LE(r[i], 0.6);
  }
  for (int i = 2; i < 5; ++i) EXPECT_EQ(r[i], 0.0);
  // -1 = all; 0 = none.
  for (double x : prefix_ratios(options(PrefixStrategy::kRandom, -1, 0.2, 0.6), 5, 0, 1)) {
    EXPECT_GE(x, 0.2);
  }
  for (double x : prefix_ratios(options(PrefixStrategy::kRandom, 0), 5, 0, 1)) EXPECT_EQ(x, 0.0);
  // n_prefix larger than the group is capped at the group.
  EXPECT_EQ(prefix_ratios(options(PrefixStrategy::kFixed, 8), 3, 0, 1).size(), 3u);
}

TEST(PrefixTest, RandomIsUniformInRangeAndSeeded) {
  PrefixOptions o = options(PrefixStrategy::kRandom, -1, 0.25, 0.75);
  auto [lo, hi] = range_at(o, 0);
  EXPECT_GE(lo, 0.25);
  EXPECT_LE(hi, 0.75);
  EXPECT_LT(lo, 0.27);  // the range is covered, not a point
  EXPECT_GT(hi, 0.73);
  EXPECT_EQ(prefix_ratios(o, 4, 0, 9), prefix_ratios(o, 4, 0, 9));
  EXPECT_NE(prefix_ratios(o, 4, 0, 9), prefix_ratios(o, 4, 0, 10));
  auto r = prefix_ratios(o, 4, 0, 9);
  EXPECT_NE(r[0], r[1]) << "each sample draws its own ratio";
}

TEST(PrefixTest, ShareAcrossGroupGivesOneRatioPerGroup) {
  PrefixOptions o = options(PrefixStrategy::kRandom, 3, 0.1, 0.9);
  o.share_across_group = true;
  auto r = prefix_ratios(o, 5, 0, 4);
  EXPECT_EQ(r[0], r[1]);
  EXPECT_EQ(r[1], r[2]);
  EXPECT_EQ(r[3], 0.0);
  EXPECT_NE(prefix_ratios(o, 5, 0, 4)[0], prefix_ratios(o, 5, 0, 5)[0]);
}

TEST(PrefixTest, LinearDecaysFromMaxToMinOverSteps) {
  PrefixOptions o = options(PrefixStrategy::kLinear, -1, 0.2, 0.8);
  auto at = [&](int64_t step) { return prefix_ratios(o, 2, step, 0)[0]; };
  EXPECT_DOUBLE_EQ(at(0), 0.8);
  EXPECT_DOUBLE_EQ(at(50), 0.5);
  EXPECT_DOUBLE_EQ(at(100), 0.2);
  EXPECT_DOUBLE_EQ(at(1000), 0.2);  // stays at min after the schedule
  EXPECT_EQ(prefix_ratios(o, 2, 25, 0)[0], prefix_ratios(o, 2, 25, 99)[1]);  // no randomness
}

TEST(PrefixTest, LinearMaxLowersTheUpperBoundInTenWindows) {
  PrefixOptions o = options(PrefixStrategy::kLinearMax, -1, 0.0, 0.8);
  // Window w (steps [10w, 10w + 10)): uniform in [0, 0.8 (10 - w) / 10].
  for (int64_t w : {0, 3, 9}) {
    auto [lo, hi] = range_at(o, 10 * w + 5);
    const double bound = 0.8 * (10 - w) / 10.0;
    EXPECT_GE(lo, 0.0);
    EXPECT_LE(hi, bound + 1e-12) << "window " << w;
    EXPECT_GT(hi, 0.95 * bound) << "window " << w;
  }
  // Past the schedule it stays in the last window.
  EXPECT_LE(range_at(o, 500).second, 0.08 + 1e-12);
}

TEST(PrefixTest, ReverseLinearRaisesTheUpperBoundInTenWindows) {
  PrefixOptions o = options(PrefixStrategy::kReverseLinear, -1, 0.1, 0.9);
  for (int64_t w : {0, 4, 9}) {
    auto [lo, hi] = range_at(o, 10 * w + 1);
    const double bound = 0.1 + 0.8 * (w + 1) / 10.0;
    EXPECT_GE(lo, 0.1);
    EXPECT_LE(hi, bound + 1e-12) << "window " << w;
    EXPECT_GT(hi, 0.1 + 0.95 * (bound - 0.1)) << "window " << w;
  }
}

TEST(PrefixTest, FixedSpreadsRatiosEvenly) {
  auto r = prefix_ratios(options(PrefixStrategy::kFixed, 4, 0.2, 0.8), 6, 17, 3);
  ASSERT_EQ(r.size(), 6u);
  EXPECT_DOUBLE_EQ(r[0], 0.2);
  EXPECT_DOUBLE_EQ(r[1], 0.4);
  EXPECT_DOUBLE_EQ(r[2], 0.6);
  EXPECT_DOUBLE_EQ(r[3], 0.8);
  EXPECT_EQ(r[4], 0.0);
  EXPECT_EQ(prefix_ratios(options(PrefixStrategy::kFixed, 1, 0.3, 0.8), 2, 0, 0)[0], 0.3);
}

TEST(PrefixTest, PrefixLengthFloorsAndCaps) {
  EXPECT_EQ(prefix_length(0.5, 7, 100), 3);
  EXPECT_EQ(prefix_length(1.0, 7, 100), 7);
  EXPECT_EQ(prefix_length(0.99, 7, 100), 6);
  EXPECT_EQ(prefix_length(1.0, 7, 4), 4);
  EXPECT_EQ(prefix_length(0.0, 7, 100), 0);
  EXPECT_EQ(prefix_length(0.5, 0, 100), 0);
}

TEST(PrefixTest, StrategiesHaveOneNameEachAndFixedIsNotShared) {
  for (const auto& entry : kPrefixStrategyNames.entries()) {
    EXPECT_EQ(kPrefixStrategyNames.parse(kPrefixStrategyNames.name(entry.value)).value(),
              entry.value);
  }
  RolloutConfig c;
  c.engine.prefix.strategy = PrefixStrategy::kFixed;
  c.engine.prefix.n_prefix = -1;
  EXPECT_TRUE(check_options(c, "rollout").ok());
  c.engine.prefix.share_across_group = true;
  EXPECT_EQ(check_options(c, "rollout").message(),
            "rollout.prefix.share_across_group: must be false with strategy 'fixed', got true");
}

}  // namespace
}  // namespace relay::rollout
