#include "relay/model/hf_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

#include "relay/model/policy_config.h"

namespace relay::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Qwen/Qwen2-0.5B's config.json (max_position_embeddings as in the brief).
constexpr char kQwen2Config[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Meta-Llama-3-8B-Instruct style: eos_token_id is a list.
constexpr char kLlama3Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// kQwen2Config with `key` set to `value` (JSON text), or removed when value is empty.
std::string qwen2_with(const std::string& key, const std::string& value) {
  json j = json::parse(kQwen2Config);
  if (value.empty()) {
    j.erase(key);
  } else {
    j[key] = json::parse(value);
  }
  return j.dump();
}

void expect_same_config(const PolicyConfig& a, const PolicyConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);  // exact: JSON doubles round-trip
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
}

TEST(HfConfigTest, ParsesQwen2Config) {
  auto c = parse_hf_config(kQwen2Config, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->intermediate_size, 4864);
  EXPECT_EQ(c->num_hidden_layers, 24);
  EXPECT_EQ(c->num_attention_heads, 14);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 0);
  EXPECT_EQ(c->resolved_head_dim(), 64);  // 896 / 14
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 1000000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->attention_bias);  // qwen2 always has q/k/v bias, though the key is absent
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_id, 151643);
  EXPECT_EQ(c->torch_dtype, "bfloat16");

  // Even an explicit false does not turn the bias off for qwen2.
  auto forced = parse_hf_config(qwen2_with("attention_bias", "false"), "config.json");
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(forced->attention_bias);
}

TEST(HfConfigTest, ParsesLlama3ConfigWithEosList) {
  auto c = parse_hf_config(kLlama3Config, "llama/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->resolved_head_dim(), 128);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_id, 128001);  // first of [128001, 128009]
}

TEST(HfConfigTest, DefaultsForAbsentOptionalKeys) {
  auto c = parse_hf_config(R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 16,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "eos_token_id": null})",
                           "tiny.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 0);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->eos_token_id, -1);
  EXPECT_EQ(c->torch_dtype, "float32");
}

// Qwen/Qwen3-0.6B's config.json (transformers 4.51).
constexpr char kQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen/Qwen3-30B-A3B's config.json.
constexpr char kQwen3MoeConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// meta-llama/Llama-3.2-1B-Instruct's config.json.
constexpr char kLlama32Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

TEST(HfConfigTest, ParsesQwen3Config) {
  auto c = parse_hf_config(kQwen3Config, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_EQ(c->head_dim, 128);  // 1024 / 16 would be 64
  EXPECT_EQ(c->resolved_head_dim(), 128);
  EXPECT_TRUE(c->has_qk_norm());
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>({151645}));
  EXPECT_TRUE(c->rope_scaling.is_default());
  EXPECT_EQ(c->num_moe_layers(), 0);
}

TEST(HfConfigTest, ParsesQwen3MoeConfig) {
  auto c = parse_hf_config(kQwen3MoeConfig, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->decoder_sparse_step, 1);
  EXPECT_TRUE(c->mlp_only_layers.empty());
  EXPECT_EQ(c->num_moe_layers(), 48);
  // Qwen3MoeConfig's defaults when the keys are absent.
  json j = json::parse(kQwen3MoeConfig);
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}) {
    j.erase(k);
  }
  j["num_hidden_layers"] = 4;
  j["mlp_only_layers"] = {2};
  auto d = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_experts, 128);
  EXPECT_EQ(d->num_experts_per_tok, 8);
  EXPECT_FALSE(d->norm_topk_prob);
  EXPECT_EQ(d->num_moe_layers(), 3);
  EXPECT_FALSE(d->is_moe_layer(2));
  // Round trip.
  auto back = parse_hf_config(to_hf_config_json(*c), "again");
  ASSERT_TRUE(back.ok()) << back.status();
  expect_same_config(*c, *back);
  EXPECT_EQ(back->num_experts, 128);
  EXPECT_TRUE(back->norm_topk_prob);
}

TEST(HfConfigTest, ParsesLlama32WithLlama3RopeAndEveryEosId) {
  auto c = parse_hf_config(kLlama32Config, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->eos_token_id, 128001);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>({128001, 128008, 128009}));
  auto back = parse_hf_config(to_hf_config_json(*c), "again");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(back->rope_scaling.factor, 32.0);
  EXPECT_EQ(back->eos_token_ids, c->eos_token_ids);
}

