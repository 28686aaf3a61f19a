// relay init CONFIG --out DIR: a fresh model directory (HF layout and
// tokenizer) with random weights seeded by run.seed in model.dtype, built
// from model.init or from a Hugging Face config.json.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/app/setup.h"
#include "relay/common/file_io.h"
#include "relay/config/config.h"
#include "relay/model/bpe_tokenizer.h"
#include "relay/model/checkpoint.h"
#include "relay/model/device.h"
#include "relay/model/hf_config.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"

namespace relay::cli {
namespace {

struct InitArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string out_dir;
  bool overwrite = false;
  // An HF config.json whose architecture to build instead of model.init's.
  std::string hf_config;
  // A tokenizer.json, or a directory holding one (its tokenizer_config.json,
  // special_tokens_map.json and generation_config.json are copied too);
  // empty = relay's char tokenizer.
  std::string tokenizer;
  int64_t max_shard_mb = 0;  // shard the weights into files of this size; 0 = 5 GB
};

// The tokenizer files `relay init --tokenizer` takes along: a tokenizer.json,
// or the HF files of a directory.
StatusOr<std::map<std::string, std::string>> tokenizer_files(const std::string& path) {
  std::map<std::string, std::string> files;
  if (!std::filesystem::is_directory(path)) {
    RELAY_ASSIGN_OR_RETURN(files[model::kHfTokenizerFile], read_file(path));
    return files;
  }
  for (const char* name : {model::kHfTokenizerFile, model::kHfTokenizerConfigFile,
                           "special_tokens_map.json", "generation_config.json"}) {
    const std::string file = path + "/" + name;
    if (std::filesystem::exists(file)) {
      RELAY_ASSIGN_OR_RETURN(files[name], read_file(file));
    }
  }
  if (files.count(model::kHfTokenizerFile) == 0) {
    return NotFoundError(absl::StrCat("--tokenizer: ", path, " has no tokenizer.json"));
  }
  return files;
}

int init_model(const InitArgs& args) {
  StatusOr<ExperimentConfig> config = load_config(args.config_file, args.overrides);
  if (!config.ok()) return fail("init", config.status());
  if (config->model.tokenizer != "char" && args.tokenizer.empty()) {
    return fail("init", InvalidArgumentError(absl::StrCat(
                            "model.tokenizer: init builds char-tokenizer models unless --tokenizer "
                            "names a tokenizer.json, got '",
                            config->model.tokenizer, "'")));
  }
  if (!args.hf_config.empty() && args.tokenizer.empty()) {
    return fail("init", InvalidArgumentError(
                            "--hf-config: a Hugging Face architecture needs its tokenizer: give "
                            "--tokenizer (a tokenizer.json or a directory with one)"));
  }
  if (args.max_shard_mb < 0) {
    return fail("init", InvalidArgumentError(
                            absl::StrCat("--max-shard-mb: must be >= 0, got ", args.max_shard_mb)));
  }
  model::SaveOptions save;
  std::unique_ptr<model::Tokenizer> tokenizer;
  if (args.tokenizer.empty()) {
    StatusOr<model::CharTokenizer> chars = model::CharTokenizer::create();
    if (!chars.ok()) return fail("init", chars.status());
    save.extra_files[model::kCharTokenizerFile] = chars->to_json();
    tokenizer = std::make_unique<model::CharTokenizer>(*std::move(chars));
  } else {
    StatusOr<std::map<std::string, std::string>> files = tokenizer_files(args.tokenizer);
    if (!files.ok()) return fail("init", files.status());
    save.extra_files = *std::move(files);
    // Load it as the written directory will: through a scratch directory,
    // so tokenizer_config.json's special tokens apply.
    const std::string scratch = args.out_dir + ".tokenizer-check";
    std::filesystem::create_directories(scratch);
    for (const auto& [name, text] : save.extra_files) {
      if (Status s = write_file_atomic(scratch + "/" + name, text); !s.ok()) return fail("init", s);
    }
    StatusOr<std::unique_ptr<model::Tokenizer>> loaded = model::load_tokenizer(scratch);
    std::filesystem::remove_all(scratch);
    if (!loaded.ok()) return fail("init", loaded.status());
    tokenizer = *std::move(loaded);
  }
  StatusOr<model::PolicyConfig> pc = args.hf_config.empty()
                                         ? app::policy_config_from_init(*config, *tokenizer)
                                         : model::read_hf_config(args.hf_config);
  if (!pc.ok()) return fail("init", pc.status());
  if (pc->vocab_size < tokenizer->vocab_size()) {
    return fail("init",
                InvalidArgumentError(absl::StrCat("vocab_size: the model's ", pc->vocab_size,
                                                  " rows cannot hold the tokenizer's ",
                                                  tokenizer->vocab_size(), " tokens")));
  }
  pc->torch_dtype = model::kPrecisionNames.name(config->model.dtype);

  model::Policy policy(*pc);
  model::init_weights(*policy, config->run.seed);
  save.dtype = model::scalar_type(config->model.dtype);
  save.overwrite = args.overwrite;
  if (args.max_shard_mb > 0) save.max_shard_bytes = static_cast<uint64_t>(args.max_shard_mb) << 20;
  Status s = model::save_policy(*policy, args.out_dir, save);
  if (!s.ok()) return fail("init", s);
  int64_t params = 0;
  for (const auto& p : policy->parameters()) params += p.numel();
  std::printf("wrote %s: %s, %lld layers, hidden %lld, %lld parameters, seed %llu\n",
              args.out_dir.c_str(), pc->model_type.c_str(),
              static_cast<long long>(pc->num_hidden_layers),
              static_cast<long long>(pc->hidden_size), static_cast<long long>(params),
              static_cast<unsigned long long>(config->run.seed));
  return 0;
}

}  // namespace

Command add_init_command(CLI::App& relay) {
  auto args = std::make_shared<InitArgs>();
  CLI::App* init = relay.add_subcommand("init", "Write a fresh model directory from model.init");
  init->add_option("config", args->config_file, "YAML experiment config")->required();
  init->add_option("overrides", args->overrides, "key.path=value overrides");
  init->add_option("--out", args->out_dir, "Model directory to create")->required();
  init->add_flag("--overwrite", args->overwrite, "Replace an existing directory");
  init->add_option("--hf-config", args->hf_config,
                   "Build this Hugging Face config.json's architecture instead of model.init's");
  init->add_option("--tokenizer", args->tokenizer,
                   "tokenizer.json, or a directory with one (and tokenizer_config.json, "
                   "generation_config.json), to write with the model");
  init->add_option("--max-shard-mb", args->max_shard_mb,
                   "Shard the weights into safetensors files of this size");
  return {init, [args] { return init_model(*args); }};
}

}  // namespace relay::cli
