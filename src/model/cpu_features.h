#pragma once

// What the CPU offers relay's hand-written kernels (src/model's
// row_linear.h and decode_attention.h, src/trainer's adamw_kernel.h).
// Private to src/.
//
// The kernels are compiled for AVX2/FMA (and AVX-512) through per-function target
// attributes, so the build's flags stay portable and the choice is made at
// run time, once.

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RELAY_X86_KERNELS 1
#endif

namespace relay::model {

// x86-64 with AVX2 and FMA.
inline bool cpu_has_avx2_fma() {
#ifdef RELAY_X86_KERNELS
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

// x86-64 with AVX-512F (the foundation: 32 sixteen-lane registers).
inline bool cpu_has_avx512f() {
#ifdef RELAY_X86_KERNELS
  static const bool has = __builtin_cpu_supports("avx512f") && cpu_has_avx2_fma();
  return has;
#else
  return false;
#endif
}

// x86-64 with F16C (fp16 <-> fp32 conversions; every AVX2 CPU has it, a VM
// may hide it).
inline bool cpu_has_f16c() {
#ifdef RELAY_X86_KERNELS
  static const bool has = __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

// x86-64 with AVX512-BF16 (bf16 dot products in hardware: Zen 4, Cooper
// Lake, Sapphire Rapids and later), where LibTorch's bf16 product (oneDNN)
// runs them natively.
inline bool cpu_has_avx512_bf16() {
#ifdef RELAY_X86_KERNELS
  static const bool has = __builtin_cpu_supports("avx512bf16") && cpu_has_avx512f();
  return has;
#else
  return false;
#endif
}

}  // namespace relay::model
