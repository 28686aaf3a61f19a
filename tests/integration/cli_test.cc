// The `relay` binary as a user runs it: exit codes, stdout, stderr.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "relay/common/tensorboard.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/checkpoint.h"
#include "relay/model/layers.h"
#include "relay/model/weight_manifest.h"
#include "relay/store/rollout_store.h"
#include "testing/byte_tokenizer_json.h"

namespace relay {
namespace {

namespace fs = std::filesystem;

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `env`: a prefix for the shell ("VAR=value ...", "env -u VAR").
CliResult RelayCli(const std::string& args, const std::string& env = "") {
  // ctest runs each test in its own process, in parallel: keep files apart.
  const std::string err_file =
      ::testing::TempDir() + "/relay_cli_stderr_" + std::to_string(::getpid()) + ".txt";
  const std::string cmd = env + " " + RELAY_CLI_PATH + " " + args + " 2>" + err_file;
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  FILE* f = fopen(err_file.c_str(), "r");
  if (f) {
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.err.append(buf.data(), n);
    fclose(f);
  }
  return r;
}

const std::string kTinyConfig = std::string(RELAY_SOURCE_DIR) + "/configs/tiny.yaml";

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ =
        new std::string(::testing::TempDir() + "/cli_tiny_model_" + std::to_string(::getpid()));
    fs::remove_all(*model_dir_);
    CliResult r = RelayCli("init " + kTinyConfig + " --out " + *model_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*model_dir_);
    delete model_dir_;
  }
  static std::string* model_dir_;
};
std::string* CliTest::model_dir_ = nullptr;

TEST_F(CliTest, ConfigCheckPrintsTheResolvedConfig) {
  CliResult r = RelayCli("config check " + kTinyConfig + " rollout.n=6");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kv_heads: 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n: 6"), std::string::npos) << r.out;
}

TEST_F(CliTest, ConfigCheckReportsThePathOfABadValue) {
  CliResult r = RelayCli("config check " + kTinyConfig + " rollout.n=0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rollout.n: must be >= 1, got 0"), std::string::npos) << r.err;
  r = RelayCli("config check /nonexistent/x.yaml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/x.yaml"), std::string::npos) << r.err;
}

