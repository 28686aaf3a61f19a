// row_linear (src/model/row_linear.h): few-row products take the skinny
// kernel or BLAS matrix-vector products, everything else is torch::linear,
// and all agree.

#include "model/row_linear.h"

#include "model/kernel_pool.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <string>
#include <vector>

#include "relay/model/device.h"

namespace relay::model {
namespace {

struct Operands {
  at::Tensor weight, bias;
};

Operands make_operands(int64_t out, int64_t in, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({out, in}), torch::randn({out})};
}

// Exactly what one addmv (or mv) per row gives.
at::Tensor by_rows(const at::Tensor& x, const Operands& o, bool with_bias) {
  const at::Tensor flat = x.reshape({-1, o.weight.size(1)});
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < flat.size(0); ++r) {
    rows.push_back(with_bias ? torch::addmv(o.bias, o.weight, flat[r])
                             : torch::mv(o.weight, flat[r]));
  }
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = o.weight.size(0);
  return torch::stack(rows).view(sizes);
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

// 67 inputs: eight-lane blocks and a remainder; 1000 outputs: several
// parallel_for tasks.
TEST(RowLinearTest, SkinnyKernelAgreesWithLinearForOneToFourRows) {
  torch::NoGradGuard no_grad;
  std::printf("skinny kernel on this CPU: %s\n", has_skinny_kernel() ? "yes" : "no");
  const Operands o = make_operands(1000, 67, 1);
  for (bool with_bias : {true, false}) {
    const at::Tensor bias = with_bias ? o.bias : at::Tensor();
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
             {67}, {1, 67}, {1, 1, 67}, {2, 67}, {3, 1, 67}, {4, 67}, {2, 2, 67}}) {
      SCOPED_TRACE(::testing::PrintToString(shape) + (with_bias ? " bias" : " no bias"));
      const at::Tensor x = torch::randn(shape);
      const at::Tensor want = torch::linear(x, o.weight, bias);
      const at::Tensor y = row_linear(x, o.weight, bias, RowKernel::kSkinny);
      ASSERT_EQ(y.sizes(), want.sizes());
      EXPECT_LE(relative_error(y, want), 1e-6);
      // A non-contiguous input (every other row of a wider tensor) too.
      const at::Tensor wide = torch::randn({x.numel() / 67, 134}).narrow(1, 0, 67);
      EXPECT_LE(relative_error(row_linear(wide, o.weight, bias, RowKernel::kSkinny),
                               torch::linear(wide, o.weight, bias)),
                1e-6);
    }
  }
}

// The kernel takes the weight rows three at a time: output counts with each
// remainder, split over threads or not, and every row of a batch gives the
// same bits as that row alone (the property decoding relies on to record the
// same log-prob for a sequence whatever else is in the batch).
TEST(RowLinearTest, SkinnyRowsGiveTheSameBitsInAnyBatch) {
  if (!has_skinny_kernel()) GTEST_SKIP() << "no AVX2/FMA on this CPU";
  torch::NoGradGuard no_grad;
  const int threads = at::get_num_threads();
  const int kernel_threads = kernel_pool()->threads();
  // {LibTorch intra-op threads, kernel-pool threads}: the kernel runs on
  // the intra-op pool when the kernel pool has one thread.
  const std::vector<std::pair<int, int>> settings = {{1, 1}, {2, 1}, {1, 2}, {1, 3}};
  for (int64_t out : {1, 2, 3, 4, 5, 3001}) {
    const Operands o = make_operands(out, 131, 10 + out);
    const at::Tensor x = torch::randn({kMaxSkinnyRows, 131});
    at::Tensor first;
    for (const auto& [intra_op, pool] : settings) {
      at::set_num_threads(intra_op);
      set_kernel_threads(pool);
      SCOPED_TRACE("out " + std::to_string(out) + ", intra-op threads " + std::to_string(intra_op) +
                   ", kernel-pool threads " + std::to_string(pool));
      const at::Tensor all = row_linear(x, o.weight, o.bias, RowKernel::kSkinny);
      EXPECT_LE(relative_error(all, torch::linear(x, o.weight, o.bias)), 1e-6);
      if (!first.defined()) first = all;
      EXPECT_TRUE(torch::equal(all, first)) << "bits differ between thread settings";
      for (int64_t rows = 1; rows <= kMaxSkinnyRows; ++rows) {
        const at::Tensor some =
            row_linear(x.narrow(0, 0, rows), o.weight, o.bias, RowKernel::kSkinny);
        EXPECT_TRUE(torch::equal(some, all.narrow(0, 0, rows))) << rows << " rows";
        const at::Tensor last = row_linear(x[rows - 1], o.weight, o.bias, RowKernel::kSkinny);
        EXPECT_TRUE(torch::equal(last, all[rows - 1])) << "row " << rows - 1 << " alone";
      }
    }
  }
  at::set_num_threads(threads);
  set_kernel_threads(kernel_threads);
}

TEST(RowLinearTest, MatrixVectorKernelIsOneAddmvPerRow) {
  torch::NoGradGuard no_grad;
  const Operands o = make_operands(96, 64, 2);
  for (bool with_bias : {true, false}) {
    const at::Tensor bias = with_bias ? o.bias : at::Tensor();
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{64}, {1, 1, 64}, {2, 64}}) {
      const at::Tensor x = torch::randn(shape);
      const at::Tensor y = row_linear(x, o.weight, bias, RowKernel::kMatrixVector);
      EXPECT_TRUE(torch::equal(y, by_rows(x, o, with_bias)));
      EXPECT_LE(relative_error(y, torch::linear(x, o.weight, bias)), 1e-6);
    }
    // Three rows are past it: linear itself.
    const at::Tensor x = torch::randn({3, 64});
    EXPECT_TRUE(torch::equal(row_linear(x, o.weight, bias, RowKernel::kMatrixVector),
                             torch::linear(x, o.weight, bias)));
  }
}

TEST(RowLinearTest, MoreRowsGradientsAndAutocastAreLinearItself) {
  const Operands o = make_operands(96, 64, 3);
  {
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({kMaxSkinnyRows + 1, 64});
    EXPECT_TRUE(torch::equal(row_linear(x, o.weight, o.bias), torch::linear(x, o.weight, o.bias)));
  }
  // With autograd: linear's own graph, so its gradients are linear's.
  const at::Tensor x = torch::randn({1, 64}).requires_grad_(true);
  const at::Tensor y = row_linear(x, o.weight, o.bias);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, torch::linear(x, o.weight, o.bias)));
  y.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), o.weight.sum(0).view({1, 64}), 1e-5, 1e-5));
  // Under CPU autocast the product runs in bfloat16, as linear's does.
  torch::NoGradGuard no_grad;
  const AutocastGuard autocast(c10::DeviceType::CPU, torch::kBFloat16);
  const at::Tensor one = torch::randn({1, 64});
  const at::Tensor low = row_linear(one, o.weight, o.bias);
  EXPECT_EQ(low.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(low, torch::linear(one, o.weight, o.bias)));
}

}  // namespace
}  // namespace relay::model