TEST(HfConfigTest, ReadsEveryRopeTypeAndRefusesOthers) {
  // transformers 5 style: rope_parameters with rope_theta inside.
  json j = json::parse(kQwen3Config);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {
      {"rope_type", "yarn"},     {"factor", 4.0},   {"original_max_position_embeddings", 32768},
      {"rope_theta", 1000000.0}, {"beta_fast", 16}, {"truncate", false}};
  auto yarn = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->rope_theta, 1e6);
  EXPECT_EQ(yarn->rope_scaling.rope_type, "yarn");
  EXPECT_EQ(yarn->rope_scaling.factor, 4.0);
  EXPECT_EQ(yarn->rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_EQ(yarn->rope_scaling.beta_fast, 16.0);
  EXPECT_EQ(yarn->rope_scaling.beta_slow, 1.0);
  EXPECT_FALSE(yarn->rope_scaling.truncate);
  auto back = parse_hf_config(to_hf_config_json(*yarn), "again");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rope_scaling.beta_fast, 16.0);
  EXPECT_FALSE(back->rope_scaling.truncate);

  // Old style "type", linear and dynamic.
  for (const char* type : {"linear", "dynamic"}) {
    auto c = parse_hf_config(
        qwen2_with("rope_scaling", absl::StrCat(R"({"type": ")", type, R"(", "factor": 2})")),
        "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->rope_scaling.rope_type, type);
    EXPECT_EQ(c->rope_scaling.factor, 2.0);
  }
  // An unknown type stays a clear error.
  auto longrope = parse_hf_config(
      qwen2_with("rope_scaling", R"({"rope_type": "longrope", "factor": 4})"), "config.json");
  EXPECT_EQ(longrope.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(longrope.status().message(),
            "config.json: rope_scaling: RoPE scaling of type 'longrope' is not supported (relay "
            "implements default, linear, dynamic, yarn and llama3)");
  // Required keys are named.
  auto no_factor =
      parse_hf_config(qwen2_with("rope_scaling", R"({"rope_type": "linear"})"), "config.json");
  EXPECT_EQ(no_factor.status().message(),
            "config.json: rope_scaling.factor: required key is missing");
  auto no_low = parse_hf_config(
      qwen2_with("rope_scaling", R"({"rope_type": "llama3", "factor": 8, "high_freq_factor": 4})"),
      "config.json");
  EXPECT_EQ(no_low.status().message(),
            "config.json: rope_scaling.low_freq_factor: required key is missing");
  // "default" is plain RoPE.
  EXPECT_TRUE(parse_hf_config(qwen2_with("rope_scaling", R"({"rope_type": "default"})"), "c").ok());
}

TEST(HfConfigTest, RefusesSlidingWindowLayersAndPartialRotary) {
  json j = json::parse(kQwen3Config);
  j["layer_types"] = json::array();
  for (int i = 0; i < 28; ++i)
    j["layer_types"].push_back(i < 20 ? "full_attention" : "sliding_attention");
  auto c = parse_hf_config(j.dump(), "config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("layer_types"), std::string::npos) << c.status();
  j["layer_types"] = json::array({"full_attention"});
  EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").ok());
  auto partial = parse_hf_config(qwen2_with("partial_rotary_factor", "0.5"), "config.json");
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(HfConfigTest, ReadsGenerationConfigEosIds) {
  const fs::path dir = fs::temp_directory_path() / "relay_generation_config_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto none = read_generation_eos_ids(dir.string());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  std::ofstream(dir / "generation_config.json")
      << R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": true})";
  auto ids = read_generation_eos_ids(dir.string());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, std::vector<int64_t>({128001, 128008, 128009}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "x"})";
  auto bad = read_generation_eos_ids(dir.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("generation_config.json: eos_token_id"), std::string::npos)
      << bad.status();
  fs::remove_all(dir);
}

TEST(HfConfigTest, ReadsRopeThetaFromRopeParameters) {
  json j = json::parse(kQwen2Config);
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  auto c = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 1000000.0);
}

TEST(HfConfigTest, RejectsBadConfigs) {
  struct Case {
    const char* label;
    std::string text;
    absl::StatusCode code;
    std::string message;  // exact
  };
  const std::vector<Case> cases = {
      {"unsupported model_type", qwen2_with("model_type", R"("gpt2")"),
       absl::StatusCode::kUnimplemented,
       "config.json: model_type 'gpt2' is not supported (llama, qwen2, qwen3, qwen3_moe)"},
      {"missing model_type", qwen2_with("model_type", ""), absl::StatusCode::kInvalidArgument,
       "config.json: model_type: required key is missing"},
      {"missing hidden_size", qwen2_with("hidden_size", ""), absl::StatusCode::kInvalidArgument,
       "config.json: hidden_size: required key is missing"},
      {"string hidden_size", qwen2_with("hidden_size", R"("abc")"),
       absl::StatusCode::kInvalidArgument,
       R"(config.json: hidden_size: expected an integer, got "abc")"},
      {"float layers", qwen2_with("num_hidden_layers", "24.5"), absl::StatusCode::kInvalidArgument,
       "config.json: num_hidden_layers: expected an integer, got 24.5"},
      {"string eps", qwen2_with("rms_norm_eps", R"("1e-6")"), absl::StatusCode::kInvalidArgument,
       R"(config.json: rms_norm_eps: expected a number, got "1e-6")"},
      {"int tie", qwen2_with("tie_word_embeddings", "1"), absl::StatusCode::kInvalidArgument,
       "config.json: tie_word_embeddings: expected true or false, got 1"},
      {"string eos", qwen2_with("eos_token_id", R"("</s>")"), absl::StatusCode::kInvalidArgument,
       R"(config.json: eos_token_id: expected an integer, a list of integers or null, got "</s>")"},
      {"bad kv heads", qwen2_with("num_key_value_heads", "3"), absl::StatusCode::kInvalidArgument,
       "config.json: num_key_value_heads: must divide num_attention_heads (14), got 3"},
      {"zero kv heads", qwen2_with("num_key_value_heads", "0"), absl::StatusCode::kInvalidArgument,
       "config.json: num_key_value_heads: must be >= 1, got 0"},
      {"gelu", qwen2_with("hidden_act", R"("gelu")"), absl::StatusCode::kUnimplemented,
       "config.json: hidden_act 'gelu' is not supported (silu)"},
      {"sliding window", qwen2_with("use_sliding_window", "true"), absl::StatusCode::kUnimplemented,
       "config.json: use_sliding_window: true is not supported"},
      {"not JSON", "{\"model_type\": ", absl::StatusCode::kInvalidArgument, ""},
      {"not an object", "[]", absl::StatusCode::kInvalidArgument,
       "config.json: must be a JSON object"},
      {"nested 200,000 deep",
       qwen2_with("rope_scaling", "null")
           .replace(1, 0,
                    "\"x\": " + std::string(200000, '[') + "0" + std::string(200000, ']') + ", "),
       absl::StatusCode::kInvalidArgument,
       "config.json: JSON nests deeper than 128 levels (at byte 133)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    auto parsed = parse_hf_config(c.text, "config.json");
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), c.code) << parsed.status();
    if (!c.message.empty()) {
      EXPECT_EQ(parsed.status().message(), c.message);
    } else {
      EXPECT_EQ(parsed.status().message().rfind("config.json: not valid JSON", 0), 0u)
          << parsed.status();
    }
  }
}

