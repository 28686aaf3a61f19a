#include "relay/trainer/value_loss.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <vector>

#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::AllClose;

at::Tensor row(std::vector<float> v) { return torch::tensor(v).unsqueeze(0); }

// verl's compute_value_loss by hand, clip_range 0.2:
//   t  V     V_old  R     V_c    (V-R)^2  (V_c-R)^2  max   clipped  d max / dV
//   0  1.0   0.5    1.2   0.7    0.04     0.25       0.25  yes      0
//   1  0.2   0.5    1.0   0.3    0.64     0.49       0.64  no       2 (V - R) = -1.6
//   2 -0.5   0.0   -1.0  -0.2    0.25     0.64       0.64  yes      0
//   3  2.0   1.0    0.0   1.2    4.0      1.44       4.0   no       2 (V - R) = 4
// token-mean: 0.5 x 5.53 / 4 = 0.69125; gradient 0.5 x [0, -1.6, 0, 4] / 4.
struct Case {
  at::Tensor values = row({1.0f, 0.2f, -0.5f, 2.0f}).requires_grad_(true);
  at::Tensor old = row({0.5f, 0.5f, 0.0f, 1.0f});
  at::Tensor returns = row({1.2f, 1.0f, -1.0f, 0.0f});
};

TEST(ValueLossTest, ClippedValueLossByHand) {
  Case c;
  ValueLossOptions o;
  o.clip_range = 0.2;
  ValueLossResult r = value_loss(c.values, c.old, c.returns, torch::ones({1, 4}), o);
  EXPECT_NEAR(r.loss.item<float>(), 0.69125, 1e-6);
  EXPECT_NEAR(r.clip_fraction, 0.5, 1e-12);
  EXPECT_NEAR(r.value_mean, 0.675, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(c.values.grad(), row({0, -0.2f, 0, 0.5f}), 1e-6)) << c.values.grad();
}

TEST(ValueLossTest, AggregationModesAndTheMask) {
  // The same tokens as [2, 2] rows, the last one masked out: maxima
  // {0.25, 0.64 | 0.64, -}.
  Case c;
  const at::Tensor values = c.values.detach().reshape({2, 2});
  const at::Tensor old = c.old.reshape({2, 2});
  const at::Tensor ret = c.returns.reshape({2, 2});
  const at::Tensor mask = torch::tensor({1, 1, 1, 0}, torch::kBool).reshape({2, 2});
  ValueLossOptions o;
  o.clip_range = 0.2;
  // token-mean: 0.5 x (0.25 + 0.64 + 0.64) / 3.
  EXPECT_NEAR(value_loss(values, old, ret, mask, o).loss.item<float>(), 0.255, 1e-6);
  EXPECT_NEAR(value_loss(values, old, ret, mask, o).clip_fraction, 2.0 / 3.0, 1e-12);
  // seq-mean-token-mean: 0.5 x ((0.25 + 0.64) / 2 + 0.64) / 2.
  o.agg_mode = LossAggMode::kSeqMeanTokenMean;
  EXPECT_NEAR(value_loss(values, old, ret, mask, o).loss.item<float>(), 0.27125, 1e-6);
  // seq-mean-token-sum-norm, C = 10: 0.5 x (0.25 + 0.64 + 0.64) / 10.
  o.agg_mode = LossAggMode::kSeqMeanTokenSumNorm;
  GlobalNormalizer n;
  n.loss_scale_factor = 10;
  EXPECT_NEAR(value_loss(values, old, ret, mask, o, n).loss.item<float>(), 0.0765, 1e-6);
  // A NaN value outside the mask does not leak into the loss.
  at::Tensor poisoned = values.clone();
  poisoned[1][1] = std::nanf("");
  o.agg_mode = LossAggMode::kTokenMean;
  EXPECT_NEAR(value_loss(poisoned, old, ret, mask, o).loss.item<float>(), 0.255, 1e-6);
}

TEST(ValueLossTest, NoClipWhenTheValuesStayInTheBand) {
  // |V - V_old| <= clip_range everywhere: the loss is 0.5 (V - R)^2, nothing clipped.
  at::Tensor v = row({0.1f, 0.3f}).requires_grad_(true);
  ValueLossOptions o;  // clip_range 0.5
  ValueLossResult r = value_loss(v, row({0, 0}), row({1, -1}), torch::ones({1, 2}), o);
  EXPECT_NEAR(r.loss.item<float>(), 0.5 * (0.81 + 1.69) / 2, 1e-6);
  EXPECT_EQ(r.clip_fraction, 0.0);
}

TEST(ValueLossTest, ExplainedVariance) {
  // returns {1, 2, 3, 4}, values {1, 2, 3, 3}: Var(R - V) = 0.25, Var(R) = 5/3.
  const at::Tensor mask = torch::ones({1, 4});
  EXPECT_NEAR(explained_variance(row({1, 2, 3, 3}), row({1, 2, 3, 4}), mask), 1 - 0.25 / (5.0 / 3),
              1e-12);
  EXPECT_NEAR(explained_variance(row({1, 2, 3, 4}), row({1, 2, 3, 4}), mask), 1.0, 1e-12);
  // The masked-out token is ignored; constant returns or one token give NaN.
  EXPECT_NEAR(explained_variance(row({1, 2, 3, 100}), row({1, 2, 3, 4}), row({1, 1, 1, 0})), 1.0,
              1e-12);
  EXPECT_TRUE(std::isnan(explained_variance(row({0, 1}), row({2, 2}), torch::ones({1, 2}))));
  EXPECT_TRUE(std::isnan(explained_variance(row({0, 1}), row({2, 3}), row({1, 0}))));
}

}  // namespace
}  // namespace relay::trainer
