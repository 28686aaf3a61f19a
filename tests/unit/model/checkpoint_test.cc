#include "relay/model/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "relay/model/hf_config.h"
#include "relay/model/safetensors.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

namespace fs = std::filesystem;
using relay::testing::AllClose;
using relay::testing::TinyConfig;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::path(::testing::TempDir()) /
        ("ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  std::string Dir(const std::string& name) { return (root_ / name).string(); }

  static Policy Make(const PolicyConfig& c, uint64_t seed = 1) {
    Policy p(c);
    init_weights(*p, seed);
    p->eval();
    return p;
  }
  static void ExpectSameWeights(Policy& a, Policy& b) {
    auto pb = b->named_parameters();
    ASSERT_EQ(a->named_parameters().size(), pb.size());
    for (const auto& item : a->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
    }
  }
  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void WriteFile(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  }
  // Rewrites a checkpoint's weights through `edit`.
  static void EditTensors(
      const std::string& dir,
      const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& edit) {
    auto tensors = CheckpointTensors::open(dir);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    std::vector<std::pair<std::string, at::Tensor>> all;
    for (const std::string& name : tensors->names()) all.emplace_back(name, *tensors->tensor(name));
    edit(all);
    ASSERT_TRUE(write_checkpoint_tensors(dir, all).ok());
  }

  fs::path root_;
};

TEST_F(CheckpointTest, RoundTripsEveryArchitectureVariant) {
  for (const std::string type : {"llama", "qwen2"}) {
    for (bool tied : {false, true}) {
      PolicyConfig c = TinyConfig(type);
      c.tie_word_embeddings = tied;
      Policy p = Make(c, 3);
      const std::string dir = Dir(type + (tied ? "_tied" : "_untied"));
      ASSERT_TRUE(save_policy(*p, dir).ok());
      EXPECT_TRUE(fs::exists(dir + "/config.json"));
      EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
      auto loaded = load_policy(dir);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ExpectSameWeights(p, *loaded);
      EXPECT_EQ((*loaded)->config().tie_word_embeddings, tied);
      at::Tensor ids = torch::tensor({{1, 4, 9, 16}}, torch::kInt64);
      torch::NoGradGuard g;
      EXPECT_TRUE(AllClose(p->forward(ids), (*loaded)->forward(ids), 0.0)) << type << tied;
    }
  }
}

