#include "relay/trainer/policy_loss.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <string>

#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::AllClose;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

at::Tensor row(std::initializer_list<float> v) {
  return torch::tensor(std::vector<float>(v)).unsqueeze(0);
}
at::Tensor mat(std::initializer_list<std::initializer_list<float>> rows) {
  std::vector<at::Tensor> out;
  for (const auto& r : rows) out.push_back(torch::tensor(std::vector<float>(r)));
  return torch::stack(out);
}
float ln(double x) { return static_cast<float>(std::log(x)); }

// logp as a leaf that requires grad, plus the other inputs.
struct Batch {
  at::Tensor logp;
  PolicyLossInputs in;
};
Batch make(const at::Tensor& logp, const at::Tensor& old, const at::Tensor& adv,
           const at::Tensor& mask) {
  Batch b;
  b.logp = logp.clone().requires_grad_(true);
  b.in = PolicyLossInputs{b.logp, old, adv, mask, at::Tensor(), at::Tensor()};
  return b;
}

// ---------------------------------------------------------------- aggregation

TEST(LossAggregationTest, HandComputedModes) {
  // loss = [[1, 2, 3], [4, 5, 6]], mask = [[1, 1, 0], [1, 0, 0]]; sequence sums 3 and 4.
  at::Tensor loss = mat({{1, 2, 3}, {4, 5, 6}});
  at::Tensor mask = mat({{1, 1, 0}, {1, 0, 0}});
  // token-mean: (1 + 2 + 4) / 3
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kTokenMean).item<float>(), 7.0 / 3, 1e-6);
  // seq-mean-token-sum: (3 + 4) / 2
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenSum).item<float>(), 3.5, 1e-6);
  // seq-mean-token-mean: (3/2 + 4/1) / 2
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenMean).item<float>(), 2.75, 1e-6);
  // seq-mean-token-sum-norm, as verl's agg_loss: 7 / C, C = L = 3 by
  // default, or 10; no division by the 2 sequences.
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenSumNorm).item<float>(), 7.0 / 3,
              1e-6);
  GlobalNormalizer n;
  n.loss_scale_factor = 10;
  n.num_sequences = 2;
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenSumNorm, n).item<float>(), 0.7,
              1e-6);
}

TEST(LossAggregationTest, MaskedNaNEmptyRowsAndEmptyMask) {
  // NaN under the mask's zeros does not leak; a fully masked row is not a sequence.
  at::Tensor loss = mat({{1, 2, kNaN}, {4, kNaN, kNaN}, {kNaN, kNaN, kNaN}});
  at::Tensor mask = mat({{1, 1, 0}, {1, 0, 0}, {0, 0, 0}});
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kTokenMean).item<float>(), 7.0 / 3, 1e-6);
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenSum).item<float>(), 3.5, 1e-6);
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenMean).item<float>(), 2.75, 1e-6);
  at::Tensor empty = torch::zeros({3, 3});
  for (LossAggMode mode : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenSum,
                           LossAggMode::kSeqMeanTokenMean, LossAggMode::kSeqMeanTokenSumNorm}) {
    EXPECT_EQ(aggregate_loss(loss, empty, mode).item<float>(), 0.0f)
        << kLossAggModeNames.name(mode);
  }
}

TEST(LossAggregationTest, GlobalNormalizerCountsAllMicroBatches) {
  // Tokens: 2 + 1 + 0 + 3 = 6; sequences with a token: 3.
  GlobalNormalizer n =
      make_global_normalizer({mat({{1, 1, 0}, {1, 0, 0}}), mat({{0, 0, 0}, {1, 1, 1}})}, 8);
  EXPECT_EQ(n.num_tokens, 6);
  EXPECT_EQ(n.num_sequences, 3);
  EXPECT_EQ(n.loss_scale_factor, 8);
}

// Splitting a batch into micro-batches and summing their losses, with the
// step's GlobalNormalizer, gives the full-batch loss and gradient.
TEST(LossAggregationTest, MicroBatchSumEqualsFullBatch) {
  torch::manual_seed(0);
  const int64_t B = 5, L = 6;
  at::Tensor logp0 = -torch::rand({B, L}) * 2 - 0.1;
  at::Tensor old = logp0 + torch::randn({B, L}) * 0.3;
  at::Tensor adv = torch::randn({B, 1}).expand({B, L}).contiguous();
  at::Tensor mask = mat({{1, 1, 1, 0, 0, 0},
                         {1, 1, 1, 1, 1, 1},
                         {0, 0, 0, 0, 0, 0},
                         {1, 0, 0, 0, 0, 0},
                         {1, 1, 1, 1, 0, 0}});
  const GlobalNormalizer whole = make_global_normalizer({mask}, 8);
  for (LossAggMode mode : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenSum,
                           LossAggMode::kSeqMeanTokenMean, LossAggMode::kSeqMeanTokenSumNorm}) {
    PpoClipOptions o;
    o.agg_mode = mode;
    Batch full = make(logp0, old, adv, mask);
    at::Tensor full_loss = ppo_clip_loss(full.in, o, whole).loss;
    full_loss.backward();

    at::Tensor logp = logp0.clone().requires_grad_(true);
    at::Tensor total = torch::zeros({});
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 2}, {2, 5}}) {
      PolicyLossInputs part{logp.slice(0, lo, hi), old.slice(0, lo, hi), adv.slice(0, lo, hi),
                            mask.slice(0, lo, hi), at::Tensor(),         at::Tensor()};
      total = total + ppo_clip_loss(part, o, whole).loss;
    }
    total.backward();
    EXPECT_NEAR(total.item<float>(), full_loss.item<float>(), 1e-6) << kLossAggModeNames.name(mode);
    EXPECT_TRUE(AllClose(logp.grad(), full.logp.grad(), 1e-6)) << kLossAggModeNames.name(mode);
  }
  // The same holds for the sequence-level losses (GSPO: seq-mean-token-mean; GMPO: per sequence).
  for (int which = 0; which < 2; ++which) {
    Batch full = make(logp0, old, adv, mask);
    auto run = [&](const PolicyLossInputs& in) {
      return which == 0 ? gspo_loss(in, GspoOptions{0.2, 0.2}, whole).loss
                        : gmpo_loss(in, GmpoOptions{}, whole).loss;
    };
    at::Tensor full_loss = run(full.in);
    full_loss.backward();
    at::Tensor logp = logp0.clone().requires_grad_(true);
    at::Tensor total = run({logp.slice(0, 0, 3), old.slice(0, 0, 3), adv.slice(0, 0, 3),
                            mask.slice(0, 0, 3), at::Tensor(), at::Tensor()}) +
                       run({logp.slice(0, 3, 5), old.slice(0, 3, 5), adv.slice(0, 3, 5),
                            mask.slice(0, 3, 5), at::Tensor(), at::Tensor()});
    total.backward();
    EXPECT_NEAR(total.item<float>(), full_loss.item<float>(), 1e-6) << which;
    EXPECT_TRUE(AllClose(logp.grad(), full.logp.grad(), 1e-6)) << which;
  }
}

// --------------------------------------------------------------------- PPO

// Six tokens, old = -1, ratio r = exp(logp - old):
//   t0 A=+1 r=1.5 -> clipped high: -1.28              grad 0
//   t1 A=+1 r=0.5 -> max(-0.5, -0.8) = -0.5           grad -A r = -0.5
//   t2 A=-1 r=0.5 -> max(0.5, 0.8) = 0.8 (clip low)   grad 0
//   t3 A=-1 r=4   -> max(4, 1.28) = 4, dual min(4, 3) = 3   grad 0
//   t4 A=-1 r=2   -> max(2, 1.28) = 2 < 3             grad -A r = 2
//   t5 A=+2 r=1.1 -> -2.2                             grad -A r = -2.2
struct PpoCase {
  at::Tensor old = torch::full({1, 6}, -1.0f);
  at::Tensor logp = old + row({ln(1.5), ln(0.5), ln(0.5), ln(4), ln(2), ln(1.1)});
  at::Tensor adv = row({1, 1, -1, -1, -1, 2});
  at::Tensor mask = torch::ones({1, 6});
};

