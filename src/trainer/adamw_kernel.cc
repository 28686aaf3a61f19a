#include "trainer/adamw_kernel.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "model/cpu_features.h"

#ifdef RELAY_X86_KERNELS
#include <immintrin.h>
#endif

namespace relay::trainer {
namespace {

// Elements per task on the intra-op threads: 1 MiB of each array.
constexpr int64_t kGrain = int64_t{1} << 18;

// One element, rounded as ATen's kernels round torch's AdamW (adamw_kernel.h).
// The AVX2 loop below must stay this function, eight lanes at a time.
inline void update_one(float& p, float g, float& m, float& v, const AdamWConstants& c) {
  if (c.decays) p = p * c.decay;
  m = std::fma(g, c.one_minus_beta1, m * c.beta1);
  v = std::fma(c.one_minus_beta2 * g, g, v * c.beta2);
  const float denom = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
  p = p + (c.neg_step_size * m) / denom;
}

void update_scalar(float* p, const float* g, float* m, float* v, int64_t n,
                   const AdamWConstants& c) {
  for (int64_t i = 0; i < n; ++i) update_one(p[i], g[i], m[i], v[i], c);
}

#ifdef RELAY_X86_KERNELS
__attribute__((target("avx2,fma"))) void update_avx2(float* p, const float* g, float* m, float* v,
                                                     int64_t n, const AdamWConstants& c) {
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 b1 = _mm256_set1_ps(c.beta1), a1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), a2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sc2 = _mm256_set1_ps(c.sqrt_bias_correction2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.neg_step_size);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 gi = _mm256_loadu_ps(g + i);
    __m256 mi = _mm256_loadu_ps(m + i);
    __m256 vi = _mm256_loadu_ps(v + i);
    if (c.decays) pi = _mm256_mul_ps(pi, decay);
    mi = _mm256_fmadd_ps(gi, a1, _mm256_mul_ps(mi, b1));
    vi = _mm256_fmadd_ps(_mm256_mul_ps(a2, gi), gi, _mm256_mul_ps(vi, b2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), sc2), eps);
    pi = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), denom));
    _mm256_storeu_ps(p + i, pi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  update_scalar(p + i, g + i, m + i, v + i, n - i, c);
}
#endif

}  // namespace

AdamWConstants adamw_constants(const OptimizerOptions& o, int64_t step, double lr) {
  const double c1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double c2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  AdamWConstants c;
  c.decays = o.weight_decay != 0;
  c.decay = static_cast<float>(1 - lr * o.weight_decay);
  c.beta1 = static_cast<float>(o.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(c2));
  c.eps = static_cast<float>(o.eps);
  c.neg_step_size = static_cast<float>(-lr / c1);
  return c;
}

void adamw_fused(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const AdamWConstants& c) {
  auto run = [&](int64_t begin, int64_t end) {
#ifdef RELAY_X86_KERNELS
    if (model::cpu_has_avx2_fma()) {
      update_avx2(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin, c);
      return;
    }
#endif
    update_scalar(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin, c);
  };
  if (n < 2 * kGrain) {
    run(0, n);
  } else {
    at::parallel_for(0, n, kGrain, run);
  }
}

bool adamw_fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq) {
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != at::kFloat ||
        !t->is_contiguous() || t->numel() != param.numel()) {
      return false;
    }
  }
  return true;
}

}  // namespace relay::trainer
