#include "relay/trainer/kl.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>

#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::AllClose;

at::Tensor row(std::initializer_list<float> v) {
  return torch::tensor(std::vector<float>(v)).unsqueeze(0);
}

// d = logp - ref = [0.5, -1.0, 0.0].
struct KlCase {
  at::Tensor logp = row({-1.0f, -2.0f, -0.5f});
  at::Tensor ref = row({-1.5f, -1.0f, -0.5f});
};

// Value and d/dlogp of sum(kl_penalty).
std::pair<at::Tensor, at::Tensor> value_and_grad(KlEstimator e) {
  KlCase c;
  at::Tensor logp = c.logp.clone().requires_grad_(true);
  at::Tensor v = kl_penalty(logp, c.ref, e);
  v.sum().backward();
  return {v.detach(), logp.grad()};
}

TEST(KlTest, K1IsLogRatioWithUnitGradient) {
  auto [v, g] = value_and_grad(KlEstimator::kK1);
  EXPECT_TRUE(AllClose(v, row({0.5f, -1.0f, 0.0f})));
  EXPECT_TRUE(AllClose(g, row({1.0f, 1.0f, 1.0f})));
}

TEST(KlTest, AbsIsAbsoluteLogRatio) {
  auto [v, g] = value_and_grad(KlEstimator::kAbs);
  EXPECT_TRUE(AllClose(v, row({0.5f, 1.0f, 0.0f})));
  // d|d|/dd = sign(d); torch's sign(0) = 0.
  EXPECT_TRUE(AllClose(g, row({1.0f, -1.0f, 0.0f})));
}

TEST(KlTest, K2IsHalfSquareWithGradientD) {
  // 0.5 d^2 = [0.125, 0.5, 0]; gradient d.
  auto [v, g] = value_and_grad(KlEstimator::kK2);
  EXPECT_TRUE(AllClose(v, row({0.125f, 0.5f, 0.0f})));
  EXPECT_TRUE(AllClose(g, row({0.5f, -1.0f, 0.0f})));
}

TEST(KlTest, K3IsLowVarianceEstimator) {
  // x = ref - logp = [-0.5, 1, 0]; k3 = e^x - x - 1 = [e^-0.5 - 0.5, e - 2, 0];
  // d/dlogp = 1 - e^x = [1 - e^-0.5, 1 - e, 0].
  auto [v, g] = value_and_grad(KlEstimator::kK3);
  EXPECT_TRUE(AllClose(v, row({0.1065307f, 0.7182818f, 0.0f})));
  EXPECT_TRUE(AllClose(g, row({0.3934693f, -1.7182818f, 0.0f})));
}

TEST(KlTest, K3IsClampedToTen) {
  // ref - logp = 30 -> clamped to 20 -> e^20 - 21 -> clamped to 10.
  at::Tensor v = kl_penalty(row({-31.0f}), row({-1.0f}), KlEstimator::kK3);
  EXPECT_FLOAT_EQ(v.item<float>(), 10.0f);
}

TEST(KlTest, StraightThroughVariantsKeepValueAndTakeK2Gradient) {
  auto [k3v, k3g] = value_and_grad(KlEstimator::kK3Plus);
  EXPECT_TRUE(AllClose(k3v, row({0.1065307f, 0.7182818f, 0.0f})));
  EXPECT_TRUE(AllClose(k3g, row({0.5f, -1.0f, 0.0f})));  // gradient of 0.5 d^2 = d
  auto [k1v, k1g] = value_and_grad(KlEstimator::kK1Plus);
  EXPECT_TRUE(AllClose(k1v, row({0.5f, -1.0f, 0.0f})));
  EXPECT_TRUE(AllClose(k1g, row({0.5f, -1.0f, 0.0f})));
  auto [absv, absg] = value_and_grad(KlEstimator::kAbsPlus);
  EXPECT_TRUE(AllClose(absv, row({0.5f, 1.0f, 0.0f})));
  EXPECT_TRUE(AllClose(absg, row({0.5f, -1.0f, 0.0f})));
}

TEST(KlTest, RefLogprobsGetNoGradient) {
  KlCase c;
  at::Tensor ref = c.ref.clone().requires_grad_(true);
  at::Tensor logp = c.logp.clone().requires_grad_(true);
  kl_penalty(logp, ref, KlEstimator::kK3).sum().backward();
  EXPECT_FALSE(ref.grad().defined());
}

TEST(KlTest, ParsesVerlNames) {
  struct Case {
    const char* name;
    KlEstimator want;
  };
  for (const Case& c :
       {Case{"kl", KlEstimator::kK1}, Case{"k1", KlEstimator::kK1}, Case{"abs", KlEstimator::kAbs},
        Case{"mse", KlEstimator::kK2}, Case{"k2+", KlEstimator::kK2},
        Case{"low_var_kl", KlEstimator::kK3}, Case{"k3", KlEstimator::kK3},
        Case{"k3+", KlEstimator::kK3Plus}, Case{"low_var_kl+", KlEstimator::kK3Plus},
        Case{"k1+", KlEstimator::kK1Plus}, Case{"abs+", KlEstimator::kAbsPlus}}) {
    auto got = kKlEstimatorNames.parse(c.name);
    ASSERT_TRUE(got.ok()) << c.name;
    EXPECT_EQ(*got, c.want) << c.name;
  }
  auto bad = kKlEstimatorNames.parse("k4");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown KL estimator 'k4'; known: k1, abs, k2, k3, k1+, abs+, k3+, kl, mse, "
            "low_var_kl, kl+, mse+, k2+, low_var_kl+");
  EXPECT_STREQ(kKlEstimatorNames.name(KlEstimator::kK3Plus), "k3+");
}

TEST(KlControllerTest, FixedNeverChanges) {
  KlController c(KlControllerOptions{KlControllerType::kFixed, 0.1, 6.0, 10000});
  c.update(100.0, 256);
  EXPECT_DOUBLE_EQ(c.value(), 0.1);
}

TEST(KlControllerTest, AdaptiveFollowsZieglerUpdate) {
  // beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon, target 6, horizon 1e4:
  //   kl 9,   n 256:  e = +0.2 (0.5 clipped) -> 0.1 * 1.00512   = 0.100512
  //   kl 3,   n 1000: e = -0.2 (-0.5 clipped) -> * 0.98        = 0.09850176
  //   kl 6.6, n 500:  e = +0.1                -> * 1.005       = 0.0989942688
  KlController c(KlControllerOptions{KlControllerType::kAdaptive, 0.1, 6.0, 10000});
  c.update(9.0, 256);
  EXPECT_NEAR(c.value(), 0.100512, 1e-12);
  c.update(3.0, 1000);
  EXPECT_NEAR(c.value(), 0.09850176, 1e-12);
  c.update(6.6, 500);
  EXPECT_NEAR(c.value(), 0.0989942688, 1e-12);
}

}  // namespace
}  // namespace relay::trainer
