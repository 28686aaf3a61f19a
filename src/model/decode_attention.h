#pragma once

// Attention for decode steps read straight from the paged KV cache. Private
// to src/model.
//
// The general path (AttentionImpl::forward) gathers every row's keys and
// values out of the cache's flat storage into [B, KVH, S, D] tensors each
// layer and step (index_select), then multiplies: at long contexts that copy
// is larger than the weights the step reads (qwen2-100m: 24 KB per cached
// position per step). When every row brings one new token, this kernel
// instead walks each row's positions through its storage rows: per (row, kv
// head), the dot products of the `rep` query heads that share the kv head
// with each key, a masked softmax in fp32, and the weighted sum of the
// values, each key and value read once where it lies.
//
// Same math as grouped_attention (scores scaled by 1/sqrt(D), masked
// positions excluded, softmax with its maximum subtracted), summed in
// another order: agreement to fp32 rounding, not bit for bit. The (row, kv
// head) tasks run on relay's kernel pool (kernel_pool.h) where it has the
// cores, as row_linear's products do; each task's sums are its own, so the
// bits do not depend on the number of threads.
//
// A bf16 or fp16 cache (a rollout engine's, rollout.dtype) is read the same
// way, each key and value widened to fp32 as it is loaded (simd_load.h):
// the scores, the softmax and the weighted sum stay fp32, and the output is
// rounded once to the cache's precision. The general path rounds the scores
// and the probabilities to bf16 on the way (transformers' eager attention
// does the same), so the two agree to bf16 rounding, the kernel being the
// closer to the fp32 result.
//
// Applies to fp32, bf16 and fp16 (fp16 with F16C) on the CPU, the query in
// the cache's precision, without autograd, D a multiple of 8, on x86-64
// with AVX2 and FMA (checked at run time); paged_decode_attention returns an
// undefined tensor otherwise and the caller takes the general path.

#include <ATen/core/Tensor.h>

namespace relay::model {

bool has_decode_attention_kernel();

// Off: paged_decode_attention declines everything, so decode steps take the
// gathered path (a benchmark's baseline in the same run). On by default;
// process-wide.
void set_decode_attention_kernel(bool on);

// q [B, H, 1, D] (rotated); cache_k, cache_v [rows, KVH, D], the cache's flat
// storage with this step's keys and values written; read_index [B, S]: the
// storage row of each row's position s; mask [B, 1, 1, S] (bool): which
// positions the row's query sees. Returns [B, H, 1, D], or undefined when
// the kernel does not apply.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& cache_k,
                                  const at::Tensor& cache_v, const at::Tensor& read_index,
                                  const at::Tensor& mask);

}  // namespace relay::model
