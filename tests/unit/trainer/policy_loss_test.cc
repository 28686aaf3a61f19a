#include "relay/trainer/policy_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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
  // seq-mean-token-sum-norm: 7 / (2 seqs * C), C = L = 3 by default, or 10.
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenSumNorm).item<float>(), 7.0 / 6,
              1e-6);
  GlobalNormalizer n;
  n.loss_scale_factor = 10;
  EXPECT_NEAR(aggregate_loss(loss, mask, LossAggMode::kSeqMeanTokenSumNorm, n).item<float>(), 0.35,
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
    EXPECT_EQ(aggregate_loss(loss, empty, mode).item<float>(), 0.0f) << loss_agg_mode_name(mode);
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
    EXPECT_NEAR(total.item<float>(), full_loss.item<float>(), 1e-6) << loss_agg_mode_name(mode);
    EXPECT_TRUE(AllClose(logp.grad(), full.logp.grad(), 1e-6)) << loss_agg_mode_name(mode);
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

TEST(LossAggregationTest, ParsesVerlNames) {
  auto m = parse_loss_agg_mode("seq-mean-token-sum-norm");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, LossAggMode::kSeqMeanTokenSumNorm);
  auto bad = parse_loss_agg_mode("token_mean", "trainer.loss_agg_mode");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("trainer.loss_agg_mode"), std::string::npos);
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
  ASSERT_TRUE(validate(o).ok());
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

TEST(PolicyLossTest, OptionsValidationNamesTheField) {
  PpoClipOptions o;
  o.clip_c = 0.5;
  Status s = validate(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("ppo.clip_c"), std::string::npos);
  o = PpoClipOptions{};
  o.clip_delta = 1.1;  // must exceed 1 + clip_high
  EXPECT_NE(std::string(validate(o, "actor").message()).find("actor.clip_delta"),
            std::string::npos);
  o = PpoClipOptions{};
  o.behav_imp_weight_cap = 0.9;
  EXPECT_FALSE(validate(o).ok());
  EXPECT_TRUE(validate(PpoClipOptions{}).ok());
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
  ASSERT_TRUE(validate(o).ok());
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

TEST(LuffyLossTest, ParsesShapingNames) {
  double gamma = 0.1;
  auto s = parse_off_policy_shaping("p_div_p_0.5", &gamma);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, OffPolicyShaping::kPDivP);
  EXPECT_DOUBLE_EQ(gamma, 0.5);
  auto bad = parse_off_policy_shaping("p_div_q", nullptr, "luffy.off_policy_reshape");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("luffy.off_policy_reshape"),
            std::string::npos);
  LuffyOptions o;
  o.gamma = 0;
  EXPECT_NE(std::string(validate(o).message()).find("luffy.gamma"), std::string::npos);
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