TEST(PolicyLossTest, PpoAsymmetricAndDualClip) {
  PpoCase c;
  Batch b = make(c.logp, c.old, c.adv, c.mask);
  PpoClipOptions o;  // clip_low 0.2, clip_c 3
  o.clip_high = 0.28;
  PolicyLossResult r = ppo_clip_loss(b.in, o);
  // (-1.28 - 0.5 + 0.8 + 3 + 2 - 2.2) / 6 = 1.82 / 6
  EXPECT_NEAR(r.loss.item<float>(), 1.82 / 6, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({0, -0.5f / 6, 0, 0, 2.0f / 6, -2.2f / 6}), 1e-6));
  EXPECT_NEAR(r.metrics.clip_fraction, 2.0 / 6, 1e-9);  // t0, t2
  EXPECT_NEAR(r.metrics.clip_fraction_high, 1.0 / 6, 1e-9);
  EXPECT_NEAR(r.metrics.clip_fraction_low, 1.0 / 6, 1e-9);
  EXPECT_NEAR(r.metrics.dual_clip_fraction, 1.0 / 6, 1e-9);  // t3
  // ppo_kl = -mean(log r) = -(ln1.5 + 2 ln0.5 + ln4 + ln2 + ln1.1) / 6
  EXPECT_NEAR(r.metrics.ppo_kl, -0.19898708, 1e-6);
  EXPECT_NEAR(r.metrics.mean_ratio, 9.6 / 6, 1e-6);  // (1.5+0.5+0.5+4+2+1.1) / 6
}

TEST(PolicyLossTest, PpoDeltaClipCapsRatioForNegativeAdvantages) {
  // clip_delta 1.5, no dual clip: t3 -> -A min(4, 1.5) = 1.5, t4 -> 1.5, others as above.
  // (-1.28 - 0.5 + 0.8 + 1.5 + 1.5 - 2.2) / 6 = -0.18 / 6
  PpoCase c;
  Batch b = make(c.logp, c.old, c.adv, c.mask);
  PpoClipOptions o;
  o.clip_high = 0.28;
  o.clip_c = 0;
  o.clip_delta = 1.5;
  ASSERT_TRUE(check_options(o, "o").ok()) << check_options(o, "o");
  PolicyLossResult r = ppo_clip_loss(b.in, o);
  EXPECT_NEAR(r.loss.item<float>(), -0.03, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({0, -0.5f / 6, 0, 0, 0, -2.2f / 6}), 1e-6));
  EXPECT_NEAR(r.metrics.dual_clip_fraction, 2.0 / 6, 1e-9);  // t3, t4
}

TEST(PolicyLossTest, PpoOnPolicyHasUnitRatioAndNoClipping) {
  torch::manual_seed(1);
  at::Tensor logp = -torch::rand({3, 4}) * 3;
  at::Tensor adv = torch::randn({3, 4});
  Batch b = make(logp, logp, adv, torch::ones({3, 4}));
  PolicyLossResult r = ppo_clip_loss(b.in, PpoClipOptions{});
  // r = 1 everywhere: loss = mean(-A), gradient -A / 12.
  EXPECT_NEAR(r.loss.item<float>(), -adv.mean().item<float>(), 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), -adv / 12, 1e-7));
  EXPECT_EQ(r.metrics.clip_fraction, 0.0);
  EXPECT_EQ(r.metrics.dual_clip_fraction, 0.0);
  EXPECT_DOUBLE_EQ(r.metrics.mean_ratio, 1.0);
  EXPECT_DOUBLE_EQ(r.metrics.ppo_kl, 0.0);
}

TEST(PolicyLossTest, PpoGradientMatchesFiniteDifferences) {
  torch::manual_seed(2);
  at::Tensor logp = (-torch::rand({2, 5}) * 2).to(torch::kFloat64);
  at::Tensor old = logp + torch::randn({2, 5}, torch::kFloat64) * 0.1;
  at::Tensor adv = torch::randn({2, 5}, torch::kFloat64);
  at::Tensor mask = torch::ones({2, 5}, torch::kFloat64);
  PpoClipOptions o;
  o.agg_mode = LossAggMode::kSeqMeanTokenMean;
  Batch b = make(logp, old, adv, mask);
  ppo_clip_loss(b.in, o).loss.backward();
  const double eps = 1e-6;
  for (int64_t k = 0; k < 10; ++k) {
    at::Tensor up = logp.clone(), down = logp.clone();
    up.view(-1)[k] += eps;
    down.view(-1)[k] -= eps;
    const double fd = (ppo_clip_loss({up, old, adv, mask, {}, {}}, o).loss.item<double>() -
                       ppo_clip_loss({down, old, adv, mask, {}, {}}, o).loss.item<double>()) /
                      (2 * eps);
    EXPECT_NEAR(b.logp.grad().view(-1)[k].item<double>(), fd, 1e-6) << k;
  }
}

// ----------------------------------------------------------- decoupled PPO

TEST(PolicyLossTest, DecoupledPpoEqualsPpoWhenProximalIsBehavior) {
  torch::manual_seed(3);
  at::Tensor logp = -torch::rand({4, 5}) * 2;
  at::Tensor old = logp + torch::randn({4, 5}) * 0.4;
  at::Tensor adv = torch::randn({4, 5});
  at::Tensor mask = (torch::rand({4, 5}) > 0.3).to(torch::kFloat32);
  for (LossAggMode mode : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean}) {
    PpoClipOptions o;
    o.clip_high = 0.28;
    o.behav_imp_weight_cap = 5;
    o.agg_mode = mode;
    Batch a = make(logp, old, adv, mask);
    Batch d = make(logp, old, adv, mask);
    d.in.proximal_logprobs = old.clone();
    PolicyLossResult ra = ppo_clip_loss(a.in, o);
    PolicyLossResult rd = decoupled_ppo_loss(d.in, o);
    EXPECT_EQ(ra.loss.item<float>(), rd.loss.item<float>());
    ra.loss.backward();
    rd.loss.backward();
    EXPECT_TRUE(AllClose(a.logp.grad(), d.logp.grad(), 0.0));
    EXPECT_EQ(ra.metrics.clip_fraction, rd.metrics.clip_fraction);
    EXPECT_DOUBLE_EQ(rd.metrics.behav_imp_weight, 1.0);
    EXPECT_EQ(rd.metrics.behav_capped_fraction, 0.0);
  }
}

TEST(PolicyLossTest, DecoupledPpoWeightsByBehaviorImportanceAndCaps) {
  // behav = -2; w = exp(prox - behav) = [1.5, 0.5, 3]; r = exp(logp - prox) = [1.1, 0.9, 1];
  // clip 0.2, no dual clip, cap 2:
  //   t0 A=+1: PPO -1.1, times w 1.5 -> -1.65;  grad -A r w = -1.65
  //   t1 A=-1: PPO 0.9 (unclipped), times 0.5 -> 0.45;  grad 0.45
  //   t2 A=+1: w = 3 > cap -> dropped (still counted in the token mean)
  // loss = (-1.65 + 0.45 + 0) / 3 = -0.4
  at::Tensor behav = torch::full({1, 3}, -2.0f);
  at::Tensor prox = behav + row({ln(1.5), ln(0.5), ln(3)});
  at::Tensor logp = prox + row({ln(1.1), ln(0.9), 0});
  Batch b = make(logp, behav, row({1, -1, 1}), torch::ones({1, 3}));
  b.in.proximal_logprobs = prox;
  PpoClipOptions o;
  o.clip_c = 0;
  o.behav_imp_weight_cap = 2;
  PolicyLossResult r = decoupled_ppo_loss(b.in, o);
  EXPECT_NEAR(r.loss.item<float>(), -0.4, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({-0.55f, 0.15f, 0}), 1e-6));
  EXPECT_NEAR(r.metrics.behav_capped_fraction, 1.0 / 3, 1e-9);
  EXPECT_NEAR(r.metrics.behav_imp_weight, 1.0, 1e-6);  // (1.5 + 0.5) / 2 over kept tokens
  // ppo_kl = mean(prox - logp) = -(ln 1.1 + ln 0.9) / 3
  EXPECT_NEAR(r.metrics.ppo_kl, 0.00335011, 1e-6);
  EXPECT_EQ(r.metrics.clip_fraction, 0.0);
}