TEST_F(CliTest, InitWritesAnHfLayoutDirectory) {
  EXPECT_TRUE(fs::exists(*model_dir_ + "/config.json"));
  EXPECT_TRUE(fs::exists(*model_dir_ + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(*model_dir_ + "/relay_tokenizer.json"));
  // A second init into the same directory refuses instead of clobbering it.
  CliResult r = RelayCli("init " + kTinyConfig + " --out " + *model_dir_);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
}

TEST_F(CliTest, ScoreJsonMatchesTheLibrary) {
  CliResult r = RelayCli("score --model " + *model_dir_ + " --ids 1,18,6,13,7,19 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["logprobs"].size(), 5u);
  EXPECT_FALSE(j.contains("logits"));
  auto policy = model::load_policy(*model_dir_);
  ASSERT_TRUE(policy.ok());
  torch::NoGradGuard g;
  at::Tensor expected = (*policy)->score(torch::tensor({1, 18, 6, 13, 7, 19}).view({1, -1}))[0];
  for (int t = 0; t < 5; ++t) {
    EXPECT_NEAR(j["logprobs"][t].get<double>(), expected[t].item<double>(), 1e-6) << t;
  }
  r = RelayCli("score --model " + *model_dir_ + " --ids 1,18,6 --json --logits");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["logits"].size(), 3u);
  EXPECT_EQ(j["logits"][0].size(), 28u);  // the char tokenizer's vocabulary
}

// End to end through the binaries' own I/O: generate's recorded log-probs are
// what score says for prompt + response at positions P - 1 + j.
TEST_F(CliTest, GenerateLogProbsAgreeWithScore) {
  CliResult g = RelayCli("generate --model " + *model_dir_ +
                         " --ids 1,18,6,13 --max-new-tokens 8 --seed 3 --no-eos-stop --json");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  nlohmann::json gen = nlohmann::json::parse(g.out);
  ASSERT_EQ(gen["ids"].size(), 8u);
  ASSERT_EQ(gen["logprobs"].size(), 8u);
  EXPECT_EQ(gen["finish_reason"], "length");
  std::string ids = "1,18,6,13";
  for (const auto& id : gen["ids"]) ids += "," + std::to_string(id.get<int64_t>());
  CliResult s = RelayCli("score --model " + *model_dir_ + " --ids " + ids + " --json");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  nlohmann::json sc = nlohmann::json::parse(s.out);
  for (int j = 0; j < 8; ++j) {
    EXPECT_NEAR(gen["logprobs"][j].get<double>(), sc["logprobs"][3 + j].get<double>(), 1e-4) << j;
  }
  // Same seed, same tokens.
  CliResult again = RelayCli("generate --model " + *model_dir_ +
                             " --ids 1,18,6,13 --max-new-tokens 8 --seed 3 --no-eos-stop --json");
  EXPECT_EQ(nlohmann::json::parse(again.out)["ids"], gen["ids"]);
}

TEST_F(CliTest, GenerateFromText) {
  CliResult r =
      RelayCli("generate --model " + *model_dir_ + " --text '<3+4+5>' --greedy --max-new-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("text: <3+4+5>|"), std::string::npos) << r.out;
}

TEST_F(CliTest, BadInputGivesOneLineErrors) {
  CliResult r = RelayCli("score --model " + *model_dir_ + " --ids 1,x,3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "relay score: ids[1]: expected an integer, got 'x'\n");
  r = RelayCli("score --model " + *model_dir_ + " --ids 1,500");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "relay score: ids[1]: token id 500 outside the vocabulary [0, 28)\n");
  r = RelayCli("generate --model /nonexistent/model --ids 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "relay generate: model directory not found: /nonexistent/model\n");
  r = RelayCli("generate --model " + *model_dir_ + " --ids 1 --temperature 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "relay generate: temperature: must be > 0, got 0\n");
  r = RelayCli("score --model " + *model_dir_);  // missing --ids: a usage error
  EXPECT_EQ(r.exit_code, 2);
}

// More ids than the model has positions (configs/tiny.yaml: 128) are
// refused, not scored at positions the model was never meant to see.
// relay export of a plain model directory: a copy (here in bf16) that keeps
// its tokenizer and scores like the source within bf16's rounding; --merge
// is for adapters only, and an existing --out is kept without --overwrite.
TEST_F(CliTest, ExportCopiesAModelDirectoryAndRefusesWhatItCannotDo) {
  const std::string out = ::testing::TempDir() + "/cli_export_" + std::to_string(::getpid());
  fs::remove_all(out);
  CliResult r = RelayCli("export " + *model_dir_ + " --out " + out + " --merge");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is not a LoRA adapter directory"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = RelayCli("export " + *model_dir_ + " --out " + out + " --dtype bfloat16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream config(out + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(config)["torch_dtype"], "bfloat16");
  EXPECT_TRUE(fs::exists(out + "/relay_tokenizer.json"));
  auto logprobs = [](const std::string& dir) {
    CliResult s = RelayCli("score --model " + dir + " --ids 1,12,15,13,14,2 --json");
    EXPECT_EQ(s.exit_code, 0) << s.err;
    return nlohmann::json::parse(s.out)["logprobs"];
  };
  const nlohmann::json a = logprobs(*model_dir_), b = logprobs(out);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i].get<double>(), b[i].get<double>(), 0.05);
  r = RelayCli("export " + *model_dir_ + " --out " + out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  fs::remove_all(out);
}

// train-local --save with trainer.lora: a PEFT adapter directory naming its
// base, the --model directory, or for a fresh model.init model the base
// written beside it; either loads back (here through relay score).
TEST_F(CliTest, TrainLocalSavesALoraAdapterNamingItsBase) {
  const std::string out = ::testing::TempDir() + "/cli_lora_" + std::to_string(::getpid());
  const std::string common =
      " --sft-steps 2 --steps 1 --groups-per-step 4 --eval-prompts 8 --save " + out +
      " trainer.lora.rank=4 rollout.n=4";
  for (const bool with_model : {true, false}) {
    fs::remove_all(out);
    fs::remove_all(out + "-base");
    CliResult r = RelayCli("train-local " + kTinyConfig +
                           (with_model ? " --model " + *model_dir_ : std::string()) + common);
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    ASSERT_TRUE(fs::exists(out + "/adapter_config.json")) << r.out;
    EXPECT_FALSE(fs::exists(out + "/config.json"));
    std::ifstream config(out + "/adapter_config.json");
    const std::string base = nlohmann::json::parse(config)["base_model_name_or_path"];
    EXPECT_EQ(base, fs::absolute(with_model ? *model_dir_ : out + "-base").lexically_normal())
        << with_model;
    EXPECT_EQ(fs::exists(out + "-base"), !with_model);
    CliResult s = RelayCli("score --model " + out + " --ids 1,12,15,13 --json");
    EXPECT_EQ(s.exit_code, 0) << s.err;
  }
  fs::remove_all(out);
  fs::remove_all(out + "-base");
}

TEST_F(CliTest, ScoreRefusesMoreIdsThanTheModelsContext) {
  std::string ids = "1";
  for (int i = 1; i < 129; ++i) ids += ",1";
  CliResult r = RelayCli("score --model " + *model_dir_ + " --ids " + ids);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.err,
            "relay score: ids: 129 tokens exceed the model's context of 128 "
            "(max_position_embeddings in " +
                *model_dir_ + "/config.json)\n");
  r = RelayCli("score --model " + *model_dir_ + " --ids " + ids.substr(2) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["logprobs"].size(), 127u) << "128 ids fit";
}

// A tokenizer file that is there but damaged is reported as such, not as a
// missing tokenizer; --ids, which needs none, warns and goes on.
TEST_F(CliTest, GenerateReportsADamagedTokenizer) {
  const std::string dir = ::testing::TempDir() + "/cli_bad_tok_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::copy(*model_dir_, dir, fs::copy_options::recursive);
  const std::string file = dir + "/relay_tokenizer.json";
  { std::ofstream(file, std::ios::trunc) << "{\"type\": \"ch"; }
  CliResult r = RelayCli("generate --model " + dir + " --text '<3+4>' --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.rfind("relay generate: " + file + ": ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("not valid JSON (truncated or corrupt)"), std::string::npos) << r.err;
  r = RelayCli("generate --model " + dir + " --ids 1,2 --max-new-tokens 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: " + file), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("text:"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace relay

namespace relay {
namespace {

// `relay rollout`: the whole in-process rollout path (task -> tokenizer ->
// engine -> verifier) writes one JSON line per group with complete,
// consistent per-token fields.
TEST_F(CliTest, RolloutWritesScoredTrajectoryGroups) {
  const std::string out =
      ::testing::TempDir() + "/rollout_" + std::to_string(::getpid()) + ".jsonl";
  CliResult r = RelayCli("rollout " + kTinyConfig + " --model " + *model_dir_ +
                         " --prompts 3 --start 5 --out " + out +
                         " rollout.n=3 rollout.prefix.n_prefix=1 rollout.prefix.strategy=fixed"
                         " rollout.prefix.min_ratio=1.0 rollout.prefix.max_ratio=1.0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("3 groups, 9 trajectories"), std::string::npos) << r.out;
  // Every token names the weights that sampled it by their manifest digest.
  const uint64_t digest =
      model::weight_manifest(*model::load_policy(*model_dir_).value(), 0).value().digest;
  ASSERT_NE(digest, 0u);
  std::ifstream in(out);
  std::string line;
  int groups = 0;
  std::set<std::string> ids;
  while (std::getline(in, line)) {
    nlohmann::json g = nlohmann::json::parse(line);
    ++groups;
    ids.insert(g["group_id"].get<std::string>());
    ASSERT_EQ(g["trajectories"].size(), 3u);
    for (size_t j = 0; j < 3; ++j) {
      const nlohmann::json& t = g["trajectories"][j];
      const size_t n = t["response_tokens"].size();
      ASSERT_GT(n, 0u);
      for (const char* field : {"behavior_logprobs", "token_versions", "proximal_logprobs",
                                "proximal_versions", "offpolicy_mask"}) {
        EXPECT_EQ(t[field].size(), n) << field;
      }
      const double reward = t["reward"].get<double>();
      EXPECT_TRUE(reward == 0.0 || reward == 1.0);
      EXPECT_EQ(t["interrupt_policy"], "recompute");
      EXPECT_EQ(t["version_digests"], nlohmann::json::array({nlohmann::json::array({0, digest})}));
      // Sample 0 copies the whole target ("<answer>#"), which ends in the
      // task's stop token: it is forced, stopped and correct.
      if (j == 0) {
        EXPECT_EQ(t["offpolicy_mask"], nlohmann::json(std::vector<int>(n, 1)));
        EXPECT_EQ(t["finish_reason"], "stop");
        EXPECT_EQ(t["response"].get<std::string>(), g["reference"].get<std::string>() + "#");
        EXPECT_EQ(reward, 1.0);
      } else {
        EXPECT_EQ(t["offpolicy_mask"][0], 0);
      }
    }
  }
  EXPECT_EQ(groups, 3);
  EXPECT_EQ(ids, (std::set<std::string>{"arithmetic/5", "arithmetic/6", "arithmetic/7"}));
}

// With the remax estimator each group also gets a greedy response, scored
// like the samples and written apart from them.
TEST_F(CliTest, RolloutAddsAScoredGreedyBaselineForRemax) {
  const std::string out =
      ::testing::TempDir() + "/rollout_remax_" + std::to_string(::getpid()) + ".jsonl";
  CliResult r =
      RelayCli("rollout " + kTinyConfig + " --model " + *model_dir_ + " --prompts 2 --out " + out +
               " rollout.n=2 trainer.advantage.estimator=remax");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 groups, 4 trajectories"), std::string::npos) << r.out;
  std::ifstream in(out);
  std::string line;
  int groups = 0;
  while (std::getline(in, line)) {
    nlohmann::json g = nlohmann::json::parse(line);
    ++groups;
    EXPECT_EQ(g["trajectories"].size(), 2u);
    ASSERT_TRUE(g.contains("baseline")) << line;
    const nlohmann::json& b = g["baseline"];
    EXPECT_GT(b["response_tokens"].size(), 0u);
    const double reward = b["reward"].get<double>();
    EXPECT_TRUE(reward == 0.0 || reward == 1.0);
  }
  EXPECT_EQ(groups, 2);
}

// Groups appended by `relay rollout --store` are what `relay store inspect`
// reports, with a sample trajectory's per-token values side by side.
TEST_F(CliTest, RolloutAppendsToTheStoreAndInspectReportsIt) {
  const std::string dir = ::testing::TempDir() + "/store_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  CliResult r = RelayCli("rollout " + kTinyConfig + " --model " + *model_dir_ +
                         " --prompts 3 --store " + dir + " rollout.n=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("appended 3 groups to " + dir), std::string::npos) << r.out;
  CliResult inspect = RelayCli("store inspect " + dir + " --json");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  nlohmann::json j = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(j["ready"], 3);
  EXPECT_EQ(j["by_min_version"]["0"]["trajectories"], 6);
  const nlohmann::json& sample = j["sample"];
  EXPECT_EQ(sample["group_id"], "arithmetic/2");
  EXPECT_EQ(sample["behavior_logprobs"].size(), sample["response_tokens"].size());
  EXPECT_EQ(sample["token_versions"].size(), sample["response_tokens"].size());

  CliResult text = RelayCli("store inspect " + dir);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("groups: 3 ready, 0 consumed, 0 expired"), std::string::npos) << text.out;

  CliResult missing = RelayCli("store inspect " + dir + "_missing");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("no store at " + dir + "_missing"), std::string::npos) << missing.err;
}

// model.chat_template end to end: a model directory with a byte-level
// tokenizer.json holding ChatML's tokens (byte b = id b; <|endoftext|> 256,
// <|im_start|> 257, <|im_end|> 258), a JSONL task whose prompt is a message
// list. The prompt the engine gets is the rendered conversation; the forced
// target ends with <|im_end|>, which stops the response; the verifier's exact
// match sees "ok" without it.
TEST_F(CliTest, RolloutRendersChatPromptsAndStopsAtTheEndOfTurn) {
  const std::string base = ::testing::TempDir() + "/cli_chat_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string model = base + "/model";
  CliResult r = RelayCli("init " + kTinyConfig + " --out " + model + " model.init.vocab=259");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::remove(model + "/relay_tokenizer.json");
  std::ofstream(model + "/tokenizer.json")
      << relay::testing::byte_tokenizer_json({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
             .dump();
  const std::string data = base + "/chat.jsonl";
  std::ofstream(data) << R"({"prompt": [{"role": "user", "content": "hi"}], "answer": "ok",)"
                      << R"( "target": "ok"})"
                      << "\n";
  const std::string out = base + "/rollout.jsonl";
  r = RelayCli("rollout " + kTinyConfig + " --model " + model + " --prompts 1 --out " + out +
               " task.name=jsonl task.path=" + data +
               " model.chat_template=auto 'model.system_prompt=Be brief.' rollout.n=2"
               " rollout.prefix.n_prefix=1 rollout.prefix.strategy=fixed"
               " rollout.prefix.min_ratio=1.0 rollout.prefix.max_ratio=1.0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json g = nlohmann::json::parse(line);
  const std::string prompt =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(g["prompt"], prompt);
  std::vector<int64_t> want;
  const auto bytes = [&want](const std::string& text) {
    for (unsigned char c : text) want.push_back(c);
  };
  want.push_back(257);
  bytes("system\nBe brief.");
  want.push_back(258);
  bytes("\n");
  want.push_back(257);
  bytes("user\nhi");
  want.push_back(258);
  bytes("\n");
  want.push_back(257);
  bytes("assistant\n");
  EXPECT_EQ(g["prompt_tokens"], nlohmann::json(want));
  const nlohmann::json& t = g["trajectories"][0];                    // the whole target, forced
  EXPECT_EQ(t["response_tokens"], nlohmann::json({111, 107, 258}));  // 'o', 'k', <|im_end|>
  EXPECT_EQ(t["finish_reason"], "stop");
  EXPECT_EQ(t["response"], "ok<|im_end|>");
  EXPECT_EQ(t["reward"], 1.0) << "the verifier must see 'ok', without <|im_end|>";

  // relay generate renders --text the same way.
  r = RelayCli("generate --model " + model +
               " --text hi --chat-template auto --system 'Be brief.' --greedy --max-new-tokens 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("text: " + prompt + "|"), std::string::npos) << r.out;

  // The char tokenizer has no chat tokens.
  r = RelayCli("generate --model " + *model_dir_ + " --text 1 --chat-template llama3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("relay generate: --chat-template: 'llama3' needs '<|begin_of_text|>'"),
            std::string::npos)
      << r.err;
  r = RelayCli("rollout " + kTinyConfig + " --model " + *model_dir_ +
               " model.chat_template=chatml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "relay rollout: model.chat_template: 'chatml' needs '<|im_start|>', '<|im_end|>' as "
            "single tokens of the model's tokenizer, which it does not have (the char tokenizer "
            "has no chat tokens; give a model directory whose tokenizer.json has them, or set "
            "none)\n");
  fs::remove_all(base);
}

// Episodes with the calculator tool through `relay rollout`: the prompt
// lists the tool as Qwen's template does, the forced first turn is a tool
// call, the tool's answer follows it as the template renders a tool turn
// (token-in/token-out, marked as the environment's), and the model takes
// its next turn from there.
// A byte-level model with ChatML's tokens, and one arithmetic question whose
// target is a calculator call (forced whole, so the first turn calls the tool).
struct AgentFixture {
  std::string base, model, data, call;
};

AgentFixture make_agent_fixture(const std::string& name) {
  AgentFixture f;
  f.base = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  fs::remove_all(f.base);
  f.model = f.base + "/model";
  CliResult r = RelayCli("init " + kTinyConfig + " --out " + f.model +
                         " model.init.vocab=259 model.init.max_seq_len=1024");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  fs::remove(f.model + "/relay_tokenizer.json");
  std::ofstream(f.model + "/tokenizer.json")
      << relay::testing::byte_tokenizer_json({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
             .dump();
  f.call =
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n"
      "</tool_call>";
  nlohmann::json line = {{"prompt", "What is 6*7?"}, {"answer", "42"}, {"target", f.call}};
  f.data = f.base + "/agent.jsonl";
  std::ofstream(f.data) << line.dump() << "\n" << line.dump() << "\n";
  return f;
}

const char kAgentArgs[] =
    " task.name=jsonl task.environment=calculator model.chat_template=auto"
    " rollout.max_new_tokens=96 rollout.episode.max_turns=2"
    " rollout.prefix.n_prefix=-1 rollout.prefix.strategy=fixed"
    " rollout.prefix.min_ratio=1.0 rollout.prefix.max_ratio=1.0";

TEST_F(CliTest, RolloutRunsCalculatorEpisodes) {
  const AgentFixture f = make_agent_fixture("cli_agent");
  const std::string& call = f.call;
  const std::string out = f.base + "/rollout.jsonl";
  CliResult r = RelayCli("rollout " + kTinyConfig + " --model " + f.model + " --prompts 1 --out " +
                         out + " task.path=" + f.data + " rollout.n=2" + kAgentArgs);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  std::string text;
  ASSERT_TRUE(std::getline(in, text));
  const nlohmann::json g = nlohmann::json::parse(text);
  const std::string prompt = g["prompt"];
  EXPECT_EQ(prompt.rfind("<|im_start|>system\n# Tools\n\nYou may call one or more functions", 0),
            0u)
      << prompt;
  EXPECT_NE(prompt.find("{\"type\": \"function\", \"function\": {\"name\": \"calculator\""),
            std::string::npos)
      << prompt;
  const std::string observation =
      "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  for (const nlohmann::json& t : g["trajectories"]) {
    ASSERT_TRUE(t.contains("turns")) << t.dump();
    const auto tokens = t["response_tokens"].get<std::vector<int64_t>>();
    const auto env = t["env_mask"].get<std::vector<int>>();
    ASSERT_EQ(env.size(), tokens.size());
    const int64_t model_end = t["turns"][0]["model_end"], env_end = t["turns"][0]["env_end"];
    // The first turn is the forced call, ending with <|im_end|> (258).
    EXPECT_EQ(model_end, static_cast<int64_t>(call.size()) + 1);
    EXPECT_EQ(tokens[model_end - 1], 258);
    // Then the tool's answer, byte for byte (chat tokens as single ids).
    std::string got;
    for (int64_t j = model_end; j < env_end; ++j) {
      EXPECT_EQ(env[j], 1) << j;
      got += tokens[j] == 257   ? std::string("<|im_start|>")
             : tokens[j] == 258 ? std::string("<|im_end|>")
                                : std::string(1, static_cast<char>(tokens[j]));
    }
    EXPECT_EQ(got, observation);
    for (int64_t j = env_end; j < static_cast<int64_t>(tokens.size()); ++j) EXPECT_EQ(env[j], 0);
    for (int64_t j = model_end; j < env_end; ++j) EXPECT_TRUE(t["behavior_logprobs"][j].is_null());
    const std::string finish = t["finish_reason"];
    EXPECT_TRUE(finish == "stop" || finish == "length" || finish == "tool_budget") << finish;
    EXPECT_TRUE(t["sub_scores"].contains("environment"));
  }
}

// The same episodes through `relay run`: the worker answers the turns, the
// trainer takes the environment's tokens as context (out of the loss, out of
// frac_old_logprobs_valid) and scores the model's tokens exactly as the
// engine sampled them.
TEST_F(CliTest, RunTrainsOnCalculatorEpisodes) {
  const AgentFixture f = make_agent_fixture("run_agent");
  const std::string metrics = f.base + "/metrics.jsonl";
  CliResult r = RelayCli("run " + kTinyConfig + " --model " + f.model +
                         " --steps 2 --groups-per-step 2 --eval-every 0 --metrics-out " + metrics +
                         " experiment.output_dir=" + f.base + " task.path=" + f.data +
                         " rollout.n=2" + kAgentArgs);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] != "rl") continue;
    ++steps;
    EXPECT_EQ(j["frac_old_logprobs_valid"].get<double>(), 1.0) << line;
    EXPECT_GT(j["episode/env_token_fraction"].get<double>(), 0.05) << line;
    // Every episode's forced first turn is a calculator call that runs.
    EXPECT_GE(j["episode/tool_calls"].get<double>(), 1.0) << line;
    EXPECT_GE(j["episode/turns"].get<double>(), 1.0) << line;
    const double tool_use = j["episode/tool_use"];
    EXPECT_TRUE(tool_use >= 0 && tool_use <= 1) << line;
    EXPECT_LT(j["mismatch/engine_k3"].get<double>(), 1e-6) << "same weights, same numbers";
  }
  EXPECT_EQ(steps, 2);
}

TEST_F(CliTest, RolloutRejectsAStopTextThatIsNotOneToken) {
  CliResult r =
      RelayCli("rollout " + kTinyConfig + " --model " + *model_dir_ + " rollout.stop=[\\\"12\\\"]");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "relay rollout: rollout.stop[0]: stop text '12' is not a single token of the "
            "tokenizer\n");
}

}  // namespace
}  // namespace relay

namespace relay {
namespace {

// The learning test: engine, verifier and trainer in one process learn the
// arithmetic task. A short supervised warm start gets the model off zero;
// RL must then clearly raise greedy accuracy on held-out prompts, with the
// trainer's log-probs agreeing with the sampler's at every step.
// DAPO dynamic sampling: an untrained model gets reward 0 everywhere, so
// every group is dropped and each step generates 1 + max_extra_batches
// batches before giving up on that step.
TEST_F(CliTest, TrainLocalRefillsDroppedGroupsUpToTheExtraBatchBudget) {
  CliResult r = RelayCli("train-local " + kTinyConfig + " --model " + *model_dir_ +
                         " --steps 2 --groups-per-step 2 --eval-prompts 2 rollout.n=2"
                         " rollout.max_new_tokens=4 trainer.drop_equal_reward_groups=true"
                         " trainer.max_extra_batches=2");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("step 1: skipped: no group with a learning signal in 3 generation batches"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step 2: skipped"), std::string::npos) << r.out;
}

TEST_F(CliTest, TrainLocalLearnsArithmetic) {
  const std::string metrics =
      ::testing::TempDir() + "/train_local_" + std::to_string(::getpid()) + ".jsonl";
  CliResult r = RelayCli("train-local " + kTinyConfig + " --model " + *model_dir_ +
                         " --steps 40 --groups-per-step 16 --sft-steps 60 --sft-lr 3e-3"
                         " --eval-prompts 128 --metrics-out " +
                         metrics + " trainer.lr=1e-4 rollout.n=8 task.arithmetic.max_operands=2");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream in(metrics);
  std::string line;
  std::vector<double> evals;
  int rl_steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "eval") evals.push_back(j["accuracy"].get<double>());
    if (j["phase"] == "rl") {
      ++rl_steps;
      EXPECT_EQ(j["frac_old_logprobs_valid"].get<double>(), 1.0);
      EXPECT_LT(j["mismatch/k3"].get<double>(), 1e-6) << "step " << j["step"];
    }
  }
  ASSERT_EQ(evals.size(), 3u) << r.out;  // before, after the warm start, after RL
  EXPECT_EQ(rl_steps, 40);
  // RL must add 0.15 to the warm start, or bring it to 0.65 where the warm
  // start leaves less room: this toy's greedy accuracy levels off at
  // 0.70-0.81 after these 40 steps whatever it starts from, and the warm
  // start itself moves with BLAS rounding (60 SFT steps at 3e-3 are
  // chaotic). On a Zen 4 VM whose OpenBLAS picked its Cooperlake kernels,
  // the warm start reached 0.734 and RL 0.805, where +0.15 cannot be had.
  // Eight runs of this command (run.seed 0-3, Cooperlake and SkylakeX
  // kernels; 2026-12-07): warm 0.21-0.73, final 0.695-0.812, every final
  // above its warm start by 0.07-0.50.
  const double warm = evals[1], final_accuracy = evals[2];
  EXPECT_GT(warm, evals[0]);
  EXPECT_GT(final_accuracy, warm) << r.out;
  EXPECT_GE(final_accuracy, std::min(warm + 0.15, 0.65)) << r.out;
}

// relay run: relay-trainer and two relay-rollout processes over gRPC and
// the rollout store, from a supervised warm start, with a staleness bound of
// one version. Which version each token was sampled with, and so every step
// after the first, depends on timing (and on BLAS rounding), so two checks:
//   - what holds whatever the timing, exactly: 40 steps, one version each
//     and in order, no token older than the bound, every behavior log-prob
//     present, engine and trainer agreeing on the numbers;
//   - that accuracy rose, on a measure the timing moves less: the mean of
//     the evals at steps 20, 30 and 40. A single eval swings with the run
//     (the last one alone ranged 0.625-0.98 over 30 runs, so "final >=
//     before + 0.1" failed about one run in 30); that mean was 0.82 +- 0.025
//     (min 0.77) over 24 runs, 8 of them two at a time, from 0.625 before,
//     but under the full suite's load (ctest -j2, 2 cores) one run gave
//     0.711 (evals 0.656, 0.711, 0.766): slower workers shift which version
//     sampled what. So the mean must rise by 0.05, and one of those evals
//     must beat the first: accuracy is greedy on the same 128 prompts, so a
//     policy that did not learn repeats its first figure.
// The warm start is 40 SFT steps, not the 60 of TrainLocalLearnsArithmetic:
// 60 steps at 3e-3 are chaotic, and on a Zen 4 VM whose OpenBLAS picked its
// Cooperlake kernels (2026-12-07) they reached 0.734, where this toy levels
// off (means 0.60-0.76 from there, and in one run of three no eval beat
// the first). From 40 steps (0.21-0.55 over run.seed 0-3 with Cooperlake
// kernels and 0 and 3 with SkylakeX) the mean rose by 0.06-0.33 in all six
// runs, by 0.13 or more in five.
TEST_F(CliTest, RunTrainsAsynchronouslyWithTwoWorkers) {
  const std::string base = ::testing::TempDir() + "/run_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string args = " rollout.n=8 task.arithmetic.max_operands=2";
  CliResult warm = RelayCli("train-local " + kTinyConfig + " --model " + *model_dir_ +
                            " --sft-steps 40 --sft-lr 3e-3 --steps 0 --groups-per-step 16"
                            " --eval-prompts 128 --save " +
                            base + "/warm" + args);
  ASSERT_EQ(warm.exit_code, 0) << warm.err << warm.out;
  const std::string metrics = base + "/metrics.jsonl";
  CliResult r = RelayCli("run " + kTinyConfig + " --model " + base + "/warm --workers 2" +
                         " --steps 40 --groups-per-step 16 --eval-prompts 128 --eval-every 10"
                         " --metrics-out " +
                         metrics + " --save " + base + "/trained experiment.output_dir=" + base +
                         " trainer.lr=3e-4 trainer.max_staleness=1" + args);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream in(metrics);
  std::string line;
  std::map<int, double> evals;  // by step
  int steps = 0;
  double max_staleness = 0;
  double train_threads_min = 1e9, train_threads_max = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "eval") evals[j["step"].get<int>()] = j["accuracy"].get<double>();
    if (j["phase"] == "rl") {
      ++steps;
      EXPECT_EQ(j["step"].get<int>(), steps);
      EXPECT_EQ(j["version"].get<double>(), steps) << "one version per step, in order";
      EXPECT_EQ(j["frac_old_logprobs_valid"].get<double>(), 1.0);
      max_staleness = std::max(max_staleness, j["staleness/max"].get<double>());
      EXPECT_LT(j["mismatch/engine_k3"].get<double>(), 1e-6) << "same weights, same numbers";
      ASSERT_TRUE(j.contains("time/train_threads")) << line;
      train_threads_min = std::min(train_threads_min, j["time/train_threads"].get<double>());
      train_threads_max = std::max(train_threads_max, j["time/train_threads"].get<double>());
    }
  }
  EXPECT_EQ(steps, 40);
  EXPECT_LE(max_staleness, 1.0) << "the staleness bound";
  // run.threads 0: the processes shared the machine's cores through a file
  // in the run directory (model/core_share.h), which the run removed.
  std::stringstream saved;
  saved << std::ifstream(base + "/tiny/config.yaml").rdbuf();
  std::smatch share;
  const std::string config = saved.str();
  ASSERT_TRUE(
      std::regex_search(config, share, std::regex("\n  threads: ([0-9]+)\n  core_share: (\\S+)\n")))
      << config;
  EXPECT_EQ(std::stoi(share[1]), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(fs::path(share[2].str()).parent_path(), fs::path(base + "/tiny")) << share[2];
  EXPECT_FALSE(fs::exists(share[2].str())) << share[2];
  // Each process (trainer, 2 workers) shared through that file, its
  // OpenBLAS threads set to sleep at once (relay run's environment).
  const std::string logs = r.out + r.err;
  const std::string said =
      "cores shared through " + share[2].str() + "; OpenBLAS thread timeout 2^4 cycles";
  int processes = 0;
  for (size_t at = logs.find(said); at != std::string::npos; at = logs.find(said, at + 1)) {
    ++processes;
  }
  EXPECT_GE(processes, 3) << logs;
  // The trainer reported the threads each step trained on.
  EXPECT_GE(train_threads_min, 1.0);
  EXPECT_LE(train_threads_max, std::thread::hardware_concurrency());
  ASSERT_EQ(evals.size(), 5u) << r.out;
  ASSERT_EQ(evals.count(0) + evals.count(20) + evals.count(30) + evals.count(40), 4u) << r.out;
  const double later = (evals[20] + evals[30] + evals[40]) / 3;
  EXPECT_GE(later, evals[0] + 0.05) << r.out;
  EXPECT_GT(std::max({evals[20], evals[30], evals[40]}), evals[0]) << r.out;
  EXPECT_TRUE(fs::exists(base + "/trained/model.safetensors"));
  // The store keeps what was trained on for the retention window (8
  // versions) before the last checkpoint, which a restart may rewind to:
  // compaction at step 40 (before that step's checkpoint) kept the groups
  // consumed from version 30 - 8 on, and deleted the older ones.
  CliResult inspect = RelayCli("store inspect " + base + "/tiny/store --json");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  nlohmann::json st = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(st["consumed"].get<int64_t>(), (40 - (30 - 8)) * 16);
  fs::remove_all(base);
}

// max_staleness 0 through the services is synchronous RL: every step trains
// only on tokens of its own version, with two workers racing for leases (a
// run that once stalled when refused groups' leases held the bound).
TEST_F(CliTest, RunWithMaxStalenessZeroIsSynchronous) {
  const std::string base = ::testing::TempDir() + "/run_sync_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string metrics = base + "/metrics.jsonl";
  CliResult r =
      RelayCli("run " + kTinyConfig + " --model " + *model_dir_ +
               " --workers 2 --steps 12 --groups-per-step 8 --groups-in-flight 8"
               " --metrics-out " +
               metrics + " experiment.output_dir=" + base + " trainer.max_staleness=0 rollout.n=4");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] != "rl") continue;
    ++steps;
    EXPECT_EQ(j["staleness/max"].get<double>(), 0.0) << line;
    EXPECT_EQ(j["batch/trajectories"].get<double>(), 32.0);
  }
  EXPECT_EQ(steps, 12);
  fs::remove_all(base);
}

// A finite dataset smaller than the leases in flight (3 prompts; 3 workers
// holding up to 4 leases each; staleness 4): every lease is its own group
// (the epoch and the stream position are in its id), so the same prompt may
// be in flight several times at once and training proceeds. It once sat at
// step 0 while workers died on "group_id: already queued or in flight".
TEST_F(CliTest, RunTrainsOnADatasetSmallerThanTheLeasesInFlight) {
  const std::string base = ::testing::TempDir() + "/run_small_" + std::to_string(::getpid());
  fs::remove_all(base);
  fs::create_directories(base);
  const std::string data = base + "/three.jsonl";
  std::ofstream(data) << R"({"prompt": "1+1=", "answer": "2"})"
                      << "\n"
                      << R"({"prompt": "2+2=", "answer": "4"})"
                      << "\n"
                      << R"({"prompt": "3+3=", "answer": "6"})"
                      << "\n";
  const std::string metrics = base + "/metrics.jsonl";
  CliResult r = RelayCli("run " + kTinyConfig + " --model " + *model_dir_ +
                         " --workers 3 --steps 6 --groups-per-step 2 --groups-in-flight 4"
                         " --metrics-out " +
                         metrics + " experiment.output_dir=" + base +
                         " trainer.max_staleness=4 rollout.n=2 eval.prompts=0 task.name=jsonl"
                         " task.path=" +
                         data);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(r.err.find("already queued or in flight"), std::string::npos) << r.err;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    if (nlohmann::json::parse(line)["phase"] == "rl") ++steps;
  }
  EXPECT_EQ(steps, 6);
  // Every stored group has its own id, and the prompts came round again.
  CliResult inspect = RelayCli("store inspect " + base + "/tiny/store --json");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  const nlohmann::json st = nlohmann::json::parse(inspect.out);
  EXPECT_GE(st["consumed"].get<int64_t>(), 12);
  EXPECT_EQ(st["rejected"].get<int64_t>(), 0);
  store::StoreOptions so;
  so.path = base + "/tiny/store";
  so.read_only = true;
  auto store = store::RolloutStore::open(so).value();
  std::set<std::string> ids;
  int later_epochs = 0;
  auto scanned = store->scan();
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  for (const store::StoredGroup& g : *scanned) {
    EXPECT_TRUE(ids.insert(g.group.group_id).second) << g.group.group_id << " stored twice";
    if (g.group.group_id.find("@e0") == std::string::npos) ++later_epochs;
  }
  EXPECT_GT(later_epochs, 0) << "3 prompts, 12+ groups: later epochs were leased";
  fs::remove_all(base);
}

