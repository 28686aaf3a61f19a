#include "relay/rollout/sampler.h"

#include <ATen/Parallel.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "model/cpu_features.h"
#include "model/kernel_pool.h"

#ifdef RELAY_X86_KERNELS
#include <immintrin.h>
#endif

namespace relay::rollout {
namespace {

// The fused CPU sampler (sample() without truncation). Per row: the maximum
// of z = logits / temperature, e = exp(z - max) kept in a scratch row with
// sums over blocks of kBlock, then the inverse-CDF walk over the block sums
// and within one block. No [B, V] temporaries: at Qwen's vocabulary and
// batch 64 the batched ops allocated five 39-78 MB tensors a step (fresh
// pages each time) and ran single-threaded; rows here run on the kernel
// pool (model/kernel_pool.h).
constexpr int64_t kBlock = 64;

std::atomic<bool> g_fused_sampler{true};

struct RowDraw {
  int64_t token = 0;
  float logprob = 0;
  float raw = 0;
  bool fallback = false;  // a non-finite maximum or a NaN: the batched path decides
};

#ifdef RELAY_X86_KERNELS
// exp(x) for x <= 0 (Cephes' single-precision polynomial, about 2 ulp);
// exactly 0 below -87.3 (where expf underflows) and for NaN.
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3365447f);
  const __m256 in_range = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lowest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2 =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(pow2)), in_range);
}

__attribute__((target("avx2,fma"))) inline float lanes_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) inline float lanes_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// max over z = x / t (t == 1: x itself); NaN anywhere makes it NaN.
__attribute__((target("avx2,fma"))) float scaled_max(const float* x, int64_t V, float t,
                                                     bool* nan) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 bad = _mm256_setzero_ps();
  const __m256 tv = _mm256_set1_ps(t);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 z = _mm256_div_ps(_mm256_loadu_ps(x + i), tv);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, z);
  }
  float top = lanes_max(m);
  bool any_nan = _mm256_movemask_ps(bad) != 0;
  for (; i < V; ++i) {
    const float z = x[i] / t;
    any_nan = any_nan || std::isnan(z);
    top = std::max(top, z);
  }
  *nan = any_nan;
  return top;
}

// e[i] = exp(x[i] / t - top); blocks[k] = the sum of e over block k (in
// order of lanes, then lanes summed); returns the sum of the blocks.
__attribute__((target("avx2,fma"))) double fill_exp(const float* x, int64_t V, float t, float top,
                                                    float* e, double* blocks) {
  const __m256 tv = _mm256_set1_ps(t), mv = _mm256_set1_ps(top);
  double total = 0;
  for (int64_t b0 = 0, k = 0; b0 < V; b0 += kBlock, ++k) {
    const int64_t b1 = std::min(V, b0 + kBlock);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = b0;
    for (; i + 8 <= b1; i += 8) {
      const __m256 z = _mm256_div_ps(_mm256_loadu_ps(x + i), tv);
      const __m256 ev = exp_nonpositive(_mm256_sub_ps(z, mv));
      _mm256_storeu_ps(e + i, ev);
      acc = _mm256_add_ps(acc, ev);
    }
    double sum = lanes_sum(acc);
    for (; i < b1; ++i) {
      e[i] = std::exp(x[i] / t - top);
      sum += e[i];
    }
    blocks[k] = sum;
    total += sum;
  }
  return total;
}

// log sum exp(x) (temperature 1), without keeping e.
__attribute__((target("avx2,fma"))) double raw_logsumexp(const float* x, int64_t V) {
  bool nan = false;
  const float top = scaled_max(x, V, 1.0f, &nan);
  const __m256 mv = _mm256_set1_ps(top);
  double sum = 0;
  for (int64_t b0 = 0; b0 < V; b0 += kBlock) {  // fp32 within a block, as fill_exp
    const int64_t b1 = std::min(V, b0 + kBlock);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = b0;
    for (; i + 8 <= b1; i += 8) {
      acc = _mm256_add_ps(acc, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
    }
    double block = lanes_sum(acc);
    for (; i < b1; ++i) block += std::exp(x[i] - top);
    sum += block;
  }
  return top + std::log(sum);
}
#endif  // RELAY_X86_KERNELS

// The portable passes, for CPUs without AVX2/FMA.
float scaled_max_portable(const float* x, int64_t V, float t, bool* nan) {
  float top = -std::numeric_limits<float>::infinity();
  bool any_nan = false;
  for (int64_t i = 0; i < V; ++i) {
    const float z = x[i] / t;
    any_nan = any_nan || std::isnan(z);
    top = std::max(top, z);
  }
  *nan = any_nan;
  return top;
}

double fill_exp_portable(const float* x, int64_t V, float t, float top, float* e, double* blocks) {
  double total = 0;
  for (int64_t b0 = 0, k = 0; b0 < V; b0 += kBlock, ++k) {
    const int64_t b1 = std::min(V, b0 + kBlock);
    double sum = 0;
    for (int64_t i = b0; i < b1; ++i) {
      e[i] = std::exp(x[i] / t - top);
      sum += e[i];
    }
    blocks[k] = sum;
    total += sum;
  }
  return total;
}

double raw_logsumexp_portable(const float* x, int64_t V) {
  bool nan = false;
  const float top = scaled_max_portable(x, V, 1.0f, &nan);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - top);
  return top + std::log(sum);
}