TEST(PolicyLossTest, LoglinearProximalInterpolatesByVersionDistance) {
  // trainer_version v = 5, alpha = (v - b) / (v + 1 - b):
  //   b = 3 -> 2/3, b = 4 -> 1/2, b = 5 -> 0, b = -1 (not generated) -> 0, b = 6 -> 0.
  // prox = behav + alpha (current - behav), behav = -2, current = -1.
  at::Tensor behav = torch::full({1, 5}, -2.0f);
  at::Tensor cur = torch::full({1, 5}, -1.0f).requires_grad_(true);
  at::Tensor versions = torch::tensor({3, 4, 5, -1, 6}, torch::kLong).unsqueeze(0);
  at::Tensor prox = loglinear_proximal_logprobs(behav, cur, versions, 5);
  EXPECT_TRUE(AllClose(prox, row({-2.0f + 2.0f / 3, -1.5f, -2, -2, -2}), 1e-6));
  EXPECT_FALSE(prox.requires_grad());
}

// ------------------------------------------------------ sequence-level forms

TEST(PolicyLossTest, GspoSequenceRatioWithTokenGradient) {
  // Row 0: mask [1,1,0], A = +1, logp - old = [0.1, 0.3] -> s = exp(0.2) = 1.2214028, unclipped
  //        (clip 0.2/0.3); token loss -s; row mean -1.2214028.
  // Row 1: mask [1,1,0], A = -1, logp - old = [-0.2, -0.4] -> s = exp(-0.3) = 0.7408182 < 0.8:
  //        clipped low, loss 0.8 per token, no gradient.
  // seq-mean-token-mean: (-1.2214028 + 0.8) / 2 = -0.2107014.
  // d/dlogp of row 0 tokens: -A s / (2 tokens * 2 seqs) = -0.3053507.
  at::Tensor old = mat({{-1, -1, 0}, {-2, -2, 0}});
  at::Tensor logp = old + mat({{0.1f, 0.3f, 5}, {-0.2f, -0.4f, 5}});
  Batch b = make(logp, old, mat({{1, 1, 1}, {-1, -1, -1}}), mat({{1, 1, 0}, {1, 1, 0}}));
  PolicyLossResult r = gspo_loss(b.in, GspoOptions{0.2, 0.3});
  EXPECT_NEAR(r.loss.item<float>(), -0.2107014, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), mat({{-0.3053507f, -0.3053507f, 0}, {0, 0, 0}}), 1e-6));
  EXPECT_NEAR(r.metrics.clip_fraction, 0.5, 1e-9);
  EXPECT_NEAR(r.metrics.mean_ratio, (1.2214028 + 0.7408182) / 2, 1e-6);
}

TEST(PolicyLossTest, GmpoGeometricMeanWithSignAwareClip) {
  // clip 0.4/0.4; d = logp - old.
  // Row 0: A = +1, d = [0.1, 0.6] -> [0.1, 0.4] (high clip) -> ratio exp(0.25) = 1.2840254,
  //        loss -1.2840254.
  // Row 1: A = -1, d = [-0.6, 0.2] -> max(d, clamp d) = [-0.4, 0.2] -> ratio exp(-0.1) =
  //        0.9048374, loss +0.9048374.
  // loss = mean over rows = -0.1895940.
  // Gradients: row 0 t0: -A ratio / (2 tokens * 2 rows) = -0.3210064; t1 clipped: 0.
  //            row 1 t0 clipped: 0; t1: +0.9048374 / 4 = 0.2262094.
  at::Tensor old = torch::full({2, 2}, -1.0f);
  at::Tensor logp = old + mat({{0.1f, 0.6f}, {-0.6f, 0.2f}});
  Batch b = make(logp, old, mat({{1, 1}, {-1, -1}}), torch::ones({2, 2}));
  PolicyLossResult r = gmpo_loss(b.in, GmpoOptions{});
  EXPECT_NEAR(r.loss.item<float>(), -0.1895940, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), mat({{-0.3210064f, 0}, {0, 0.2262094f}}), 1e-6));
  EXPECT_NEAR(r.metrics.clip_fraction_high, 0.25, 1e-9);
  EXPECT_NEAR(r.metrics.clip_fraction_low, 0.25, 1e-9);
  EXPECT_NEAR(r.metrics.clip_fraction, 0.5, 1e-9);
}

TEST(PolicyLossTest, CispoClippedStopGradientWeight) {
  // t0: A=+1, logp=-1, r=1.5 -> w = sg(clip) = 1.2; loss -w A logp = 1.2; grad -w A = -1.2
  // t1: A=-1, logp=-2, r=0.5 -> w = 0.8; loss -0.8 * -1 * -2 = -1.6; grad 0.8
  // token-mean: (1.2 - 1.6) / 2 = -0.2; grads / 2.
  at::Tensor logp = row({-1, -2});
  at::Tensor old = logp - row({ln(1.5), ln(0.5)});
  Batch b = make(logp, old, row({1, -1}), torch::ones({1, 2}));
  PolicyLossResult r = cispo_loss(b.in, CispoOptions{});
  EXPECT_NEAR(r.loss.item<float>(), -0.2, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({-0.6f, 0.4f}), 1e-6));
  EXPECT_NEAR(r.metrics.clip_fraction, 1.0, 1e-9);
}

TEST(PolicyLossTest, SapoSoftGate) {
  // Gate g = (4 / tau) sigmoid(tau (r - 1)), loss -g A, tau_pos 1, tau_neg 1.05.
  // At r = 1: g = 2 / tau, d(-g A)/dlogp = -A. Row [A=+1, A=-1]:
  //   values [-2, 2/1.05], seq-mean-token-mean = (-2 + 1.9047619) / 2 = -0.0476190,
  //   grads -A / 2 = [-0.5, 0.5].
  {
    Batch b = make(row({-1, -1}), row({-1, -1}), row({1, -1}), torch::ones({1, 2}));
    PolicyLossResult r = sapo_loss(b.in, SapoOptions{});
    EXPECT_NEAR(r.loss.item<float>(), -0.0476190, 1e-6);
    r.loss.backward();
    EXPECT_TRUE(AllClose(b.logp.grad(), row({-0.5f, 0.5f}), 1e-6));
  }
  // r = 2, A = +1: g = 4 sigmoid(1) = 2.9242343, loss -2.9242343;
  // grad = -A 4 sigmoid(1)(1 - sigmoid(1)) r = -1.5728955.
  {
    Batch b = make(row({ln(2) - 1}), row({-1}), row({1}), torch::ones({1, 1}));
    PolicyLossResult r = sapo_loss(b.in, SapoOptions{});
    EXPECT_NEAR(r.loss.item<float>(), -2.9242343, 1e-5);
    r.loss.backward();
    EXPECT_NEAR(b.logp.grad().item<float>(), -1.5728955, 1e-5);
  }
}

// --------------------------------------------------- covariance-based forms

