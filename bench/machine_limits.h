#pragma once

// The machine's limits for fp32 model work, measured in the benchmark's own
// run (so under the same load and thread settings as its other rows), to
// turn into a tokens/s bound for a model. Header-only.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "bench_util.h"

namespace relay::bench {

struct MachineLimits {
  double peak_gflops = 0;  // fp32 GEMM, 2048 x 2048 x 2048 (at::mm)
  double gemv_gbs = 0;     // y = W x over a 256 MB W: bytes of W / time
  double copy_gbs = 0;     // 256 MB copy: bytes read + written / time
  // Streaming bandwidth: the larger of the two (a bound must not be low).
  double bandwidth() const { return std::max(gemv_gbs, copy_gbs); }
};

// About 2 s. Each figure is the best of several calls (after an untimed
// one): other processes on the machine can only make a call slower.
inline MachineLimits measure_limits() {
  torch::NoGradGuard no_grad;
  MachineLimits m;
  {
    const int64_t n = 2048;
    at::Tensor a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
    const double s = time_best(10, [&] { at::mm_out(c, a, b); });
    m.peak_gflops = 2.0 * n * n * n / s / 1e9;
  }
  {
    at::Tensor w = torch::randn({4096, 16384}), x = torch::randn({16384}), y = torch::empty({4096});
    const double s = time_best(5, [&] { at::mv_out(y, w, x); });
    m.gemv_gbs = w.numel() * 4.0 / s / 1e9;
    at::Tensor dst = torch::empty_like(w);
    const double c = time_best(5, [&] { dst.copy_(w); });
    m.copy_gbs = 2.0 * w.numel() * 4.0 / c / 1e9;
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