// The first token whose cumulative mass reaches u * total, skipping tokens
// of zero mass; rounding that leaves the walk short takes the last token
// with mass.
int64_t inverse_cdf(const float* e, const double* blocks, int64_t V, double total, double u) {
  const double target = u * total;
  const int64_t num_blocks = (V + kBlock - 1) / kBlock;
  double cum = 0;
  for (int64_t k = 0; k < num_blocks; ++k) {
    if (cum + blocks[k] < target) {
      cum += blocks[k];
      continue;
    }
    for (int64_t i = k * kBlock, end = std::min(V, i + kBlock); i < end; ++i) {
      cum += e[i];
      if (e[i] > 0 && cum >= target) return i;
    }
  }
  for (int64_t i = V - 1; i > 0; --i) {
    if (e[i] > 0) return i;
  }
  return 0;
}

RowDraw draw_row(const float* x, int64_t V, float t, bool raw, double u, float* e, double* blocks) {
  RowDraw d;
  const bool vector = model::cpu_has_avx2_fma();
  bool nan = false;
  float top = 0;
  double total = 0;
#ifdef RELAY_X86_KERNELS
  if (vector) {
    top = scaled_max(x, V, t, &nan);
    if (nan || !std::isfinite(top)) return RowDraw{0, 0, 0, true};
    total = fill_exp(x, V, t, top, e, blocks);
  }
#endif
  if (!vector) {
    top = scaled_max_portable(x, V, t, &nan);
    if (nan || !std::isfinite(top)) return RowDraw{0, 0, 0, true};
    total = fill_exp_portable(x, V, t, top, e, blocks);
  }
  d.token = inverse_cdf(e, blocks, V, total, u);
  // log softmax(z)[token] = z - top - log(total), from the sums sampled from.
  const double lse = static_cast<double>(top) + std::log(total);
  d.logprob = static_cast<float>(static_cast<double>(x[d.token] / t) - lse);
  if (raw) {
    if (t == 1.0f) {
      d.raw = d.logprob;
    } else {
#ifdef RELAY_X86_KERNELS
      const double raw_lse = vector ? raw_logsumexp(x, V) : raw_logsumexp_portable(x, V);
#else
      const double raw_lse = raw_logsumexp_portable(x, V);
#endif
      d.raw = static_cast<float>(static_cast<double>(x[d.token]) - raw_lse);
    }
  }
  return d;
}

// sample() without truncation on the CPU; false when a row needs the
// batched path (a non-finite maximum or a NaN logit).
bool sample_fused(const at::Tensor& logits, const at::Tensor& uniforms, const SamplingOptions& o,
                  SampleResult& r) {
  const at::Tensor x = logits.to(torch::kFloat32).contiguous();
  const at::Tensor u = uniforms.to(torch::kCPU, torch::kFloat64).contiguous();
  const int64_t B = x.size(0), V = x.size(1);
  if (V < 1) return false;
  std::vector<RowDraw> draws(static_cast<size_t>(B));
  const float* xp = x.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  const float t = static_cast<float>(o.temperature);
  const bool raw = o.record_raw_logprobs;
  auto rows = [&](int64_t b0, int64_t b1) {
    std::vector<float> e(static_cast<size_t>(V));
    std::vector<double> blocks(static_cast<size_t>((V + kBlock - 1) / kBlock));
    for (int64_t b = b0; b < b1; ++b) {
      draws[b] = draw_row(xp + b * V, V, t, raw, up[b], e.data(), blocks.data());
    }
  };
  model::kernel_parallel_for(B, 1, rows);
  r.tokens = torch::empty({B}, torch::kInt64);
  r.logprobs = torch::empty({B}, torch::kFloat32);
  if (raw) r.raw_logprobs = torch::empty({B}, torch::kFloat32);
  int64_t* tp = r.tokens.data_ptr<int64_t>();
  float* lp = r.logprobs.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    if (draws[b].fallback) return false;
    tp[b] = draws[b].token;
    lp[b] = draws[b].logprob;
    if (raw) r.raw_logprobs.data_ptr<float>()[b] = draws[b].raw;
  }
  return true;
}

}  // namespace