// A = [3, -1, -1, -1] (mean 0), logp = [-1, -3, -2, -2] (mean -2):
// cov = (A - 0)(logp + 2) = [3, 1, 0, 0].
TEST(PolicyLossTest, ClipCovDetachesHighCovarianceTokens) {
  // Only t0 has 1 < cov < 5; ratio 0.25 * 4 tokens = 1 token detached.
  // r = 1: per-token -A = [-3, 1, 1, 1] -> t0 zeroed -> token-mean 3/4; grads -A r / 4.
  at::Tensor logp = row({-1, -3, -2, -2});
  Batch b = make(logp, logp, row({3, -1, -1, -1}), torch::ones({1, 4}));
  ClipCovOptions o;
  o.clip_cov_ratio = 0.25;
  PolicyLossResult r = clip_cov_loss(b.in, o);
  EXPECT_NEAR(r.loss.item<float>(), 0.75, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({0, 0.25f, 0.25f, 0.25f}), 1e-6));
  EXPECT_NEAR(r.metrics.clip_fraction, 0.25, 1e-9);
}

TEST(PolicyLossTest, KlCovPenalizesTopCovarianceTokens) {
  // old = logp + [0.1, 0, 0, 0]: d = [-0.1, 0, 0, 0], r0 = exp(-0.1) = 0.9048374.
  // Top-1 cov is t0: loss t0 = -3 r0 + |d| = -2.6145122; others -A = 1.
  // token-mean (-2.6145122 + 3) / 4 = 0.0963719.
  // grad t0 = (-A r0 + sign(d)) / 4 = (-2.7145122 - 1) / 4 = -0.9286281; others 1/4.
  at::Tensor logp = row({-1, -3, -2, -2});
  Batch b = make(logp, logp + row({0.1f, 0, 0, 0}), row({3, -1, -1, -1}), torch::ones({1, 4}));
  KlCovOptions o;
  o.kl_cov_ratio = 0.25;
  PolicyLossResult r = kl_cov_loss(b.in, o);
  EXPECT_NEAR(r.loss.item<float>(), 0.0963719, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({-0.9286281f, 0.25f, 0.25f, 0.25f}), 1e-6));
  EXPECT_NEAR(r.metrics.ppo_kl, 0.025, 1e-7);  // mean |d|
}

// ------------------------------------------------------- ratio-free forms

TEST(PolicyLossTest, ReinforceGpgAndSft) {
  // -A logp with A = [1, 0.5], logp = [-1, -2]: [1, 1] -> token-mean 1; grads -A / 2.
  Batch b = make(row({-1, -2}), row({-1.5f, -2}), row({1, 0.5f}), torch::ones({1, 2}));
  PolicyLossResult r = reinforce_loss(b.in, LossAggMode::kTokenMean);
  EXPECT_NEAR(r.loss.item<float>(), 1.0, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({-0.5f, -0.25f}), 1e-7));
  EXPECT_NEAR(r.metrics.ppo_kl, -0.25, 1e-6);  // mean(old - logp) = (-0.5 + 0) / 2
  Batch g = make(row({-1, -2}), row({-1, -2}), row({1, 0.5f}), torch::ones({1, 2}));
  EXPECT_NEAR(gpg_loss(g.in, LossAggMode::kSeqMeanTokenSum).loss.item<float>(), 2.0, 1e-6);
  // SFT: NLL of the masked tokens: (1 + 2) / 2.
  at::Tensor lp = row({-1, -2, -3}).requires_grad_(true);
  at::Tensor nll = sft_loss(lp, row({1, 1, 0}));
  EXPECT_NEAR(nll.item<float>(), 1.5, 1e-6);
  nll.backward();
  EXPECT_TRUE(AllClose(lp.grad(), row({-0.5f, -0.5f, 0}), 1e-7));
}

// -------------------------------------------------------------------- LUFFY

// Row of 4, tokens 2 and 3 off-policy (behavior log-prob NaN). clip 0.2, gamma 0.1:
//   t0 on  A=+1 r=1.1: -1.1, grad -1.1
//   t1 on  A=-1 r=0.5: clipped low, 0.8, grad 0
//   t2 off A=+1 p=0.4: f = 0.4 / 0.5 = 0.8, loss -0.8, grad -A gamma p / (p + gamma)^2 = -0.16
//   t3 off A=-1 p=0.9: f = 0.9 / 1.0 = 0.9, loss 0.9, grad +0.09
// token-mean: (-1.1 + 0.8 - 0.8 + 0.9) / 4 = -0.05; grads / 4.
struct LuffyCase {
  at::Tensor old = row({-1, -1, kNaN, kNaN});
  at::Tensor logp = row({-1 + ln(1.1), -1 + ln(0.5), ln(0.4), ln(0.9)});
  at::Tensor adv = row({1, -1, 1, -1});
  at::Tensor mask = torch::ones({1, 4});
  at::Tensor off = row({0, 0, 1, 1});
};

TEST(LuffyLossTest, MixedOnAndOffPolicyTokens) {
  LuffyCase c;
  Batch b = make(c.logp, c.old, c.adv, c.mask);
  LuffyOptions o;
  ASSERT_TRUE(check_options(o, "o").ok()) << check_options(o, "o");
  LuffyLossResult r = luffy_loss(b.in, c.off, o);
  EXPECT_NEAR(r.loss.item<float>(), -0.05, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({-0.275f, 0, -0.04f, 0.0225f}), 1e-6));
  EXPECT_NEAR(r.metrics.off_ratio_mean, 0.85, 1e-6);
  EXPECT_NEAR(r.metrics.off_policy_prob, 0.65, 1e-6);
  EXPECT_NEAR(r.metrics.off_policy_fraction, 0.5, 1e-9);
  EXPECT_NEAR(r.metrics.on_policy.clip_fraction, 0.5, 1e-9);
  EXPECT_NEAR(r.metrics.on_loss, -0.15, 1e-6);
  EXPECT_NEAR(r.metrics.off_loss, 0.05, 1e-6);
}

TEST(LuffyLossTest, RemoveClipAndSftTerm) {
  // loss_remove_clip: t1 becomes -A r = 0.5 with grad 0.5 -> (-1.1 + 0.5 - 0.8 + 0.9) / 4.
  // sft_coef 0.1: + 0.1 * mean(-logp over off tokens) = 0.1 * -(ln 0.4 + ln 0.9) / 2.
  LuffyCase c;
  Batch b = make(c.logp, c.old, c.adv, c.mask);
  LuffyOptions o;
  o.loss_remove_clip = true;
  o.sft_coef = 0.1;
  LuffyLossResult r = luffy_loss(b.in, c.off, o);
  const double sft = -(std::log(0.4) + std::log(0.9)) / 2;  // 0.5108256
  EXPECT_NEAR(r.loss.item<float>(), -0.125 + 0.1 * sft, 1e-6);
  EXPECT_NEAR(r.metrics.sft_loss, sft, 1e-6);
  r.loss.backward();
  // SFT adds -0.1 / 2 to each off token's gradient.
  EXPECT_TRUE(
      AllClose(b.logp.grad(), row({-0.275f, 0.125f, -0.04f - 0.05f, 0.0225f - 0.05f}), 1e-6));
}

