#include "bin/commands.h"

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "relay/common/config.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/generate.h"

namespace relay::cli {
namespace {

int fail(const char* command, const Status& status) {
  std::fprintf(stderr, "relay %s: %s\n", command, std::string(status.message()).c_str());
  return 1;
}

// NaN (a missing value) becomes JSON null rather than a silent number.
nlohmann::json float_list(const at::Tensor& t) {
  nlohmann::json out = nlohmann::json::array();
  at::Tensor c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(c.data_ptr<double>()[i]);
  return out;
}

StatusOr<model::PolicyConfig> policy_config_from_init(const ExperimentConfig& config,
                                                      const model::Tokenizer& tokenizer) {
  const ModelInitConfig& init = config.model.init;
  model::PolicyConfig pc;
  pc.model_type = init.arch;
  pc.vocab_size = init.vocab > 0 ? init.vocab : tokenizer.vocab_size();
  if (pc.vocab_size < tokenizer.vocab_size()) {
    return InvalidArgumentError(absl::StrCat("model.init.vocab: must be 0 or >= the tokenizer's ",
                                             tokenizer.vocab_size(), " tokens, got ", init.vocab));
  }
  pc.hidden_size = init.hidden;
  pc.intermediate_size = init.ffn;
  pc.num_hidden_layers = init.layers;
  pc.num_attention_heads = init.heads;
  pc.num_key_value_heads = init.kv_heads;
  pc.max_position_embeddings = init.max_seq_len;
  pc.rope_theta = init.rope_theta;
  pc.rms_norm_eps = init.rms_norm_eps;
  pc.tie_word_embeddings = init.tie_embeddings;
  pc.attention_bias = init.arch == "qwen2";
  pc.bos_token_id = tokenizer.bos_id();
  pc.eos_token_id = tokenizer.eos_id();
  pc.torch_dtype = config.model.dtype;
  RELAY_RETURN_IF_ERROR(model::validate(pc));
  return pc;
}

}  // namespace

bool parse_ids(const std::string& text, std::vector<int64_t>* ids, std::string* error) {
  ids->clear();
  size_t start = 0;
  int index = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    size_t used = 0;
    long long value = 0;
    bool ok = !item.empty();
    if (ok) {
      try {
        value = std::stoll(item, &used);
      } catch (...) {
        ok = false;
      }
    }
    if (!ok || used != item.size()) {
      *error = absl::StrCat("ids[", index, "]: expected an integer, got '", item, "'");
      return false;
    }
    ids->push_back(value);
    ++index;
    start = end + 1;
  }
  return true;
}

int config_check(const ConfigCheckArgs& args) {
  StatusOr<ExperimentConfig> config = load_config(args.file, args.overrides);
  if (!config.ok()) return fail("config check", config.status());
  std::cout << to_yaml(*config);
  std::fprintf(stderr, "%s: ok\n", args.file.c_str());
  return 0;
}