// services.weight_sync: broadcast through `relay run`: both workers join the
// trainer's c10d group and take new versions from it; no broadcast fails.
TEST_F(CliTest, RunWithBroadcastWeightSync) {
  const std::string base = ::testing::TempDir() + "/run_bcast_" + std::to_string(::getpid());
  fs::remove_all(base);
  CliResult r =
      RelayCli("run " + kTinyConfig + " --model " + *model_dir_ +
               " --workers 2 --steps 10 --groups-per-step 4 experiment.output_dir=" + base +
               " trainer.max_staleness=1 rollout.n=4 services.weight_sync=broadcast");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::regex re(R"(versions applied \((\d+) by broadcast\))");
  int workers = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), re); it != std::sregex_iterator();
       ++it) {
    ++workers;
    EXPECT_GT(std::stoi((*it)[1]), 0) << r.out;
  }
  // On a loaded machine the second worker may start after the ten tiny
  // steps are done ("stopping before registering"); every worker that ran
  // took its versions by broadcast.
  const int late = static_cast<int>(r.out.find("stopping before registering") != std::string::npos);
  EXPECT_GE(workers, 1) << r.out;
  EXPECT_EQ(workers + late, 2) << r.out;
  std::ifstream in(base + "/tiny/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] != "rl") continue;
    ++steps;
    EXPECT_EQ(j["weight_sync/failures"].get<double>(), 0.0) << line;
  }
  EXPECT_EQ(steps, 10);
  fs::remove_all(base);
}

