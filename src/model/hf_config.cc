#include "relay/model/hf_config.h"

#include "relay/common/file_io.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"

namespace relay::model {
namespace {

using json = nlohmann::json;

// Reads the known keys of one config.json object; messages start with source.
class ConfigFields {
 public:
  ConfigFields(const json& j, const std::string& source) : j_(j), source_(source) {}

  // True when `key` is present and not null.
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  Status missing(const char* key) const {
    return InvalidArgumentError(source_ + ": " + key + ": required key is missing");
  }
  Status wrong_type(const char* key, const char* expected) const {
    return InvalidArgumentError(source_ + ": " + key + ": expected " + expected + ", got " +
                                j_[key].dump());
  }

  // Leaves *out unchanged when the key is absent or null and not required.
  Status get_int(const char* key, bool required, int64_t* out) const {
    if (!has(key)) return required ? missing(key) : OkStatus();
    const json& v = j_[key];
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))) {
      return wrong_type(key, "an integer");
    }
    *out = v.get<int64_t>();
    return OkStatus();
  }
  Status get_double(const char* key, double* out) const {
    if (!has(key)) return OkStatus();
    if (!j_[key].is_number()) return wrong_type(key, "a number");
    *out = j_[key].get<double>();
    return OkStatus();
  }
  Status get_bool(const char* key, bool* out) const {
    if (!has(key)) return OkStatus();
    if (!j_[key].is_boolean()) return wrong_type(key, "true or false");
    *out = j_[key].get<bool>();
    return OkStatus();
  }
  Status get_string(const char* key, std::string* out) const {
    if (!has(key)) return OkStatus();
    if (!j_[key].is_string()) return wrong_type(key, "a string");
    *out = j_[key].get<std::string>();
    return OkStatus();
  }
  // An id, null (-1), or a list of ids of which the first is kept.
  Status get_token_id(const char* key, int64_t* out) const {
    if (!j_.contains(key)) return OkStatus();
    const json& v = j_[key];
    const json* id = &v;
    if (v.is_array()) {
      if (v.empty()) {
        *out = -1;
        return OkStatus();
      }
      id = &v[0];
    }
    if (id->is_null()) {
      *out = -1;
      return OkStatus();
    }
    if (!id->is_number_integer() ||
        (id->is_number_unsigned() && id->get<uint64_t>() > uint64_t(INT64_MAX))) {
      return wrong_type(key, "an integer, a list of integers or null");
    }
    *out = id->get<int64_t>();
    return OkStatus();
  }

  // rope_scaling / rope_parameters: absent, null or of type "default" is plain
  // RoPE; anything else changes the rotation, which relay does not implement.
  Status check_plain_rope(const char* key) const {
    if (!has(key)) return OkStatus();
    const json& v = j_[key];
    std::string type = v.dump();
    if (v.is_object()) {
      for (const char* k : {"rope_type", "type"}) {
        if (v.contains(k) && v[k].is_string()) {
          type = v[k].get<std::string>();
          break;
        }
      }
      if (type == "default") return OkStatus();
    }
    return UnimplementedError(source_ + ": " + key + ": RoPE scaling of type '" + type +
                              "' is not supported (relay implements plain RoPE only)");
  }

 private:
  const json& j_;
  const std::string& source_;
};

}  // namespace