void set_fused_sampler(bool on) { g_fused_sampler.store(on); }

bool truncates(const SamplingOptions& o, int64_t vocab) {
  return (o.top_k > 0 && o.top_k < vocab) || o.top_p < 1.0;
}

at::Tensor sampling_logprobs(const at::Tensor& logits, const SamplingOptions& o) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  at::Tensor z = logits.to(torch::kFloat32);
  if (o.temperature != 1.0) z = z / o.temperature;
  const int64_t V = z.size(-1);
  if (o.top_k > 0 && o.top_k < V) {
    at::Tensor keep =
        torch::zeros_like(z, torch::kBool).scatter(1, std::get<1>(z.topk(o.top_k, -1)), true);
    z = z.masked_fill(keep.logical_not(), kNegInf);
  }
  if (o.top_p < 1.0) {
    // Drop a token when the tokens more likely than it already hold >= top_p
    // of the mass; the most likely token is always kept.
    auto sorted = z.sort(-1, /*descending=*/true);
    at::Tensor p = torch::softmax(std::get<0>(sorted), -1);
    at::Tensor mass_before = p.cumsum(-1) - p;
    at::Tensor drop_sorted = mass_before.ge(o.top_p);
    at::Tensor drop = torch::zeros_like(drop_sorted).scatter(1, std::get<1>(sorted), drop_sorted);
    z = z.masked_fill(drop, kNegInf);
  }
  return torch::log_softmax(z, -1);
}

SampleResult sample(const at::Tensor& logits, const at::Tensor& uniforms,
                    const SamplingOptions& o) {
  TORCH_CHECK(logits.dim() == 2, "sample: logits must be [B, V], got ", logits.sizes());
  TORCH_CHECK(uniforms.numel() == logits.size(0), "sample: need one uniform per row");
  SampleResult r;
  if (!o.greedy && !truncates(o, logits.size(1)) && logits.device().is_cpu() &&
      g_fused_sampler.load(std::memory_order_relaxed)) {
    if (sample_fused(logits, uniforms, o, r)) return r;
    r = SampleResult{};
  }
  if (o.greedy || o.record_raw_logprobs) {
    r.raw_logprobs = torch::log_softmax(logits.to(torch::kFloat32), -1);
  }
  if (o.greedy) {
    r.tokens = logits.argmax(-1);
    r.raw_logprobs = r.raw_logprobs.gather(1, r.tokens.unsqueeze(1)).squeeze(1);
    r.logprobs = r.raw_logprobs;
    return r;
  }
  at::Tensor logp = sampling_logprobs(logits, o);
  // Inverse CDF on exp(logp): the first index whose cumulative mass reaches
  // u * total. Zero-probability tokens add no mass, so they are never chosen.
  at::Tensor cdf = logp.exp().to(torch::kFloat64).cumsum(-1);
  at::Tensor target =
      uniforms.to(cdf.device(), torch::kFloat64).view({-1, 1}) * cdf.narrow(1, cdf.size(1) - 1, 1);
  r.tokens = torch::searchsorted(cdf, target).squeeze(1).clamp_max(logits.size(1) - 1);
  r.logprobs = logp.gather(1, r.tokens.unsqueeze(1)).squeeze(1);
  if (o.record_raw_logprobs) {
    r.raw_logprobs = r.raw_logprobs.gather(1, r.tokens.unsqueeze(1)).squeeze(1);
  }
  return r;
}

at::Tensor tempered_logprobs(const at::Tensor& logits, const at::Tensor& tokens,
                             double temperature) {
  at::Tensor z = logits.to(torch::kFloat32);
  if (temperature != 1.0) z = z / temperature;
  at::Tensor index = tokens.to(z.device(), torch::kInt64).view({-1, 1});
  return (z.gather(1, index) - z.logsumexp(-1, /*keepdim=*/true)).squeeze(1);
}

uint64_t sequence_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace relay::rollout