TEST_F(CheckpointTest, ShardedCheckpointLoadsTheSame) {
  Policy p = Make(TinyConfig(), 4);
  SaveOptions opts;
  opts.max_shard_bytes = 8 * 1024;  // forces several shards for this ~70 KB model
  ASSERT_TRUE(save_policy(*p, Dir("sharded"), opts).ok());
  EXPECT_TRUE(fs::exists(Dir("sharded") + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(Dir("sharded") + "/model.safetensors"));
  auto loaded = load_policy(Dir("sharded"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(p, *loaded);
}

TEST_F(CheckpointTest, SavesInBfloat16AndLoadsIntoAnyDtype) {
  Policy p = Make(TinyConfig(), 5);
  SaveOptions opts;
  opts.dtype = torch::kBFloat16;
  ASSERT_TRUE(save_policy(*p, Dir("bf16"), opts).ok());
  auto cfg = read_hf_config(Dir("bf16") + "/config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->torch_dtype, "bfloat16");
  auto reader = SafetensorsReader::open(Dir("bf16") + "/model.safetensors");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->entries()[0].dtype, DType::kBF16);
  auto as_f32 = load_policy(Dir("bf16"));
  ASSERT_TRUE(as_f32.ok()) << as_f32.status();
  auto params = (*as_f32)->named_parameters();
  for (const auto& item : p->named_parameters()) {
    EXPECT_TRUE(
        torch::equal(params[item.key()], item.value().to(torch::kBFloat16).to(torch::kFloat32)))
        << item.key();
  }
  LoadOptions half;
  half.dtype = torch::kBFloat16;
  auto as_bf16 = load_policy(Dir("bf16"), half);
  ASSERT_TRUE(as_bf16.ok());
  EXPECT_EQ((*as_bf16)->named_parameters()["model.norm.weight"].scalar_type(), torch::kBFloat16);
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  Policy p = Make(TinyConfig());
  ASSERT_TRUE(save_policy(*p, Dir("m")).ok());
  EditTensors(Dir("m"), [](auto& all) {
    all.erase(std::remove_if(
                  all.begin(), all.end(),
                  [](const auto& kv) { return kv.first == "model.layers.1.mlp.up_proj.weight"; }),
              all.end());
  });
  auto r = load_policy(Dir("m"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            Dir("m") + ": missing tensor 'model.layers.1.mlp.up_proj.weight'");
}

TEST_F(CheckpointTest, ShapeDisagreeingWithConfigIsNamed) {
  Policy p = Make(TinyConfig());
  ASSERT_TRUE(save_policy(*p, Dir("s")).ok());
  PolicyConfig c = TinyConfig();
  c.intermediate_size = 40;
  ASSERT_TRUE(write_hf_config(c, Dir("s") + "/config.json").ok());
  auto r = load_policy(Dir("s"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), Dir("s") +
                                      ": tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
                                      "[48, 32], config.json implies [40, 32]");
}

TEST_F(CheckpointTest, UnknownTensorsAreRejectedAndRopeBuffersIgnored) {
  Policy p = Make(TinyConfig());
  ASSERT_TRUE(save_policy(*p, Dir("u")).ok());
  EditTensors(Dir("u"), [](auto& all) {
    all.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({4}));
  });
  ASSERT_TRUE(load_policy(Dir("u")).ok());
  EditTensors(Dir("u"), [](auto& all) { all.emplace_back("score.weight", torch::ones({2, 32})); });
  auto r = load_policy(Dir("u"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not have: score.weight"), std::string::npos)
      << r.status().message();
}

TEST_F(CheckpointTest, OverwriteIsExplicitAndKeepsOtherFiles) {
  Policy a = Make(TinyConfig(), 1), b = Make(TinyConfig(), 2);
  SaveOptions opts;
  opts.extra_files["notes.txt"] = "first";
  ASSERT_TRUE(save_policy(*a, Dir("o"), opts).ok());
  EXPECT_EQ(ReadFile(Dir("o") + "/notes.txt"), "first");
  WriteFile(Dir("o") + "/README.md", "user file");
  EXPECT_EQ(save_policy(*b, Dir("o")).code(), absl::StatusCode::kAlreadyExists);
  SaveOptions replace;
  replace.overwrite = true;
  ASSERT_TRUE(save_policy(*b, Dir("o"), replace).ok());
  auto loaded = load_policy(Dir("o"));
  ASSERT_TRUE(loaded.ok());
  ExpectSameWeights(b, *loaded);
  EXPECT_EQ(ReadFile(Dir("o") + "/README.md"), "user file");
  // No staging directories are left behind.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(root_)) entries += e.path().filename() == "o" ? 0 : 1;
  EXPECT_EQ(entries, 0);
}

// A directory as transformers writes it for a Llama model: a config.json with
// keys relay does not use, and weights in HF names.
TEST_F(CheckpointTest, LoadsAHuggingFaceStyleDirectory) {
  const std::string dir = Dir("hf");
  fs::create_directories(dir);
  WriteFile(dir + "/config.json", R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32,
  "initializer_range": 0.02, "intermediate_size": 48, "max_position_embeddings": 64,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "float32",
  "transformers_version": "4.45.0", "use_cache": true, "vocab_size": 37
})");
  Policy p = Make(TinyConfig(), 8);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : p->named_parameters())
    tensors.emplace_back(item.key(), item.value().detach());
  ASSERT_TRUE(write_checkpoint_tensors(dir, tensors).ok());
  auto loaded = load_policy(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(p, *loaded);
  EXPECT_EQ((*loaded)->config().eos_token_id, 2);
}

TEST_F(CheckpointTest, MissingDirectoryOrWeightsAreNotFound) {
  EXPECT_EQ(load_policy(Dir("absent")).status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(Dir("empty"));
  ASSERT_TRUE(write_hf_config(TinyConfig(), Dir("empty") + "/config.json").ok());
  EXPECT_EQ(load_policy(Dir("empty")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace relay::model
