#pragma once

// Building blocks of a LLaMA-family decoder, registered under Hugging Face's
// parameter names so that `named_parameters()` matches checkpoint keys:
//   model.layers.<i>.input_layernorm.weight
//   model.layers.<i>.self_attn.{q,k,v,o}_proj.weight (+ q/k/v bias for Qwen2)
//   model.layers.<i>.post_attention_layernorm.weight
//   model.layers.<i>.mlp.{gate,up,down}_proj.weight
//
// The numerics follow the reference implementation in `transformers`: RMSNorm
// in fp32, rotate-half RoPE with cos/sin computed in fp32, softmax in fp32.

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "relay/model/policy_config.h"

namespace relay::model {

class KVCache;

// What attention needs beyond the hidden states; built once per forward and
// shared by every layer.
struct AttentionContext {
  at::Tensor positions;  // [B, T] int64: absolute position of each query token
  at::Tensor mask;       // [B, 1, T, S] bool: true where query t may attend key s
  // Cached path only (cache == nullptr: keys/values come from this input alone).
  KVCache* cache = nullptr;
  at::Tensor slots;        // [B] int64: cache slot of each row
  int64_t kv_len = 0;      // S: keys [0, S) of each slot are read
  at::Tensor write_rows;   // [N] int64: flat (b * T + t) indices of the valid new tokens
  at::Tensor write_slots;  // [N] int64: their slot
  at::Tensor write_pos;    // [N] int64: their absolute position
};

// y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Rotary position embedding (rotate-half form) applied to x [B, heads, T, D]
// at positions [B, T], with inv_freq [D/2] = theta^(-2i/D).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq);
at::Tensor rope_inv_freq(int64_t head_dim, double theta);

// softmax(q k^T / sqrt(D) + mask) v with grouped-query attention: query head h
// reads key/value head h / (H / KVH), as transformers' repeat_kv does, without
// materialising the repeated keys. q [B, H, T, D]; k, v [B, KVH, S, D].
at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& mask);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const PolicyConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const AttentionContext& ctx, const at::Tensor& inv_freq);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t layer_index_;
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

// down(silu(gate(x)) * up(x))
class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const PolicyConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

// Pre-norm residual block: h = x + attn(norm(x)); y = h + mlp(norm(h)).
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const PolicyConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const AttentionContext& ctx, const at::Tensor& inv_freq);

  RMSNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

}  // namespace relay::model
