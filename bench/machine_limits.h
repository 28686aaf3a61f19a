#pragma once

// The machine's limits for model work, measured in the benchmark's own run
// (so under the same load and thread settings as its other rows), to turn
// into a tokens/s bound for a model. On the CPU in fp32 by default; on a
// CUDA device and in bfloat16 when the benchmark runs its models there, so
// the bound is the device's own (HBM bandwidth, tensor-core GEMM peak).
// Header-only.

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "bench_util.h"

namespace relay::bench {

struct MachineLimits {
  double peak_gflops = 0;  // GEMM n^3 in the dtype (at::mm), n 2048 on a CPU and 8192 on a GPU
  double gemv_gbs = 0;     // y = W x over a 256 MB W: bytes of W / time
  double copy_gbs = 0;     // 256 MB copy: bytes read + written / time
  // Streaming bandwidth: the larger of the two (a bound must not be low).
  double bandwidth() const { return std::max(gemv_gbs, copy_gbs); }
};

// About 2 s. Each figure is the best of several calls (after an untimed
// one): other processes on the machine can only make a call slower. On a
// GPU every timed call ends with a synchronize, so the time is the
// kernel's, not its launch's.
inline MachineLimits measure_limits(c10::Device device = c10::Device(c10::DeviceType::CPU),
                                    c10::ScalarType dtype = c10::ScalarType::Float) {
  torch::NoGradGuard no_grad;
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  // A 2048 cube keeps a CPU busy ~50 ms; a GPU finishes it before its
  // clocks and tiles are at their best.
  auto gemm_gflops = [&](c10::ScalarType t) {
    const int64_t n = device.is_cuda() ? 8192 : 2048;
    const auto o = opts.dtype(t);
    at::Tensor a = torch::randn({n, n}, o), b = torch::randn({n, n}, o),
               c = torch::empty({n, n}, o);
    const double s = time_best(10, [&] {
      at::mm_out(c, a, b);
      sync();
    });
    return 2.0 * n * n * n / s / 1e9;
  };
  MachineLimits m;
  m.peak_gflops = gemm_gflops(dtype);
  // A CPU's bf16 work may run as fp32 (relay's row kernels widen the
  // weights; so do some of LibTorch's): the faster of the two bounds it.
  if (device.is_cpu() && dtype != c10::ScalarType::Float) {
    m.peak_gflops = std::max(m.peak_gflops, gemm_gflops(c10::ScalarType::Float));
  }
  // 256 MB whatever the dtype: 4096 rows of 16384 fp32, or of 32768 bf16.
  auto stream_gbs = [&](c10::ScalarType t, double* gemv, double* copy) {
    const auto o = opts.dtype(t);
    const int64_t cols = 16384 * 4 / static_cast<int64_t>(c10::elementSize(t));
    at::Tensor w = torch::randn({4096, cols}, o), x = torch::randn({cols}, o),
               y = torch::empty({4096}, o);
    const double bytes = static_cast<double>(w.numel()) * w.element_size();
    const double s = time_best(5, [&] {
      at::mv_out(y, w, x);
      sync();
    });
    *gemv = std::max(*gemv, bytes / s / 1e9);
    at::Tensor dst = torch::empty_like(w);
    const double c = time_best(5, [&] {
      dst.copy_(w);
      sync();
    });
    *copy = std::max(*copy, 2.0 * bytes / c / 1e9);
  };
  stream_gbs(dtype, &m.gemv_gbs, &m.copy_gbs);
  // Bytes are bytes, but a CPU LibTorch's bf16 GEMV is no streaming kernel
  // (1.13's reads 6 GB/s where its fp32 one reads 29 on the same machine).
  if (device.is_cpu() && dtype != c10::ScalarType::Float) {
    stream_gbs(c10::ScalarType::Float, &m.gemv_gbs, &m.copy_gbs);
  }
  return m;
}

// The better of two measurements, field by field (limits measured at the
// start and the end of a run).
inline MachineLimits best_of(const MachineLimits& a, const MachineLimits& b) {
  MachineLimits m;
  m.peak_gflops = std::max(a.peak_gflops, b.peak_gflops);
  m.gemv_gbs = std::max(a.gemv_gbs, b.gemv_gbs);
  m.copy_gbs = std::max(a.copy_gbs, b.copy_gbs);
  return m;
}

}  // namespace relay::bench