// On-policy ratio shaping (LUFFY's on_policy_reshape) on LuffyCase: the
// shaped ratio r' is clipped to [0.8, 1.2] instead of r. Off-policy tokens
// are unchanged: -0.8 (t2) + 0.9 (t3).
TEST(LuffyLossTest, OnPolicyShaping) {
  LuffyCase c;
  struct Case {
    OffPolicyShaping shaping;
    double loss;
    double grad0;  // d loss / d logp of t0 (t1 is clipped in every case)
  } cases[] = {
      // sqrt: t0 -sqrt(1.1) = -1.048809; t1 max(sqrt(0.5), 0.8) = 0.8 (clipped);
      // (-1.048809 + 0.8 + 0.1) / 4; grad t0 = -0.5 sqrt(1.1) / 4.
      {OffPolicyShaping::kSquareRoot, -0.0372022120, -0.1311011060},
      // p_logp (weight 1): t0 -(1.1 + ln 1.1); t1 max(0.5 + ln 0.5, 0.8) = 0.8;
      // grad t0 = -(r + 1) / 4 = -2.1 / 4.
      {OffPolicyShaping::kPLogp, -0.0738275450, -0.525},
      // p_div_p (gamma 0.1): f(p) = p / (p + 0.1), p = e^-1 r, p_old = e^-1:
      // t0 r' = f(1.1 e^-1) / f(e^-1) = 1.019815; t1 r' = 0.823906 (inside the band).
      {OffPolicyShaping::kPDivP, -0.0239771864, std::nan("")},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(static_cast<int>(k.shaping));
    Batch b = make(c.logp, c.old, c.adv, c.mask);
    LuffyOptions o;
    o.on_policy_shaping = k.shaping;
    ASSERT_TRUE(check_options(o, "o").ok()) << check_options(o, "o");
    LuffyLossResult r = luffy_loss(b.in, c.off, o);
    EXPECT_NEAR(r.loss.item<float>(), k.loss, 1e-6);
    r.loss.backward();
    if (!std::isnan(k.grad0)) {
      EXPECT_NEAR(b.logp.grad()[0][0].item<float>(), k.grad0, 1e-6);
      EXPECT_EQ(b.logp.grad()[0][1].item<float>(), 0.0f) << "t1 is clipped";
      EXPECT_NEAR(r.metrics.on_policy.clip_fraction, 0.5, 1e-9);
    }
    EXPECT_NEAR(b.logp.grad()[0][2].item<float>(), -0.04, 1e-6);
  }
  LuffyOptions bad;
  bad.on_policy_pow_exponent = 0;
  EXPECT_EQ(check_options(bad, "luffy").message(), "luffy.on_reshape_pow_exp: must be > 0, got 0");
}

TEST(LuffyLossTest, ShapingVariantsAndClips) {
  // One off-policy token, A = -1, p = 0.25: loss = f(p), gradient = df/dlogp.
  struct Case {
    OffPolicyShaping shaping;
    double exponent;
    float value, grad;
  };
  const float lp = ln(0.25);  // -1.3862944
  for (const Case& k : {Case{OffPolicyShaping::kNoReshape, 0, 0.25f, 0.25f},
                        Case{OffPolicyShaping::kLogp, 0, lp, 1.0f},
                        Case{OffPolicyShaping::kPLogp, 0, 0.25f + lp, 1.25f},
                        Case{OffPolicyShaping::kSquareRoot, 0, 0.5f, 0.25f},
                        Case{OffPolicyShaping::kPow, 2.0, 0.0625f, 0.125f}}) {
    Batch b = make(row({lp}), row({kNaN}), row({-1}), torch::ones({1, 1}));
    LuffyOptions o;
    o.shaping = k.shaping;
    o.pow_exponent = k.exponent > 0 ? k.exponent : 0.5;
    LuffyLossResult r = luffy_loss(b.in, row({1}), o);
    EXPECT_NEAR(r.loss.item<float>(), k.value, 1e-6) << static_cast<int>(k.shaping);
    r.loss.backward();
    EXPECT_NEAR(b.logp.grad().item<float>(), k.grad, 1e-6) << static_cast<int>(k.shaping);
  }
  // off_max_clip 0.5 on p_div_p f = 0.4 / 0.5 = 0.8: value 0.5, no gradient.
  Batch b = make(row({ln(0.4)}), row({kNaN}), row({-1}), torch::ones({1, 1}));
  LuffyOptions o;
  o.off_max_clip = 0.5;
  LuffyLossResult r = luffy_loss(b.in, row({1}), o);
  EXPECT_NEAR(r.loss.item<float>(), 0.5, 1e-6);
  r.loss.backward();
  EXPECT_EQ(b.logp.grad().item<float>(), 0.0f);
  EXPECT_EQ(r.metrics.off_max_clip_fraction, 1.0);
}

// LUFFY's ppo_kl and on_pg_clipfrac run over every masked token, guidance
// tokens included (their old log-prob is the actor's recompute in LUFFY);
// relay's on-policy metrics over the sampled tokens only. LuffyCase with old
// log-probs on the guidance tokens: old(t2) = ln(0.4 / 1.5) gives r = 1.5 with A = +1 (clipped
// high), old(t3) = ln 1.8 gives r = 0.5 with A = -1 (clipped low); t1 is clipped low, t0 is not.
//   all tokens: clip 3/4 (low 2/4, high 1/4), ppo_kl (-ln 1.1 + ln 2 - ln 1.5 + ln 2) / 4
//   on-policy:  clip 1/2 (low 1/2),            ppo_kl (-ln 1.1 + ln 2) / 2
// The loss does not read the guidance tokens' old log-probs: still -0.05.
TEST(LuffyLossTest, LuffysMetricsCoverEveryTokenAndRelaysTheSampledOnes) {
  LuffyCase c;
  at::Tensor old = row({-1, -1, ln(0.4f / 1.5f), ln(1.8f)});
  Batch b = make(c.logp, old, c.adv, c.mask);
  LuffyOptions o;
  LuffyLossResult r = luffy_loss(b.in, c.off, o);
  EXPECT_NEAR(r.loss.item<float>(), -0.05, 1e-6);
  const PolicyLossMetrics& all = r.metrics.all_tokens;
  EXPECT_NEAR(all.clip_fraction, 0.75, 1e-9);
  EXPECT_NEAR(all.clip_fraction_low, 0.5, 1e-9);
  EXPECT_NEAR(all.clip_fraction_high, 0.25, 1e-9);
  const double ln11 = std::log(1.1), ln2 = std::log(2.0), ln15 = std::log(1.5);
  EXPECT_NEAR(all.ppo_kl, (-ln11 + ln2 - ln15 + ln2) / 4, 1e-6);
  const PolicyLossMetrics& on = r.metrics.on_policy;
  EXPECT_NEAR(on.clip_fraction, 0.5, 1e-9);
  EXPECT_NEAR(on.clip_fraction_low, 0.5, 1e-9);
  EXPECT_EQ(on.clip_fraction_high, 0.0);
  EXPECT_NEAR(on.ppo_kl, (-ln11 + ln2) / 2, 1e-6);
  // loss_remove_clip: LUFFY reports no clipping; ppo_kl is unchanged.
  o.loss_remove_clip = true;
  LuffyLossResult u = luffy_loss(make(c.logp, old, c.adv, c.mask).in, c.off, o);
  EXPECT_EQ(u.metrics.all_tokens.clip_fraction, 0.0);
  EXPECT_NEAR(u.metrics.all_tokens.ppo_kl, (-ln11 + ln2 - ln15 + ln2) / 4, 1e-6);
}

TEST(LuffyLossTest, NoOffPolicyTokensIsFiniteAndEqualsPpo) {
  // The bug LUFFY users hit: a micro-batch without guidance tokens must not give NaN.
  torch::manual_seed(4);
  at::Tensor logp = -torch::rand({3, 4}) * 4;
  at::Tensor old = logp + torch::randn({3, 4}) * 0.3;
  at::Tensor adv = torch::randn({3, 4});
  at::Tensor mask = (torch::rand({3, 4}) > 0.2).to(torch::kFloat32);
  LuffyOptions o;
  o.sft_coef = 0.5;
  Batch b = make(logp, old, adv, mask);
  LuffyLossResult r = luffy_loss(b.in, torch::zeros({3, 4}), o);
  ASSERT_TRUE(std::isfinite(r.loss.item<float>()));
  r.loss.backward();
  EXPECT_TRUE(b.logp.grad().isfinite().all().item<bool>());
  EXPECT_EQ(r.metrics.off_loss, 0.0);
  EXPECT_EQ(r.metrics.off_ratio_mean, 0.0);
  EXPECT_EQ(r.metrics.sft_loss, 0.0);
  // ... and it is exactly the PPO loss of LUFFY's on-policy options.
  Batch p = make(logp, old, adv, mask);
  PolicyLossResult rp = ppo_clip_loss(p.in, o.on_policy);
  EXPECT_NEAR(r.loss.item<float>(), rp.loss.item<float>(), 1e-7);
  rp.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), p.logp.grad(), 1e-7));
}

