#include "relay/model/policy_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace relay::model {

Status validate(const PolicyConfig& c) {
  std::vector<std::string> problems;
  auto at_least_one = [&](const char* key, int64_t v) {
    if (v < 1) problems.push_back(absl::StrCat(key, ": must be >= 1, got ", v));
  };

  if (c.model_type != "llama" && c.model_type != "qwen2") {
    problems.push_back("model_type: must be llama or qwen2, got '" + c.model_type + "'");
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

  if (problems.empty()) return OkStatus();
  return InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

}  // namespace relay::model
