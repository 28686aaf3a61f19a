// The one-pass AdamW update (src/trainer/adamw_kernel.h) against torch's
// AdamW, and slice by slice against itself.

#include "trainer/adamw_kernel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "trainer/adamw_internal.h"

namespace relay::trainer {
namespace {

OptimizerOptions decaying() {
  OptimizerOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  return o;
}

struct State {
  at::Tensor param, exp_avg, exp_avg_sq;
};

State fresh(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({n}), torch::zeros({n}), torch::zeros({n})};
}

std::vector<at::Tensor> gradients(int64_t n, int steps, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> g;
  // Mixed scales, exact zeros and one huge value: denominators near eps
  // and far from it.
  for (int s = 0; s < steps; ++s) {
    at::Tensor x = torch::randn({n}) * torch::pow(10.0, torch::randint(-6, 2, {n}).to(at::kFloat));
    x.index_put_({torch::randint(0, n, {n / 10})}, 0.0f);
    x[0] = 1e4f;
    g.push_back(x);
  }
  return g;
}

TEST(AdamWKernelTest, MatchesTorchAdamWOverSeveralSteps) {
  for (const OptimizerOptions& o : {OptimizerOptions{}, decaying()}) {
    const int64_t n = 100'003;  // not a multiple of 8: the scalar tail runs too
    State mine = fresh(n, 1);
    at::Tensor theirs = mine.param.clone().set_requires_grad(true);
    torch::optim::AdamW torch_adamw({theirs}, adamw_options(o));
    const std::vector<at::Tensor> g = gradients(n, 5, 2);
    for (int s = 0; s < 5; ++s) {
      adamw_update(mine.param, g[s], mine.exp_avg, mine.exp_avg_sq, s + 1, o, o.lr);
      theirs.mutable_grad() = g[s].clone();
      torch_adamw.step();
    }
    // Bit for bit: the rounding of ATen's kernels (adamw_kernel.h).
    torch::optim::AdamWParamState* st = adamw_state(torch_adamw, theirs);
    ASSERT_NE(st, nullptr);
    EXPECT_TRUE(torch::equal(mine.param, theirs.detach())) << "weight_decay " << o.weight_decay;
    EXPECT_TRUE(torch::equal(mine.exp_avg, st->exp_avg())) << "weight_decay " << o.weight_decay;
    EXPECT_TRUE(torch::equal(mine.exp_avg_sq, st->exp_avg_sq()))
        << "weight_decay " << o.weight_decay;
    EXPECT_FALSE(torch::equal(mine.param, fresh(n, 1).param));
  }
}

TEST(AdamWKernelTest, SlicesAtAnyOffsetGiveTheBitsOfTheWholeTensor) {
  // Past the threshold where the update runs on the intra-op threads.
  const int64_t n = (int64_t{1} << 19) + 37;
  const OptimizerOptions o = decaying();
  State whole = fresh(n, 3), sliced = fresh(n, 3);
  const std::vector<at::Tensor> g = gradients(n, 3, 4);
  for (int s = 0; s < 3; ++s) {
    adamw_update(whole.param, g[s], whole.exp_avg, whole.exp_avg_sq, s + 1, o, o.lr);
    // Slices of odd lengths, so an element lands in the vector body in
    // one update and in the scalar tail in another.
    const std::vector<int64_t> cuts = {0, 5, 13, 100, 4099, 70'001, n};
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t a = cuts[k], len = cuts[k + 1] - a;
      at::Tensor p = sliced.param.narrow(0, a, len), m = sliced.exp_avg.narrow(0, a, len),
                 v = sliced.exp_avg_sq.narrow(0, a, len);
      adamw_update(p, g[s].narrow(0, a, len), m, v, s + 1, o, o.lr);
    }
  }
  EXPECT_TRUE(torch::equal(whole.param, sliced.param));
  EXPECT_TRUE(torch::equal(whole.exp_avg, sliced.exp_avg));
  EXPECT_TRUE(torch::equal(whole.exp_avg_sq, sliced.exp_avg_sq));
}

TEST(AdamWKernelTest, OtherLayoutsTakeTorchsOperations) {
  const OptimizerOptions o = decaying();
  at::Tensor base = torch::randn({64, 33});
  State fused = {base.clone(), torch::zeros({64, 33}), torch::zeros({64, 33})};
  // A transposed (non-contiguous) parameter and its state cannot be fused.
  State strided = {base.t().contiguous().t(), torch::zeros({33, 64}).t(),
                   torch::zeros({33, 64}).t()};
  const at::Tensor g = torch::randn({64, 33});
  ASSERT_TRUE(adamw_fusable(fused.param, g, fused.exp_avg, fused.exp_avg_sq));
  ASSERT_FALSE(adamw_fusable(strided.param, g, strided.exp_avg, strided.exp_avg_sq));
  ASSERT_FALSE(adamw_fusable(fused.param.to(at::kDouble), g.to(at::kDouble),
                             fused.exp_avg.to(at::kDouble), fused.exp_avg_sq.to(at::kDouble)));
  adamw_update(fused.param, g, fused.exp_avg, fused.exp_avg_sq, 1, o, o.lr);
  adamw_update(strided.param, g, strided.exp_avg, strided.exp_avg_sq, 1, o, o.lr);
  EXPECT_TRUE(torch::equal(fused.param, strided.param.contiguous()));
  EXPECT_FALSE(torch::equal(fused.param, base));
}

}  // namespace
}  // namespace relay::trainer
