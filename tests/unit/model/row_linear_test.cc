// row_linear (src/model/row_linear.h): few-row products take a skinny
// kernel (AVX2 or AVX-512) or BLAS matrix-vector products, everything else is torch::linear,
// and all agree.

#include "model/row_linear.h"

#include "model/cpu_features.h"
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

struct SkinnyKernel {
  RowKernel kernel;
  int64_t max_rows;
  const char* name;
};

// The skinny kernels this CPU runs (a test of one the CPU lacks would test
// the fallback instead).
std::vector<SkinnyKernel> skinny_kernels_here() {
  std::vector<SkinnyKernel> kernels;
  if (cpu_has_avx2_fma()) kernels.push_back({RowKernel::kSkinnyAvx2, kMaxAvx2Rows, "avx2"});
  if (cpu_has_avx512f()) kernels.push_back({RowKernel::kSkinnyAvx512, kMaxAvx512Rows, "avx512"});
  std::printf("skinny kernels on this CPU: %zu; kBest takes up to %lld rows\n", kernels.size(),
              static_cast<long long>(max_row_kernel_rows()));
  return kernels;
}

TEST(RowLinearTest, BestKernelIsTheWidestThisCpuHas) {
  const RowKernel best = best_row_kernel();
  if (cpu_has_avx512f()) {
    EXPECT_EQ(best, RowKernel::kSkinnyAvx512);
    EXPECT_EQ(max_row_kernel_rows(), kMaxAvx512Rows);
  } else if (cpu_has_avx2_fma()) {
    EXPECT_EQ(best, RowKernel::kSkinnyAvx2);
    EXPECT_EQ(max_row_kernel_rows(), kMaxAvx2Rows);
  } else {
    EXPECT_EQ(best, RowKernel::kMatrixVector);
    EXPECT_EQ(max_row_kernel_rows(), kMaxMatrixVectorRows);
  }
}

// 131 inputs: sixteen- and eight-lane blocks and a remainder; 1000 outputs:
// several tasks. Every row count each kernel takes, in several shapes.
TEST(RowLinearTest, SkinnyKernelsAgreeWithLinearForEveryRowCountTheyTake) {
  torch::NoGradGuard no_grad;
  const Operands o = make_operands(1000, 131, 1);
  for (const SkinnyKernel& k : skinny_kernels_here()) {
    for (bool with_bias : {true, false}) {
      const at::Tensor bias = with_bias ? o.bias : at::Tensor();
      std::vector<std::vector<int64_t>> shapes = {{131}, {1, 1, 131}, {3, 1, 131}, {2, 1, 1, 131}};
      for (int64_t rows = 1; rows <= k.max_rows; ++rows) shapes.push_back({rows, 131});
      for (const std::vector<int64_t>& shape : shapes) {
        SCOPED_TRACE(std::string(k.name) + " " + ::testing::PrintToString(shape) +
                     (with_bias ? " bias" : " no bias"));
        const at::Tensor x = torch::randn(shape);
        const at::Tensor want = torch::linear(x, o.weight, bias);
        const at::Tensor y = row_linear(x, o.weight, bias, k.kernel);
        ASSERT_EQ(y.sizes(), want.sizes());
        EXPECT_LE(relative_error(y, want), 1e-6);
        // A non-contiguous input (every other row of a wider tensor) too.
        const at::Tensor wide = torch::randn({x.numel() / 131, 262}).narrow(1, 0, 131);
        EXPECT_LE(relative_error(row_linear(wide, o.weight, bias, k.kernel),
                                 torch::linear(wide, o.weight, bias)),
                  1e-6);
      }
    }
  }
}

