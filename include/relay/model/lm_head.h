#pragma once

// Token log-probs (and entropies) through the LM head without ever holding
// the [positions, vocab] logits of more than one chunk: the memory a
// 150k-token vocabulary would otherwise take (8,192 positions x 151,936
// logits x 4 bytes = 5 GB, kept for backward by autograd).
//
// Forward, per chunk of positions: z = (h W^T) / tau in fp32, then
//   logp = z[target] - logsumexp(z),   H = logsumexp(z) - sum_v softmax(z)_v z_v.
// Backward recomputes each chunk's z from the saved h and W (the same
// casts as the forward, so under autocast the same low-precision product),
// unless the forward kept the chunk's fp32 log-softmax (the first chunks,
// within a byte budget: memory for one GEMM of the head's four), and
// applies, with p = softmax(z):
//   dlogp/dz = onehot(target) - p,     dH/dz = -p (log p + H),
//   dh = (dz / tau) W,                 dW += (dz / tau)^T h.
// The values equal a plain chunked forward exactly (same operations in the
// same order); gradients equal autograd's up to summation order.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace relay::model {

// Positions per chunk when the caller leaves it to the head: as many as keep
// one chunk's fp32 logits within 256 MiB, in [16, 1024] (441 for a
// 151,936-token vocabulary, 1024 for small ones). Backward holds about three
// such buffers at once. Smaller chunks cost time: each one reads and writes
// the whole [V, H] weight gradient once.
int64_t lm_head_chunk_tokens(int64_t vocab);

struct TokenScores {
  at::Tensor logprobs;  // [n] fp32
  at::Tensor entropy;   // [n] fp32, or undefined when not asked for
};

// hidden [n, H]; weight [V, H] (the LM head, or the rows of it that may be
// scored); targets [n] int64 in [0, V). Differentiable in hidden and
// weight; when neither requires grad it is a plain chunked forward.
// keep_bytes: what the kept log-softmax of the first chunks may hold until
// backward (whole chunks of chunk_tokens x V x 4 bytes; 0 = recompute all).
TokenScores lm_head_token_scores(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& targets, double temperature,
                                 int64_t chunk_tokens, bool with_entropy, int64_t keep_bytes = 0);

}  // namespace relay::model
