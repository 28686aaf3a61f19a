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

namespace {

std::string format_metrics(const trainer::StepMetrics& m, const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) {
    auto it = m.find(k);
    if (it != m.end()) absl::StrAppend(&out, " ", k, "=", absl::StrFormat("%.4g", it->second));
  }
  return out;
}

}  // namespace

int train_local(const TrainLocalArgs& args) {
  app::SetupArgs ra;
  ra.config_file = args.config_file;
  ra.overrides = args.overrides;
  ra.model_dir = args.model_dir;
  StatusOr<app::RolloutSetup> setup = app::setup_rollout(ra);
  if (!setup.ok()) return fail("train-local", setup.status());
  app::RolloutSetup& s = *setup;
  if (s.config.trainer.data_parallel.world_size != 1) {
    return fail("train-local",
                InvalidArgumentError(absl::StrCat(
                    "trainer.world_size is ", s.config.trainer.data_parallel.world_size,
                    ": train-local is one process; data-parallel training runs under relay run "
                    "or relay-trainer")));
  }
  if (args.steps < 0 || args.groups_per_step < 1 || args.sft_steps < 0 || args.eval_prompts < 0) {
    return fail("train-local",
                InvalidArgumentError("--steps, --sft-steps and --eval-prompts must be >= 0 and "
                                     "--groups-per-step >= 1"));
  }
  app::PromptSplit split{s.task->size(), args.eval_prompts};
  if (split.size >= 0 && split.size - split.eval < args.groups_per_step) {
    return fail("train-local",
                InvalidArgumentError(absl::StrCat(
                    "--eval-prompts: task '", s.task->name(), "' has ", split.size,
                    " prompts; keeping ", split.eval, " for evaluation leaves too few to train")));
  }
  StatusOr<trainer::TrainerOptions> to = app::trainer_options(s);
  if (!to.ok()) return fail("train-local", to.status());
  rollout::SafeVerifier verifier(s.task, std::chrono::milliseconds(static_cast<int64_t>(
                                             std::ceil(s.config.task.verifier_timeout_s * 1000))));
  std::string metrics_lines;
  auto record = [&](const std::string& phase, int64_t step, trainer::StepMetrics m) {
    nlohmann::json j = {{"phase", phase}, {"step", step}};
    for (const auto& [k, v] : m) j[k] = v;
    absl::StrAppend(&metrics_lines, j.dump(), "\n");
  };

  StatusOr<double> acc = app::evaluate(s, s.policy, split, verifier);
  if (!acc.ok()) return fail("train-local", acc.status());
  std::printf("eval before: accuracy %.3f on %lld held-out prompts\n", *acc,
              static_cast<long long>(split.eval));
  record("eval", 0, {{"accuracy", *acc}});

  // The warm start has its own optimizer (and learning rate): Adam's moments
  // from supervised steps are no guide for the RL objective.
  int64_t version = 0;
  if (args.sft_steps > 0) {
    app::WarmStart ws;
    ws.steps = args.sft_steps;
    ws.lr = args.sft_lr > 0 ? args.sft_lr : to->optimizer.lr;
    ws.batch = args.groups_per_step * s.config.rollout.n;
    StatusOr<int64_t> after =
        app::warm_start(s, *to, split, version, ws, [&](int64_t k, const trainer::StepMetrics& m) {
          std::printf("sft %lld:%s\n", static_cast<long long>(k),
                      format_metrics(m, {"sft_loss", "grad_norm"}).c_str());
          record("sft", k, m);
        });
    if (!after.ok()) return fail("train-local", after.status());
    acc = app::evaluate(s, s.policy, split, verifier);
    if (!acc.ok()) return fail("train-local", acc.status());
    std::printf("eval after warm start: accuracy %.3f\n", *acc);
    record("eval", 0, {{"accuracy", *acc}});
    version = *after;
  }
  model::Policy reference{nullptr};
  if (!s.config.trainer.reference.empty() && to->needs_reference()) {
    StatusOr<model::Policy> ref = model::load_policy(s.config.trainer.reference);
    if (!ref.ok()) {
      return fail("train-local",
                  Status(ref.status().code(),
                         absl::StrCat("trainer.reference: ", std::string(ref.status().message()))));
    }
    reference = *ref;
  }
  StatusOr<std::unique_ptr<trainer::Trainer>> tr =
      trainer::Trainer::create(s.policy, *to, version, reference);
  if (!tr.ok()) return fail("train-local", tr.status());
  trainer::Trainer& trainer = **tr;

  // The engine holds its own copy of the weights, as a worker would.
  StatusOr<uint64_t> digest = app::weights_digest(*trainer.policy());
  if (!digest.ok()) return fail("train-local", digest.status());
  StatusOr<std::unique_ptr<rollout::Engine>> engine = rollout::Engine::create(
      model::clone_policy(*trainer.policy()), s.engine, trainer.version(), *digest);
  if (!engine.ok()) return fail("train-local", engine.status());
  // With DAPO dynamic sampling, extra generation batches refill the groups
  // dropped for equal rewards (trainer.max_extra_batches).
  trainer::BatchFillerOptions fo;
  fo.groups_per_batch = args.groups_per_step;
  fo.drop_equal_reward_groups = to->drop_equal_reward_groups;
  fo.max_extra_batches = s.config.trainer.max_extra_batches;
  trainer::BatchFiller filler(fo);
  int64_t generated = 0;  // generation batches so far: prompts and seeds move on
  for (int64_t step = 0; step < args.steps; ++step) {
    do {
      std::map<std::string, rollout::TaskPrompt> prompts;
      for (int64_t i = 0; i < args.groups_per_step; ++i) {
        const int64_t index = split.train_index(generated * args.groups_per_step + i);
        StatusOr<rollout::TaskPrompt> p = s.task->prompt(index);
        if (!p.ok()) return fail("train-local", p.status());
        const std::string id = absl::StrCat(p->id, "@", generated);
        StatusOr<rollout::PromptGroup> g =
            app::prompt_group(s, *p, id,
                         rollout::sequence_seed(s.config.run.seed,
                                                static_cast<uint64_t>(generated * 1000003 + i)));
        if (!g.ok()) return fail("train-local", g.status());
        if (Status st = (*engine)->submit(*std::move(g)); !st.ok()) return fail("train-local", st);
        prompts.emplace(id, std::move(*p));
      }
      ++generated;
      StatusOr<std::vector<rollout::TrajectoryGroup>> groups = (*engine)->run();
      if (!groups.ok()) return fail("train-local", groups.status());
      for (rollout::TrajectoryGroup& g : *groups) {
        if (Status st = app::score_group(s, verifier, prompts.at(g.group_id), g); !st.ok()) {
          return fail("train-local", st);
        }
      }
      filler.add(*std::move(groups));
    } while (filler.wants_more());
    trainer::BatchFillerStats fill;
    std::vector<rollout::TrajectoryGroup> batch = filler.take(&fill);
    if (batch.empty()) {
      std::printf(
          "step %lld: skipped: no group with a learning signal in %lld generation "
          "batches\n",
          static_cast<long long>(step + 1), static_cast<long long>(fill.generated_batches));
      continue;
    }
    StatusOr<trainer::StepMetrics> m = trainer.step(batch);
    if (m.ok()) {
      (*m)["batch/generated_batches"] = static_cast<double>(fill.generated_batches);
      (*m)["batch/filled_fraction"] =
          static_cast<double>(batch.size()) / static_cast<double>(args.groups_per_step);
    }
    if (!m.ok()) return fail("train-local", m.status());
    std::unordered_map<std::string, at::Tensor> weights =
        model::parameter_tensors(*trainer.policy());
    StatusOr<model::WeightManifest> manifest = model::weight_manifest(weights, trainer.version());
    if (!manifest.ok()) return fail("train-local", manifest.status());
    if (Status st = (*engine)->update_weights(trainer.version(), manifest->digest, weights);
        !st.ok()) {
      return fail("train-local", st);
    }
    std::printf("step %lld:%s\n", static_cast<long long>(step + 1),
                format_metrics(*m, {"reward/mean", "response_length/mean", "clip_fraction",
                                    "mismatch/k3", "pg_loss", "grad_norm"})
                    .c_str());
    record("rl", step + 1, *m);
    if (args.eval_every > 0 && (step + 1) % args.eval_every == 0 && step + 1 < args.steps) {
      acc = app::evaluate(s, trainer.policy(), split, verifier);
      if (!acc.ok()) return fail("train-local", acc.status());
      std::printf("eval at step %lld: accuracy %.3f\n", static_cast<long long>(step + 1), *acc);
      record("eval", step + 1, {{"accuracy", *acc}});
    }
  }
  acc = app::evaluate(s, trainer.policy(), split, verifier);
  if (!acc.ok()) return fail("train-local", acc.status());
  std::printf("eval after: accuracy %.3f; verifier errors %lld, timeouts %lld\n", *acc,
              static_cast<long long>(verifier.errors()),
              static_cast<long long>(verifier.timeouts()));
  record("eval", args.steps, {{"accuracy", *acc}});
  if (!args.metrics_out.empty()) {
    if (Status st = write_file_atomic(args.metrics_out, metrics_lines); !st.ok()) {
      return fail("train-local", st);
    }
  }
  if (!args.save.empty()) {
    model::SaveOptions save;
    save.overwrite = true;
    if (s.tokenizer) {
      if (auto* ct = dynamic_cast<const model::CharTokenizer*>(s.tokenizer.get())) {
        save.extra_files[model::kCharTokenizerFile] = ct->to_json();
      }
    }
    if (Status st = model::save_policy(*trainer.policy(), args.save, save); !st.ok()) {
      return fail("train-local", st);
    }
    std::printf("wrote %s\n", args.save.c_str());
  }
  return 0;
}

}  // namespace relay::cli
