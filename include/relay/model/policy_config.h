#pragma once

// Architecture of a LLaMA-family decoder, in Hugging Face config.json terms
// (field names match the JSON keys), for model_type "llama" and "qwen2".

#include <cstdint>
#include <string>

#include "relay/common/status.h"

namespace relay::model {

struct PolicyConfig {
  std::string model_type = "llama";  // llama | qwen2
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // SwiGLU width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // == heads: MHA; < heads: GQA (must divide heads)
  int64_t head_dim = 0;             // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;     // LM head reuses model.embed_tokens.weight
  bool attention_bias = false;          // q/k/v projections have a bias (always on for qwen2)
  int64_t bos_token_id = -1;            // -1 = none
  int64_t eos_token_id = -1;            // -1 = none
  std::string torch_dtype = "float32";  // dtype the weights were saved in

  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : hidden_size / num_attention_heads;
  }
};

// Rejects non-positive sizes, heads not divisible by kv heads, hidden not
// divisible by heads (when head_dim is 0) and unknown model types. Messages
// name the config.json key.
Status validate(const PolicyConfig& config);

}  // namespace relay::model
