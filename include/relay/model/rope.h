#pragma once

// Rotary position embeddings and their scaled variants, computed as
// transformers' modeling_rope_utils.py (v5) computes them, operation for
// operation in fp32 where transformers uses tensors and in double where it
// uses Python floats, so the frequencies agree bit for bit:
//
//   default  inv_freq_i = 1 / theta^(2i / d)
//   linear   inv_freq / factor
//   dynamic  (NTK) theta' = theta * (factor * L / M - (factor - 1))^(d / (d - 2)) for a
//            forward pass whose largest position + 1 is L > M = max_position_embeddings;
//            plain RoPE for L <= M. transformers keeps the largest L seen so far
//            in the module (and resets below M); relay evaluates each pass on
//            its own. The two agree whenever sequences stay within M, and
//            relay's engine never runs past M (max_position_embeddings is
//            a sequence's capacity), so engine and trainer always see plain
//            RoPE here.
//   yarn     blend of interpolated (inv_freq / factor) and extrapolated
//            frequencies over the correction range found from beta_fast /
//            beta_slow and original_max_position_embeddings; cos and sin are
//            multiplied by attention_factor (default 0.1 ln(factor) + 1, or
//            mscale / mscale_all_dim's ratio). transformers 4.4x-4.5x
//            replaced `factor` by max_position_embeddings /
//            original_max_position_embeddings when the latter was given;
//            v5 uses the explicit factor, and so does relay.
//   llama3   Llama 3.1's smooth interpolation between inv_freq (high
//            frequencies) and inv_freq / factor (wavelengths beyond
//            original_max_position_embeddings / low_freq_factor).

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "relay/model/policy_config.h"

namespace relay::model {

struct RopeFrequencies {
  at::Tensor inv_freq;             // [head_dim / 2] fp32, on the CPU
  double attention_scaling = 1.0;  // cos and sin are multiplied by it
};

// The frequencies of `config` for a forward pass whose largest position + 1
// is `seq_len` (only dynamic scaling reads it; 0 = max_position_embeddings).
// REQUIRES: validate(config).ok().
RopeFrequencies rope_frequencies(const PolicyConfig& config, int64_t seq_len = 0);

// True when rope_frequencies() depends on seq_len beyond max_position_embeddings.
inline bool rope_depends_on_length(const PolicyConfig& config) {
  return config.rope_scaling.rope_type == "dynamic";
}

// Rotary position embedding (rotate-half form) applied to x [B, heads, T, D]
// at positions [B, T]: x cos + rotate_half(x) sin, with cos/sin of
// positions x inv_freq computed in fp32, multiplied by attention_scaling
// and cast to x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq,
                      double attention_scaling = 1.0);

}  // namespace relay::model
