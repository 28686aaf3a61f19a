// Few-row linear products for incremental decoding (row_linear.h).

#include "model/row_linear.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "relay/model/device.h"

#include "model/cpu_features.h"
#include "model/kernel_pool.h"
#include "model/simd_load.h"

#ifdef RELAY_X86_KERNELS
#include <immintrin.h>
#endif

namespace relay::model {
namespace {

#ifdef RELAY_X86_KERNELS

// Weights as stored: fp32, or bf16 and fp16 widened as they are loaded
// (simd_load.h).
using simd::BF16;
using simd::elements;
using simd::F16;
using simd::F32;
using simd::load16;
using simd::load8;
using simd::widen;

// Sums an eight-lane vector of partial sums.
__attribute__((target("avx2,fma"))) inline float lane_sum(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s4 = _mm_hadd_ps(s4, s4);
  s4 = _mm_hadd_ps(s4, s4);
  return _mm_cvtss_f32(s4);
}

// y[r * out + o] = sum_i w[o * in + i] * x[r * in + i] (+ bias[o]) for the
// O weight rows from o and all R input rows: O x R sums of eight lanes each,
// so every weight vector loaded serves R rows and every input vector O
// weight rows (3 x 4 accumulators + 3 weight vectors + 1 input vector fill
// the 16 registers). Each sum adds its lanes in the same order whatever O
// and R are, so a row's result does not depend on the other rows or on how
// the outputs were split between threads.
template <class W, int O, int R>
__attribute__((target("avx2,fma,f16c"))) inline void skinny_tile(const typename W::T* w,
                                                                 const float* x, const float* bias,
                                                                 float* y, int64_t out, int64_t in,
                                                                 int64_t o) {
  __m256 acc[O][R];
#pragma GCC unroll 4
  for (int a = 0; a < O; ++a) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[a][r] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 wv[O];
#pragma GCC unroll 4
    for (int a = 0; a < O; ++a) wv[a] = load8(W{}, w + (o + a) * in + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * in + i);
#pragma GCC unroll 4
      for (int a = 0; a < O; ++a) acc[a][r] = _mm256_fmadd_ps(wv[a], xv, acc[a][r]);
    }
  }
#pragma GCC unroll 4
  for (int a = 0; a < O; ++a) {
    const typename W::T* wo = w + (o + a) * in;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      float s = lane_sum(acc[a][r]);
      for (int64_t k = i; k < in; ++k) s += widen(W{}, wo[k]) * x[r * in + k];
      y[r * out + o + a] = bias != nullptr ? s + bias[o + a] : s;
    }
  }
}

// Outputs [o0, o1) for R input rows, three weight rows at a time.
template <class W, int R>
__attribute__((target("avx2,fma,f16c"))) void skinny_block(const typename W::T* w, const float* x,
                                                           const float* bias, float* y, int64_t out,
                                                           int64_t in, int64_t o0, int64_t o1) {
  int64_t o = o0;
  for (; o + 3 <= o1; o += 3) skinny_tile<W, 3, R>(w, x, bias, y, out, in, o);
  for (; o < o1; ++o) skinny_tile<W, 1, R>(w, x, bias, y, out, in, o);
}

// Asks for the cache line holding element k of w, which the next tile reads
// (a hint: an address past the matrix is harmless; taken as an integer so
// that no pointer points past the matrix). The hardware prefetcher alone
// left these row-interleaved streams at 7-17 GB/s on two threads; with the
// hint one tile ahead, a probe over qwen2-100m's 85 matrices went from 16.7
// to 21.4 GB/s at 4 rows in fp32 and from 13.3 to 18.8 at one row in bf16
// (docs/BENCHMARKS.md, "Half-precision weights in the engine").
template <class T>
inline void prefetch(const T* w, int64_t k) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w) +
                                             static_cast<uintptr_t>(k) * sizeof(T)),
               _MM_HINT_T0);
}

// Sums a sixteen-lane vector: its halves, then as lane_sum. (The zero-masked
// extracts because GCC 12's unmasked ones fill with an undefined vector and
// trip -Wuninitialized.)
__attribute__((target("avx512f,avx2,fma"))) inline float lane_sum16(__m512 v) {
  const __m512d d = _mm512_castps_pd(v);
  const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, d, 0));
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, d, 1));
  return lane_sum(_mm256_add_ps(lo, hi));
}

// skinny_tile with sixteen lanes and AVX-512's 32 registers, which hold the
// sums of eight input rows: 3 x 8 accumulators + 3 weight vectors + 1 input
// vector. The same rule: each sum's order depends on neither O nor R.
template <class W, int O, int R>
__attribute__((target("avx512f,avx2,fma"))) inline void wide_tile(const typename W::T* w,
                                                                  const float* x, const float* bias,
                                                                  float* y, int64_t out, int64_t in,
                                                                  int64_t o) {
  __m512 acc[O][R];
#pragma GCC unroll 8
  for (int a = 0; a < O; ++a) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[a][r] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m512 wv[O];
#pragma GCC unroll 8
    for (int a = 0; a < O; ++a) {
      wv[a] = load16(W{}, w + (o + a) * in + i);
      prefetch(w, (o + O + a) * in + i);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * in + i);
#pragma GCC unroll 8
      for (int a = 0; a < O; ++a) acc[a][r] = _mm512_fmadd_ps(wv[a], xv, acc[a][r]);
    }
  }
