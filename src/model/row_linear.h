#pragma once

// torch::linear with a faster path for the few-row products of incremental
// decoding. Private to src/model.
//
// LibTorch runs linear() on a [rows, in] input as a GEMM, and OpenBLAS
// re-packs the weight matrix on every call: a decode step of a 100M model at
// batch 1 streams its weights at about half the speed the memory allows.
// Streaming the qwen2-100m shape's 85 matrices from memory with Debian's
// OpenBLAS on the 2-core VM (GB/s of weights; one thread for the kernel,
// two for OpenBLAS):
//
//   rows                      1      2      4      8
//   linear (SGEMM)         13.7   12.6    8.6   10.1
//   addmv per row          25.1   16.3   10.9    6.8   (Python probe)
//   RowKernel::kSkinny     27.5   22.2   14.9    7.1
//
// (On another VM, an Emerald Rapids guest, one thread streamed ~10 GB/s and
// two 20: the kernel splits its weight rows over relay's kernel pool,
// src/model/kernel_pool.h, which has the cores OpenBLAS idles on meanwhile.)
//
// So up to kMaxSkinnyRows rows run RowKernel::kSkinny where the CPU has
// AVX2 and FMA: every weight row is read once and dotted with all the input
// rows, three weight rows at a time so that each input vector loaded serves
// three of them (on one thread, 4 rows: 13.9 GFLOP/s against 10.8 taking
// one weight row at a time, on the Xeon VM of docs/BENCHMARKS.md). Past 4
// rows a probe of 3 x 4 and AVX-512 tiles on one thread did not beat the
// two-thread SGEMM by enough to take over. Elsewhere (another architecture, an older x86) one or
// two rows run as BLAS matrix-vector products (RowKernel::kMatrixVector), and more rows as linear()
// itself.
//
// Only where nothing else depends on the GEMM: fp32 tensors on the CPU, a
// contiguous weight, no autograd (no operand requires a gradient while grad
// mode is on) and CPU autocast off (autocast runs the GEMM in its lower
// precision). The sums run in another order than the GEMM's, so results
// agree with linear() to fp32 rounding (about 1e-6 relative), not bit for
// bit. They do not depend on the other rows: a row gives the same bits alone
// as in any batch, on any number of threads.

#include <ATen/core/Tensor.h>

namespace relay::model {

inline constexpr int64_t kMaxSkinnyRows = 4;
inline constexpr int64_t kMaxMatrixVectorRows = 2;

enum class RowKernel {
  kBest,          // kSkinny where the CPU has it, else kMatrixVector
  kSkinny,        // AVX2/FMA: each weight row once for all input rows
  kMatrixVector,  // BLAS addmv (mv) per input row
};

// Whether this CPU runs RowKernel::kSkinny (x86-64 with AVX2 and FMA).
bool has_skinny_kernel();

// y = x W^T + b over x's last dimension, as torch::linear(x, weight, bias);
// `bias` may be undefined. `kernel` other than kBest is for tests and
// benchmarks (kSkinny where the CPU lacks it falls back as kBest does).
at::Tensor row_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {},
                      RowKernel kernel = RowKernel::kBest);

}  // namespace relay::model
