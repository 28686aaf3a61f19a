#include "bin/commands.h"
#include "relay/app/setup.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

#include "relay/common/file_io.h"
#include "relay/config/config.h"
#include "relay/model/bpe_tokenizer.h"
#include "relay/model/chat_template.h"
#include "relay/model/checkpoint.h"
#include "relay/model/hf_config.h"
#include "relay/model/policy.h"
#include "relay/model/threads.h"
#include "relay/model/tokenizer.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/generate.h"
#include "relay/rollout/task.h"
#include "relay/store/rollout_store.h"
#include "relay/trainer/batch_filler.h"
#include "relay/trainer/options.h"
#include "relay/trainer/trainer.h"

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

namespace {

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

}  // namespace

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
  StatusOr<c10::ScalarType> dtype = model::parse_torch_dtype(config->model.dtype);
  if (!dtype.ok()) return fail("init", dtype.status());
  pc->torch_dtype = config->model.dtype;

  model::Policy policy(*pc);
  model::init_weights(*policy, config->run.seed);
  save.dtype = *dtype;
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
  // Past max_position_embeddings the model still computes (RoPE extends),
  // but the numbers are for positions it never saw: refuse, not mislead.
  const int64_t context = (*policy)->config().max_position_embeddings;
  if (static_cast<int64_t>(ids.size()) > context) {
    return fail("score", InvalidArgumentError(absl::StrCat(
                             "ids: ", ids.size(), " tokens exceed the model's context of ", context,
                             " (max_position_embeddings in ", args.model_dir, "/config.json)")));
  }
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
  model::MoeRouting routing;
  routing.record = (*policy)->config().num_moe_layers() > 0;
  if (routing.record) opts.routing = &routing;
  at::Tensor logprobs = (*policy)->score(input, {}, opts)[0];
  if (args.json) {
    nlohmann::json out = {{"logprobs", float_list(logprobs)}};
    if (routing.record) {
      // [layer][position][k]: the experts each MoE layer's router chose for
      // the input token at each position.
      nlohmann::json layers = nlohmann::json::array();
      for (const at::Tensor& chosen : routing.chosen) {
        at::Tensor c = chosen.to(torch::kCPU, torch::kInt64).contiguous();
        nlohmann::json positions = nlohmann::json::array();
        for (int64_t t = 0; t < c.size(0); ++t) {
          positions.push_back(
              std::vector<int64_t>(c[t].data_ptr<int64_t>(), c[t].data_ptr<int64_t>() + c.size(1)));
        }
        layers.push_back(std::move(positions));
      }
      out["routing"] = std::move(layers);
    }
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

int tokenize(const TokenizeArgs& args) {
  StatusOr<std::unique_ptr<model::Tokenizer>> tokenizer =
      std::filesystem::is_directory(args.tokenizer) ? model::load_tokenizer(args.tokenizer)
                                                    : model::load_tokenizer_file(args.tokenizer);
  if (!tokenizer.ok()) return fail("tokenize", tokenizer.status());
  if (args.decode) {
    std::vector<int64_t> ids;
    std::string error;
    if (!parse_ids(args.ids, &ids, &error)) return fail("tokenize", InvalidArgumentError(error));
    StatusOr<std::string> text = (*tokenizer)->decode(ids);
    if (!text.ok()) return fail("tokenize", text.status());
    if (args.json) {
      // Ids that end inside a UTF-8 sequence decode to invalid UTF-8: JSON
      // shows those bytes as U+FFFD.
      std::cout << nlohmann::json{{"text", *text}}.dump(-1, ' ', false,
                                                        nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << *text << "\n";
    }
    return 0;
  }
  StatusOr<std::vector<int64_t>> ids = (*tokenizer)->encode(args.text);
  if (!ids.ok()) return fail("tokenize", ids.status());
  if (args.json) {
    std::cout << nlohmann::json{{"ids", *ids}}.dump() << "\n";
  } else {
    std::cout << absl::StrJoin(*ids, ",") << "\n";
  }
  return 0;
}

namespace {

// With --chat-template: `text` becomes the rendered conversation (--system,
// then --text as the user's message) and `stop` its end-of-turn token.
Status render_chat_text(const GenerateArgs& args, const model::Tokenizer& tokenizer,
                        std::string* text, std::optional<int64_t>* stop) {
  RELAY_ASSIGN_OR_RETURN(
      model::ChatTemplate t,
      model::resolve_chat_template(args.chat_template, tokenizer, "--chat-template"));
  if (t == model::ChatTemplate::kNone) {
    if (!args.system_prompt.empty()) {
      return InvalidArgumentError("--system: needs --chat-template (chatml, llama3 or auto)");
    }
    return OkStatus();
  }
  std::vector<model::ChatMessage> messages;
  if (!args.system_prompt.empty()) messages.push_back({"system", args.system_prompt});
  messages.push_back({"user", args.text});
  if (std::optional<model::ChatProblem> problem = model::find_chat_problem(t, messages)) {
    const bool system = !args.system_prompt.empty() && problem->path.rfind("[0]", 0) == 0;
    return InvalidArgumentError(absl::StrCat(system ? "--system" : "--text", ": ", problem->what));
  }
  *text = model::render_chat(t, messages);
  *stop = tokenizer.token_id(model::end_of_turn(t));
  return OkStatus();
}

}  // namespace

int generate(const GenerateArgs& args) {
  StatusOr<model::Policy> policy = model::load_policy(args.model_dir);
  if (!policy.ok()) return fail("generate", policy.status());
  // --ids needs no tokenizer (the text line is left out without one); a
  // tokenizer file that is there but does not load is reported either way,
  // not taken for an absent one.
  std::unique_ptr<model::Tokenizer> tokenizer;
  StatusOr<std::unique_ptr<model::Tokenizer>> loaded = model::load_tokenizer(args.model_dir);
  if (loaded.ok()) {
    tokenizer = *std::move(loaded);
  } else if (!absl::IsNotFound(loaded.status())) {
    if (!args.text.empty()) return fail("generate", loaded.status());
    std::fprintf(stderr, "relay generate: warning: %s; printing ids only\n",
                 std::string(loaded.status().message()).c_str());
  }

  std::vector<int64_t> prompt;
  std::string error;
  std::optional<int64_t> chat_stop;  // the chat template's end-of-turn token
  if (!args.text.empty()) {
    if (!tokenizer)
      return fail("generate",
                  NotFoundError(absl::StrCat("--text needs a tokenizer in ", args.model_dir)));
    std::string text = args.text;
    if (Status st = render_chat_text(args, *tokenizer, &text, &chat_stop); !st.ok()) {
      return fail("generate", st);
    }
    StatusOr<std::vector<int64_t>> encoded = tokenizer->encode(text);
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
  if (chat_stop) opts.stop_tokens.push_back(*chat_stop);

  StatusOr<std::vector<rollout::Generation>> result = rollout::generate(*policy, {prompt}, opts);
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

namespace {

// A float list where NaN (unknown) is null.
nlohmann::json nullable_floats(const std::vector<float>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (float v : values) {
    if (std::isnan(v)) {
      out.push_back(nullptr);
    } else {
      out.push_back(v);
    }
  }
  return out;
}

nlohmann::json trajectory_json(const rollout::Trajectory& t, const std::string& text,
                               const rollout::Score& score, const std::string& verifier_error) {
  nlohmann::json digests = nlohmann::json::array();
  for (const auto& [v, d] : t.version_digests) digests.push_back({v, d});
  nlohmann::json j = {
      {"response", text},
      {"response_tokens", t.response_tokens},
      {"behavior_logprobs", nullable_floats(t.behavior_logprobs)},
      {"token_versions", t.token_versions},
      {"proximal_logprobs", nullable_floats(t.proximal_logprobs)},
      {"proximal_versions", t.proximal_versions},
      {"offpolicy_mask", t.offpolicy_mask},
      {"finish_reason", rollout::finish_reason_name(t.finish_reason)},
      {"interrupt_policy", rollout::interrupt_policy_name(t.interrupt_policy)},
      {"interruptions", t.interruptions},
      {"prefix_ratio", t.prefix_ratio},
      {"version_digests", digests},
      {"reward", score.reward},
      {"sub_scores", score.sub_scores},
      {"seconds",
       {{"admitted", t.admitted_s}, {"first_token", t.first_token_s}, {"finished", t.finished_s}}}};
  if (!t.raw_logprobs.empty()) j["raw_logprobs"] = nullable_floats(t.raw_logprobs);
  if (!verifier_error.empty()) j["verifier_error"] = verifier_error;
  return j;
}

}  // namespace

int rollout(const RolloutArgs& args) {
  StatusOr<app::RolloutSetup> setup = app::setup_rollout(
      {args.config_file, args.overrides, args.model_dir, args.prompts, args.start});
  if (!setup.ok()) return fail("rollout", setup.status());
  app::RolloutSetup& s = *setup;
  // Trajectories name the weights that sampled them by their manifest digest.
  StatusOr<uint64_t> digest = app::weights_digest(*s.policy);
  if (!digest.ok()) return fail("rollout", digest.status());
  StatusOr<std::unique_ptr<rollout::Engine>> engine =
      rollout::Engine::create(s.policy, s.engine, /*version=*/0, *digest);
  if (!engine.ok()) return fail("rollout", engine.status());

  std::map<std::string, rollout::TaskPrompt> prompts;
  for (int64_t i = args.start; i < args.start + args.prompts; ++i) {
    StatusOr<rollout::TaskPrompt> p = s.task->prompt(i);
    if (!p.ok()) return fail("rollout", p.status());
    StatusOr<rollout::PromptGroup> g =
        app::prompt_group(s, *p, p->id, rollout::sequence_seed(s.config.run.seed, i));
    if (!g.ok()) return fail("rollout", g.status());
    if (Status st = (*engine)->submit(*std::move(g)); !st.ok()) return fail("rollout", st);
    prompts.emplace(p->id, std::move(*p));
  }

  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<std::vector<rollout::TrajectoryGroup>> groups = (*engine)->run();
  if (!groups.ok()) return fail("rollout", groups.status());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  rollout::SafeVerifier verifier(s.task, std::chrono::milliseconds(static_cast<int64_t>(
                                             std::ceil(s.config.task.verifier_timeout_s * 1000))));
  std::string lines;
  double reward_sum = 0;
  int64_t trajectories = 0, tokens = 0;
  for (rollout::TrajectoryGroup& g : *groups) {
    const rollout::TaskPrompt& p = prompts.at(g.group_id);
    nlohmann::json out = {{"group_id", g.group_id},
                          {"prompt", p.prompt},
                          {"reference", p.reference},
                          {"prompt_tokens", g.trajectories.at(0).prompt_tokens}};
    nlohmann::json list = nlohmann::json::array();
    Status st =
        app::score_group(s, verifier, p, g,
                         [&](int64_t index, const rollout::Trajectory& t, const std::string& text,
                             const rollout::Score& score, const std::string& error) {
                           if (index < 0) {
                             out["baseline"] = trajectory_json(t, text, score, error);
                             return;
                           }
                           reward_sum += score.reward;
                           ++trajectories;
                           tokens += static_cast<int64_t>(t.response_tokens.size());
                           list.push_back(trajectory_json(t, text, score, error));
                         });
    if (!st.ok()) return fail("rollout", st);
    out["trajectories"] = std::move(list);
    // A byte-level BPE response can end inside a UTF-8 sequence (cut at
    // max_new_tokens) or sample bytes that form none: JSON shows those bytes
    // as U+FFFD rather than failing; response_tokens keep the exact ids.
    absl::StrAppend(&lines, out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "\n");
  }
  if (!args.out.empty()) {
    if (Status st = write_file_atomic(args.out, lines); !st.ok()) return fail("rollout", st);
  }
  if (!args.store.empty()) {
    store::StoreOptions so;
    so.path = args.store;
    StatusOr<std::unique_ptr<store::RolloutStore>> db = store::RolloutStore::open(so);
    if (!db.ok()) return fail("rollout", db.status());
    for (const rollout::TrajectoryGroup& g : *groups) {
      StatusOr<uint64_t> seq = (*db)->append(g, /*trainer_version=*/0);
      if (!seq.ok()) return fail("rollout", seq.status());
    }
    std::printf("appended %lld groups to %s\n", static_cast<long long>(groups->size()),
                args.store.c_str());
  }
  const rollout::EngineStats stats = (*engine)->stats();
  std::printf(
      "%lld groups, %lld trajectories, %lld response tokens in %.2f s (%.1f tokens/s); "
      "mean reward %.4f; verifier errors %lld, timeouts %lld; prefill shared %lld times\n",
      static_cast<long long>(groups->size()), static_cast<long long>(trajectories),
      static_cast<long long>(tokens), seconds, seconds > 0 ? tokens / seconds : 0.0,
      trajectories > 0 ? reward_sum / trajectories : 0.0, static_cast<long long>(verifier.errors()),
      static_cast<long long>(verifier.timeouts()), static_cast<long long>(stats.shared_prefills));
  if (!args.out.empty()) std::printf("wrote %s\n", args.out.c_str());
  return 0;
}

}  // namespace relay::cli