#pragma GCC unroll 8
  for (int a = 0; a < O; ++a) {
    const typename W::T* wo = w + (o + a) * in;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float s = lane_sum16(acc[a][r]);
      for (int64_t k = i; k < in; ++k) s += widen(W{}, wo[k]) * x[r * in + k];
      y[r * out + o + a] = bias != nullptr ? s + bias[o + a] : s;
    }
  }
}

// Outputs [o0, o1) for R <= 8 input rows: four weight rows at a time up to
// four input rows, three above (the registers' limit).
template <class W, int R>
__attribute__((target("avx512f,avx2,fma"))) void wide_block(const typename W::T* w, const float* x,
                                                            const float* bias, float* y,
                                                            int64_t out, int64_t in, int64_t o0,
                                                            int64_t o1) {
  constexpr int O = R <= 4 ? 4 : 3;
  int64_t o = o0;
  for (; o + O <= o1; o += O) wide_tile<W, O, R>(w, x, bias, y, out, in, o);
  for (; o < o1; ++o) wide_tile<W, 1, R>(w, x, bias, y, out, in, o);
}

// One call of block(o0, o1) per range of weight rows, each range streaming
// at least ~64 KB of weights.
template <typename Block>
void split_weight_rows(int64_t out, int64_t in, const Block& block) {
  kernel_parallel_for(out, std::max<int64_t>(1, 16384 / std::max<int64_t>(in, 1)), block);
}

template <class W>
void skinny(const typename W::T* w, const float* x, const float* bias, float* y, int64_t rows,
            int64_t out, int64_t in) {
  split_weight_rows(out, in, [&](int64_t o0, int64_t o1) {
    switch (rows) {
      case 1:
        skinny_block<W, 1>(w, x, bias, y, out, in, o0, o1);
        break;
      case 2:
        skinny_block<W, 2>(w, x, bias, y, out, in, o0, o1);
        break;
      case 3:
        skinny_block<W, 3>(w, x, bias, y, out, in, o0, o1);
        break;
      default:
        skinny_block<W, 4>(w, x, bias, y, out, in, o0, o1);
        break;
    }
  });
}

// Eight input rows at a time over one range of weight rows (~64 KB, which
// the first eight left in cache): the weights stream from memory once.
template <class W>
void wide(const typename W::T* w, const float* x, const float* bias, float* y, int64_t rows,
          int64_t out, int64_t in) {
  split_weight_rows(out, in, [&](int64_t o0, int64_t o1) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8) {
      const float* xr = x + r0 * in;
      float* yr = y + r0 * out;
      switch (std::min<int64_t>(rows - r0, 8)) {
        case 1:
          wide_block<W, 1>(w, xr, bias, yr, out, in, o0, o1);
          break;
        case 2:
          wide_block<W, 2>(w, xr, bias, yr, out, in, o0, o1);
          break;
        case 3:
          wide_block<W, 3>(w, xr, bias, yr, out, in, o0, o1);
          break;
        case 4:
          wide_block<W, 4>(w, xr, bias, yr, out, in, o0, o1);
          break;
        case 5:
          wide_block<W, 5>(w, xr, bias, yr, out, in, o0, o1);
          break;
        case 6:
          wide_block<W, 6>(w, xr, bias, yr, out, in, o0, o1);
          break;
        case 7:
          wide_block<W, 7>(w, xr, bias, yr, out, in, o0, o1);
          break;
        default:
          wide_block<W, 8>(w, xr, bias, yr, out, in, o0, o1);
          break;
      }
    }
  });
}

#endif  // RELAY_X86_KERNELS

// The kernel a request runs on this CPU: the request where the CPU has it,
// else the best it has.
RowKernel resolve(RowKernel kernel) {
  if (kernel == RowKernel::kSkinnyAvx512 && cpu_has_avx512f()) return kernel;
  if (kernel == RowKernel::kSkinnyAvx2 && cpu_has_avx2_fma()) return kernel;
  if (kernel == RowKernel::kMatrixVector) return kernel;
  if (cpu_has_avx512f()) return RowKernel::kSkinnyAvx512;
  if (cpu_has_avx2_fma()) return RowKernel::kSkinnyAvx2;
  return RowKernel::kMatrixVector;
}

// Whether LibTorch's bf16 product beats widening to an SGEMM here.
bool native_bf16_gemm(c10::ScalarType dtype) {
  return dtype == torch::kBFloat16 && cpu_has_avx512_bf16();
}

