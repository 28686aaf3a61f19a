#include "relay/model/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "relay/common/file_io.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"
#include "relay/model/safetensors.h"
#include "relay/model/tokenizer.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

namespace fs = std::filesystem;
using relay::testing::TinyConfig;

Policy make_policy() {
  Policy p(TinyConfig());
  init_weights(*p, 3, 0.3);
  p->eval();
  return p;
}

LoraConfig all_linear(int64_t rank = 4, double alpha = 8) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  c.targets = {"all-linear"};
  return c;
}

// Gives every lora_B values, so the adapters change the output.
void randomize_b(PolicyImpl& p, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : p.named_parameters()) {
    if (item.key().find("lora_B") != std::string::npos) {
      item.value().copy_(torch::empty(item.value().sizes()).normal_(0, 0.2, gen));
    }
  }
}

at::Tensor ids() { return torch::tensor({{1, 4, 9, 2, 7, 3}, {5, 8, 2, 6, 1, 1}}, torch::kInt64); }
at::Tensor lengths() { return torch::tensor({6, 4}, torch::kInt64); }

std::string temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("relay_lora_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

TEST(LoraTest, AFreshAdapterLeavesTheModelExactlyAsItWas) {
  Policy p = make_policy();
  const at::Tensor before = p->score(ids(), lengths());
  ASSERT_TRUE(attach_lora(*p, all_linear(), 7).ok());
  EXPECT_TRUE(has_lora(*p));
  EXPECT_TRUE(torch::equal(p->score(ids(), lengths()), before));  // B = 0
  // Two matrices per projection: 7 projections in each of the layers.
  const std::vector<std::string> names = adapter_names(*p);
  EXPECT_EQ(static_cast<int64_t>(names.size()), 2 * 7 * TinyConfig().num_hidden_layers);
  EXPECT_EQ(names.front(), "model.layers.0.mlp.down_proj.lora_A.weight");
  // Only the adapters train; A is U(-1/sqrt(in), 1/sqrt(in)) and not zero.
  auto params = p->named_parameters();
  for (const auto& item : params) {
    const bool adapter = std::binary_search(names.begin(), names.end(), item.key());
    EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
  }
  const at::Tensor a = params["model.layers.0.self_attn.q_proj.lora_A.weight"];
  const double bound = 1.0 / std::sqrt(static_cast<double>(TinyConfig().hidden_size));
  EXPECT_EQ(a.sizes(), (at::IntArrayRef{4, TinyConfig().hidden_size}));
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GT(a.abs().max().item<double>(), bound / 2);
  // The same seed draws the same A.
  Policy q = make_policy();
  ASSERT_TRUE(attach_lora(*q, all_linear(), 7).ok());
  EXPECT_TRUE(
      torch::equal(q->named_parameters()["model.layers.0.self_attn.q_proj.lora_A.weight"], a));
  EXPECT_EQ(attach_lora(*p, all_linear(), 7).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LoraTest, AProjectionComputesPeftsFormula) {
  Policy p = make_policy();
  ASSERT_TRUE(attach_lora(*p, all_linear(/*rank=*/3, /*alpha=*/6), 1).ok());
  randomize_b(*p, 2);
  auto& layer = *p->model->layers[0]->as<DecoderLayerImpl>();
  ProjectionImpl& q = *layer.self_attn->q_proj;
  const at::Tensor x = torch::randn({2, 5, TinyConfig().hidden_size});
  torch::NoGradGuard no_grad;
  const at::Tensor base = torch::linear(x, q.weight, q.bias);
  const at::Tensor delta =
      torch::matmul(torch::matmul(x, q.lora_A->weight.t()), q.lora_B->weight.t()) * (6.0 / 3.0);
  EXPECT_TRUE(relay::testing::AllClose(q.forward(x), base + delta, 1e-5));
  {
    AdaptersDisabled off(*p);
    EXPECT_TRUE(relay::testing::AllClose(q.forward(x), base, 1e-5));
  }
  EXPECT_TRUE(relay::testing::AllClose(q.forward(x), base + delta, 1e-5));
}

TEST(LoraTest, TargetsChooseTheProjections) {
  Policy p = make_policy();
  LoraConfig c;
  c.rank = 2;  // PEFT's default targets: q_proj and v_proj
  ASSERT_TRUE(attach_lora(*p, c, 0).ok());
  std::set<std::string> kinds;
  for (const std::string& n : adapter_names(*p)) {
    kinds.insert(n.substr(n.rfind("_proj") - 1, 6));
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"q_proj", "v_proj"}));
  const std::optional<LoraConfig> back = lora_config(*p);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 2);
  EXPECT_DOUBLE_EQ(back->alpha, 8);
  EXPECT_EQ(back->targets, (std::vector<std::string>{"q_proj", "v_proj"}));
}

