#include "relay/model/policy_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace relay::model {

bool PolicyConfig::is_moe_layer(int64_t layer) const {
  if (model_type != "qwen3_moe" || num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t PolicyConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

int64_t PolicyConfig::moe_layer_index(int64_t layer) const {
  if (!is_moe_layer(layer)) return -1;
  int64_t n = 0;
  for (int64_t i = 0; i < layer; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

namespace {

bool finite_positive(double x) { return x > 0 && std::isfinite(x); }

void check_rope_scaling(const PolicyConfig& c, std::vector<std::string>& problems) {
  const RopeScaling& r = c.rope_scaling;
  const std::string& t = r.rope_type;
  if (t != "default" && t != "linear" && t != "dynamic" && t != "yarn" && t != "llama3") {
    problems.push_back(
        "rope_scaling.rope_type: must be default, linear, dynamic, yarn or llama3, got '" + t +
        "'");
    return;
  }
  if (t == "default") return;
  if (!finite_positive(r.factor)) {
    problems.push_back(
        absl::StrCat("rope_scaling.factor: must be a finite number > 0, got ", r.factor));
  }
  if (r.original_max_position_embeddings < 0) {
    problems.push_back(
        absl::StrCat("rope_scaling.original_max_position_embeddings: must be >= 1 (0 = "
                     "max_position_embeddings), got ",
                     r.original_max_position_embeddings));
  }
  if (t == "llama3") {
    if (!finite_positive(r.low_freq_factor)) {
      problems.push_back(absl::StrCat(
          "rope_scaling.low_freq_factor: must be a finite number > 0, got ", r.low_freq_factor));
    }
    if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
      problems.push_back(
          absl::StrCat("rope_scaling.high_freq_factor: must exceed low_freq_factor (",
                       r.low_freq_factor, "), got ", r.high_freq_factor));
    }
  }
  if (t == "yarn") {
    if (!(r.attention_factor >= 0) || !std::isfinite(r.attention_factor)) {
      problems.push_back(absl::StrCat(
          "rope_scaling.attention_factor: must be a finite number >= 0 (0 = derived), got ",
          r.attention_factor));
    }
    if (!finite_positive(r.beta_fast) || !finite_positive(r.beta_slow)) {
      problems.push_back(
          absl::StrCat("rope_scaling.beta_fast / beta_slow: must be finite numbers > 0, got ",
                       r.beta_fast, " / ", r.beta_slow));
    }
  }
}

void check_moe(const PolicyConfig& c, std::vector<std::string>& problems) {
  if (c.model_type != "qwen3_moe") return;
  auto at_least_one = [&](const char* key, int64_t v) {
    if (v < 1) problems.push_back(absl::StrCat(key, ": must be >= 1, got ", v));
  };
  at_least_one("num_experts", c.num_experts);
  at_least_one("num_experts_per_tok", c.num_experts_per_tok);
  at_least_one("moe_intermediate_size", c.moe_intermediate_size);
  at_least_one("decoder_sparse_step", c.decoder_sparse_step);
  if (c.num_experts >= 1 && c.num_experts_per_tok > c.num_experts) {
    problems.push_back(absl::StrCat("num_experts_per_tok: must be <= num_experts (", c.num_experts,
                                    "), got ", c.num_experts_per_tok));
  }
  for (int64_t layer : c.mlp_only_layers) {
    if (layer < 0 || layer >= c.num_hidden_layers) {
      problems.push_back(absl::StrCat("mlp_only_layers: layer ", layer, " outside [0, ",
                                      c.num_hidden_layers, ")"));
    }
  }
}

}  // namespace

Status validate(const PolicyConfig& c) {
  std::vector<std::string> problems;
  auto at_least_one = [&](const char* key, int64_t v) {
    if (v < 1) problems.push_back(absl::StrCat(key, ": must be >= 1, got ", v));
  };

  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      c.model_type != "qwen3_moe") {
    problems.push_back("model_type: must be llama, qwen2, qwen3 or qwen3_moe, got '" +
                       c.model_type + "'");
  }
  at_least_one("vocab_size", c.vocab_size);
  at_least_one("hidden_size", c.hidden_size);
  at_least_one("intermediate_size", c.intermediate_size);
  at_least_one("num_hidden_layers", c.num_hidden_layers);
  at_least_one("num_attention_heads", c.num_attention_heads);
  at_least_one("num_key_value_heads", c.num_key_value_heads);
  at_least_one("max_position_embeddings", c.max_position_embeddings);

  const int64_t heads = c.num_attention_heads;
  if (heads >= 1 && c.num_key_value_heads >= 1 && heads % c.num_key_value_heads != 0) {
    problems.push_back(absl::StrCat("num_key_value_heads: must divide num_attention_heads (", heads,
                                    "), got ", c.num_key_value_heads));
  }
  if (c.head_dim < 0) {
    problems.push_back(
        absl::StrCat("head_dim: must be >= 0 (0 = hidden_size / "
                     "num_attention_heads), got ",
                     c.head_dim));
  } else if (c.head_dim > 0) {
    if (c.head_dim % 2 != 0) {
      problems.push_back(
          absl::StrCat("head_dim: must be even (RoPE rotates pairs), got ", c.head_dim));
    }
  } else if (heads >= 1 && c.hidden_size >= 1) {
    if (c.hidden_size % heads != 0) {
      problems.push_back(absl::StrCat("hidden_size: must be divisible by num_attention_heads (",
                                      heads, ") when head_dim is unset, got ", c.hidden_size));
    } else if ((c.hidden_size / heads) % 2 != 0) {
      problems.push_back(absl::StrCat(
          "head_dim: must be even (RoPE rotates pairs), got hidden_size / num_attention_heads = ",
          c.hidden_size / heads));
    }
  }
  // Written as !(x > 0) so that NaN fails too.
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    problems.push_back(
        absl::StrCat("rms_norm_eps: must be a finite number > 0, got ", c.rms_norm_eps));
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    problems.push_back(absl::StrCat("rope_theta: must be a finite number > 0, got ", c.rope_theta));
  }
  check_rope_scaling(c, problems);
  check_moe(c, problems);
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16") {
    problems.push_back("torch_dtype: must be float32, bfloat16 or float16, got '" + c.torch_dtype +
                       "'");
  }
  if (c.bos_token_id < -1) {
    problems.push_back(
        absl::StrCat("bos_token_id: must be >= 0 or -1 (none), got ", c.bos_token_id));
  }
  if (c.eos_token_id < -1) {
    problems.push_back(
        absl::StrCat("eos_token_id: must be >= 0 or -1 (none), got ", c.eos_token_id));
  }
  for (int64_t id : c.eos_token_ids) {
    if (id < 0) {
      problems.push_back(absl::StrCat("eos_token_id: every listed id must be >= 0, got ", id));
      break;
    }
  }

  if (problems.empty()) return OkStatus();
  return InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

}  // namespace relay::model