int64_t max_rows(RowKernel resolved, c10::ScalarType dtype = torch::kFloat32) {
  const bool half = dtype == torch::kBFloat16 || dtype == torch::kHalf;
  switch (resolved) {
    case RowKernel::kSkinnyAvx512:
      if (!half) return kMaxAvx512Rows;
      return native_bf16_gemm(dtype) ? kMaxBf16RowsNative : kMaxHalfRows;
    case RowKernel::kSkinnyAvx2:
      return kMaxAvx2Rows;
    default:
      return kMaxMatrixVectorRows;
  }
}

thread_local bool incremental_rows = false;

}  // namespace

IncrementalRows::IncrementalRows() : previous_(incremental_rows) { incremental_rows = true; }
IncrementalRows::~IncrementalRows() { incremental_rows = previous_; }

RowKernel best_row_kernel() { return resolve(RowKernel::kBest); }

int64_t max_row_kernel_rows() { return max_rows(best_row_kernel()); }

at::Tensor row_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      RowKernel kernel) {
  const bool grad = torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                      (bias.defined() && bias.requires_grad()));
  const c10::ScalarType dtype = weight.scalar_type();
  const bool half = dtype == torch::kBFloat16 || dtype == torch::kHalf;
  // The row count and the sequence dimension first: most calls (prefill,
  // scoring) leave here.
  if (grad || weight.dim() != 2 || weight.size(1) == 0 || x.dim() < 1 ||
      x.size(-1) != weight.size(1) || (!half && x.numel() / weight.size(1) > kMaxAvx512Rows) ||
      (x.dim() >= 3 && x.size(-2) != 1 &&
       (!incremental_rows || (half && x.numel() / weight.size(1) > kMaxHalfAppendRows))) ||
      !x.device().is_cpu() || (dtype != torch::kFloat32 && !half) || x.scalar_type() != dtype ||
      !weight.is_contiguous() ||
      (bias.defined() &&
       (bias.scalar_type() != dtype || !bias.is_contiguous() || bias.numel() != weight.size(0))) ||
      current_autocast(c10::DeviceType::CPU).has_value()) {
    return torch::linear(x, weight, bias);
  }
  const int64_t in = weight.size(1), out = weight.size(0);
  const int64_t rows = x.numel() / in;
  const RowKernel resolved = resolve(kernel);
  if (rows < 1) return torch::linear(x, weight, bias);
  if (rows > max_rows(resolved, dtype)) {
    if (!half) return torch::linear(x, weight, bias);
    // Many rows of bf16 or fp16 on an AVX-512 CPU: the weights widened to
    // fp32 for one SGEMM, its sums rounded once, as the kernel's are; or,
    // where the CPU has bf16 products, LibTorch's own (also fp32 sums
    // rounded once), twice as fast as the widening.
    if (resolved == RowKernel::kSkinnyAvx512 && !native_bf16_gemm(dtype)) {
      return torch::linear(x.to(torch::kFloat32), weight.to(torch::kFloat32),
                           bias.defined() ? bias.to(torch::kFloat32) : bias)
          .to(dtype);
    }
    return torch::linear(x, weight, bias);
  }
  // bf16 and fp16 only through the kernels (fp16 on AVX2 with F16C).
  if (half && (resolved == RowKernel::kMatrixVector ||
               (resolved == RowKernel::kSkinnyAvx2 && dtype == torch::kHalf && !cpu_has_f16c()))) {
    return torch::linear(x, weight, bias);
  }
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out;
  // The inputs and the bias in fp32 (a few rows: cheap), the sums in fp32,
  // then rounded once to the weights' precision.
  const at::Tensor flat = x.reshape({rows, in}).to(torch::kFloat32).contiguous();
  at::Tensor y = torch::empty({rows, out}, x.options().dtype(torch::kFloat32));
#ifdef RELAY_X86_KERNELS
  if (resolved != RowKernel::kMatrixVector) {
    const at::Tensor b = bias.defined() ? bias.to(torch::kFloat32).contiguous() : at::Tensor();
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    const bool avx512 = resolved == RowKernel::kSkinnyAvx512;
    const float* xp = flat.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    if (dtype == torch::kFloat32) {
      (avx512 ? wide<F32> : skinny<F32>)(elements<F32>(weight), xp, bp, yp, rows, out, in);
    } else if (dtype == torch::kBFloat16) {
      (avx512 ? wide<BF16> : skinny<BF16>)(elements<BF16>(weight), xp, bp, yp, rows, out, in);
    } else {
      (avx512 ? wide<F16> : skinny<F16>)(elements<F16>(weight), xp, bp, yp, rows, out, in);
    }
    return (half ? y.to(dtype) : y).view(sizes);
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    at::Tensor dst = y[r];
    if (bias.defined()) {
      torch::addmv_out(dst, bias, weight, flat[r]);
    } else {
      torch::mv_out(dst, weight, flat[r]);
    }
  }
  return y.view(sizes);
}

}  // namespace relay::model
