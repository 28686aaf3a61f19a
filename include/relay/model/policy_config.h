#pragma once

// Architecture of a LLaMA-family decoder, in Hugging Face config.json terms
// (field names match the JSON keys), for model_type "llama", "qwen2",
// "qwen3" and "qwen3_moe".
//
// What each model_type changes, as transformers' modeling files define it:
//   llama      q/k/v/o projections with a bias only when attention_bias;
//   qwen2      q/k/v always with a bias, o without;
//   qwen3      RMSNorm over each head's dimension of q and k (q_norm,
//              k_norm) before RoPE; biases as llama; head_dim is explicit;
//   qwen3_moe  qwen3's attention, and a sparse mixture of experts in place of
//              the MLP in the layers is_moe_layer() names (rope and norms as
//              qwen3).

#include <cstdint>
#include <string>
#include <vector>

#include "relay/common/status.h"

namespace relay::model {

// rope_scaling (transformers < 5) / rope_parameters (transformers >= 5), with
// the keys transformers' modeling_rope_utils.py reads for each type. Values
// keep HF's defaults when a key is absent.
struct RopeScaling {
  // default | linear | dynamic | yarn | llama3
  std::string rope_type = "default";
  double factor = 1.0;  // linear, dynamic, llama3, yarn
  // llama3 and yarn: the pre-training context; 0 = max_position_embeddings
  // (as transformers' standardize_rope_params fills it in).
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // yarn: cos/sin multiplier; 0 = derived from factor (and mscale /
  // mscale_all_dim when both are set).
  double attention_factor = 0.0;
  double beta_fast = 32.0;      // yarn
  double beta_slow = 1.0;       // yarn
  double mscale = 0.0;          // yarn; 0 = unset
  double mscale_all_dim = 0.0;  // yarn; 0 = unset
  bool truncate = true;         // yarn: floor/ceil the correction range
  bool is_default() const { return rope_type == "default"; }
};

struct PolicyConfig {
  std::string model_type = "llama";  // llama | qwen2 | qwen3 | qwen3_moe
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // SwiGLU width of the dense MLPs
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // == heads: MHA; < heads: GQA (must divide heads)
  int64_t head_dim = 0;             // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // LM head reuses model.embed_tokens.weight
  bool attention_bias = false;       // q/k/v/o have a bias (qwen2: q/k/v always, o never)
  int64_t bos_token_id = -1;         // -1 = none
  int64_t eos_token_id = -1;         // the first of eos_token_ids; -1 = none
  // Every end-of-sequence id config.json lists (Llama 3.1 lists three);
  // generation stops on any of them.
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "float32";  // dtype the weights were saved in

  // qwen3_moe: a router (mlp.gate) picks num_experts_per_tok of num_experts
  // SwiGLU experts of width moe_intermediate_size per token.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;           // renormalise the top-k router probabilities to sum to 1
  int64_t decoder_sparse_step = 1;       // every n-th layer is sparse
  std::vector<int64_t> mlp_only_layers;  // layers kept dense regardless

  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : hidden_size / num_attention_heads;
  }
  // q_norm / k_norm over each head (Qwen3).
  bool has_qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }
  // Qwen3MoeDecoderLayer's rule: not in mlp_only_layers, experts exist, and
  // (layer + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t layer) const;
  // Layers with a router, in order; layer i's index into per-layer routing
  // records is moe_layer_index(i) (-1 for a dense layer).
  int64_t num_moe_layers() const;
  int64_t moe_layer_index(int64_t layer) const;
};

// Rejects non-positive sizes, heads not divisible by kv heads, hidden not
// divisible by heads (when head_dim is 0), unknown model types and rope
// types, and MoE settings that do not fit together. Messages name the
// config.json key.
Status validate(const PolicyConfig& config);

}  // namespace relay::model
