#pragma once

// The policy network: a LLaMA-family decoder (Llama, Qwen2, Qwen3, Qwen3-MoE)
// with two forward paths over the same weights.
//
//  * Scoring/training: a right-padded batch of whole sequences with their
//    lengths -> logits, or straight to per-token log-probs (score()).
//  * Incremental decoding: extend() appends tokens to sequences held in a
//    KVCache (prefill = extend from length 0; decode = extend by one token).
//
// Alignment (DESIGN.md invariant 4): the logit at position t predicts token
// t + 1, so for prompt length P, response token j is scored at P - 1 + j.
//
// Parameter names are Hugging Face's (model.embed_tokens.weight, ...,
// lm_head.weight when untied), so checkpoints load by name (checkpoint.h).

#include <cstdint>
#include <string>
#include <unordered_map>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "relay/model/layers.h"
#include "relay/model/policy_config.h"

namespace relay::model {

class KVCache;

// What a fully sharded trainer (trainer.sharding: full) does around each
// decoder layer, whose weights it keeps only a shard of between uses. The
// decoder calls, for layer i of a scoring pass:
//   * without gradients: acquire(i), the layer, release(i);
//   * with gradients: acquire(i), the layer without autograd (as activation
//     checkpointing: only its input is kept), release(i); then in backward
//     acquire(i), the recompute and its backward, gradients_ready(i), which
//     takes the layer's parameter gradients and releases the layer.
// Every rank runs the same passes, so each call can be a collective. A
// failure throws (c10::Error), which the trainer turns into a Status.
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void acquire(int64_t layer) = 0;
  virtual void release(int64_t layer) = 0;
  virtual void gradients_ready(int64_t layer) = 0;
};

// The transformer body, registered as "model" so names match HF's.
class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const PolicyConfig& config);
  // With `checkpointing` and gradients enabled, each decoder layer keeps
  // only its input for backward and recomputes its activations then.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardContext& ctx,
                     bool checkpointing = false);

  // Not owned; null = the weights are whole (LayerHooks).
  void set_layer_hooks(LayerHooks* hooks) { hooks_ = hooks; }
  LayerHooks* layer_hooks() const { return hooks_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  LayerHooks* hooks_ = nullptr;
};
TORCH_MODULE(Decoder);

struct ScoreOptions {
  double temperature = 1.0;  // logits are divided by this before log_softmax
  // Positions per LM-head chunk; bounds the [chunk, vocab] buffers. 0 = by
  // the vocabulary (lm_head_chunk_tokens: 441 for 151,936 ids).
  int64_t chunk_tokens = 0;
  // Ids [0, vocab_limit) are the distribution's support: the logits of the
  // rest (an embedding padded past the tokenizer's vocabulary) are left out
  // of the softmax, as the rollout engine leaves them out of sampling.
  // 0 = the whole vocab_size.
  int64_t vocab_limit = 0;
  // Bytes of the first chunks' fp32 log-softmax the LM head may keep from
  // forward to backward, which then skips recomputing their logits
  // (lm_head.h). 0 = recompute every chunk.
  int64_t lm_head_keep_bytes = 0;
  MoeRouting* routing = nullptr;  // MoE record / replay (layers.h); null = neither
  // Sequence packing: rows hold several sequences end to end. [B, T] int64:
  // the position where the sequence holding position t begins (t itself
  // for a padding position, which is a sequence of its own). Positions
  // restart at 0 in each sequence and a token attends only to its own
  // sequence's earlier tokens, so each sequence scores as it would alone.
  // Undefined = one sequence per row.
  at::Tensor sequence_starts;
  // [B, T - 1] bool: the positions whose scores the caller reads (a
  // trainer's response tokens). The LM head, the costliest layer of a small
  // model's backward, runs on these only; every other position scores 0,
  // as padding does. Undefined = every position.
  at::Tensor scored;
};

// Per-position outputs of Policy::score_with_entropy, [B, T - 1] fp32 each.
struct ScoreOutput {
  at::Tensor logprobs;  // log p(token[t + 1] | tokens[0..t])
  // Entropy of the whole next-token distribution at position t (at the
  // scoring temperature): H = logsumexp(z) - sum_v softmax(z)_v z_v.
  at::Tensor entropy;
};

// Which logits extend() returns.
enum class ExtendLogits {
  kLast,  // [B, V]: each row's last new token (enough to sample the next one)
  kAll,   // [B, T, V]: every new position (re-prefill that scores a response)
  kNone,  // undefined tensor: only fill the cache (a prompt's context before its last token)
};

struct ExtendOptions {
  ExtendLogits which = ExtendLogits::kLast;
  int64_t vocab_limit = 0;        // logits of ids [0, vocab_limit) only; 0 = all (ScoreOptions)
  MoeRouting* routing = nullptr;  // MoE record / replay; null = neither
};

class PolicyImpl : public torch::nn::Module {
 public:
  // Builds the architecture with placeholder values; call init_weights() or
  // load a checkpoint before use. REQUIRES: validate(config).ok().
  explicit PolicyImpl(const PolicyConfig& config);

  const PolicyConfig& config() const { return config_; }