int init_model(const InitArgs& args) {
  StatusOr<ExperimentConfig> config = load_config(args.config_file, args.overrides);
  if (!config.ok()) return fail("init", config.status());
  if (config->model.tokenizer != "char") {
    return fail("init", InvalidArgumentError(absl::StrCat(
                            "model.tokenizer: init builds char-tokenizer models only, got '",
                            config->model.tokenizer, "'")));
  }
  StatusOr<model::CharTokenizer> tokenizer = model::CharTokenizer::create();
  if (!tokenizer.ok()) return fail("init", tokenizer.status());
  StatusOr<model::PolicyConfig> pc = policy_config_from_init(*config, *tokenizer);
  if (!pc.ok()) return fail("init", pc.status());
  StatusOr<c10::ScalarType> dtype = model::parse_torch_dtype(config->model.dtype);
  if (!dtype.ok()) return fail("init", dtype.status());

  model::Policy policy(*pc);
  model::init_weights(*policy, config->run.seed);
  model::SaveOptions save;
  save.dtype = *dtype;
  save.overwrite = args.overwrite;
  save.extra_files[model::kCharTokenizerFile] = tokenizer->to_json();
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

int score(const ScoreArgs& args) {
  std::vector<int64_t> ids;
  std::string error;
  if (!parse_ids(args.ids, &ids, &error)) return fail("score", InvalidArgumentError(error));
  if (ids.size() < 2) {
    return fail("score",
                InvalidArgumentError("ids: need at least 2 tokens (position t scores t+1)"));
  }
  StatusOr<model::Policy> policy = model::load_policy(args.model_dir);
  if (!policy.ok()) return fail("score", policy.status());
  const int64_t vocab = (*policy)->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return fail("score",
                  InvalidArgumentError(absl::StrCat("ids[", i, "]: token id ", ids[i],
                                                    " outside the vocabulary [0, ", vocab, ")")));
    }
  }
  if (!(args.temperature > 0)) {
    return fail("score", InvalidArgumentError(
                             absl::StrCat("temperature: must be > 0, got ", args.temperature)));
  }
  torch::NoGradGuard no_grad;
  at::Tensor input = torch::tensor(ids, torch::kInt64).view({1, -1});
  model::ScoreOptions opts;
  opts.temperature = args.temperature;
  at::Tensor logprobs = (*policy)->score(input, {}, opts)[0];
  if (args.json) {
    nlohmann::json out = {{"logprobs", float_list(logprobs)}};
    if (args.logits) {
      // One row per position: row t holds the logits that predict token t+1.
      at::Tensor logits = (*policy)->forward(input)[0].to(torch::kFloat32);
      if (args.temperature != 1.0) logits = logits / args.temperature;
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t t = 0; t < logits.size(0); ++t) rows.push_back(float_list(logits[t]));
      out["logits"] = rows;
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::printf("%5s %8s %12s\n", "pos", "token", "logprob");
  for (int64_t t = 0; t < logprobs.size(0); ++t) {
    std::printf("%5lld %8lld %12.6f\n", static_cast<long long>(t + 1),
                static_cast<long long>(ids[t + 1]), logprobs[t].item<double>());
  }
  std::printf("sum %.6f over %lld tokens\n", logprobs.sum().item<double>(),
              static_cast<long long>(logprobs.size(0)));
  return 0;
}

int generate(const GenerateArgs& args) {
  StatusOr<model::Policy> policy = model::load_policy(args.model_dir);
  if (!policy.ok()) return fail("generate", policy.status());
  std::unique_ptr<model::Tokenizer> tokenizer;
  if (auto t = model::load_tokenizer(args.model_dir); t.ok()) tokenizer = std::move(*t);

  std::vector<int64_t> prompt;
  std::string error;
  if (!args.text.empty()) {
    if (!tokenizer)
      return fail("generate",
                  NotFoundError(absl::StrCat("--text needs a tokenizer in ", args.model_dir)));
    StatusOr<std::vector<int64_t>> encoded = tokenizer->encode(args.text);
    if (!encoded.ok()) return fail("generate", encoded.status());
    prompt = *encoded;
  } else if (args.ids.empty()) {
    return fail("generate", InvalidArgumentError("give the prompt with --ids or --text"));
  } else if (!parse_ids(args.ids, &prompt, &error)) {
    return fail("generate", InvalidArgumentError(error));
  }

  rollout::GenerateOptions opts;
  opts.max_new_tokens = args.max_new_tokens;
  opts.seed = args.seed;
  opts.sampling.greedy = args.greedy;
  opts.sampling.temperature = args.temperature;
  opts.sampling.top_k = args.top_k;
  opts.sampling.top_p = args.top_p;
  if (!args.stop.empty() && !parse_ids(args.stop, &opts.stop_tokens, &error)) {
    return fail("generate", InvalidArgumentError("--stop: " + error));
  }
  const int64_t eos = (*policy)->config().eos_token_id;
  if (!args.no_eos_stop && eos >= 0) opts.stop_tokens.push_back(eos);

  StatusOr<std::vector<rollout::Generation>> result = rollout::generate(**policy, {prompt}, opts);
  if (!result.ok()) return fail("generate", result.status());
  const rollout::Generation& g = (*result)[0];
  if (args.json) {
    nlohmann::json out = {{"ids", g.tokens},
                          {"logprobs", g.logprobs},
                          {"finish_reason", rollout::finish_reason_name(g.finish_reason)}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::printf("ids:");
  for (int64_t id : g.tokens) std::printf(" %lld", static_cast<long long>(id));
  std::printf("\nlogprobs:");
  for (float lp : g.logprobs) std::printf(" %.4f", lp);
  std::printf("\nfinish: %s\n", rollout::finish_reason_name(g.finish_reason));
  if (tokenizer) {
    StatusOr<std::string> prompt_text = tokenizer->decode(prompt);
    StatusOr<std::string> text = tokenizer->decode(g.tokens);
    if (prompt_text.ok() && text.ok())
      std::printf("text: %s|%s\n", prompt_text->c_str(), text->c_str());
  }
  return 0;
}

}  // namespace relay::cli
