#include "relay/model/hf_config.h"

#include "relay/common/file_io.h"

#include <filesystem>
#include <limits>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "model/json_nesting.h"

namespace relay::model {
namespace {

using json = nlohmann::json;

// Reads the known keys of one config.json object (or of a nested object,
// whose keys are named `prefix` + key); messages start with source.
class ConfigFields {
 public:
  ConfigFields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // True when `key` is present and not null.
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  Status missing(const char* key) const {
    return InvalidArgumentError(source_ + ": " + prefix_ + key + ": required key is missing");
  }
  Status wrong_type(const char* key, const char* expected) const {
    return InvalidArgumentError(source_ + ": " + prefix_ + key + ": expected " + expected +
                                ", got " + j_[key].dump());
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
  // An id, null, or a list of ids: every id goes to *ids, in order.
  Status get_token_ids(const char* key, std::vector<int64_t>* ids) const {
    if (!j_.contains(key)) return OkStatus();
    const json& v = j_[key];
    std::vector<const json*> items;
    if (v.is_array()) {
      for (const json& item : v) items.push_back(&item);
    } else if (!v.is_null()) {
      items.push_back(&v);
    }
    ids->clear();
    for (const json* id : items) {
      if (!id->is_number_integer() ||
          (id->is_number_unsigned() && id->get<uint64_t>() > uint64_t(INT64_MAX))) {
        return wrong_type(key, "an integer, a list of integers or null");
      }
      ids->push_back(id->get<int64_t>());
    }
    return OkStatus();
  }
  // The first of get_token_ids(), or -1.
  Status get_token_id(const char* key, int64_t* out) const {
    std::vector<int64_t> ids;
    RELAY_RETURN_IF_ERROR(get_token_ids(key, &ids));
    *out = ids.empty() ? -1 : ids[0];
    return OkStatus();
  }
  Status get_int_list(const char* key, std::vector<int64_t>* out) const {
    if (!has(key)) return OkStatus();
    const json& v = j_[key];
    if (!v.is_array()) return wrong_type(key, "a list of integers");
    out->clear();
    for (const json& item : v) {
      if (!item.is_number_integer()) return wrong_type(key, "a list of integers");
      out->push_back(item.get<int64_t>());
    }
    return OkStatus();
  }

  // rope_scaling / rope_parameters into `r`: absent, null or of type
  // "default" is plain RoPE; linear, dynamic, yarn and llama3 read the keys
  // transformers reads for them; any other type (longrope, ...) is
  // Unimplemented rather than computed wrongly.
  Status get_rope_scaling(const char* key, RopeScaling* r) const {
    if (!has(key)) return OkStatus();
    const json& v = j_[key];
    if (!v.is_object()) return wrong_type(key, "an object or null");
    std::string type = "default";
    for (const char* k : {"rope_type", "type"}) {
      if (v.contains(k) && !v[k].is_null()) {
        if (!v[k].is_string()) return wrong_type(key, "an object whose rope_type is a string");
        type = v[k].get<std::string>();
        break;
      }
    }
    if (type != "default" && type != "linear" && type != "dynamic" && type != "yarn" &&
        type != "llama3") {
      return UnimplementedError(source_ + ": " + prefix_ + key + ": RoPE scaling of type '" + type +
                                "' is not supported (relay implements default, linear, dynamic, "
                                "yarn and llama3)");
    }
    r->rope_type = type;
    if (type == "default") return OkStatus();
    const ConfigFields sub(v, source_, prefix_ + key + ".");
    if (!sub.has("factor")) {
      return sub.missing("factor");
    }
    RELAY_RETURN_IF_ERROR(sub.get_double("factor", &r->factor));
    RELAY_RETURN_IF_ERROR(sub.get_int("original_max_position_embeddings", false,
                                      &r->original_max_position_embeddings));
    if (type == "llama3") {
      for (const char* k : {"low_freq_factor", "high_freq_factor"}) {
        if (!sub.has(k)) return sub.missing(k);
      }
      RELAY_RETURN_IF_ERROR(sub.get_double("low_freq_factor", &r->low_freq_factor));
      RELAY_RETURN_IF_ERROR(sub.get_double("high_freq_factor", &r->high_freq_factor));
    }
    if (type == "yarn") {
      RELAY_RETURN_IF_ERROR(sub.get_double("attention_factor", &r->attention_factor));
      // beta_* of 0 mean "unset" to transformers (`or 32`), as absent does.
      double beta = 0;
      RELAY_RETURN_IF_ERROR(sub.get_double("beta_fast", &beta));
      if (beta != 0) r->beta_fast = beta;
      beta = 0;
      RELAY_RETURN_IF_ERROR(sub.get_double("beta_slow", &beta));
      if (beta != 0) r->beta_slow = beta;
      RELAY_RETURN_IF_ERROR(sub.get_double("mscale", &r->mscale));
      RELAY_RETURN_IF_ERROR(sub.get_double("mscale_all_dim", &r->mscale_all_dim));
      RELAY_RETURN_IF_ERROR(sub.get_bool("truncate", &r->truncate));
    }
    return OkStatus();
  }

 private:
  const json& j_;
  const std::string source_;
  const std::string prefix_;
};

// `text` as a JSON object; errors name `source`.
StatusOr<json> parse_object(const std::string& text, const std::string& source) {
  RELAY_RETURN_IF_ERROR(check_json_nesting(text, source));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return InvalidArgumentError(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(source + ": must be a JSON object");
  return j;
}

Status read_model_type(const ConfigFields& f, const std::string& source, PolicyConfig& c) {
  if (!f.has("model_type")) return f.missing("model_type");
  RELAY_RETURN_IF_ERROR(f.get_string("model_type", &c.model_type));
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "qwen3" &&
      c.model_type != "qwen3_moe") {
    return UnimplementedError(source + ": model_type '" + c.model_type +
                              "' is not supported (llama, qwen2, qwen3, qwen3_moe)");
  }
  return OkStatus();
}

// Keys that change the math: refuse rather than compute something else.
Status refuse_unsupported(const json& j, const ConfigFields& f, const std::string& source) {
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
  if (f.has("layer_types")) {
    const json& types = j["layer_types"];
    if (!types.is_array()) return f.wrong_type("layer_types", "a list of strings");
    for (const json& t : types) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        return UnimplementedError(source + ": layer_types: " + t.dump() +
                                  " is not supported (full_attention only)");
      }
    }
  }
  double partial_rotary = 1.0;
  RELAY_RETURN_IF_ERROR(f.get_double("partial_rotary_factor", &partial_rotary));
  if (partial_rotary != 1.0) {
    return UnimplementedError(source + ": partial_rotary_factor: only 1 is supported");
  }
  return OkStatus();
}

Status read_sizes(const ConfigFields& f, PolicyConfig& c) {
  RELAY_RETURN_IF_ERROR(f.get_int("vocab_size", true, &c.vocab_size));
  RELAY_RETURN_IF_ERROR(f.get_int("hidden_size", true, &c.hidden_size));
  RELAY_RETURN_IF_ERROR(
      f.get_int("intermediate_size", c.model_type != "qwen3_moe", &c.intermediate_size));
  RELAY_RETURN_IF_ERROR(f.get_int("num_hidden_layers", true, &c.num_hidden_layers));
  RELAY_RETURN_IF_ERROR(f.get_int("num_attention_heads", true, &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  RELAY_RETURN_IF_ERROR(f.get_int("num_key_value_heads", false, &c.num_key_value_heads));
  RELAY_RETURN_IF_ERROR(f.get_int("head_dim", false, &c.head_dim));
  RELAY_RETURN_IF_ERROR(f.get_int("max_position_embeddings", false, &c.max_position_embeddings));
  return f.get_double("rms_norm_eps", &c.rms_norm_eps);
}

Status read_rope(const json& j, const ConfigFields& f, const std::string& source, PolicyConfig& c) {
  // transformers 5 writes rope_parameters (with rope_theta inside); earlier
  // versions rope_scaling beside rope_theta. The first present wins.
  const char* rope_key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  RELAY_RETURN_IF_ERROR(f.get_rope_scaling(rope_key, &c.rope_scaling));
  if (f.has("rope_theta")) {
    RELAY_RETURN_IF_ERROR(f.get_double("rope_theta", &c.rope_theta));
  } else if (f.has("rope_parameters")) {
    const ConfigFields rp(j["rope_parameters"], source, "rope_parameters.");
    RELAY_RETURN_IF_ERROR(rp.get_double("rope_theta", &c.rope_theta));
  }
  // Phi-3 style: a top-level original_max_position_embeddings takes
  // precedence for the types that read one (transformers' standardize).
  if (f.has("original_max_position_embeddings") &&
      (c.rope_scaling.rope_type == "llama3" || c.rope_scaling.rope_type == "yarn")) {
    RELAY_RETURN_IF_ERROR(f.get_int("original_max_position_embeddings", false,
                                    &c.rope_scaling.original_max_position_embeddings));
  }
  return OkStatus();
}

Status read_tokens_and_dtype(const ConfigFields& f, PolicyConfig& c) {
  RELAY_RETURN_IF_ERROR(f.get_bool("tie_word_embeddings", &c.tie_word_embeddings));
  RELAY_RETURN_IF_ERROR(f.get_bool("attention_bias", &c.attention_bias));
  if (c.model_type == "qwen2") c.attention_bias = true;  // Qwen2Attention: q/k/v bias always
  RELAY_RETURN_IF_ERROR(f.get_token_id("bos_token_id", &c.bos_token_id));
  RELAY_RETURN_IF_ERROR(f.get_token_ids("eos_token_id", &c.eos_token_ids));
  c.eos_token_id = c.eos_token_ids.empty() ? -1 : c.eos_token_ids[0];
  if (f.has("torch_dtype")) return f.get_string("torch_dtype", &c.torch_dtype);
  return f.get_string("dtype", &c.torch_dtype);
}

Status read_moe(const ConfigFields& f, PolicyConfig& c) {
  // Qwen3MoeConfig's defaults for absent keys.
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  RELAY_RETURN_IF_ERROR(f.get_int("num_experts", false, &c.num_experts));
  RELAY_RETURN_IF_ERROR(f.get_int("num_experts_per_tok", false, &c.num_experts_per_tok));
  RELAY_RETURN_IF_ERROR(f.get_int("moe_intermediate_size", false, &c.moe_intermediate_size));
  RELAY_RETURN_IF_ERROR(f.get_bool("norm_topk_prob", &c.norm_topk_prob));
  RELAY_RETURN_IF_ERROR(f.get_int("decoder_sparse_step", false, &c.decoder_sparse_step));
  RELAY_RETURN_IF_ERROR(f.get_int_list("mlp_only_layers", &c.mlp_only_layers));
  // A dense layer (mlp_only_layers, decoder_sparse_step) uses intermediate_size.
  if (c.intermediate_size == 0) c.intermediate_size = c.moe_intermediate_size;
  return OkStatus();
}

// validate()'s problems, one per line, each prefixed with the file they are in.
Status validate_in(const PolicyConfig& c, const std::string& source) {
  Status s = validate(c);
  if (s.ok()) return s;
  std::string msg;
  for (absl::string_view line : absl::StrSplit(s.message(), '\n')) {
    absl::StrAppend(&msg, msg.empty() ? "" : "\n", source, ": ", line);
  }
  return Status(s.code(), msg);
}

}  // namespace

StatusOr<PolicyConfig> parse_hf_config(const std::string& json_text, const std::string& source) {
  RELAY_ASSIGN_OR_RETURN(const json j, parse_object(json_text, source));
  const ConfigFields f(j, source);
  PolicyConfig c;
  RELAY_RETURN_IF_ERROR(read_model_type(f, source, c));
  RELAY_RETURN_IF_ERROR(refuse_unsupported(j, f, source));
  RELAY_RETURN_IF_ERROR(read_sizes(f, c));
  RELAY_RETURN_IF_ERROR(read_rope(j, f, source, c));
  RELAY_RETURN_IF_ERROR(read_tokens_and_dtype(f, c));
  if (c.model_type == "qwen3_moe") RELAY_RETURN_IF_ERROR(read_moe(f, c));
  RELAY_RETURN_IF_ERROR(validate_in(c, source));
  return c;
}

StatusOr<PolicyConfig> read_hf_config(const std::string& path) {
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_hf_config(text, path);
}

std::string to_hf_config_json(const PolicyConfig& c) {
  nlohmann::ordered_json j;
  const std::map<std::string, std::string> architectures = {{"llama", "LlamaForCausalLM"},
                                                            {"qwen2", "Qwen2ForCausalLM"},
                                                            {"qwen3", "Qwen3ForCausalLM"},
                                                            {"qwen3_moe", "Qwen3MoeForCausalLM"}};
  j["architectures"] = json::array();
  if (auto it = architectures.find(c.model_type); it != architectures.end()) {
    j["architectures"].push_back(it->second);
  }
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
  const RopeScaling& r = c.rope_scaling;
  if (r.is_default()) {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json rs;
    rs["rope_type"] = r.rope_type;
    rs["factor"] = r.factor;
    if (r.original_max_position_embeddings > 0) {
      rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
    if (r.rope_type == "llama3") {
      rs["low_freq_factor"] = r.low_freq_factor;
      rs["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.rope_type == "yarn") {
      if (r.attention_factor > 0) rs["attention_factor"] = r.attention_factor;
      rs["beta_fast"] = r.beta_fast;
      rs["beta_slow"] = r.beta_slow;
      if (r.mscale > 0) rs["mscale"] = r.mscale;
      if (r.mscale_all_dim > 0) rs["mscale_all_dim"] = r.mscale_all_dim;
      rs["truncate"] = r.truncate;
    }
    j["rope_scaling"] = rs;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["hidden_act"] = "silu";
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() > 1) {
    j["eos_token_id"] = c.eos_token_ids;
  } else if (c.eos_token_id >= 0) {
    j["eos_token_id"] = c.eos_token_id;
  }
  if (c.model_type == "qwen3_moe") {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
  }
  j["torch_dtype"] = c.torch_dtype;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

StatusOr<std::vector<int64_t>> read_generation_eos_ids(const std::string& model_dir) {
  const std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return std::vector<int64_t>{};
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  RELAY_ASSIGN_OR_RETURN(const json j, parse_object(text, path));
  std::vector<int64_t> ids;
  RELAY_RETURN_IF_ERROR(ConfigFields(j, path).get_token_ids("eos_token_id", &ids));
  return ids;
}

Status write_hf_config(const PolicyConfig& config, const std::string& path) {
  Status s = validate(config);
  if (!s.ok()) return Status(s.code(), path + ": " + std::string(s.message()));
  return write_file_atomic(path, to_hf_config_json(config));
}

}  // namespace relay::model