  // Scoring path. input_ids [B, T] int64, right-padded; lengths [B] int64 (an
  // undefined tensor = every row has length T). Returns logits [B, T, V].
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& lengths = {});

  // Final hidden states [B, T, H] (after the last RMSNorm) on the scoring
  // path; `sequence_starts` as ScoreOptions has it.
  at::Tensor hidden_states(const at::Tensor& input_ids, const at::Tensor& lengths = {},
                           MoeRouting* routing = nullptr, const at::Tensor& sequence_starts = {});

  // LM head: hidden [..., H] -> logits [..., V] (or [..., vocab_limit]).
  at::Tensor logits(const at::Tensor& hidden, int64_t vocab_limit = 0);

  // An fp32 LM head for a policy held in bf16 or fp16 (rollout.fp32_lm_head):
  // logits() and score() multiply the final hidden states, widened to fp32,
  // by `head` [V, H] widened to fp32 (copied; the trainer's own fp32 values
  // when the caller has them), so the logits are not rounded to the weights'
  // precision. An undefined tensor turns it off. Inference only: it is not a
  // parameter, has no gradient, and the caller refreshes it when the
  // weights change.
  void set_fp32_lm_head(const at::Tensor& head);
  bool has_fp32_lm_head() const { return fp32_head_.defined(); }
  // The LM head's parameter: "lm_head.weight", or "model.embed_tokens.weight"
  // when tied.
  std::string lm_head_parameter_name() const;

  // log p(token[t + 1] | tokens[0..t]) for t in [0, T - 1): [B, T - 1], fp32.
  // Positions t >= lengths[b] - 1 (padding) are 0; the caller masks them.
  // Packed rows (options.sequence_starts): so is the last position of each
  // sequence, whose next token begins the next one; so are positions left
  // out of options.scored. None of these runs through the LM head.
  // The LM head runs in chunks of options.chunk_tokens positions and its
  // backward recomputes them (lm_head.h), so the full [B, T, V] logits are
  // never held at once, not even for autograd. Differentiable.
  at::Tensor score(const at::Tensor& input_ids, const at::Tensor& lengths = {},
                   const ScoreOptions& options = {});
  // score() plus the entropy of each position's distribution, from the same
  // LM-head chunks (one extra softmax per chunk, no second forward pass).
  // Padding positions are 0 in both. Differentiable.
  ScoreOutput score_with_entropy(const at::Tensor& input_ids, const at::Tensor& lengths = {},
                                 const ScoreOptions& options = {});

  // Incremental path. Appends input_ids[b, 0:new_lengths[b]] to the sequence
  // in cache slot slots[b], at positions cache.length(slot) onwards, then
  // advances the cache. input_ids [B, T] (right-padded), new_lengths [B] >= 1,
  // slots [B] distinct. Throws c10::Error when a slot would overflow or the
  // cache has no block for it; the cache is then as it was, but for blocks
  // handed to slots (still empty, and counted in their reservations).
  at::Tensor extend(const at::Tensor& input_ids, const at::Tensor& new_lengths,
                    const at::Tensor& slots, KVCache& cache, const ExtendOptions& options);
  at::Tensor extend(const at::Tensor& input_ids, const at::Tensor& new_lengths,
                    const at::Tensor& slots, KVCache& cache,
                    ExtendLogits which = ExtendLogits::kLast) {
    ExtendOptions o;
    o.which = which;
    return extend(input_ids, new_lengths, slots, cache, o);
  }

  // One decode step in fixed shapes, for DecodeGraphs (decode_graphs.h),
  // whose captured CUDA graphs replay it: row b appends token ids[b] at
  // position positions[b], written to storage row write_index[b] of every
  // layer, and attends to the keys at storage rows read_index[b, 0..S),
  // of which those at s <= positions[b] are its own (the rest are masked).
  // key_positions is arange(S') for some S' >= max(S, B). All int64 on the
  // weights' device: ids, positions, write_index [B]; read_index [B, S].
  // Returns logits [B, V] (V = vocab_limit when > 0). The cache's lengths
  // are the caller's to advance. Not for MoE layers (their routing reads
  // counts back to the host).
  at::Tensor decode_fixed(const at::Tensor& ids, const at::Tensor& positions,
                          const at::Tensor& write_index, const at::Tensor& read_index,
                          const at::Tensor& key_positions, KVCache& cache, int64_t vocab_limit);
  // Per decoder layer activation checkpointing on the scoring path (the
  // trainer's activation_checkpointing): a layer keeps only its input for
  // backward and recomputes the rest then, under the same autocast and with
  // the same MoE routing.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

  Decoder model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  const at::Tensor& lm_head_weight();
  // The LM head rows that may be scored: [vocab_limit or V, H].
  at::Tensor head_rows(int64_t vocab_limit);
  // RoPE for a pass whose largest position + 1 is seq_len, on `device`.
  void set_rope(ForwardContext& ctx, int64_t seq_len, c10::Device device);
  ScoreOutput score_impl(const at::Tensor& input_ids, const at::Tensor& lengths,
                         const ScoreOptions& options, bool with_entropy);

  PolicyConfig config_;
  // RoPE frequencies for passes within max_position_embeddings: an fp32
  // copy kept out of the registered buffers on purpose, since
  // module.to(kBFloat16) would round them and they must stay fp32 as in
  // transformers. Moved to the weights' device on first use.
  at::Tensor inv_freq_;
  at::Tensor fp32_head_;  // set_fp32_lm_head; undefined = the weights' own head
  double rope_scaling_ = 1.0;
  bool checkpointing_ = false;
};
TORCH_MODULE(Policy);

// Deterministic initialisation from a seed, independent of device and of
// global RNG state: N(0, initializer_range) for linear and embedding weights,
// zeros for biases, ones for norm weights, drawn in named_parameters() order
// on the CPU in fp32 and then copied into the parameters.
void init_weights(PolicyImpl& policy, uint64_t seed, double initializer_range = 0.02);

// A separate policy with the same config and a copy of every weight, each
// on its device and in its dtype, in eval mode: a rollout engine's own copy,
// or a frozen reference policy.
Policy clone_policy(const PolicyImpl& policy);

// Every parameter by name, detached and cloned: what update_weights() and a
// weight publisher take.
std::unordered_map<std::string, at::Tensor> parameter_tensors(const PolicyImpl& policy);

}  // namespace relay::model