// configs/arith_ppo.yaml, shortened (a 20-step warm start, 2 RL steps, then
// 2 more in a second run on two trainer ranks): every checkpoint carries the
// critic as a token classifier, the steps report verl's critic metrics, and
// the second run resumes the policy and the critic from the last checkpoint.
// With LoRA the adapters' checkpoints carry the whole critic and resume it.
TEST_F(CliTest, PpoConfigTrainsACriticAndResumesIt) {
  const std::string base = ::testing::TempDir() + "/ppo_job_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith_ppo.yaml";
  const std::string common = " experiment.output_dir=" + base +
                             " experiment.warm_start.sft_steps=20 experiment.checkpoint_every=2"
                             " eval.every=0";
  CliResult r = RelayCli("run " + config + " experiment.steps=2" + common);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string checkpoints = base + "/arith_ppo/checkpoints/";
  for (const char* step : {"step_000000", "step_000002"}) {
    const std::string critic = checkpoints + step + "/critic";
    ASSERT_TRUE(fs::exists(critic + "/config.json")) << critic;
    std::ifstream in(critic + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["architectures"][0], "LlamaForTokenClassification");
    EXPECT_EQ(j["num_labels"], 1);
  }
  // Resumed on two trainer ranks with sharded optimizer state: rank 0 reads
  // the critic from the checkpoint and sends it to rank 1, which restores
  // its share of the critic's AdamW state from trainer_state.pt.
  r = RelayCli("run " + config + " experiment.steps=4 trainer.world_size=2" +
               " trainer.sharding=optimizer" + common);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(checkpoints + "step_000004/critic/model.safetensors"));
  std::ifstream in(base + "/arith_ppo/metrics.jsonl");
  std::string line;
  int rl = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] != "rl") continue;
    ++rl;
    EXPECT_TRUE(j["critic/vf_loss"].is_number()) << line;
    EXPECT_TRUE(j["critic/vf_explained_var"].is_number() || j["critic/vf_explained_var"].is_null())
        << line;
  }
  EXPECT_EQ(rl, 4);
  // Resumed again with the weights sharded too: each rank holds shards of
  // the policy and the critic, and rank 0 gathers the critic whole for the
  // checkpoint, which has moved on from step 4's.
  r = RelayCli("run " + config + " experiment.steps=6 trainer.world_size=2" +
               " trainer.sharding=full" + common);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string critic6 = checkpoints + "step_000006/critic/model.safetensors";
  ASSERT_TRUE(fs::exists(critic6));
  EXPECT_EQ(fs::file_size(critic6),
            fs::file_size(checkpoints + "step_000004/critic/model.safetensors"));
  EXPECT_NE(bytes(critic6), bytes(checkpoints + "step_000004/critic/model.safetensors"));
  // trainer.critic.path starts another run's critic from this one's (the
  // one gathered from shards); a directory that is not there is an error
  // naming it.
  r = RelayCli("run " + config + " experiment.name=from_critic experiment.steps=1" +
               " trainer.critic.path=" + checkpoints + "step_000006/critic" + common);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  // LoRA: the adapters are the policy's checkpoint, the critic a whole model
  // in critic/ beside them; a resume reads it back.
  const std::string lora = " experiment.name=lora_ppo trainer.lora.rank=4";
  r = RelayCli("run " + config + lora + " experiment.steps=2" + common);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string lora_step = base + "/lora_ppo/checkpoints/step_000002";
  EXPECT_TRUE(fs::exists(lora_step + "/adapter_config.json"));
  EXPECT_TRUE(fs::exists(lora_step + "/critic/model.safetensors"));
  r = RelayCli("run " + config + lora + " experiment.steps=3" + common);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  r = RelayCli("run " + config + " experiment.name=no_critic experiment.steps=1" +
               " trainer.critic.path=" + base + "/nowhere" + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.err + r.out).find("model directory not found: " + base + "/nowhere"),
            std::string::npos)
      << r.err << r.out;
  fs::remove_all(base);
}