// Qwen3-MoE: a target names every expert's projection of that name and the
// dense layers' too; the router ("mlp.gate") is never adapted.
TEST(LoraTest, MoeExpertsAreAdaptedByProjectionNameAndTheRouterNever) {
  PolicyConfig c = TinyConfig("qwen3");
  c.model_type = "qwen3_moe";
  c.head_dim = 16;
  c.num_hidden_layers = 2;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers = {1};
  Policy p(c);
  init_weights(*p, 2, 0.3);
  p->eval();
  LoraConfig lora;
  lora.rank = 2;
  lora.targets = {"gate_proj"};
  ASSERT_TRUE(attach_lora(*p, lora, 0).ok());
  const std::vector<std::string> names = adapter_names(*p);
  EXPECT_EQ(names.size(), 2u * (4 + 1));  // 4 experts in layer 0, the dense MLP of layer 1
  for (const std::string& n : names) {
    EXPECT_NE(n.find("gate_proj.lora_"), std::string::npos) << n;
  }
  EXPECT_TRUE(std::binary_search(names.begin(), names.end(),
                                 "model.layers.0.mlp.experts.3.gate_proj.lora_B.weight"));
  randomize_b(*p, 1);
  Policy merged = merged_policy(*p);
  EXPECT_TRUE(
      relay::testing::AllClose(merged->score(ids(), lengths()), p->score(ids(), lengths()), 2e-5));
}

