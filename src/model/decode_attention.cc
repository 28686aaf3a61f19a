// Decode-step attention over the paged KV cache in place (decode_attention.h).

#include "model/decode_attention.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "model/cpu_features.h"
#include "model/kernel_pool.h"
#include "model/simd_load.h"

#ifdef RELAY_X86_KERNELS
#include <immintrin.h>
#endif

namespace relay::model {
namespace {

#ifdef RELAY_X86_KERNELS

// Keys and values as the cache stores them: fp32, or bf16 and fp16 widened
// as they are loaded (simd_load.h); the query, the sums and the output stay
// fp32.
template <class E>
__attribute__((target("avx2,fma,f16c"))) float dot(const float* a, const typename E::T* b,
                                                   int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), simd::load8(E{}, b + i), acc);
  }
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_hadd_ps(s4, s4);
  s4 = _mm_hadd_ps(s4, s4);
  return _mm_cvtss_f32(s4);
}

// y += alpha * x
template <class E>
__attribute__((target("avx2,fma,f16c"))) void axpy(float alpha, const typename E::T* x, float* y,
                                                   int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  for (int64_t i = 0; i < n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, simd::load8(E{}, x + i), _mm256_loadu_ps(y + i)));
  }
}

struct Shapes {
  int64_t S = 0, KVH = 0, D = 0, rep = 0;
  float scale = 1;
};

// The `rep` query heads of kv head `g` of one row: q and out [rep, D];
// scratch: scores [rep, S], top and inv [rep].
template <class E>
void attend(const float* q, const typename E::T* keys, const typename E::T* values,
            const int64_t* rows, const bool* mask, int64_t g, const Shapes& s, float* scores,
            float* top, float* inv, float* out) {
  std::fill(top, top + s.rep, -std::numeric_limits<float>::infinity());
  for (int64_t p = 0; p < s.S; ++p) {
    if (!mask[p]) continue;
    const typename E::T* k = keys + (rows[p] * s.KVH + g) * s.D;
    for (int64_t r = 0; r < s.rep; ++r) {
      const float x = dot<E>(q + r * s.D, k, s.D) * s.scale;
      scores[r * s.S + p] = x;
      if (x > top[r]) top[r] = x;
    }
  }
  for (int64_t r = 0; r < s.rep; ++r) {
    float sum = 0;
    for (int64_t p = 0; p < s.S; ++p) {
      const float e = mask[p] ? std::exp(scores[r * s.S + p] - top[r]) : 0.0f;
      scores[r * s.S + p] = e;
      sum += e;
    }
    inv[r] = 1.0f / sum;
  }
  std::fill(out, out + s.rep * s.D, 0.0f);
  for (int64_t p = 0; p < s.S; ++p) {
    if (!mask[p]) continue;
    const typename E::T* v = values + (rows[p] * s.KVH + g) * s.D;
    for (int64_t r = 0; r < s.rep; ++r) {
      axpy<E>(scores[r * s.S + p] * inv[r], v, out + r * s.D, s.D);
    }
  }
}

// Every (row, kv head) task of one step; qp and op fp32 [B, H, D].
template <class E>
void attend_all(const float* qp, const typename E::T* kp, const typename E::T* vp,
                const int64_t* rp, const bool* mp, int64_t B, int64_t H, const Shapes& s,
                float* op) {
  // Heads h = g * rep + r share kv head g: each task is one (row, g). Each
  // task's sums are its own, so the split does not change the bits.
  auto tasks = [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(s.rep * (s.S + 2)));
    float* scores = scratch.data();
    float* top = scores + s.rep * s.S;
    float* inv = top + s.rep;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.KVH, g = task % s.KVH;
      const int64_t head = (b * H + g * s.rep) * s.D;
      attend<E>(qp + head, kp, vp, rp + b * s.S, mp + b * s.S, g, s, scores, top, inv, op + head);
    }
  };
  kernel_parallel_for(B * s.KVH, 1, tasks);
}

#endif  // RELAY_X86_KERNELS

std::atomic<bool> g_kernel_on{true};

}  // namespace

bool has_decode_attention_kernel() { return cpu_has_avx2_fma(); }

#ifdef RELAY_X86_KERNELS
namespace {

// fp32 and bf16 on any AVX2 CPU; fp16 also needs F16C.
bool kernel_takes(c10::ScalarType dtype) {
  return dtype == torch::kFloat32 || dtype == torch::kBFloat16 ||
         (dtype == torch::kHalf && cpu_has_f16c());
}

}  // namespace
#endif  // RELAY_X86_KERNELS

void set_decode_attention_kernel(bool on) { g_kernel_on.store(on); }

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& cache_k,
                                  const at::Tensor& cache_v, const at::Tensor& read_index,
                                  const at::Tensor& mask) {
#ifdef RELAY_X86_KERNELS
  if (!has_decode_attention_kernel() || !g_kernel_on.load(std::memory_order_relaxed) ||
      q.dim() != 4 || q.size(2) != 1 || !q.device().is_cpu() || !kernel_takes(q.scalar_type()) ||
      cache_k.scalar_type() != q.scalar_type() || cache_v.scalar_type() != q.scalar_type() ||
      cache_k.dim() != 3 || cache_v.sizes() != cache_k.sizes() || !cache_k.is_contiguous() ||
      !cache_v.is_contiguous() || !cache_k.device().is_cpu() ||
      (torch::GradMode::is_enabled() && q.requires_grad()) || !read_index.defined() ||
      !mask.defined() || !read_index.device().is_cpu() || !mask.device().is_cpu() ||
      mask.scalar_type() != torch::kBool) {
    return at::Tensor();
  }
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t KVH = cache_k.size(1);
  if (cache_k.size(2) != D || D % 8 != 0 || KVH < 1 || H % KVH != 0 || read_index.dim() != 2 ||
      read_index.size(0) != B || mask.numel() != read_index.numel()) {
    return at::Tensor();
  }
  Shapes s;
  s.S = read_index.size(1);
  s.KVH = KVH;
  s.D = D;
  s.rep = H / KVH;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  // The query in fp32 (a few rows), the output rounded once to its dtype.
  const at::Tensor qc = q.to(torch::kFloat32).contiguous();
  const at::Tensor rows = read_index.to(torch::kInt64).contiguous();
  const at::Tensor seen = mask.reshape({B, s.S}).contiguous();
  at::Tensor out = torch::empty({B, H, 1, D}, q.options().dtype(torch::kFloat32));
  const float* qp = qc.data_ptr<float>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const bool* mp = seen.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  switch (q.scalar_type()) {
    case torch::kBFloat16:
      attend_all<simd::BF16>(qp, simd::elements<simd::BF16>(cache_k),
                             simd::elements<simd::BF16>(cache_v), rp, mp, B, H, s, op);
      return out.to(q.scalar_type());
    case torch::kHalf:
      attend_all<simd::F16>(qp, simd::elements<simd::F16>(cache_k),
                            simd::elements<simd::F16>(cache_v), rp, mp, B, H, s, op);
      return out.to(q.scalar_type());
    default:
      attend_all<simd::F32>(qp, simd::elements<simd::F32>(cache_k),
                            simd::elements<simd::F32>(cache_v), rp, mp, B, H, s, op);
      return out;
  }
#else
  (void)q, (void)cache_k, (void)cache_v, (void)read_index, (void)mask;
  return at::Tensor();
#endif
}

}  // namespace relay::model