// configs/arith_distill.yaml's plumbing, short: a teacher written by `relay
// init` (a larger shape, random weights, the student's char tokenizer), two
// RL steps with the config's two workers and two trainer ranks. Every stored sample carries the
// teacher's log-prob of each response token and the teacher's digest, the
// trainer logs the distillation figures, and a teacher with another
// tokenizer is refused naming it.
TEST_F(CliTest, DistillConfigStoresTheTeachersLogprobsAndTrainsOnThem) {
  const std::string base = ::testing::TempDir() + "/distill_job_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string source = std::string(RELAY_SOURCE_DIR) + "/configs/";
  const std::string teacher = base + "/teacher";
  CliResult r = RelayCli("init " + source + "arith.yaml --out " + teacher +
                         " model.init.layers=3 model.init.hidden=96 model.init.ffn=192 run.seed=5");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string common = " experiment.output_dir=" + base +
                             " experiment.warm_start.sft_steps=5 eval.every=0"
                             " experiment.checkpoint_every=0";
  // Two trainer ranks: rank 1 gets the teacher's log-probs with the groups.
  r = RelayCli("run " + source + "arith_distill.yaml experiment.steps=2 trainer.world_size=2" +
               " trainer.distill.teacher=" + teacher + common);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream in(base + "/arith_distill/metrics.jsonl");
  std::string line;
  int rl = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] != "rl") continue;
    ++rl;
    // advantage.estimator none: the teacher's term is every advantage,
    // -(log pi - log q) per token at coef 1.
    EXPECT_LT(j["distill/teacher_logprob"].get<double>(), 0) << line;
    EXPECT_NEAR(j["distill/advantage_mean"].get<double>(), -j["distill/reverse_kl"].get<double>(),
                1e-9)
        << line;
    EXPECT_NEAR(j["advantages/mean"].get<double>(), j["distill/advantage_mean"].get<double>(), 1e-6)
        << line;
  }
  EXPECT_EQ(rl, 2);
  CliResult inspect = RelayCli("store inspect " + base + "/arith_distill/store --json");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  const nlohmann::json sample = nlohmann::json::parse(inspect.out)["sample"];
  ASSERT_TRUE(sample.contains("teacher_logprobs")) << sample.dump();
  EXPECT_EQ(sample["teacher_logprobs"].size(), sample["response_tokens"].size());
  for (const nlohmann::json& lp : sample["teacher_logprobs"]) EXPECT_LT(lp.get<double>(), 0);
  EXPECT_NE(sample["teacher_digest"].get<uint64_t>(), 0u);

  // train-local scores in its own process with the same teacher.
  const std::string local = base + "/local.jsonl";
  r = RelayCli("train-local " + source +
               "arith_distill.yaml --steps 2 --groups-per-step 2 --eval-prompts 2 --metrics-out " +
               local + " trainer.distill.teacher=" + teacher);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream local_in(local);
  rl = 0;
  while (std::getline(local_in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] != "rl") continue;
    ++rl;
    EXPECT_LT(j["distill/teacher_logprob"].get<double>(), 0) << line;
  }
  EXPECT_EQ(rl, 2);

  // A teacher with another tokenizer: refused before anything is sampled.
  const std::string other = base + "/other_teacher";
  r = RelayCli("init " + source + "arith.yaml --out " + other + " --tokenizer " + source +
               "tokenizers/agent_calc.json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  r = RelayCli("run " + source + "arith_distill.yaml experiment.name=mismatch experiment.steps=1" +
               " trainer.distill.teacher=" + other + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.err + r.out)
                .find("trainer.distill.teacher: the tokenizer of " + other +
                      " is not the one of model.tokenizer char"),
            std::string::npos)
      << r.err << r.out;
  fs::remove_all(base);
}