// The kernels take the weight rows three or four at a time and the AVX-512
// one the input rows eight at a time: output counts with each remainder,
// split over threads or not, and every row of a batch gives the same bits
// as that row alone (the property decoding relies on to record the same
// log-prob for a sequence whatever else is in the batch).
TEST(RowLinearTest, SkinnyRowsGiveTheSameBitsInAnyBatch) {
  const std::vector<SkinnyKernel> kernels = skinny_kernels_here();
  if (kernels.empty()) GTEST_SKIP() << "no AVX2/FMA on this CPU";
  torch::NoGradGuard no_grad;
  const int threads = at::get_num_threads();
  const int kernel_threads = kernel_pool()->threads();
  // {LibTorch intra-op threads, kernel-pool threads}: the kernel runs on
  // the intra-op pool when the kernel pool has one thread.
  const std::vector<std::pair<int, int>> settings = {{1, 1}, {2, 1}, {1, 2}, {1, 3}};
  for (const SkinnyKernel& k : kernels) {
    for (int64_t out : {1, 2, 3, 4, 5, 7, 3001}) {
      const Operands o = make_operands(out, 131, 10 + out);
      const at::Tensor x = torch::randn({k.max_rows, 131});
      at::Tensor first;
      for (const auto& [intra_op, pool] : settings) {
        at::set_num_threads(intra_op);
        set_kernel_threads(pool);
        SCOPED_TRACE(std::string(k.name) + ", out " + std::to_string(out) + ", intra-op threads " +
                     std::to_string(intra_op) + ", kernel-pool threads " + std::to_string(pool));
        const at::Tensor all = row_linear(x, o.weight, o.bias, k.kernel);
        EXPECT_LE(relative_error(all, torch::linear(x, o.weight, o.bias)), 1e-6);
        if (!first.defined()) first = all;
        EXPECT_TRUE(torch::equal(all, first)) << "bits differ between thread settings";
        for (int64_t rows = 1; rows <= k.max_rows; ++rows) {
          const at::Tensor some = row_linear(x.narrow(0, 0, rows), o.weight, o.bias, k.kernel);
          EXPECT_TRUE(torch::equal(some, all.narrow(0, 0, rows))) << rows << " rows";
          // The last rows alone, as a batch that starts past row 0.
          const at::Tensor tail =
              row_linear(x.narrow(0, rows - 1, k.max_rows - rows + 1), o.weight, o.bias, k.kernel);
          EXPECT_TRUE(torch::equal(tail, all.narrow(0, rows - 1, k.max_rows - rows + 1)))
              << "rows from " << rows - 1;
          const at::Tensor last = row_linear(x[rows - 1], o.weight, o.bias, k.kernel);
          EXPECT_TRUE(torch::equal(last, all[rows - 1])) << "row " << rows - 1 << " alone";
        }
      }
    }
  }
  at::set_num_threads(threads);
  set_kernel_threads(kernel_threads);
}

// bf16 and fp16 weights (a rollout engine's, rollout.dtype) take the same
// kernels: each weight widened to fp32 exactly, so the result is the fp32
// kernel's on the widened operands, bit for bit, rounded once to the
// weights' precision; and so within a rounding step of the exact product.
// (LibTorch's own bf16 product mostly rounds to the same bits, so this
// checks the arithmetic, not which path ran; LibTorch 1.13 has no fp16
// product on the CPU at all, so there the fp16 cases do.)
TEST(RowLinearTest, HalfPrecisionWeightsGiveFp32SumsRoundedOnce) {
  torch::NoGradGuard no_grad;
  const Operands o = make_operands(1000, 131, 4);
  for (const SkinnyKernel& k : skinny_kernels_here()) {
    for (const c10::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
      if (dtype == torch::kHalf && k.kernel == RowKernel::kSkinnyAvx2 && !cpu_has_f16c()) continue;
      // A rounding step of the dtype, relative (bf16 keeps 8 significant
      // bits, fp16 11).
      const double step = dtype == torch::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
      const at::Tensor w = o.weight.to(dtype), b = o.bias.to(dtype);
      for (bool with_bias : {true, false}) {
        const at::Tensor bias = with_bias ? b : at::Tensor();
        const at::Tensor bias32 = with_bias ? b.to(torch::kFloat32) : at::Tensor();
        // The AVX-512 kernel takes up to kMaxHalfRows rows of half-precision
        // weights; more are one widened SGEMM. bf16 where the CPU has bf16
        // products: up to kMaxBf16RowsNative, then LibTorch's bf16 product.
        const bool avx512 = k.kernel == RowKernel::kSkinnyAvx512;
        const bool native = avx512 && dtype == torch::kBFloat16 && cpu_has_avx512_bf16();
        const int64_t kernel_rows = !avx512  ? k.max_rows
                                    : native ? kMaxBf16RowsNative
                                             : kMaxHalfRows;
        std::vector<int64_t> counts;
        for (int64_t rows = 1; rows <= k.max_rows; ++rows) counts.push_back(rows);
        if (avx512) {
          counts.insert(counts.end(), {13, 17, kMaxBf16RowsNative, kMaxBf16RowsNative + 1,
                                       kMaxHalfRows, kMaxHalfRows + 1});
        }
        for (const int64_t rows : counts) {
          SCOPED_TRACE(std::string(k.name) + (dtype == torch::kHalf ? " fp16 " : " bf16 ") +
                       std::to_string(rows) + " rows" + (with_bias ? " bias" : ""));
          const at::Tensor x = torch::randn({rows, 1, 131}).to(dtype);
          const at::Tensor y = row_linear(x, w, bias, k.kernel);
          ASSERT_EQ(y.scalar_type(), dtype);
          ASSERT_EQ(y.sizes(), (std::vector<int64_t>{rows, 1, 1000}));
          const at::Tensor x32 = x.to(torch::kFloat32), w32 = w.to(torch::kFloat32);
          if (rows <= k.max_rows) {
            EXPECT_TRUE(torch::equal(y, row_linear(x32, w32, bias32, k.kernel).to(dtype)))
                << "not the fp32 kernel's sums rounded once";
          }
          const at::Tensor exact = torch::linear(x32.to(torch::kFloat64), w32.to(torch::kFloat64),
                                                 with_bias ? bias32.to(torch::kFloat64) : bias32);
          const at::Tensor err = (y.to(torch::kFloat64) - exact).abs();
          EXPECT_TRUE((err <= exact.abs() * step + 1e-5).all().item<bool>())
              << "max error " << err.max().item<double>();
          if (rows <= kernel_rows) {
            // A row alone gives the bits it gives in the batch.
            EXPECT_TRUE(torch::equal(row_linear(x[rows - 1], w, bias, k.kernel), y[rows - 1]));
          } else if (native) {
            EXPECT_TRUE(torch::equal(y, torch::linear(x, w, bias)))
                << "not LibTorch's bf16 product";
          } else {
            EXPECT_TRUE(torch::equal(y, torch::linear(x32, w32, bias32).to(dtype)))
                << "not the widened SGEMM's sums rounded once";
          }
        }
      }
    }
  }
  // Without a kernel for them (BLAS matrix-vector), linear itself.
  const at::Tensor w = o.weight.to(torch::kBFloat16),
                   x = torch::randn({2, 131}).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(row_linear(x, w, {}, RowKernel::kMatrixVector), torch::linear(x, w)));
  // Mixed precisions are linear's business (and its error).
  EXPECT_ANY_THROW(row_linear(torch::randn({1, 131}), w));
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

