#pragma once

// grouped_attention under model.attn_implementation eager and sdpa on the
// same inputs (relay/model/attention_implementation.h): outputs and the
// gradients of q, k and v agree within `tol` (absolute and relative). Used by
// the unit suite on the CPU and by the CUDA tests on the GPU.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "relay/model/attention_implementation.h"
#include "relay/model/layers.h"
#include "testing/tensor_testing.h"

namespace relay::testing {

// Restores the process-wide choice when a test ends.
class AttentionChoiceGuard {
 public:
  AttentionChoiceGuard() : saved_(model::attention_implementation()) {}
  ~AttentionChoiceGuard() { model::set_attention_implementation(saved_); }
  AttentionChoiceGuard(const AttentionChoiceGuard&) = delete;
  AttentionChoiceGuard& operator=(const AttentionChoiceGuard&) = delete;

 private:
  model::AttentionImplementation saved_;
};

struct AttentionOutputs {
  at::Tensor out, dq, dk, dv;
};

inline AttentionOutputs run_attention(model::AttentionImplementation which, const at::Tensor& q0,
                                      const at::Tensor& k0, const at::Tensor& v0,
                                      const at::Tensor& mask, const at::Tensor& grad_out) {
  EXPECT_TRUE(model::set_attention_implementation(which));
  at::Tensor q = q0.detach().clone().requires_grad_(true);
  at::Tensor k = k0.detach().clone().requires_grad_(true);
  at::Tensor v = v0.detach().clone().requires_grad_(true);
  at::Tensor out = model::grouped_attention(q, k, v, mask);
  out.backward(grad_out);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// B = 3 rows, 6 query heads over 2 kv heads, T = 5 new positions after 4
// cached ones; row b attends keys [0, its position] within its first len[b]
// keys (Policy::extend's mask), so rows 1 and 2 end with masked keys.
inline void expect_sdpa_agrees_with_eager(c10::Device device, c10::ScalarType dtype, double tol) {
  AttentionChoiceGuard restore;
  torch::manual_seed(7);
  const int64_t B = 3, H = 6, KVH = 2, T = 5, D = 16, past = 4, S = past + T;
  auto opts = torch::TensorOptions().dtype(dtype).device(device);
  at::Tensor q = torch::randn({B, H, T, D}, opts);
  at::Tensor k = torch::randn({B, KVH, S, D}, opts);
  at::Tensor v = torch::randn({B, KVH, S, D}, opts);
  at::Tensor grad = torch::randn({B, H, T, D}, opts);
  const std::vector<int64_t> len = {S, S - 2, past + 1};
  at::Tensor mask = torch::zeros({B, 1, T, S}, torch::kBool);
  auto m = mask.accessor<bool, 4>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t s = 0; s < S; ++s) m[b][0][t][s] = s <= past + t && s < len[b];
    }
  }
  mask = mask.to(device);
  const AttentionOutputs eager =
      run_attention(model::AttentionImplementation::kEager, q, k, v, mask, grad);
  const AttentionOutputs sdpa =
      run_attention(model::AttentionImplementation::kSdpa, q, k, v, mask, grad);
  EXPECT_TRUE(AllClose(sdpa.out, eager.out, tol, tol)) << "output";
  EXPECT_TRUE(AllClose(sdpa.dq, eager.dq, tol, tol)) << "dq";
  EXPECT_TRUE(AllClose(sdpa.dk, eager.dk, tol, tol)) << "dk";
  EXPECT_TRUE(AllClose(sdpa.dv, eager.dv, tol, tol)) << "dv";
  // A masked key takes no part: row 2 ignores a change to its last value.
  at::Tensor v2 = v.clone();
  v2.select(0, 2).select(1, S - 1).fill_(100);
  ASSERT_TRUE(model::set_attention_implementation(model::AttentionImplementation::kSdpa));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(model::grouped_attention(q, k, v2, mask).select(0, 2), sdpa.out.select(0, 2),
                       tol, tol))
      << "row 2 attends a masked key";
}

}  // namespace relay::testing