// Every shipped config loads and validates.
TEST_F(CliTest, EveryShippedConfigChecks) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(RELAY_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    ++n;
    CliResult r = RelayCli("config check " + e.path().string());
    EXPECT_EQ(r.exit_code, 0) << e.path() << ": " << r.err;
  }
  EXPECT_GE(n, 5);
}

// The README's main job, as shipped: `relay run configs/arith.yaml` from a
// fresh model (warm start, then asynchronous GRPO with two workers) ends at
// >= 0.9 held-out accuracy, with the run directory laid out as documented.
// configs/arith_lora.yaml as its header says to run it: the main job's warm
// start alone makes the base, then rank-8 adapters learn the task by RL on
// it. Three seeds on a Xeon VM: 0.63-0.72 on the base, 0.98-1.0 after 60
// steps; on an AMD EPYC VM the warm start alone reached 0.85 (then 0.98), so
// "improves" is asked as RL removing at least half of the base's errors
// rather than a fixed gain. Every version carries the adapters alone, and
// the engine's log-probs are the trainer's at every version.
TEST_F(CliTest, LoraConfigLearnsOnTheWarmStartedBase) {
  const std::string base = ::testing::TempDir() + "/lora_job_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string source = std::string(RELAY_SOURCE_DIR) + "/configs/";
  CliResult r = RelayCli("run " + source +
                         "arith.yaml experiment.name=arith_base experiment.steps=0 "
                         "experiment.output_dir=" +
                         base);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string model = base + "/arith_base/checkpoints/step_000000";
  r = RelayCli("run " + source + "arith_lora.yaml model.path=" + model +
               " experiment.output_dir=" + base);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  int64_t model_bytes = 0;
  for (const auto& e : fs::directory_iterator(model)) {
    if (e.path().extension() == ".safetensors") model_bytes += fs::file_size(e.path());
  }
  std::ifstream in(base + "/arith_lora/metrics.jsonl");
  std::string line;
  std::vector<double> evals;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "eval") evals.push_back(j["accuracy"].get<double>());
    if (j["phase"] != "rl") continue;
    ++steps;
    EXPECT_LT(j["weights/version_mb"].get<double>() * (1 << 20), 0.25 * model_bytes) << line;
    if (j["mismatch/engine_k3"].is_number()) {
      EXPECT_LT(j["mismatch/engine_k3"].get<double>(), 1e-6) << line;
    }
  }
  EXPECT_EQ(steps, 60);
  ASSERT_GE(evals.size(), 2u) << r.out;
  EXPECT_GE(evals.back(), 0.9) << r.out;
  EXPECT_LT(1 - evals.back(), 0.5 * (1 - evals.front()))
      << "RL through the adapters improves on the base";
  const std::string last = base + "/arith_lora/checkpoints/step_000060";
  EXPECT_TRUE(fs::exists(last + "/adapter_config.json"));
  EXPECT_FALSE(fs::exists(last + "/config.json"));
  fs::remove_all(base);
}

// The agent config: a fresh model with a task-trained tokenizer learns to
// call the calculator tool in its warm start (whole episodes demonstrated:
// the call, the tool's answer, the result) and keeps using it through RL.
// At lr 1e-3 (the config's until 2026-11-30) eight runs of seed 0 ended at
// accuracy 0.81-0.83 and tool use 0.98-1.0, with evals along the way as low
// as 0.92 tool use (0.42 accuracy once), and one CI run ended at 0.875 tool
// use. At 3e-4, seeds 0 and 2 ended at 0.83 and 0.84 with every eval at or
// above the warm start's and tool use 1.0 throughout (docs/BENCHMARKS.md);
// the bounds below are 0 for a fresh model.
TEST_F(CliTest, AgentConfigLearnsToUseTheCalculator) {
  const std::string base = ::testing::TempDir() + "/agent_job_" + std::to_string(::getpid());
  fs::remove_all(base);
  CliResult r = RelayCli("run " + std::string(RELAY_SOURCE_DIR) +
                         "/configs/agent_calc.yaml experiment.output_dir=" + base +
                         " model.tokenizer=" + std::string(RELAY_SOURCE_DIR) +
                         "/configs/tokenizers/agent_calc.json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  std::ifstream in(base + "/agent_calc/metrics.jsonl");
  std::string line;
  std::vector<double> accuracy, tool_use;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "eval") {
      accuracy.push_back(j["accuracy"].get<double>());
      tool_use.push_back(j["tool_use"].get<double>());
    }
    if (j["phase"] == "rl") {
      ++steps;
      EXPECT_GT(j["episode/env_token_fraction"].get<double>(), 0.2) << line;
      EXPECT_EQ(j["frac_old_logprobs_valid"].get<double>(), 1.0) << line;
    }
  }
  EXPECT_EQ(steps, 60);
  ASSERT_GE(accuracy.size(), 3u) << r.out;
  EXPECT_EQ(accuracy.front(), 0.0) << "a fresh model";
  EXPECT_GE(accuracy[1], 0.5) << "after the warm start";
  EXPECT_GE(accuracy.back(), 0.7) << r.out;
  EXPECT_GE(tool_use.back(), 0.8) << r.out;
  // The checkpoint carries the tokenizer the run was configured with.
  EXPECT_TRUE(fs::exists(base + "/agent_calc/checkpoints/step_000060/tokenizer.json"));
  fs::remove_all(base);
}