TEST(HfConfigTest, PrefixesEveryValidationProblemWithSource) {
  json j = json::parse(kQwen2Config);
  j["hidden_size"] = 900;  // not divisible by 14 heads
  j["torch_dtype"] = "int8";
  auto c = parse_hf_config(j.dump(), "ckpt/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "ckpt/config.json: hidden_size: must be divisible by num_attention_heads (14) when "
            "head_dim is unset, got 900\n"
            "ckpt/config.json: torch_dtype: must be float32, bfloat16 or float16, got 'int8'");
}

TEST(HfConfigTest, ToJsonIsWhatTransformersExpects) {
  auto c = parse_hf_config(kQwen2Config, "config.json");
  ASSERT_TRUE(c.ok());
  const std::string text = to_hf_config_json(*c);
  EXPECT_NE(text.find("\n  \"model_type\": \"qwen2\""), std::string::npos) << text;  // indent 2
  json j = json::parse(text);
  EXPECT_EQ(j["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_TRUE(j.contains("rope_scaling"));
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["use_cache"], true);
  EXPECT_FALSE(j.contains("head_dim"));  // 0 = derived
  EXPECT_EQ(j["eos_token_id"], 151643);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");

  PolicyConfig llama;
  llama.vocab_size = 32;
  llama.hidden_size = 16;
  llama.intermediate_size = 48;
  llama.num_hidden_layers = 1;
  llama.num_attention_heads = 2;
  llama.num_key_value_heads = 1;
  llama.head_dim = 4;  // != 16 / 2
  json l = json::parse(to_hf_config_json(llama));
  EXPECT_EQ(l["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(l["head_dim"], 4);
  EXPECT_FALSE(l.contains("bos_token_id"));  // -1 = none
  EXPECT_FALSE(l.contains("eos_token_id"));
}

TEST(HfConfigTest, JsonRoundTrip) {
  PolicyConfig llama;
  llama.vocab_size = 1000;
  llama.hidden_size = 64;
  llama.intermediate_size = 176;
  llama.num_hidden_layers = 3;
  llama.num_attention_heads = 8;
  llama.num_key_value_heads = 2;
  llama.head_dim = 16;
  llama.max_position_embeddings = 4096;
  llama.rms_norm_eps = 1e-5;
  llama.rope_theta = 500000.0;
  llama.tie_word_embeddings = true;
  llama.attention_bias = true;
  llama.bos_token_id = 1;
  llama.eos_token_id = 2;
  llama.torch_dtype = "float16";

  auto qwen = parse_hf_config(kQwen2Config, "config.json");
  ASSERT_TRUE(qwen.ok());
  for (const PolicyConfig& c : {llama, *qwen}) {
    SCOPED_TRACE(c.model_type);
    auto back = parse_hf_config(to_hf_config_json(c), "roundtrip");
    ASSERT_TRUE(back.ok()) << back.status();
    expect_same_config(*back, c);
  }
}

TEST(HfConfigTest, FileRoundTrip) {
  const fs::path dir = fs::path(::testing::TempDir()) / "relay_hf_config_FileRoundTrip";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();

  auto qwen = parse_hf_config(kQwen2Config, "config.json");
  ASSERT_TRUE(qwen.ok());
  ASSERT_TRUE(write_hf_config(*qwen, path).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto back = read_hf_config(path);
  ASSERT_TRUE(back.ok()) << back.status();
  expect_same_config(*back, *qwen);

  PolicyConfig bad = *qwen;
  bad.num_key_value_heads = 5;
  Status s = write_hf_config(bad, path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path + ": num_key_value_heads"), std::string::npos) << s;
  EXPECT_EQ(read_hf_config(path)->num_key_value_heads, 2);  // old file intact

  auto missing = read_hf_config((dir / "nope.json").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);
}

// validate() lives in policy_config.cc; its messages use config.json keys.
PolicyConfig valid_config() {
  PolicyConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

TEST(PolicyConfigTest, ValidateEachRule) {
  struct Case {
    const char* label;
    void (*mutate)(PolicyConfig&);
    std::string message;  // exact; empty = valid
  };
  const std::vector<Case> cases = {
      {"valid", [](PolicyConfig&) {}, ""},
      {"qwen2", [](PolicyConfig& c) { c.model_type = "qwen2"; }, ""},
      {"explicit even head_dim", [](PolicyConfig& c) { c.head_dim = 6; }, ""},
      {"model_type", [](PolicyConfig& c) { c.model_type = "gpt2"; },
       "model_type: must be llama, qwen2, qwen3 or qwen3_moe, got 'gpt2'"},
      {"vocab", [](PolicyConfig& c) { c.vocab_size = 0; }, "vocab_size: must be >= 1, got 0"},
      {"layers", [](PolicyConfig& c) { c.num_hidden_layers = -1; },
       "num_hidden_layers: must be >= 1, got -1"},
      {"max pos", [](PolicyConfig& c) { c.max_position_embeddings = 0; },
       "max_position_embeddings: must be >= 1, got 0"},
      {"kv divides", [](PolicyConfig& c) { c.num_key_value_heads = 3; },
       "num_key_value_heads: must divide num_attention_heads (4), got 3"},
      {"hidden divisible", [](PolicyConfig& c) { c.hidden_size = 18; },
       "hidden_size: must be divisible by num_attention_heads (4) when head_dim is unset, got 18"},
      {"derived head_dim odd", [](PolicyConfig& c) { c.hidden_size = 12; },
       "head_dim: must be even (RoPE rotates pairs), got hidden_size / num_attention_heads = 3"},
      {"explicit head_dim odd", [](PolicyConfig& c) { c.head_dim = 5; },
       "head_dim: must be even (RoPE rotates pairs), got 5"},
      {"eps", [](PolicyConfig& c) { c.rms_norm_eps = 0; },
       "rms_norm_eps: must be a finite number > 0, got 0"},
      {"theta", [](PolicyConfig& c) { c.rope_theta = -1; },
       "rope_theta: must be a finite number > 0, got -1"},
      {"dtype", [](PolicyConfig& c) { c.torch_dtype = "float64"; },
       "torch_dtype: must be float32, bfloat16 or float16, got 'float64'"},
      {"eos", [](PolicyConfig& c) { c.eos_token_id = -2; },
       "eos_token_id: must be >= 0 or -1 (none), got -2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    PolicyConfig config = valid_config();
    c.mutate(config);
    Status s = validate(config);
    if (c.message.empty()) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(s.message(), c.message);
    }
  }
}

TEST(PolicyConfigTest, ValidateListsEveryProblem) {
  PolicyConfig c = valid_config();
  c.vocab_size = 0;
  c.num_key_value_heads = 3;
  c.rms_norm_eps = std::nan("");
  Status s = validate(c);
  EXPECT_EQ(s.message(),
            "vocab_size: must be >= 1, got 0\n"
            "num_key_value_heads: must divide num_attention_heads (4), got 3\n"
            "rms_norm_eps: must be a finite number > 0, got nan");
}

}  // namespace
}  // namespace relay::model