TEST(LuffyLossTest, OnlyOffPolicyTokensIsFinite) {
  Batch b = make(row({-0.5f, -30.0f}), row({kNaN, kNaN}), row({1, -1}), torch::ones({1, 2}));
  LuffyOptions o;
  o.shaping = OffPolicyShaping::kSquareRoot;
  LuffyLossResult r = luffy_loss(b.in, torch::ones({1, 2}), o);
  ASSERT_TRUE(std::isfinite(r.loss.item<float>()));
  r.loss.backward();
  EXPECT_TRUE(b.logp.grad().isfinite().all().item<bool>());
  EXPECT_EQ(r.metrics.on_policy.clip_fraction, 0.0);
}

// ------------------------------------------------------------------ entropy

TEST(EntropyLossTest, EntropyFromLogitsOnMaskedPositions) {
  // Position 0: logits [0, ln 3, -inf-ish] -> p = [0.25, 0.75, 0]:
  //   H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351.
  // Position 1: uniform over 3 -> ln 3 = 1.0986123. Position 2: masked -> 0.
  at::Tensor logits = torch::tensor({0.0f, ln(3), -1e4f, 1.0f, 1.0f, 1.0f, 5.0f, 0.0f, 0.0f})
                          .reshape({1, 3, 3})
                          .requires_grad_(true);
  at::Tensor mask = row({1, 1, 0});
  for (int64_t chunk : {1, 2, 1024}) {
    at::Tensor h = entropy_from_logits(logits, mask, chunk);
    EXPECT_TRUE(AllClose(h, row({0.5623351f, 1.0986123f, 0}), 1e-6)) << chunk;
  }
  // dH/dz_i = -p_i (ln p_i + H): position 0 -> [0.2059898, -0.2059898, 0]; uniform -> 0.
  at::Tensor h = entropy_from_logits(logits, mask, 2);
  h.sum().backward();
  EXPECT_TRUE(AllClose(logits.grad(),
                       torch::tensor({0.2059898f, -0.2059898f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f})
                           .reshape({1, 3, 3}),
                       1e-6));
  // Bonus: -coef * token-mean(H) = -0.01 * (0.5623351 + 1.0986123) / 2.
  EXPECT_NEAR(entropy_bonus_loss(h.detach(), mask, 0.01, LossAggMode::kTokenMean).item<float>(),
              -0.0083047, 1e-7);
}

}  // namespace
}  // namespace relay::trainer

#include <map>
#include <set>
#include <vector>

namespace relay::trainer {
namespace {

// ------------------------------------------------------ rollout-correction weights

TEST(IsWeightsTest, PpoMultipliesThePerTokenLossBeforeAggregation) {
  // PpoCase per-token losses (clip_high 0.28, clip_c 3):
  //   l = [-1.28, -0.5, 0.8, 3, 2, -2.2], gradients -A r or 0: [0, -0.5, 0, 0, 2, -2.2].
  // Weights w = [2, 1, 1, 1, 0.5, 2]:
  //   loss = (2(-1.28) - 0.5 + 0.8 + 3 + 0.5(2) + 2(-2.2)) / 6 = -2.66 / 6
  //   grad = w * [0, -0.5, 0, 0, 2, -2.2] / 6 = [0, -0.5, 0, 0, 1, -4.4] / 6
  PpoCase c;
  Batch b = make(c.logp, c.old, c.adv, c.mask);
  b.in.is_weights = row({2, 1, 1, 1, 0.5f, 2});
  PpoClipOptions o;
  o.clip_high = 0.28;
  PolicyLossResult r = ppo_clip_loss(b.in, o);
  EXPECT_NEAR(r.loss.item<float>(), -2.66 / 6, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({0, -0.5f / 6, 0, 0, 1.0f / 6, -4.4f / 6}), 1e-6));
  // The weights are data: metrics are those of the unweighted surrogate.
  EXPECT_NEAR(r.metrics.clip_fraction, 2.0 / 6, 1e-9);
  EXPECT_NEAR(r.metrics.mean_ratio, 9.6 / 6, 1e-6);

  // Weights 2 on one token only (t5, A = +2, r = 1.1, l = -2.2):
  //   loss = (1.82 - 2.2) / 6 = -0.38 / 6, i.e. the unweighted 1.82 / 6 plus one more -2.2 / 6.
  Batch one = make(c.logp, c.old, c.adv, c.mask);
  one.in.is_weights = row({1, 1, 1, 1, 1, 2});
  EXPECT_NEAR(ppo_clip_loss(one.in, o).loss.item<float>(), -0.38 / 6, 1e-6);
}

TEST(IsWeightsTest, WeightsAreDataNotDifferentiated) {
  // A weight tensor that requires grad gets none: the loss treats it as data.
  PpoCase c;
  Batch b = make(c.logp, c.old, c.adv, c.mask);
  at::Tensor w = torch::full({1, 6}, 2.0f).requires_grad_(true);
  b.in.is_weights = w;
  PpoClipOptions o;
  o.clip_high = 0.28;
  PolicyLossResult r = ppo_clip_loss(b.in, o);
  EXPECT_NEAR(r.loss.item<float>(), 2 * 1.82 / 6, 1e-6);  // twice the unweighted loss
  r.loss.backward();
  EXPECT_FALSE(w.grad().defined());
}

TEST(IsWeightsTest, ReinforceMultipliesThePerTokenLoss) {
  // -A logp with A = [1, 0.5], logp = [-1, -2]: [1, 1]; weights [3, 0.5] -> [3, 0.5].
  //   token-mean (3 + 0.5) / 2 = 1.75; grad -A w / 2 = [-1.5, -0.125].
  Batch b = make(row({-1, -2}), row({-1.5f, -2}), row({1, 0.5f}), torch::ones({1, 2}));
  b.in.is_weights = row({3, 0.5f});
  PolicyLossResult r = reinforce_loss(b.in, LossAggMode::kTokenMean);
  EXPECT_NEAR(r.loss.item<float>(), 1.75, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), row({-1.5f, -0.125f}), 1e-7));
  // seq-mean-token-sum with one sequence: 3 + 0.5.
  Batch s = make(row({-1, -2}), row({-1.5f, -2}), row({1, 0.5f}), torch::ones({1, 2}));
  s.in.is_weights = row({3, 0.5f});
  EXPECT_NEAR(reinforce_loss(s.in, LossAggMode::kSeqMeanTokenSum).loss.item<float>(), 3.5, 1e-6);
}