// rollout.agent: the same config's training episodes played by an agent
// process (examples/agents/calculator_agent.py, plain HTTP) through each
// worker's OpenAI endpoint; the agent runs the calculator itself and posts
// the reward. The tickets' messages plus the agent's tool render the prompts
// relay's own episodes use, so the warm-started model keeps its accuracy
// (eight 10-step runs on 2026-11-30, four of them two at a time: step
// rewards 0.46-0.81, 0.66-0.70 on average, tool use 0.91-1.0 a step,
// held-out accuracy 0.80-0.81 after, as with the built-in environment).
TEST_F(CliTest, AgentsPlayTheTrainingEpisodesThroughTheEndpoint) {
  const std::string base = ::testing::TempDir() + "/agents_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string src = RELAY_SOURCE_DIR;
  CliResult r = RelayCli("run " + src + "/configs/agent_calc.yaml experiment.output_dir=" + base +
                         " model.tokenizer=" + src + "/configs/tokenizers/agent_calc.json" +
                         " experiment.steps=10 eval.every=10 rollout.agent.listen=127.0.0.1:0" +
                         " 'rollout.agent.command=[/usr/bin/python3, " + src +
                         "/examples/agents/calculator_agent.py, --concurrency, 16]'");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string out = r.out + r.err;
  EXPECT_NE(out.find("agents play episodes through http://127.0.0.1:"), std::string::npos) << out;
  // (Not the agent's own summary line: relay-rollout may stop the agent with
  // SIGTERM before it prints it.)
  // Every group an agent finished was accepted, none dropped, but for
  // groups that came back too late: an episode whose first token is older
  // than trainer.max_staleness allows when it ends is refused as stale, by
  // design (2 of 3 runs had one such group among ~200 on a loaded machine).
  int workers = 0, logged = 0, counted = 0;
  std::istringstream lines(out);
  for (std::string l; std::getline(lines, l);) {
    if (l.find(" refused: ") != std::string::npos) {
      ++logged;
      EXPECT_NE(l.find("is older than the staleness bound"), std::string::npos) << l;
    }
    if (l.find(" groups submitted, ") == std::string::npos) continue;
    ++workers;
    EXPECT_NE(l.find(", 0 agent groups dropped"), std::string::npos) << l;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(l, m, std::regex(R"(, (\d+) refused, )"))) << l;
    counted += std::stoi(m[1]);
  }
  EXPECT_EQ(workers, 2) << out;
  EXPECT_EQ(logged, counted) << "each refusal is logged with its reason: " << out;
  EXPECT_LE(counted, 4) << out;
  std::ifstream in(base + "/agent_calc/metrics.jsonl");
  std::string line;
  std::vector<double> accuracy;
  double reward = 0, tool_use = 0, env_tokens = 0;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "eval") accuracy.push_back(j["accuracy"].get<double>());
    if (j["phase"] == "rl") {
      ++steps;
      reward += j["reward/mean"].get<double>();
      // The agent's tool calls, its results as environment tokens, and the
      // rewards it posted, at every step. Until the config's lr went from
      // 1e-3 to 3e-4, one step could move the policy by a k3 of 0.6 and the
      // next steps scored 0 (a CI run: reward 0.64, then 0.000 from step 4
      // on, held-out accuracy 0 after); these bounds would have caught it.
      EXPECT_GT(j["episode/tool_use"].get<double>(), 0.5) << line;
      EXPECT_GT(j["episode/env_token_fraction"].get<double>(), 0.2) << line;
      EXPECT_GE(j["reward/mean"].get<double>(), 0.2) << line;
      EXPECT_LT(j["mismatch/staleness_k3"].get<double>(), 0.2) << line;
      tool_use += j["episode/tool_use"].get<double>();
      env_tokens += j["episode/env_token_fraction"].get<double>();
      EXPECT_EQ(j["frac_old_logprobs_valid"].get<double>(), 1.0) << line;
    }
  }
  ASSERT_EQ(steps, 10);
  EXPECT_GT(tool_use / steps, 0.8);
  EXPECT_GT(env_tokens / steps, 0.3);
  // A reward the agent failed to post reads 0 throughout.
  EXPECT_GE(reward / steps, 0.45) << "the agent's rewards, as the warm start earns them";
  ASSERT_GE(accuracy.size(), 3u) << r.out;
  // A fresh model scores 0; 0.7 says the agents' episodes kept the warm
  // start's skill. A failing run keeps its directory (metrics.jsonl) for
  // whoever sees it next.
  EXPECT_GE(accuracy.back(), 0.7) << r.out;
  if (HasFailure()) {
    std::cerr << "kept for inspection: " << base << "\n";
  } else {
    fs::remove_all(base);
  }
}

// An agent program that ends while its worker could go on stops the worker
// (leases given back, exit 1 naming the command and how it ended); relay run
// gives up on workers that die the same way three times.
TEST_F(CliTest, AnAgentThatExitsStopsItsWorkerSayingHow) {
  const std::string base = ::testing::TempDir() + "/dead_agent_" + std::to_string(::getpid());
  fs::remove_all(base);
  const std::string src = RELAY_SOURCE_DIR;
  CliResult r =
      RelayCli("run " + src + "/configs/agent_calc.yaml experiment.output_dir=" + base +
               " model.tokenizer=" + src + "/configs/tokenizers/agent_calc.json" +
               " experiment.steps=3 experiment.warm_start.sft_steps=0 eval.every=0" +
               " rollout.agent.listen=127.0.0.1:0 'rollout.agent.command=[sh, -c, exit 3]'");
  const std::string out = r.out + r.err;
  EXPECT_EQ(r.exit_code, 1) << out;
  EXPECT_NE(out.find("the agent (rollout.agent.command: sh -c exit 3) exited with 3 before the "
                     "worker stopped"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("gave back"), std::string::npos) << "its leases went back: " << out;
  EXPECT_NE(out.find("every rollout worker is gone"), std::string::npos) << out;
  fs::remove_all(base);
}

TEST_F(CliTest, MainJobConfigReachesNinetyPercent) {
  const std::string base = ::testing::TempDir() + "/main_job_" + std::to_string(::getpid());
  fs::remove_all(base);
  CliResult r = RelayCli("run " + std::string(RELAY_SOURCE_DIR) +
                         "/configs/arith.yaml experiment.output_dir=" + base);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string run = base + "/arith";
  for (const char* f : {"config.yaml", "metrics.jsonl", "store", "checkpoints", "tensorboard"}) {
    EXPECT_TRUE(fs::exists(run + "/" + f)) << f;
  }
  // TensorBoard: one event file, every record's CRCs right, one event per
  // warm-start step, evaluation and RL step after the file-version event.
  std::vector<std::string> event_files;
  for (const auto& e : fs::directory_iterator(run + "/tensorboard")) {
    event_files.push_back(e.path().string());
  }
  ASSERT_EQ(event_files.size(), 1u);
  StatusOr<std::vector<std::string>> events = read_tfrecords(event_files[0]);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(events->size(), 1u + 100 + 5 + 60);  // version, sft, evals, rl
  EXPECT_NE(events->back().find("eval/accuracy"), std::string::npos) << "the final evaluation";
  EXPECT_NE((*events)[events->size() - 2].find("reward/mean"), std::string::npos) << "step 60";
  std::ifstream in(run + "/metrics.jsonl");
  std::string line;
  std::vector<double> evals;
  int steps = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["phase"] == "eval") evals.push_back(j["accuracy"].get<double>());
    if (j["phase"] == "rl") {
      ++steps;
      EXPECT_LE(j["staleness/max"].get<double>(), 2.0) << line;
    }
  }
  EXPECT_EQ(steps, 60);
  ASSERT_GE(evals.size(), 3u) << r.out;
  EXPECT_GE(evals.back(), 0.9) << r.out;
  EXPECT_GT(evals.back(), evals[1]) << "RL improves on the warm start";
  // The final checkpoint is step 60's, an HF-layout directory with the
  // tokenizer; the best-by-eval one is linked; config.yaml reloads.
  const std::string last = run + "/checkpoints/step_000060";
  for (const char* f : {"config.json", "model.safetensors", "relay_tokenizer.json",
                        "trainer_state.pt", "checkpoint.json", "dispenser_state.bin"}) {
    EXPECT_TRUE(fs::exists(last + "/" + f)) << f;
  }
  EXPECT_TRUE(fs::exists(run + "/checkpoints/best/checkpoint.json"));
  CliResult check = RelayCli("config check " + run + "/config.yaml");
  EXPECT_EQ(check.exit_code, 0) << check.err;

  // relay eval on the known-right model (the final checkpoint) reproduces the
  // trainer's final evaluation exactly: same engine, prompts and scoring.
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/arith.yaml";
  CliResult right = RelayCli("eval --model " + last + " --task " + config + " --n 4 --json");
  ASSERT_EQ(right.exit_code, 0) << right.err << right.out;
  nlohmann::json rj = nlohmann::json::parse(right.out);
  EXPECT_EQ(rj["prompts"], 128);
  EXPECT_DOUBLE_EQ(rj["accuracy"].get<double>(), evals.back()) << right.out;
  EXPECT_GE(rj["accuracy"].get<double>(), 0.9);
  // pass@k grows with k, and pass@1 is the samples' fraction correct.
  EXPECT_LE(rj["pass@1"].get<double>(), rj["pass@2"].get<double>());
  EXPECT_LE(rj["pass@2"].get<double>(), rj["pass@4"].get<double>());
  EXPECT_GT(rj["pass@4"].get<double>(), 0.5);
  // The known-wrong model: the same architecture freshly initialised.
  const std::string fresh = base + "/fresh";
  ASSERT_EQ(RelayCli("init " + config + " --out " + fresh).exit_code, 0);
  CliResult wrong = RelayCli("eval --model " + fresh + " --task " + config + " --n 4 --json");
  ASSERT_EQ(wrong.exit_code, 0) << wrong.err << wrong.out;
  nlohmann::json wj = nlohmann::json::parse(wrong.out);
  EXPECT_LE(wj["accuracy"].get<double>(), 0.05) << wrong.out;
  EXPECT_LE(wj["pass@4"].get<double>(), 0.1) << wrong.out;
  fs::remove_all(base);
}