StatusOr<PolicyConfig> parse_hf_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return InvalidArgumentError(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(source + ": must be a JSON object");
  const ConfigFields f(j, source);
  PolicyConfig c;

  if (!f.has("model_type")) return f.missing("model_type");
  RELAY_RETURN_IF_ERROR(f.get_string("model_type", &c.model_type));
  if (c.model_type != "llama" && c.model_type != "qwen2") {
    return UnimplementedError(source + ": model_type '" + c.model_type +
                              "' is not supported (llama, qwen2)");
  }

  // Keys that change the math: refuse rather than compute something else.
  RELAY_RETURN_IF_ERROR(f.check_plain_rope("rope_scaling"));
  RELAY_RETURN_IF_ERROR(f.check_plain_rope("rope_parameters"));  // transformers >= 5
  std::string hidden_act = "silu";
  RELAY_RETURN_IF_ERROR(f.get_string("hidden_act", &hidden_act));
  if (hidden_act != "silu") {
    return UnimplementedError(source + ": hidden_act '" + hidden_act + "' is not supported (silu)");
  }
  bool flag = false;
  RELAY_RETURN_IF_ERROR(f.get_bool("mlp_bias", &flag));
  if (flag) return UnimplementedError(source + ": mlp_bias: true is not supported");
  RELAY_RETURN_IF_ERROR(f.get_bool("use_sliding_window", &flag));
  if (flag) return UnimplementedError(source + ": use_sliding_window: true is not supported");

  RELAY_RETURN_IF_ERROR(f.get_int("vocab_size", true, &c.vocab_size));
  RELAY_RETURN_IF_ERROR(f.get_int("hidden_size", true, &c.hidden_size));
  RELAY_RETURN_IF_ERROR(f.get_int("intermediate_size", true, &c.intermediate_size));
  RELAY_RETURN_IF_ERROR(f.get_int("num_hidden_layers", true, &c.num_hidden_layers));
  RELAY_RETURN_IF_ERROR(f.get_int("num_attention_heads", true, &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  RELAY_RETURN_IF_ERROR(f.get_int("num_key_value_heads", false, &c.num_key_value_heads));
  RELAY_RETURN_IF_ERROR(f.get_int("head_dim", false, &c.head_dim));
  RELAY_RETURN_IF_ERROR(f.get_int("max_position_embeddings", false, &c.max_position_embeddings));
  RELAY_RETURN_IF_ERROR(f.get_double("rms_norm_eps", &c.rms_norm_eps));
  if (f.has("rope_theta")) {
    RELAY_RETURN_IF_ERROR(f.get_double("rope_theta", &c.rope_theta));
  } else if (f.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (rp.contains("rope_theta") && !rp["rope_theta"].is_null()) {
      if (!rp["rope_theta"].is_number()) {
        return InvalidArgumentError(source +
                                    ": rope_parameters.rope_theta: expected a number, got " +
                                    rp["rope_theta"].dump());
      }
      c.rope_theta = rp["rope_theta"].get<double>();
    }
  }
  RELAY_RETURN_IF_ERROR(f.get_bool("tie_word_embeddings", &c.tie_word_embeddings));
  RELAY_RETURN_IF_ERROR(f.get_bool("attention_bias", &c.attention_bias));
  if (c.model_type == "qwen2") c.attention_bias = true;  // Qwen2Attention: bias=True always
  RELAY_RETURN_IF_ERROR(f.get_token_id("bos_token_id", &c.bos_token_id));
  RELAY_RETURN_IF_ERROR(f.get_token_id("eos_token_id", &c.eos_token_id));
  if (f.has("torch_dtype")) {
    RELAY_RETURN_IF_ERROR(f.get_string("torch_dtype", &c.torch_dtype));
  } else {
    RELAY_RETURN_IF_ERROR(f.get_string("dtype", &c.torch_dtype));
  }

  Status s = validate(c);
  if (!s.ok()) {
    std::string msg;
    for (absl::string_view line : absl::StrSplit(s.message(), '\n')) {
      absl::StrAppend(&msg, msg.empty() ? "" : "\n", source, ": ", line);
    }
    return Status(s.code(), msg);
  }
  return c;
}

StatusOr<PolicyConfig> read_hf_config(const std::string& path) {
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_hf_config(text, path);
}

std::string to_hf_config_json(const PolicyConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = json::array();
  if (c.model_type == "llama") j["architectures"].push_back("LlamaForCausalLM");
  if (c.model_type == "qwen2") j["architectures"].push_back("Qwen2ForCausalLM");
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  if (c.head_dim > 0) j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["hidden_act"] = "silu";
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  j["torch_dtype"] = c.torch_dtype;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

Status write_hf_config(const PolicyConfig& config, const std::string& path) {
  Status s = validate(config);
  if (!s.ok()) return Status(s.code(), path + ": " + std::string(s.message()));
  return write_file_atomic(path, to_hf_config_json(config));
}

}  // namespace relay::model