TEST(IsWeightsTest, GmpoUsesEachSequencesMeanWeight) {
  // The GmpoGeometricMeanWithSignAwareClip case with a masked third column:
  //   row 0: loss_0 = -exp(0.25) = -1.2840254; row 1: loss_1 = exp(-0.1) = 0.9048374.
  // Weights [[1, 3, 100], [0.5, 0.5, 100]]; the masked 100s do not count, so the
  // sequences' mean weights are (1 + 3) / 2 = 2 and (0.5 + 0.5) / 2 = 0.5:
  //   loss = (2 * -1.2840254 + 0.5 * 0.9048374) / 2 = -1.0578161
  // (per-token weighting would have weighted the two row-0 tokens differently).
  // Gradients: row 0 t0: -A ratio * 2 / (2 tokens * 2 rows) = -0.6420127 (t1 clipped: 0);
  //            row 1 t1: 0.9048374 * 0.5 / 4 = 0.1131047 (t0 clipped: 0).
  at::Tensor old = torch::full({2, 3}, -1.0f);
  at::Tensor logp = old + mat({{0.1f, 0.6f, 0}, {-0.6f, 0.2f, 0}});
  Batch b = make(logp, old, mat({{1, 1, 1}, {-1, -1, -1}}), mat({{1, 1, 0}, {1, 1, 0}}));
  b.in.is_weights = mat({{1, 3, 100}, {0.5f, 0.5f, 100}});
  PolicyLossResult r = gmpo_loss(b.in, GmpoOptions{});
  EXPECT_NEAR(r.loss.item<float>(), -1.0578161, 1e-6);
  r.loss.backward();
  EXPECT_TRUE(AllClose(b.logp.grad(), mat({{-0.6420127f, 0, 0}, {0, 0.1131047f, 0}}), 1e-6));
}

// ------------------------------------------------------------ loss selection

constexpr PolicyLossKind kAllKinds[] = {
    PolicyLossKind::kPpo,       PolicyLossKind::kDecoupledPpo, PolicyLossKind::kGspo,
    PolicyLossKind::kGmpo,      PolicyLossKind::kCispo,        PolicyLossKind::kSapo,
    PolicyLossKind::kClipCov,   PolicyLossKind::kKlCov,        PolicyLossKind::kGpg,
    PolicyLossKind::kReinforce, PolicyLossKind::kLuffy,
};

