#pragma once

// fp32, bf16 and fp16 values loaded as fp32 vectors, for relay's
// hand-written CPU kernels (row_linear.cc, decode_attention.cc). Private to
// src/model.
//
// A kernel templated on the element type reads fp32 as it is and widens
// bf16 and fp16 as it loads them (a bf16 value is the top half of an fp32
// one; fp16 goes through F16C), so its products and sums are fp32 whatever
// the storage: half the bytes to read, fp32 arithmetic. Each function
// carries its instruction set as a target attribute (cpu_features.h): the
// callers check the CPU at run time.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "model/cpu_features.h"

#ifdef RELAY_X86_KERNELS
#include <immintrin.h>

namespace relay::model::simd {

// The element types, as tags; T is how they are stored.
struct F32 {
  using T = float;
};
struct BF16 {
  using T = uint16_t;
};
struct F16 {
  using T = uint16_t;
};

// A contiguous tensor's elements as a kernel of that tag reads them (the
// caller has checked its dtype): fp32 as floats, bf16 and fp16 as their bits.
template <class Tag>
const typename Tag::T* elements(const at::Tensor& t) {
  return static_cast<const typename Tag::T*>(t.data_ptr());
}

// Eight values (AVX2; fp16 also needs F16C).
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(F32, const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(BF16, const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(F16, const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Sixteen values (AVX-512F). The zero-masked forms because GCC 12's unmasked
// ones fill with an undefined vector, which trips -Wmaybe-uninitialized.
__attribute__((target("avx512f,avx2,fma"))) inline __m512 load16(F32, const float* p) {
  return _mm512_loadu_ps(p);
}
__attribute__((target("avx512f,avx2,fma"))) inline __m512 load16(BF16, const uint16_t* p) {
  const __m512i wide =
      _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, wide, 16));
}
__attribute__((target("avx512f,avx2,fma"))) inline __m512 load16(F16, const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One value.
inline float widen(F32, float v) { return v; }
inline float widen(BF16, uint16_t v) {
  return static_cast<float>(c10::BFloat16(v, c10::BFloat16::from_bits()));
}
inline float widen(F16, uint16_t v) {
  return static_cast<float>(c10::Half(v, c10::Half::from_bits()));
}

}  // namespace relay::model::simd

#endif  // RELAY_X86_KERNELS