TEST(LoraTest, BadOptionsAreNamed) {
  LoraConfig c;
  c.rank = 4;
  c.targets = {"q_proj", "lm_head"};
  c.dropout = 1.5;
  c.alpha = 0;
  Problems problems("trainer.lora");
  check(c, problems);
  const std::string msg(problems.status().message());
  EXPECT_NE(msg.find("trainer.lora.targets"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'lm_head'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trainer.lora.dropout"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trainer.lora.alpha"), std::string::npos) << msg;
  Policy p = make_policy();
  EXPECT_EQ(attach_lora(*p, c, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(has_lora(*p));
}

TEST(LoraTest, MergedWeightsScoreAsTheAdaptedModel) {
  Policy p = make_policy();
  ASSERT_TRUE(attach_lora(*p, all_linear(), 1).ok());
  randomize_b(*p, 5);
  const at::Tensor side = p->score(ids(), lengths());
  Policy merged = merged_policy(*p);
  EXPECT_FALSE(has_lora(*merged));
  const at::Tensor m = merged->score(ids(), lengths());
  EXPECT_TRUE(relay::testing::AllClose(m, side, 2e-5));
  // The adapters changed something, and the base is the adapter-free model.
  Policy base = base_policy(*p);
  EXPECT_GT((base->score(ids(), lengths()) - side).abs().max().item<double>(), 1e-3);
  AdaptersDisabled off(*p);
  EXPECT_TRUE(torch::equal(p->score(ids(), lengths()), base->score(ids(), lengths())));
}

TEST(LoraTest, GradientsReachOnlyTheAdaptersWithAndWithoutCheckpointing) {
  auto grads = [](bool checkpointing) {
    Policy p = make_policy();
    EXPECT_TRUE(attach_lora(*p, all_linear(), 1).ok());
    randomize_b(*p, 5);
    p->set_activation_checkpointing(checkpointing);
    p->score(ids(), lengths()).sum().backward();
    std::map<std::string, at::Tensor> out;
    for (const auto& item : p->named_parameters()) {
      if (item.value().grad().defined()) out[item.key()] = item.value().grad().clone();
    }
    return out;
  };
  const auto plain = grads(false), checkpointed = grads(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  EXPECT_EQ(static_cast<int64_t>(plain.size()), 2 * 7 * TinyConfig().num_hidden_layers);
  for (const auto& [name, g] : plain) {
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
    ASSERT_TRUE(checkpointed.count(name)) << name;
    EXPECT_TRUE(relay::testing::AllClose(checkpointed.at(name), g, 1e-5));
  }
  EXPECT_GT(plain.at("model.layers.0.self_attn.q_proj.lora_A.weight").abs().sum().item<double>(),
            0);
}

TEST(LoraTest, PublishedWeightsAreTheAdaptersAndTheBaseDigest) {
  Policy p = make_policy();
  const auto full = published_weights(*p).value();
  EXPECT_EQ(full.size(), p->named_parameters().size());
  ASSERT_TRUE(attach_lora(*p, all_linear(), 1).ok());
  std::optional<uint64_t> cache;
  const auto adapters = published_weights(*p, &cache).value();
  EXPECT_EQ(adapters.size(), adapter_names(*p).size() + 1);
  ASSERT_TRUE(adapters.count(kBaseDigestTensor));
  ASSERT_TRUE(cache.has_value());
  EXPECT_EQ(static_cast<uint64_t>(adapters.at(kBaseDigestTensor).item<int64_t>()), *cache);
  EXPECT_EQ(*cache, base_digest(*p).value());
  // The adapters do not enter the base digest; the base does.
  randomize_b(*p, 9);
  EXPECT_EQ(base_digest(*p).value(), *cache);
  {
    torch::NoGradGuard no_grad;
    p->model->norm->weight.add_(1e-3);
  }
  EXPECT_NE(base_digest(*p).value(), *cache);
}

TEST(LoraTest, PeftAdapterDirectoriesRoundTrip) {
  const std::string base_dir = temp_dir("base"), adapter_dir = temp_dir("adapter");
  Policy p = make_policy();
  ASSERT_TRUE(save_policy(*p, base_dir).ok());
  LoraConfig c = all_linear(4, 16);
  c.targets = {"q_proj", "v_proj", "down_proj"};
  ASSERT_TRUE(attach_lora(*p, c, 1).ok());
  randomize_b(*p, 4);
  // Without the base's path the adapter cannot be saved.
  EXPECT_EQ(save_policy(*p, adapter_dir).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(adapter_dir));
  SaveOptions so;
  so.lora_base = base_dir;
  so.extra_files["note.txt"] = "kept";
  ASSERT_TRUE(save_policy(*p, adapter_dir, so).ok());
  EXPECT_FALSE(fs::exists(fs::path(adapter_dir) / "config.json"));
  EXPECT_TRUE(fs::exists(fs::path(adapter_dir) / "note.txt"));

  // PEFT's config fields and tensor names.
  const auto j = nlohmann::json::parse(read_file(adapter_dir + "/adapter_config.json").value());
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(j["base_model_name_or_path"], base_dir);
  auto reader = SafetensorsReader::open(adapter_dir + "/adapter_model.safetensors").value();
  EXPECT_NE(reader->find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"),
            nullptr);
  EXPECT_EQ(reader->entries().size(), adapter_names(*p).size());

  // Loading the directory gives the base with this adapter: the same scores.
  Policy back = load_policy(adapter_dir).value();
  EXPECT_TRUE(has_lora(*back));
  EXPECT_TRUE(torch::equal(back->score(ids(), lengths()), p->score(ids(), lengths())));
  EXPECT_EQ(lora_config(*back)->targets, lora_config(*p)->targets);
  fs::remove_all(base_dir);
  fs::remove_all(adapter_dir);
}

TEST(LoraTest, AnAdapterWithoutATokenizerUsesItsBases) {
  const std::string base_dir = temp_dir("base3"), adapter_dir = temp_dir("adapter3");
  Policy p = make_policy();
  SaveOptions with_tokenizer;
  with_tokenizer.extra_files[kCharTokenizerFile] = CharTokenizer::create().value().to_json();
  ASSERT_TRUE(save_policy(*p, base_dir, with_tokenizer).ok());
  ASSERT_TRUE(attach_lora(*p, all_linear(), 1).ok());
  SaveOptions so;
  so.lora_base = base_dir;
  ASSERT_TRUE(save_policy(*p, adapter_dir, so).ok());
  ASSERT_FALSE(fs::exists(fs::path(adapter_dir) / kCharTokenizerFile));
  StatusOr<std::unique_ptr<Tokenizer>> t = load_tokenizer(adapter_dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), CharTokenizer::create().value().vocab_size());
  fs::remove_all(base_dir);
  fs::remove_all(adapter_dir);
}

TEST(LoraTest, UnsupportedPeftAdaptersAreRefusedByField) {
  const std::string base_dir = temp_dir("base2"), adapter_dir = temp_dir("adapter2");
  Policy p = make_policy();
  ASSERT_TRUE(save_policy(*p, base_dir).ok());
  ASSERT_TRUE(attach_lora(*p, all_linear(), 1).ok());
  SaveOptions so;
  so.lora_base = base_dir;
  ASSERT_TRUE(save_policy(*p, adapter_dir, so).ok());
  const std::string config_file = adapter_dir + "/adapter_config.json";
  const auto original = nlohmann::json::parse(read_file(config_file).value());
  // Each error names the field (or what is wrong with it).
  auto expect_refused = [&](const std::string& key, const nlohmann::json& value,
                            const std::string& said) {
    nlohmann::json j = original;
    j[key] = value;
    ASSERT_TRUE(write_file_atomic(config_file, j.dump()).ok());
    StatusOr<Policy> r = load_policy(adapter_dir);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(std::string(r.status().message()).find(said), std::string::npos)
        << r.status().message();
  };
  expect_refused("use_dora", true, "use_dora: true is not supported");
  expect_refused("use_rslora", true, "use_rslora");
  expect_refused("bias", "all", "bias: only \"none\"");
  expect_refused("modules_to_save", nlohmann::json::array({"lm_head"}), "modules_to_save");
  expect_refused("rank_pattern", nlohmann::json({{"q_proj", 8}}), "rank_pattern");
  expect_refused("target_modules", nlohmann::json::array({"embed_tokens"}), "'embed_tokens'");
  expect_refused("r", 8, "has shape [4, ");  // disagrees with the tensors
  expect_refused("base_model_name_or_path", "/nonexistent/base", "/nonexistent/base");
  ASSERT_TRUE(write_file_atomic(config_file, original.dump()).ok());
  EXPECT_TRUE(load_policy(adapter_dir).ok());
  fs::remove_all(base_dir);
  fs::remove_all(adapter_dir);
}

}  // namespace
}  // namespace relay::model