// One set of inputs every loss can run on: 3 x 5, a ragged mask, proximal
// log-probs away from the behavior ones, forced tokens in row 1, IS weights.
struct SelectionCase {
  at::Tensor logp, old, prox, adv, mask, off, weights;
  SelectionCase() {
    torch::manual_seed(11);
    logp = -torch::rand({3, 5}) * 2 - 0.1;
    old = logp + torch::randn({3, 5}) * 0.3;
    prox = old + torch::randn({3, 5}) * 0.2;
    adv = torch::randn({3, 1}).expand({3, 5}).contiguous();
    mask = mat({{1, 1, 1, 0, 0}, {1, 1, 1, 1, 1}, {1, 1, 0, 0, 0}});
    off = mat({{0, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {0, 0, 0, 0, 0}});
    weights = torch::rand({3, 5}) + 0.5;
  }
  PolicyLossInputs inputs(const at::Tensor& is_weights) const {
    return PolicyLossInputs{logp, old, adv, mask, prox, is_weights};
  }
};

// Non-default options for every kind, so that wiring the wrong ones shows.
PolicyLossOptions selection_options() {
  PolicyLossOptions o;
  o.ppo.clip_low = 0.1;
  o.ppo.clip_high = 0.15;
  o.ppo.behav_imp_weight_cap = 3;
  o.ppo.agg_mode = LossAggMode::kSeqMeanTokenSum;
  o.gspo = GspoOptions{0.05, 0.1};
  o.gmpo = GmpoOptions{0.1, 0.2};
  o.cispo.clip_low = 0.05;
  o.cispo.agg_mode = LossAggMode::kSeqMeanTokenMean;
  o.sapo.tau_pos = 2.0;
  o.sapo.tau_neg = 0.5;
  o.clip_cov.clip_cov_ratio = 0.3;
  o.clip_cov.clip_cov_lb = -100;
  o.clip_cov.clip_cov_ub = 100;
  o.clip_cov.seed = 5;
  o.kl_cov.kl_cov_ratio = 0.3;
  o.kl_cov.ppo_kl_coef = 2.0;
  o.luffy.gamma = 0.3;
  o.luffy.sft_coef = 0.2;
  return o;
}

// The loss of `kind` called directly.
PolicyLossResult direct(PolicyLossKind kind, const PolicyLossInputs& in, const at::Tensor& off,
                        const PolicyLossOptions& o, const GlobalNormalizer& n,
                        const GlobalNormalizer& sft_n) {
  switch (kind) {
    case PolicyLossKind::kPpo:
      return ppo_clip_loss(in, o.ppo, n);
    case PolicyLossKind::kDecoupledPpo:
      return decoupled_ppo_loss(in, o.ppo, n);
    case PolicyLossKind::kGspo:
      return gspo_loss(in, o.gspo, n);
    case PolicyLossKind::kGmpo:
      return gmpo_loss(in, o.gmpo, n);
    case PolicyLossKind::kCispo:
      return cispo_loss(in, o.cispo, n);
    case PolicyLossKind::kSapo:
      return sapo_loss(in, o.sapo, n);
    case PolicyLossKind::kClipCov:
      return clip_cov_loss(in, o.clip_cov, n);
    case PolicyLossKind::kKlCov:
      return kl_cov_loss(in, o.kl_cov, n);
    case PolicyLossKind::kGpg:
      return gpg_loss(in, o.ppo.agg_mode, n);
    case PolicyLossKind::kReinforce:
      return reinforce_loss(in, o.ppo.agg_mode, n);
    case PolicyLossKind::kLuffy: {
      LuffyLossResult l = luffy_loss(in, off, o.luffy, n, sft_n);
      return PolicyLossResult{l.loss, l.metrics.all_tokens};  // LUFFY's definitions
    }
  }
  return {};
}

TEST(PolicyLossSelectionTest, ComputePolicyLossEqualsTheDirectCallForEveryKind) {
  SelectionCase c;
  const PolicyLossInputs in = c.inputs(c.weights);
  GlobalNormalizer n;  // step-wide counts larger than this micro-batch's
  n.num_tokens = 20;
  n.num_sequences = 4;
  n.loss_scale_factor = 8;
  GlobalNormalizer sft_n;
  sft_n.num_tokens = 6;
  PolicyLossOptions o = selection_options();
  std::map<std::string, double> values;
  for (PolicyLossKind kind : kAllKinds) {
    SCOPED_TRACE(kPolicyLossNames.name(kind));
    o.kind = kind;
    PolicyLossResult got = compute_policy_loss(in, c.off, o, n, sft_n);
    PolicyLossResult want = direct(kind, in, c.off, o, n, sft_n);
    ASSERT_TRUE(std::isfinite(got.loss.item<float>()));
    EXPECT_FLOAT_EQ(got.loss.item<float>(), want.loss.item<float>());
    EXPECT_DOUBLE_EQ(got.metrics.clip_fraction, want.metrics.clip_fraction);
    EXPECT_DOUBLE_EQ(got.metrics.ppo_kl, want.metrics.ppo_kl);
    EXPECT_DOUBLE_EQ(got.metrics.mean_ratio, want.metrics.mean_ratio);
    EXPECT_DOUBLE_EQ(got.metrics.behav_imp_weight, want.metrics.behav_imp_weight);
    values[kPolicyLossNames.name(kind)] = got.loss.item<float>();
  }
  // The kinds are really different losses on these inputs (GPG and REINFORCE
  // share a per-token loss by definition).
  EXPECT_EQ(values["gpg"], values["reinforce"]);
  std::set<double> distinct;
  for (const auto& [name, v] : values) distinct.insert(v);
  EXPECT_EQ(distinct.size(), values.size() - 1);
  // REINFORCE aggregates with ppo.agg_mode (seq-mean-token-sum here), not token-mean.
  EXPECT_NE(values["reinforce"], reinforce_loss(in, LossAggMode::kTokenMean, n).loss.item<float>());
}

TEST(PolicyLossSelectionTest, UndefinedIsWeightsEqualAllOnesForEveryKind) {
  SelectionCase c;
  PolicyLossOptions o = selection_options();
  for (PolicyLossKind kind : kAllKinds) {
    SCOPED_TRACE(kPolicyLossNames.name(kind));
    o.kind = kind;
    const float none = compute_policy_loss(c.inputs(at::Tensor()), c.off, o).loss.item<float>();
    const float ones =
        compute_policy_loss(c.inputs(torch::ones({3, 5})), c.off, o).loss.item<float>();
    EXPECT_FLOAT_EQ(none, ones);
    // And the weights are read by every kind: a uniform weight 2 doubles the
    // policy term (LUFFY's SFT term is not weighted, so it is off here).
    PolicyLossOptions no_sft = o;
    no_sft.luffy.sft_coef = 0;
    const float base =
        compute_policy_loss(c.inputs(at::Tensor()), c.off, no_sft).loss.item<float>();
    const float twice =
        compute_policy_loss(c.inputs(torch::full({3, 5}, 2.0f)), c.off, no_sft).loss.item<float>();
    EXPECT_NEAR(twice, 2 * base, 1e-6 * std::max(1.0f, std::fabs(base)));
    EXPECT_NE(base, 0.0f);
  }
}

TEST(PolicyLossSelectionTest, LuffyExtraMetricsAreReportedUnderLuffyNames) {
  // LuffyCase: on_loss -0.15, off_loss 0.05, off_ratio_mean 0.85, off_policy_prob 0.65,
  // off_policy_fraction 0.5, no off clips, no SFT; on-policy clip_fraction 0.5 (t1).
  LuffyCase c;
  PolicyLossOptions o;
  o.kind = PolicyLossKind::kLuffy;
  PolicyLossInputs in{c.logp, c.old, c.adv, c.mask, at::Tensor(), at::Tensor()};
  std::map<std::string, double> extra;
  PolicyLossResult r = compute_policy_loss(in, c.off, o, {}, {}, &extra);
  EXPECT_NEAR(r.loss.item<float>(), -0.05, 1e-6);
  // The returned metrics are LUFFY's, over all 4 tokens: t1 clipped of 4,
  // ppo_kl (-ln 1.1 + ln 2 + 0 + 0) / 4 (no old log-prob: ratio 1).
  EXPECT_NEAR(r.metrics.clip_fraction, 0.25, 1e-9);
  EXPECT_NEAR(r.metrics.ppo_kl, (-std::log(1.1) + std::log(2.0)) / 4, 1e-6);
  std::set<std::string> names;
  for (const auto& [k, v] : extra) names.insert(k);
  EXPECT_EQ(names,
            (std::set<std::string>{"luffy/on_loss", "luffy/off_loss", "luffy/off_ratio_mean",
                                   "luffy/off_max_clip_fraction", "luffy/off_min_clip_fraction",
                                   "luffy/off_policy_prob", "luffy/off_policy_fraction",
                                   "luffy/sft_loss", "luffy/on_pg_clipfrac",
                                   "luffy/on_policy_ppo_kl", "luffy/on_policy_clip_fraction"}));
  EXPECT_NEAR(extra["luffy/on_pg_clipfrac"], 0.25, 1e-9);
  EXPECT_NEAR(extra["luffy/on_policy_clip_fraction"], 0.5, 1e-9);  // t1 of the 2 sampled
  EXPECT_NEAR(extra["luffy/on_policy_ppo_kl"], (-std::log(1.1) + std::log(2.0)) / 2, 1e-6);
  EXPECT_NEAR(extra["luffy/on_loss"], -0.15, 1e-6);            // (-1.1 + 0.8) / 2
  EXPECT_NEAR(extra["luffy/off_loss"], 0.05, 1e-6);            // (-0.8 + 0.9) / 2
  EXPECT_NEAR(extra["luffy/off_ratio_mean"], 0.85, 1e-6);      // (0.8 + 0.9) / 2
  EXPECT_NEAR(extra["luffy/off_policy_prob"], 0.65, 1e-6);     // (0.4 + 0.9) / 2
  EXPECT_NEAR(extra["luffy/off_policy_fraction"], 0.5, 1e-9);  // 2 of 4 tokens
  EXPECT_EQ(extra["luffy/off_max_clip_fraction"], 0.0);
  EXPECT_EQ(extra["luffy/off_min_clip_fraction"], 0.0);
  EXPECT_EQ(extra["luffy/sft_loss"], 0.0);
  // Without a map nothing is written (and nothing breaks).
  EXPECT_NEAR(compute_policy_loss(in, c.off, o).loss.item<float>(), -0.05, 1e-6);
  // Other kinds add nothing.
  std::map<std::string, double> none;
  o.kind = PolicyLossKind::kPpo;
  PolicyLossInputs finite{c.logp, torch::full({1, 4}, -1.0f), c.adv, c.mask, {}, {}};
  compute_policy_loss(finite, c.off, o, {}, {}, &none);
  EXPECT_TRUE(none.empty());
}

// ------------------------------------------------------------ entropy control

TEST(EntropyControllerTest, FixedCoefficientNeverMoves) {
  EntropyControlOptions o;
  o.coef = 0.01;  // target 0: fixed
  ASSERT_TRUE(check_options(o, "o").ok()) << check_options(o, "o");
  EntropyController c(o);
  EXPECT_EQ(c.value(), 0.01);
  for (double h : {0.0, 0.5, 5.0}) EXPECT_EQ(c.coef_for(h), 0.01) << h;
  c.update(0.0);
  c.update(100.0);
  EXPECT_EQ(c.value(), 0.01);
  EXPECT_EQ(c.coef_for(1.0), 0.01);
  // A negative target is fixed too.
  o.target = -1;
  EntropyController neg(o);
  neg.update(-5);
  EXPECT_EQ(neg.value(), 0.01);
  EXPECT_EQ(neg.coef_for(3.0), 0.01);
}

TEST(EntropyControllerTest, AdaptiveCoefficientStepsByDeltaWithinBounds) {
  EntropyControlOptions o;
  o.coef = 0.002;
  o.target = 1.0;
  o.delta = 0.001;
  o.max_coef = 0.004;
  ASSERT_TRUE(check_options(o, "o").ok()) << check_options(o, "o");
  EntropyController c(o);
  EXPECT_EQ(c.value(), 0.002);
  // The bonus applies only below the target.
  EXPECT_EQ(c.coef_for(0.5), 0.002);
  EXPECT_EQ(c.coef_for(1.0), 0.0);  // entropy >= target
  EXPECT_EQ(c.coef_for(1.5), 0.0);
  // Below the target: up by delta, clamped at max_coef.
  c.update(0.5);
  EXPECT_NEAR(c.value(), 0.003, 1e-15);  // 0.002 + 0.001
  EXPECT_NEAR(c.coef_for(0.9), 0.003, 1e-15);
  c.update(0.5);
  EXPECT_NEAR(c.value(), 0.004, 1e-15);  // 0.003 + 0.001 = max_coef
  c.update(0.5);
  EXPECT_NEAR(c.value(), 0.004, 1e-15);  // min(0.005, 0.004)
  // Above the target: down by delta, clamped at 0.
  c.update(2.0);
  EXPECT_NEAR(c.value(), 0.003, 1e-15);
  EXPECT_EQ(c.coef_for(2.0), 0.0);
  c.update(2.0);
  c.update(2.0);
  EXPECT_NEAR(c.value(), 0.001, 1e-15);  // 0.003 - 2 * 0.001
  c.update(2.0);
  EXPECT_NEAR(c.value(), 0.0, 1e-15);
  c.update(2.0);
  EXPECT_EQ(c.value(), 0.0);  // max(-0.001, 0)
  EXPECT_GE(c.value(), 0.0);
  c.update(0.1);
  EXPECT_NEAR(c.value(), 0.001, 1e-15);  // 0 + 0.001
}

}  // namespace
}  // namespace relay::trainer
