#pragma once

// AdamW's update in one pass over fp32 memory. Private to src/trainer.
//
// torch's AdamW runs the update as eight tensor operations, each a full pass
// over the parameter, its gradient, a moment or a temporary for the
// denominator: about 100 bytes read or written per fp32 parameter. Fused,
// each element is read once and written once: 28 bytes. On a CPU the update
// is bound by memory, so that is most of its time.
//
// The arithmetic is torch's, rounded as ATen's CPU kernels round it (its
// vectorized add and addcmul fuse a multiply-add, its addcdiv does not), so
// the result is bit for bit that of torch::optim::AdamW on fp32 tensors:
//   p = p (1 - lr wd);  m = fma(g, 1 - b1, m b1);  v = fma((1 - b2) g, g, v b2)
//   p = p + ((-lr / c1) m) / (sqrt(v) / sqrt(c2) + eps),  c_k = 1 - b_k^step
// The AVX2 path and the scalar path (std::fma; the file is compiled without
// floating-point contraction) round identically, so an element's result does
// not depend on where a slice of the tensor starts either: a tensor updated
// in slices (the sharded optimizers) equals the tensor updated whole.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "relay/trainer/options.h"

namespace relay::trainer {

// The update's per-step constants, in fp32 as ATen applies a double scalar
// to an fp32 tensor.
struct AdamWConstants {
  float decay = 1;  // 1 - lr * weight_decay
  float beta1 = 0, one_minus_beta1 = 0;
  float beta2 = 0, one_minus_beta2 = 0;
  float sqrt_bias_correction2 = 1;
  float eps = 0;
  float neg_step_size = 0;  // -lr / bias_correction1
  bool decays = false;      // weight_decay != 0
};

// step: the optimizer step this update makes (1 for the first).
AdamWConstants adamw_constants(const OptimizerOptions& options, int64_t step, double lr);

// Updates n elements in place. Runs on the intra-op threads for large n.
void adamw_fused(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const AdamWConstants& c);

// Whether adamw_fused can update these tensors: fp32, CPU, contiguous and
// of one size.
bool adamw_fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq);

}  // namespace relay::trainer
