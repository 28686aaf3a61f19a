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
// So few-row products read every weight row once and dot it with all the
// input rows, where the CPU has the vector units for it:
//
//   RowKernel::kSkinnyAvx2    AVX2 and FMA, up to 4 input rows: three weight
//                             rows at a time, so that each input vector
//                             loaded serves three of them (on one thread, 4
//                             rows: 13.9 GFLOP/s against 10.8 taking one
//                             weight row at a time, on the Xeon VM of
//                             docs/BENCHMARKS.md).
//   RowKernel::kSkinnyAvx512  AVX-512F, up to 12 input rows: 32 registers
//                             hold the sums of 3 weight rows x 8 input rows;
//                             more rows run as passes of 8 over each ~64 KB
//                             range of weight rows, the later ones from
//                             cache. qwen2-100m decode, engine tokens/s over
//                             the AVX2 kernel up to 4 rows and OpenBLAS's
//                             SkylakeX SGEMM above, 4 interleaved pairs on
//                             the Emerald Rapids VM: batch 4 1.14-1.59,
//                             8 1.15-1.72, 12 1.15-1.39, 16 0.91-1.15 (so
//                             16 rows stay with the SGEMM).
//   RowKernel::kMatrixVector  elsewhere (another architecture, an older
//                             x86): one or two rows as BLAS matrix-vector
//                             products.
//
// More rows run as linear() itself.
//
// Only decode-shaped inputs take them: [rows, in], or [..., 1, in] (one
// position per sequence). A longer sequence dimension (prefill, scoring, a
// recompute) is linear() itself however few its rows, so full-sequence work
// is the GEMM's whatever its size; except within an IncrementalRows scope
// (Policy::extend): there a short append of several positions (a short
// prompt, an episode's observation, a few sequences' next tokens together)
// is few rows like a decode step, and takes the kernel when its rows fit.
// OpenBLAS ran 2-12 fp32 rows of qwen2-100m's matrices 2-2.6x slower than
// the kernel (an extend of 12 positions took longer than one of 16 or 32);
// LibTorch's bf16 product, 4-16 rows 1.3-1.7x slower. A longer bf16
// append (kMaxHalfAppendRows) stays linear() in bf16, not the widened SGEMM
// that decode rows past the limit take: at 128-256 positions that was
// 1.6-1.9x slower than linear() on an AVX512-BF16 CPU. Scoring keeps
// linear() at any size. And
// only where nothing else depends on
// the GEMM: tensors on the CPU, a contiguous weight, no autograd (no
// operand requires a gradient while grad mode is on) and CPU autocast off
// (autocast runs the GEMM in its lower precision).
//
// Weights in bf16 or fp16 (a rollout engine's, rollout.dtype) take the same
// kernels where the CPU has them (fp16 on AVX2 also needs F16C): the input,
// weights and bias in one precision, each weight widened to fp32 as it is
// loaded, products and sums in fp32, each output rounded once to the
// weights' precision, as a bf16 GEMM with fp32 accumulation gives it (to a
// rounding step of the output, since the sums run in another order). At one
// row the step reads half the bytes of fp32 weights. The AVX-512 kernel
// takes up to 64 rows of them (passes of 8 over each weight range), and
// more rows widen the weights to fp32 for one SGEMM (the same sums, rounded
// once): LibTorch 1.13's own bf16 product runs on its one intra-op thread,
// and over qwen2-100m's matrices the kernel was 2.5x as fast as it at 12
// rows and 1.3-1.8x at 64, while from ~100 rows on the widening pass plus
// OpenBLAS's SGEMM beat the kernel (docs/BENCHMARKS.md, "Half-precision
// weights in the engine"). A CPU with AVX512-BF16 is the exception for
// bf16: there LibTorch's own product is native, and bf16 inputs of more
// than kMaxBf16RowsNative rows are linear() in bf16 (twice as fast as the
// widening from 96 rows on, on Zen 4). Sequences longer than one position stay with
// linear() in every precision, as above (within IncrementalRows, up to
// kMaxHalfAppendRows take the kernel). Without a kernel they are linear()
// itself. The sums run in another
// order than the GEMM's, so results agree with linear() to fp32 rounding
// (about 1e-6 relative), not bit for bit. They do not depend on the other
// rows: with one kernel, a row gives the same bits alone as in any batch the
// kernel takes, on any number of threads. (A CPU runs one kernel for every
// row count up to its limit, so a sequence's log-probs do not change with
// the batch it was decoded in until the batch is past the limit.)

#include <ATen/core/Tensor.h>

namespace relay::model {

inline constexpr int64_t kMaxAvx2Rows = 4;
inline constexpr int64_t kMaxAvx512Rows = 12;
inline constexpr int64_t kMaxMatrixVectorRows = 2;
// bf16 and fp16 weights on the AVX-512 kernel (more rows: widened, one SGEMM).
inline constexpr int64_t kMaxHalfRows = 64;
// ... but bf16 on a CPU with AVX512-BF16, where LibTorch's own bf16 product
// is native: more rows are linear() in bf16. On the AMD EPYC VM (Zen 4),
// qwen2-100m's 85 matrices, linear() over the kernel: 32 rows 0.87x, 64
// 1.14x; over the widened SGEMM: 96-256 rows 1.9-2.0x.
inline constexpr int64_t kMaxBf16RowsNative = 32;
// ... and for a bf16 or fp16 append of several positions (IncrementalRows;
// more rows: linear() in that precision). On the AMD EPYC VM (AVX512-BF16)
// an extend of T positions at batch 1 on qwen2-100m, kernel over LibTorch's
// bf16 linear(): T = 4 1.7x, 12 1.5x, 16 1.3x, 32 1.07x, 64 0.89x.
inline constexpr int64_t kMaxHalfAppendRows = 32;

enum class RowKernel {
  kBest,          // the first of the three below this CPU has
  kSkinnyAvx512,  // AVX-512F: each weight row once for up to 12 input rows
  kSkinnyAvx2,    // AVX2/FMA: each weight row once for up to 4 input rows
  kMatrixVector,  // BLAS addmv (mv) per input row, up to 2
};

// Within its scope, on this thread, inputs with a sequence dimension longer
// than one take the kernels too when their rows fit: they are an
// incremental append (Policy::extend), not scoring. Nests.
class IncrementalRows {
 public:
  IncrementalRows();
  ~IncrementalRows();
  IncrementalRows(const IncrementalRows&) = delete;
  IncrementalRows& operator=(const IncrementalRows&) = delete;

 private:
  bool previous_;
};

// What kBest is on this CPU, and the most rows it takes.
RowKernel best_row_kernel();
int64_t max_row_kernel_rows();

// y = x W^T + b over x's last dimension, as torch::linear(x, weight, bias);
// `bias` may be undefined. `kernel` other than kBest is for tests and
// benchmarks (one this CPU lacks falls back to kBest).
at::Tensor row_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {},
                      RowKernel kernel = RowKernel::kBest);

}  // namespace relay::model