// Policy::extend's appends of a few positions (IncrementalRows): a sequence
// whose rows fit takes the kernel, with the bits its rows give as decode
// rows; outside the scope it is linear() itself, and so is a bf16 one past
// the kernel's rows (not the widened SGEMM of decode rows).
TEST(RowLinearTest, AShortAppendTakesTheKernelOnlyWithinIncrementalRows) {
  if (best_row_kernel() == RowKernel::kMatrixVector) {
    GTEST_SKIP() << "no AVX2/FMA on this CPU: its one-row products are linear's own";
  }
  const Operands o = make_operands(96, 64, 3);
  torch::NoGradGuard no_grad;
  const int64_t max_rows = max_row_kernel_rows();
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{1, 2, 64}, {2, 2, 64}, {1, max_rows, 64}}) {
    const at::Tensor seq = torch::randn(shape);
    const int64_t rows = seq.numel() / 64;
    if (rows > max_rows) continue;
    const at::Tensor as_rows =
        row_linear(seq.reshape({rows, 64}), o.weight, o.bias).view({shape[0], shape[1], 96});
    const at::Tensor linear = torch::linear(seq, o.weight, o.bias);
    // The two paths sum in different orders: their bits differ somewhere
    // in 96 x rows outputs (else this test could not tell them apart).
    ASSERT_FALSE(torch::equal(as_rows, linear)) << ::testing::PrintToString(shape);
    EXPECT_TRUE(torch::equal(row_linear(seq, o.weight, o.bias), linear));
    {
      IncrementalRows incremental;
      EXPECT_TRUE(torch::equal(row_linear(seq, o.weight, o.bias), as_rows))
          << ::testing::PrintToString(shape);
      { IncrementalRows nested; }
      EXPECT_TRUE(torch::equal(row_linear(seq, o.weight, o.bias), as_rows)) << "still in scope";
      const at::Tensor w16 = o.weight.to(torch::kBFloat16), b16 = o.bias.to(torch::kBFloat16);
      const at::Tensor s16 = seq.to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(
          row_linear(s16, w16, b16),
          row_linear(s16.reshape({rows, 64}), w16, b16).view_as(torch::linear(s16, w16, b16))))
          << "bf16: the kernel's bits too";
      const at::Tensor long16 = torch::randn({1, kMaxHalfAppendRows + 1, 64}).to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(row_linear(long16, w16, b16), torch::linear(long16, w16, b16)))
          << "a long bf16 append is linear() in bf16";
    }
    EXPECT_TRUE(torch::equal(row_linear(seq, o.weight, o.bias), linear)) << "scope ended";
  }
}

TEST(RowLinearTest, MoreRowsGradientsAndAutocastAreLinearItself) {
  const Operands o = make_operands(96, 64, 3);
  {
    torch::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({max_row_kernel_rows() + 1, 64});
    EXPECT_TRUE(torch::equal(row_linear(x, o.weight, o.bias), torch::linear(x, o.weight, o.bias)));
    // So are sequences of more than one position, however few the rows.
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 2, 64}, {2, 3, 64}, {1, 1, 2, 64}}) {
      const at::Tensor seq = torch::randn(shape);
      EXPECT_TRUE(
          torch::equal(row_linear(seq, o.weight, o.bias), torch::linear(seq, o.weight, o.bias)))
          << ::testing::PrintToString(shape);
    }
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
