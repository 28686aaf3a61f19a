#pragma once

// Hugging Face config.json <-> PolicyConfig, for model_type "llama",
// "qwen2", "qwen3" and "qwen3_moe".
//
// Reading keeps what relay's decoder needs and ignores other keys, except keys
// that would change the math relay implements (a rope type other than
// default / linear / dynamic / yarn / llama3, hidden_act other than silu,
// mlp_bias, use_sliding_window, layer_types other than full_attention,
// partial_rotary_factor != 1): those are Unimplemented, since ignoring them
// would give silently wrong log-probs. Details:
//   - required: model_type, vocab_size, hidden_size, intermediate_size
//     (qwen3_moe: optional), num_hidden_layers, num_attention_heads;
//   - num_key_value_heads defaults to num_attention_heads; head_dim to 0
//     (hidden_size / num_attention_heads); rope_theta to 10000;
//     tie_word_embeddings to false (the configs' default);
//   - attention_bias is forced true for qwen2, whose q/k/v always have biases;
//   - bos_token_id / eos_token_id may be null (-1) or a list; every eos id is
//     kept (eos_token_ids) and the first is eos_token_id;
//   - rope_parameters (transformers >= 5, with rope_theta inside) or
//     rope_scaling (earlier): the keys each type reads (rope.h); `factor` is
//     required for every type but default, low/high_freq_factor for llama3;
//     a top-level original_max_position_embeddings wins for llama3 and yarn;
//   - qwen3_moe: num_experts, num_experts_per_tok, moe_intermediate_size,
//     norm_topk_prob, decoder_sparse_step, mlp_only_layers, with
//     Qwen3MoeConfig's defaults (128, 8, 768, false, 1, []);
//     router_aux_loss_coef / output_router_logits are training options of
//     transformers' own trainer and are ignored;
//   - torch_dtype defaults to "float32"; newer transformers' "dtype" key is
//     read when torch_dtype is absent.
// Errors are prefixed with `source` (usually the file path): a wrong JSON type
// is InvalidArgument "<source>: hidden_size: expected an integer, got \"abc\"",
// and the result must pass validate(PolicyConfig).

#include <cstdint>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/policy_config.h"

namespace relay::model {

StatusOr<PolicyConfig> parse_hf_config(const std::string& json_text, const std::string& source);
// NotFound when `path` does not exist.
StatusOr<PolicyConfig> read_hf_config(const std::string& path);

// Pretty JSON (indent 2) that transformers loads: architectures, model_type,
// every PolicyConfig field (head_dim only when > 0, bos/eos only when >= 0,
// eos as a list when several), hidden_act "silu", rope_scaling (null for
// plain RoPE), the MoE keys for qwen3_moe, use_cache true.
std::string to_hf_config_json(const PolicyConfig& config);
// generation_config.json: the ids generation stops at (eos_token_id, an id or
// a list; Llama 3 Instruct lists <|end_of_text|>, <|eom_id|> and <|eot_id|>).
// A directory without the file has none (empty); a malformed file is
// InvalidArgument naming it.
StatusOr<std::vector<int64_t>> read_generation_eos_ids(const std::string& model_dir);

// Validates `config`, then writes `path`.tmp and renames it over `path`.
Status write_hf_config(const PolicyConfig& config, const std::string& path);

}  // namespace relay::model