TEST_F(CliTest, EvalNamesWhatIsMissing) {
  const std::string config = std::string(RELAY_SOURCE_DIR) + "/configs/tiny.yaml";
  CliResult none = RelayCli("eval --model /nonexistent/model --task " + config + " --prompts 4");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("/nonexistent/model"), std::string::npos) << none.err;
  const std::string dir = ::testing::TempDir() + "/eval_names_" + std::to_string(::getpid());
  ASSERT_EQ(RelayCli("init " + config + " --out " + dir + " --overwrite").exit_code, 0);
  CliResult zero = RelayCli("eval --model " + dir + " --task " + config);
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.err.find("eval.prompts"), std::string::npos) << zero.err;
  CliResult neg = RelayCli("eval --model " + dir + " --task " + config + " --prompts 4 --n -1");
  EXPECT_NE(neg.exit_code, 0);
  EXPECT_NE(neg.err.find("eval.n"), std::string::npos) << neg.err;
  fs::remove_all(dir);
}

// The line of `relay env` that starts with `key: `, without the key.
std::string EnvLine(const std::string& out, const std::string& key) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + ": ", 0) == 0) return line.substr(key.size() + 2);
  }
  return "";
}

// Started the way a user starts it (no OPENBLAS_CORETYPE), relay runs
// OpenBLAS kernels written for this CPU's vector instructions: on a CPU that
// OpenBLAS does not recognise (here an Emerald Rapids guest, where it falls
// back to Prescott) it has started itself again with better ones.
TEST(CliEnvTest, RunsBlasKernelsWrittenForThisCpu) {
  CliResult r = RelayCli("env", "env -u OPENBLAS_CORETYPE -u RELAY_OPENBLAS_DETECTED");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(EnvLine(r.out, "libtorch").empty()) << r.out;
  EXPECT_FALSE(EnvLine(r.out, "threads").empty()) << r.out;
  EXPECT_EQ(EnvLine(r.out, "attention").rfind(model::sdpa_available() ? "sdpa (" : "eager (", 0), 0)
      << r.out;
  const std::string blas = EnvLine(r.out, "blas");
  ASSERT_FALSE(blas.empty()) << r.out;
  if (blas == "not OpenBLAS") GTEST_SKIP() << "the BLAS is not OpenBLAS";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(blas, m, std::regex(": (\\w+) kernels \\("))) << blas;
  const model::CpuVectorIsa isa = model::cpu_vector_isa();
  EXPECT_EQ(model::openblas_core_to_request(m[1].str(), isa), "") << blas;
  EXPECT_EQ(blas.find("older CPU"), std::string::npos) << blas;
  std::smatch detected;
  if (std::regex_search(blas, detected, std::regex("OpenBLAS detected (\\w+)"))) {
    // relay replaced OpenBLAS's choice only where its rule says so.
    EXPECT_NE(model::openblas_core_to_request(detected[1].str(), isa), "") << blas;
  }
}

// A choice made through OPENBLAS_CORETYPE is the user's, and stays.
TEST(CliEnvTest, KeepsTheKernelsSetInOpenblasCoretype) {
  CliResult r = RelayCli("env", "env -u RELAY_OPENBLAS_DETECTED OPENBLAS_CORETYPE=Prescott");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string blas = EnvLine(r.out, "blas");
  if (blas == "not OpenBLAS") GTEST_SKIP() << "the BLAS is not OpenBLAS";
  if (blas.find("DYNAMIC_ARCH") == std::string::npos || !model::cpu_vector_isa().avx2_fma) {
    GTEST_SKIP() << "OpenBLAS without a choice of kernels here: " << blas;
  }
  EXPECT_NE(blas.find(": Prescott kernels (OPENBLAS_CORETYPE)"), std::string::npos) << blas;
}

// relay tokenize with relay's char tokenizer file, and with a Hugging Face
// tokenizer.json from the shared parity data when it is there.
TEST(CliTokenizeTest, EncodesAndDecodes) {
  const std::string dir = ::testing::TempDir() + "/cli_tokenize_" + std::to_string(::getpid());
  fs::create_directories(dir);
  std::ofstream(dir + "/relay_tokenizer.json")
      << R"({"type": "char", "alphabet": "0123456789+<>#"})";
  CliResult r = RelayCli("tokenize --tokenizer " + dir + " --text '<3+4>' --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"ids\":[14,6,13,7,15]}\n");
  r = RelayCli("tokenize --tokenizer " + dir + "/relay_tokenizer.json --text '<3+4>'");
  EXPECT_EQ(r.out, "14,6,13,7,15\n");
  r = RelayCli("tokenize --tokenizer " + dir + " --decode --ids 6,13,7,2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "3+4<eos>\n");
  r = RelayCli("tokenize --tokenizer " + dir + " --decode --ids 6,99 --json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "relay tokenize: char tokenizer: ids[1] = 99 is outside the vocabulary [0, 17)\n");
  r = RelayCli("tokenize --tokenizer " + dir + "/nope");
  EXPECT_EQ(r.exit_code, 1);
  fs::remove_all(dir);

  const std::string qwen2 =
      std::string(RELAY_SOURCE_DIR) + "/../shared/testdata/tokenizer_parity/qwen2";
  if (!fs::exists(qwen2 + "/tokenizer.json")) GTEST_SKIP() << qwen2 << " is absent";
  r = RelayCli("tokenize --tokenizer " + qwen2 + " --text 'Hello world<|im_end|>' --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"ids\":[9707,1879,151645]}\n");
  r = RelayCli("tokenize --tokenizer " + qwen2 + "/tokenizer.json --decode --ids 9707,1879 --json");
  EXPECT_EQ(r.out, "{\"text\":\"Hello world\"}\n");
}

// Issue 17: two tokenizer.json files that crashed `relay tokenize` (rc 134
// from std::bad_alloc, rc 139 from a stack overflow) are now errors, rc 1.
TEST(CliTokenizeTest, HostileTokenizerFilesAreErrors) {
  const std::string dir =
      ::testing::TempDir() + "/cli_tokenize_hostile_" + std::to_string(::getpid());
  fs::create_directories(dir);
  nlohmann::json huge_id = relay::testing::byte_tokenizer_json({"<|endoftext|>"});
  huge_id["model"]["vocab"]["hi"] = 1 << 30;
  std::ofstream(dir + "/huge_id.json") << huge_id.dump();
  CliResult r = RelayCli("tokenize --tokenizer " + dir + "/huge_id.json --text hi");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "relay tokenize: " + dir +
                       "/huge_id.json: model.vocab[\"hi\"]: id 1073741824 is too large for the "
                       "258 tokens defined (ids must be < 1540: 2 x tokens + 1024)\n");

  nlohmann::json deep = relay::testing::byte_tokenizer_json({});
  deep["pre_tokenizer"] = "@";
  std::string inner;
  for (int i = 0; i < 20000; ++i) inner += R"({"type": "Sequence", "pretokenizers": [)";
  inner += R"({"type": "ByteLevel"})";
  for (int i = 0; i < 20000; ++i) inner += "]}";
  std::string text = deep.dump();
  text.replace(text.find("\"@\""), 3, inner);
  std::ofstream(dir + "/deep.json") << text;
  r = RelayCli("tokenize --tokenizer " + dir + "/deep.json --text hi");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("deep.json: JSON nests deeper than 128 levels"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace relay
