#pragma once

// Hugging Face config.json <-> PolicyConfig, for model_type "llama" and
// "qwen2".
//
// Reading keeps what relay's decoder needs and ignores other keys, except keys
// that would change the math relay implements (rope_scaling, hidden_act other
// than silu, mlp_bias, use_sliding_window): those are Unimplemented, since
// ignoring them would give silently wrong log-probs. Details:
//   - required: model_type, vocab_size, hidden_size, intermediate_size,
//     num_hidden_layers, num_attention_heads;
//   - num_key_value_heads defaults to num_attention_heads; head_dim to 0
//     (hidden_size / num_attention_heads); rope_theta to 10000;
//     tie_word_embeddings to false (LlamaConfig's and Qwen2Config's default);
//   - attention_bias is forced true for qwen2, whose q/k/v always have biases;
//   - bos_token_id / eos_token_id may be null (-1) or a list, of which the
//     first id is kept (Llama 3.1 lists several eos ids);
//   - torch_dtype defaults to "float32"; newer transformers' "dtype" key is
//     read when torch_dtype is absent;
//   - rope_scaling / rope_parameters of type "default" mean no scaling, and
//     rope_parameters.rope_theta is read when rope_theta is absent.
// Errors are prefixed with `source` (usually the file path): a wrong JSON type
// is InvalidArgument "<source>: hidden_size: expected an integer, got \"abc\"",
// and the result must pass validate(PolicyConfig).

#include <string>

#include "relay/common/status.h"
#include "relay/model/policy_config.h"

namespace relay::model {

StatusOr<PolicyConfig> parse_hf_config(const std::string& json_text, const std::string& source);
// NotFound when `path` does not exist.
StatusOr<PolicyConfig> read_hf_config(const std::string& path);

// Pretty JSON (indent 2) that transformers loads: architectures, model_type,
// every PolicyConfig field (head_dim only when > 0, bos/eos only when >= 0),
// hidden_act "silu", rope_scaling null, use_cache true.
std::string to_hf_config_json(const PolicyConfig& config);
// Validates `config`, then writes `path`.tmp and renames it over `path`.
Status write_hf_config(const PolicyConfig& config, const std::string& path);

}  // namespace relay::model
