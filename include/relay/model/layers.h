#pragma once

// Building blocks of a LLaMA-family decoder, registered under Hugging Face's
// parameter names so that `named_parameters()` matches checkpoint keys:
//   model.layers.<i>.input_layernorm.weight
//   model.layers.<i>.self_attn.{q,k,v,o}_proj.weight (+ biases: see policy_config.h)
//   model.layers.<i>.self_attn.{q,k}_norm.weight          (qwen3, qwen3_moe)
//   model.layers.<i>.post_attention_layernorm.weight
//   model.layers.<i>.mlp.{gate,up,down}_proj.weight       (dense layers)
//   model.layers.<i>.mlp.gate.weight                      (MoE router, [experts, hidden])
//   model.layers.<i>.mlp.experts.<e>.{gate,up,down}_proj.weight
// and, on projections given a LoRA adapter (lora.h), PEFT's names less its
// adapter name: model.layers.<i>.self_attn.q_proj.lora_{A,B}.weight.
//
// The numerics follow the reference implementation in `transformers`: RMSNorm
// in fp32, rotate-half RoPE with cos/sin computed in fp32, softmax in fp32,
// router probabilities in fp32.

#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "relay/model/attention_implementation.h"
#include "relay/model/policy_config.h"

namespace relay::model {

class KVCache;

// Mixture-of-experts routing of one forward pass, for recording what the
// routers chose and for comparing with, or replaying, a recorded choice
// (router replay). Rows are the pass's tokens in [B, T] row-major order
// (row = b * T + t); `k` is num_experts_per_tok; MoE layers are numbered in
// order (PolicyConfig::moe_layer_index).
struct MoeRouting {
  // A recorded choice, [rows, moe_layers, k] int64 expert ids; a row whose
  // ids are all -1 has none. Undefined = none at all.
  at::Tensor recorded;
  // Route rows that have a recorded choice to it (else `recorded` is only
  // compared with).
  bool replay = false;
  // When true, each MoE layer appends the ids it used, [rows, k] int64, to
  // `chosen`.
  bool record = false;
  std::vector<at::Tensor> chosen;
  // With `recorded`: per MoE layer, [rows] bool, true where the model's own
  // top-k set differs from the recorded one (rows without one: false).
  std::vector<at::Tensor> differs;
};

// What every layer needs beyond the hidden states; built once per forward
// and shared by every layer.
struct ForwardContext {
  at::Tensor positions;       // [B, T] int64: absolute position of each query token
  at::Tensor mask;            // [B, 1, T, S] bool: true where query t may attend key s
  at::Tensor inv_freq;        // [head_dim / 2] fp32 RoPE frequencies, on the model's device
  double rope_scaling = 1.0;  // cos/sin multiplier (yarn's attention factor)
  // Cached path only (cache == nullptr: keys/values come from this input alone).
  KVCache* cache = nullptr;
  int64_t kv_len = 0;             // S: keys [0, S) of each row are read
  at::Tensor write_rows;          // [N] int64: flat (b * T + t) indices of the valid new tokens
  at::Tensor write_index;         // [N] int64: their rows in the cache's flat storage
  at::Tensor read_index;          // [B, S] int64: the storage row of key s of row b
  MoeRouting* routing = nullptr;  // MoE record / replay; null = neither
};

// One LoRA matrix, registered as a module holding "weight" so that its
// parameter is named <projection>.lora_A.weight as in PEFT's files.
class LoraMatrixImpl : public torch::nn::Module {
 public:
  explicit LoraMatrixImpl(const at::Tensor& value) { weight = register_parameter("weight", value); }
  at::Tensor weight;
};
TORCH_MODULE(LoraMatrix);

// A linear projection, y = x W^T + b (torch::nn::Linear's math, parameters
// and default initialisation), that can carry a LoRA adapter (PEFT's
// LoraLayer on a Linear): y + B(A(dropout(x))) * scaling, with
// A [rank, in] and B [out, rank] registered as lora_A.weight and
// lora_B.weight. Dropout acts only in a training-mode pass that records
// gradients, so passes that only score (old and reference log-probs) see the
// adapter whole.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in_features, int64_t out_features, bool bias);
  at::Tensor forward(const at::Tensor& x);

  // Registers lora_A and lora_B (zero-filled, on the weight's device and in
  // its dtype; lora.h initialises them). REQUIRES: no adapter yet.
  void add_adapter(int64_t rank, double scaling, double dropout);
  bool has_adapter() const { return static_cast<bool>(lora_A); }
  double scaling() const { return scaling_; }
  double dropout() const { return dropout_; }
  // The adapter's contribution is left out while disabled (the base model).
  void set_adapter_enabled(bool on) { adapter_enabled_ = on; }
  bool adapter_enabled() const { return adapter_enabled_; }

  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out], undefined without one
  LoraMatrix lora_A{nullptr}, lora_B{nullptr};

 private:
  double scaling_ = 0;
  double dropout_ = 0;
  bool adapter_enabled_ = true;
};
TORCH_MODULE(Projection);

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

// softmax(q k^T / sqrt(D) + mask) v with grouped-query attention: query head h
// reads key/value head h / (H / KVH), as transformers' repeat_kv does. q [B,
// H, T, D]; k, v [B, KVH, S, D]; mask [B, 1, T, S] bool, true = attend. Runs
// the process's attention_implementation() (attention_implementation.h).
at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& mask);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const PolicyConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const ForwardContext& ctx);

  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qwen3: over each head's dimension, before RoPE

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
  MlpImpl(int64_t hidden, int64_t intermediate);
  at::Tensor forward(const at::Tensor& x);
  Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

// Qwen3-MoE's sparse block: p = softmax(gate(x)) in fp32, the top-k experts
// by p (renormalised to sum 1 when norm_topk_prob), y = sum_j w_j expert_j(x).
// Dispatch gathers each expert's tokens and runs the expert once on them
// (one host sync per layer for the per-expert counts); contributions are
// added in ascending expert order, as transformers' loop does.
//
// Router replay: a replayed row uses the recorded experts, weighted by this
// model's own p at those experts (renormalised over them when
// norm_topk_prob), so gradients still reach the router; when the recorded
// set equals the model's own top-k, the output is exactly the unreplayed one.
class SparseMoeImpl : public torch::nn::Module {
 public:
  explicit SparseMoeImpl(const PolicyConfig& config);
  // x [B, T, H] -> [B, T, H]. `routing` (may be null) records / replays this
  // layer's choice as MoE layer number `moe_index`.
  at::Tensor forward(const at::Tensor& x, MoeRouting* routing, int64_t moe_index);

  torch::nn::Linear gate{nullptr};  // the router
  torch::nn::ModuleList experts{nullptr};

 private:
  int64_t num_experts_;
  int64_t top_k_;
  bool norm_topk_prob_;
};
TORCH_MODULE(SparseMoe);

// Pre-norm residual block: h = x + attn(norm(x)); y = h + mlp(norm(h)),
// where mlp is the dense MLP or, in MoE layers, the sparse block (registered
// as "mlp" either way, so names match transformers').
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const PolicyConfig& config, int64_t layer_index);
  at::Tensor forward(const at::Tensor& x, const ForwardContext& ctx);

  RMSNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  Mlp mlp{nullptr};        // dense layers
  SparseMoe moe{nullptr};  // MoE layers (registered as "mlp")
  int64_t moe_index() const { return moe_index_; }

 private:
  int64_t moe_index_ = -1;  // index among MoE layers; -1 = dense
};
TORCH_MODULE(DecoderLayer);

}  // namespace relay::model
