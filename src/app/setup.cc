#include "relay/app/setup.h"

#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "relay/common/file_io.h"
#include "relay/common/progress.h"
#include "relay/env/remote_environment.h"
#include "relay/env/tool_environment.h"
#include "relay/env/tool_prompt.h"
#include "relay/model/attention_implementation.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/bpe_tokenizer.h"
#include "relay/model/chat_template.h"
#include "relay/model/checkpoint.h"
#include "relay/model/core_share.h"
#include "relay/model/cpu_memory.h"
#include "relay/model/device.h"
#include "relay/model/hf_config.h"
#include "relay/model/lora.h"
#include "relay/model/threads.h"
#include "relay/model/torch_error.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/eval_metrics.h"
#include "relay/rollout/generate.h"
#include "relay/trainer/options.h"

namespace relay::app {
namespace {

const char* g_program = "relay";

[[noreturn]] void on_terminate() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "%s: uncaught exception: %s\n", g_program,
                   model::exception_message(x).c_str());
    } catch (...) {
      std::fprintf(stderr, "%s: uncaught exception of an unknown type\n", g_program);
    }
  } else {
    std::fprintf(stderr, "%s: terminate called without an active exception\n", g_program);
  }
  std::abort();
}

}  // namespace

void report_uncaught_exceptions(const char* program) {
  g_program = program;
  std::set_terminate(on_terminate);
}

StatusOr<int64_t> stop_token(const model::Tokenizer& tokenizer, const std::string& text,
                             const std::string& field) {
  if (std::optional<int64_t> id = tokenizer.token_id(text)) return *id;
  StatusOr<std::vector<int64_t>> ids = tokenizer.encode(text);
  if (ids.ok() && ids->size() == 1) return (*ids)[0];
  return InvalidArgumentError(
      absl::StrCat(field, ": stop text '", text, "' is not a single token of the tokenizer"));
}

StatusOr<model::PolicyConfig> policy_config_from_init(const ExperimentConfig& config,
                                                      const model::Tokenizer& tokenizer) {
  const ModelInitConfig& init = config.model.init;
  model::PolicyConfig pc;
  pc.model_type = kModelArchNames.name(init.arch);
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
  pc.head_dim = init.head_dim;
  if (init.arch == ModelArch::kQwen3Moe) {
    pc.num_experts = init.experts;
    pc.num_experts_per_tok = init.experts_per_tok;
    pc.moe_intermediate_size = init.moe_ffn > 0 ? init.moe_ffn : init.ffn;
    pc.norm_topk_prob = true;  // as Qwen3-MoE's released configs set it
  }
  pc.max_position_embeddings = init.max_seq_len;
  pc.rope_theta = init.rope_theta;
  pc.rms_norm_eps = init.rms_norm_eps;
  pc.tie_word_embeddings = init.tie_embeddings;
  pc.attention_bias = init.arch == ModelArch::kQwen2;
  pc.bos_token_id = tokenizer.bos_id();
  pc.eos_token_id = tokenizer.eos_id();
  if (pc.eos_token_id >= 0) pc.eos_token_ids = {pc.eos_token_id};
  pc.torch_dtype = model::kPrecisionNames.name(config.model.dtype);
  RELAY_RETURN_IF_ERROR(model::validate(pc));
  return pc;
}

namespace {

// The policy and tokenizer of `dir`, or with no directory a fresh model from
// model.init and run.seed: exactly what `relay init` would write, so every
// process of a run builds the same one.
Status load_or_build_model(const std::string& dir, RolloutSetup& s) {
  if (!dir.empty()) {
    // model.dtype applies to loaded models too: a bf16 checkpoint trained in
    // bf16 must not silently become fp32 (or the reverse).
    model::LoadOptions lo;
    lo.dtype = model::scalar_type(s.config.model.dtype);
    RELAY_ASSIGN_OR_RETURN(s.policy, model::load_policy(dir, lo));
    RELAY_ASSIGN_OR_RETURN(s.tokenizer, model::load_tokenizer(dir));
    return OkStatus();
  }
  // model.tokenizer: relay's char tokenizer, or a tokenizer.json file.
  if (s.config.model.tokenizer == "char") {
    RELAY_ASSIGN_OR_RETURN(model::CharTokenizer chars, model::CharTokenizer::create());
    s.tokenizer = std::make_shared<model::CharTokenizer>(std::move(chars));
  } else {
    StatusOr<std::unique_ptr<model::Tokenizer>> file =
        model::load_tokenizer_file(s.config.model.tokenizer);
    if (!file.ok()) {
      return Status(file.status().code(),
                    absl::StrCat("model.tokenizer: ", file.status().message()));
    }
    s.tokenizer = *std::move(file);
  }
  RELAY_ASSIGN_OR_RETURN(model::PolicyConfig pc, policy_config_from_init(s.config, *s.tokenizer));
  s.policy = model::Policy(pc);
  model::init_weights(*s.policy, s.config.run.seed);
  s.policy->to(model::scalar_type(s.config.model.dtype));
  return OkStatus();
}

// run.device: the model moves there once; everything that runs it follows
// its weights. "cuda" is the GPU of this process's $LOCAL_RANK, so that one
// process per GPU on a node (trainer ranks, workers) needs no per-process
// config.
Status place_on_device(RolloutSetup& s) {
  int local_rank = 0;
  if (const char* lr = std::getenv("LOCAL_RANK"); lr != nullptr && *lr != '\0') {
    if (!absl::SimpleAtoi(lr, &local_rank) || local_rank < 0) {
      return InvalidArgumentError(absl::StrCat("$LOCAL_RANK: not a rank: '", lr, "'"));
    }
  }
  RELAY_ASSIGN_OR_RETURN(const c10::Device device,
                         model::parse_device(s.config.run.device, local_rank));
  if (!device.is_cpu()) s.policy->to(device);
  return OkStatus();
}

// task.environment's factory; null for none. A remote server is asked for
// its tools here, so one that is not up fails the start, naming its address.
StatusOr<std::shared_ptr<const env::EnvironmentFactory>> make_environment(const TaskConfig& task) {
  switch (task.environment) {
    case rollout::EnvironmentKind::kNone:
      return std::shared_ptr<const env::EnvironmentFactory>();
    case rollout::EnvironmentKind::kCalculator:
      return std::shared_ptr<const env::EnvironmentFactory>(
          std::make_shared<env::ToolEnvironmentFactory>(
              std::vector<env::ToolSpec>{env::calculator_tool()}));
    case rollout::EnvironmentKind::kRemote: {
      env::RemoteEnvironmentOptions o;
      o.address = task.environment_address;
      o.deadline = std::chrono::milliseconds(
          static_cast<int64_t>(std::ceil(task.environment_timeout_s * 1000)));
      o.connect_timeout = std::min(o.connect_timeout, o.deadline);
      StatusOr<std::shared_ptr<const env::EnvironmentFactory>> f =
          env::connect_remote_environment(o);
      if (!f.ok()) {
        return Status(f.status().code(),
                      absl::StrCat("task.environment_address: ", f.status().message()));
      }
      return f;
    }
  }
  return InternalError("unknown task.environment");
}

// The task, rendering prompts and targets with the chat template, which
// needs the tokenizer (its special tokens, for auto).
Status make_task(const SetupArgs& args, RolloutSetup& s) {
  model::ChatOptions chat;
  RELAY_ASSIGN_OR_RETURN(chat.chat_template,
                         model::resolve_chat_template(s.config.model.chat_template, *s.tokenizer));
  chat.system_prompt = s.config.model.system_prompt;
  s.chat_template = chat.chat_template;
  RELAY_ASSIGN_OR_RETURN(s.environment, make_environment(s.config.task));
  if (s.environment) {
    const std::vector<std::string> tools = s.environment->tool_schemas();
    // The prompt lists the tools as Qwen's templates do; without a template
    // the prompt is the task's text, and the format comes from a warm start.
    if (!tools.empty() && chat.chat_template == model::ChatTemplate::kLlama3) {
      return InvalidArgumentError(absl::StrCat(
          "task.environment: ", rollout::kEnvironmentKindNames.name(s.config.task.environment),
          ": its tools are called with <tool_call> blocks in the Qwen/Hermes format; "
          "model.chat_template llama3 has another tool format (use chatml or none)"));
    }
    if (!tools.empty() && chat.chat_template == model::ChatTemplate::kChatml) {
      RELAY_ASSIGN_OR_RETURN(chat.system_prompt,
                             env::tools_system_content(chat.system_prompt, tools));
    }
  }
  if (!args.read_task_prompts) {
    RELAY_ASSIGN_OR_RETURN(
        s.task, rollout::make_task_without_prompts(s.config.task, s.config.run.seed, chat));
    return OkStatus();
  }
  RELAY_ASSIGN_OR_RETURN(s.task, rollout::make_task(s.config.task, s.config.run.seed, chat));
  if (s.task->size() >= 0 && args.start + args.prompts > s.task->size()) {
    return InvalidArgumentError(absl::StrCat("--prompts: task '", s.task->name(), "' has ",
                                             s.task->size(), " prompts; asked for [", args.start,
                                             ", ", args.start + args.prompts, ")"));
  }
  return OkStatus();
}

// Token ids the engine may sample: ids past the tokenizer's vocabulary (an
// embedding padded to a multiple of 64 or 128) are never sampled, and an
// eos id there could never end a sequence.
int64_t sampled_vocab(const RolloutSetup& s) {
  return std::min(s.tokenizer->vocab_size(), s.policy->config().vocab_size);
}

// The ids generation stops at: any end-of-sequence id the model directory
// names (the tokenizer's eos from tokenizer_config.json, config.json's
// eos_token_id list, generation_config.json's) within the tokenizer's
// vocabulary, then rollout.stop and the task's stop strings (its chat
// template's end-of-turn token among them).
StatusOr<std::vector<int64_t>> stop_tokens(const std::string& dir, const RolloutSetup& s) {
  std::vector<int64_t> stops;
  auto add_stop = [&](int64_t id) {
    if (id >= 0 && std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  };
  add_stop(s.tokenizer->eos_id());
  for (int64_t id : s.policy->config().eos_token_ids) add_stop(id);
  if (!dir.empty()) {
    RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, model::read_generation_eos_ids(dir));
    for (int64_t id : ids) add_stop(id);
  }
  const int64_t support = sampled_vocab(s);
  stops.erase(std::remove_if(stops.begin(), stops.end(), [&](int64_t id) { return id >= support; }),
              stops.end());
  for (size_t i = 0; i < s.config.rollout.stop.size(); ++i) {
    RELAY_ASSIGN_OR_RETURN(int64_t id, stop_token(*s.tokenizer, s.config.rollout.stop[i],
                                                  absl::StrCat("rollout.stop[", i, "]")));
    add_stop(id);
  }
  for (const std::string& text : s.task->stop_strings()) {
    RELAY_ASSIGN_OR_RETURN(
        int64_t id, stop_token(*s.tokenizer, text, absl::StrCat("task '", s.task->name(), "'")));
    add_stop(id);
  }
  return stops;
}

}  // namespace

StatusOr<RolloutSetup> setup_rollout(const SetupArgs& args) {
  RolloutSetup s;
  RELAY_ASSIGN_OR_RETURN(s.config, load_config(args.config_file, args.overrides));
  if (args.prompts < 1) {
    return InvalidArgumentError(absl::StrCat("--prompts: must be >= 1, got ", args.prompts));
  }
  if (args.start < 0) {
    return InvalidArgumentError(absl::StrCat("--start: must be >= 0, got ", args.start));
  }
  const std::string dir = args.model_dir.empty() ? s.config.model.path : args.model_dir;
  model::configure_threads(s.config.run.threads);
  if (!s.config.run.core_share.empty()) {
    const int cores = s.config.run.threads > 0
                          ? s.config.run.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    StatusOr<std::unique_ptr<model::CoreShare>> share =
        model::CoreShare::open(s.config.run.core_share, cores);
    if (!share.ok()) {
      return InvalidArgumentError(absl::StrCat("run.core_share: ", share.status().message()));
    }
    model::install_core_share(*std::move(share));
    // One line per process, so a run's log says how its cores were shared
    // and whether OpenBLAS's threads give theirs up at once (relay run sets
    // OPENBLAS_THREAD_TIMEOUT for its processes; bin/run_command.cc).
    const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
    std::fprintf(stderr, "relay: %d cores shared through %s; OpenBLAS thread timeout %s\n", cores,
                 s.config.run.core_share.c_str(),
                 timeout != nullptr ? absl::StrCat("2^", timeout, " cycles").c_str()
                                    : "OpenBLAS's default (2^28 cycles)");
  }
  RELAY_RETURN_IF_ERROR(model::apply_attention_choice(s.config.model.attn_implementation));
  RELAY_RETURN_IF_ERROR(model::configure_cpu_memory_from_env());
  // Only where choose_blas_kernels() could not help (an OpenBLAS built for
  // one CPU, or a failed restart): say once why products are slow.
  if (const model::BlasKernels blas = model::blas_kernels(); blas.below_cpu) {
    spdlog::warn("BLAS: {}", model::describe(blas));
  }
  s.model_dir = dir;
  RELAY_RETURN_IF_ERROR(load_or_build_model(dir, s));
  RELAY_RETURN_IF_ERROR(place_on_device(s));
  // The checkpoint's read and conversion buffers: nothing reuses them.
  model::release_free_cpu_memory();
  // trainer.lora: every process of the run (trainer ranks, workers) attaches
  // the same adapters to the same base; a model loaded from an adapter
  // directory has them already (the trainer checks they match).
  if (s.config.trainer.lora.enabled() && !model::has_lora(*s.policy)) {
    RELAY_RETURN_IF_ERROR(model::attach_lora(*s.policy, s.config.trainer.lora, s.config.run.seed));
  }
  RELAY_RETURN_IF_ERROR(make_task(args, s));
  RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> stops, stop_tokens(dir, s));
  // The section's engine options, and what the section cannot know.
  s.engine = s.config.rollout.engine;
  s.engine.stop_tokens = std::move(stops);
  s.engine.autocast = s.config.run.autocast;
  if (sampled_vocab(s) < s.policy->config().vocab_size) s.engine.vocab_limit = sampled_vocab(s);
  return s;
}

StatusOr<trainer::TrainerOptions> trainer_options(const RolloutSetup& s) {
  // The trainer's section, plus what the process knows from other sections.
  trainer::TrainerOptions o = s.config.trainer;
  trainer::share_ppo_settings(o.loss);
  o.temperature =
      s.config.rollout.engine.sampling.temperature;  // score at the sampling temperature
  o.max_response_length = s.config.rollout.engine.max_new_tokens;
  o.loss.clip_cov.seed = s.config.run.seed;
  o.autocast = model::autocast_type(s.config.run.autocast);
  o.pad_token_id = std::max<int64_t>(0, s.tokenizer->pad_id());
  // The trainer scores over the support the engine samples from.
  o.vocab_limit = s.engine.vocab_limit;
  return o;
}

StatusOr<model::SaveOptions> model_save_options(const RolloutSetup& s) {
  model::SaveOptions o;
  o.overwrite = true;
  if (!s.model_dir.empty() && model::has_lora(*s.policy)) {
    // Adapter checkpoints name their base: the model directory, or the base
    // of the adapter directory it was loaded from. (A fresh model's base is
    // saved with the run: trainer_run.cc.)
    std::string base = s.model_dir;
    if (model::is_peft_adapter_dir(base)) {
      RELAY_ASSIGN_OR_RETURN(model::PeftAdapter a, model::read_peft_adapter(base));
      base = a.base_model;
    }
    o.lora_base = std::filesystem::absolute(base).lexically_normal().string();
  }
  if (auto* ct = dynamic_cast<const model::CharTokenizer*>(s.tokenizer.get())) {
    o.extra_files[model::kCharTokenizerFile] = ct->to_json();
    return o;
  }
  // A fresh model (model.init) takes model.tokenizer's file along.
  if (s.model_dir.empty() && s.config.model.tokenizer != "char") {
    RELAY_ASSIGN_OR_RETURN(o.extra_files[model::kHfTokenizerFile],
                           read_file(s.config.model.tokenizer));
    return o;
  }
  // The files HF tools look for next to the weights; whichever the source
  // directory has are carried over unchanged (a PEFT adapter directory
  // without a tokenizer: its base's).
  std::string from = s.model_dir;
  if (model::is_peft_adapter_dir(from) && !std::filesystem::exists(from + "/tokenizer.json")) {
    RELAY_ASSIGN_OR_RETURN(model::PeftAdapter a, model::read_peft_adapter(from));
    from = a.base_model;
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "vocab.json", "merges.txt"}) {
    const std::string path = from + "/" + name;
    if (from.empty() || !std::filesystem::exists(path)) continue;
    RELAY_ASSIGN_OR_RETURN(o.extra_files[name], read_file(path));
  }
  if (o.extra_files.count("tokenizer.json") == 0) {
    return FailedPreconditionError(
        absl::StrCat("model directory ", s.model_dir.empty() ? std::string("(none)") : s.model_dir,
                     " has no tokenizer.json to save with the model"));
  }
  return o;
}

StatusOr<uint64_t> weights_digest(const model::PolicyImpl& policy) {
  RELAY_ASSIGN_OR_RETURN(model::WeightManifest m, model::weight_manifest(policy, 0));
  return m.digest;
}

StatusOr<std::unique_ptr<rollout::Teacher>> load_teacher(const RolloutSetup& s) {
  const std::string& dir = s.config.trainer.distill.teacher;
  if (dir.empty()) return std::unique_ptr<rollout::Teacher>();
  const std::string student = s.model_dir.empty()
                                  ? absl::StrCat("model.tokenizer ", s.config.model.tokenizer)
                                  : absl::StrCat("the student's ", s.model_dir);
  StatusOr<std::unique_ptr<model::Tokenizer>> tokenizer = model::load_tokenizer(dir);
  if (!tokenizer.ok()) {
    return Status(tokenizer.status().code(),
                  absl::StrCat("trainer.distill.teacher: ", tokenizer.status().message()));
  }
  if (std::optional<std::string> d = rollout::tokenizer_difference(*s.tokenizer, **tokenizer)) {
    return InvalidArgumentError(absl::StrCat("trainer.distill.teacher: the tokenizer of ", dir,
                                             " is not the one of ", student, ": ", *d,
                                             "; on-policy distillation needs the same tokenizer"));
  }
  model::LoadOptions lo;
  lo.dtype = model::scalar_type(s.config.model.dtype);
  StatusOr<model::Policy> teacher = model::load_policy(dir, lo);
  if (!teacher.ok()) {
    return Status(teacher.status().code(),
                  absl::StrCat("trainer.distill.teacher: ", teacher.status().message()));
  }
  const at::Tensor weight = s.policy->parameters().front();
  if (!weight.device().is_cpu()) (*teacher)->to(weight.device());
  RELAY_ASSIGN_OR_RETURN(const uint64_t digest, weights_digest(**teacher));
  rollout::TeacherOptions o;
  const int64_t vocab = sampled_vocab(s);
  if (vocab < (*teacher)->config().vocab_size) o.vocab_limit = vocab;
  return std::make_unique<rollout::Teacher>(teacher->ptr(), digest, o);
}

serve::ServedModel served_model(const RolloutSetup& s) {
  serve::ServedModel m;
  m.tokenizer = s.tokenizer;
  m.chat_template = s.chat_template;
  m.stop_tokens = s.engine.stop_tokens;
  m.context =
      s.engine.max_seq_len > 0 ? s.engine.max_seq_len : s.policy->config().max_position_embeddings;
  return m;
}

// One task prompt as an engine group: rollout.n samples, the prompt (and
// target, for prefix guidance) tokenized; errors name the prompt.
StatusOr<rollout::PromptGroup> prompt_group(const RolloutSetup& s, const rollout::TaskPrompt& p,
                                            std::string group_id, uint64_t seed) {
  rollout::PromptGroup g;
  g.group_id = std::move(group_id);
  g.k = s.config.rollout.n;
  g.seed = seed;
  // ReMax's baseline is the reward of a greedy response to the same prompt.
  g.greedy_baseline = s.config.trainer.advantage.estimator == trainer::AdvantageEstimator::kRemax;
  g.episode = s.environment != nullptr;
  StatusOr<std::vector<int64_t>> ids = s.tokenizer->encode(p.prompt);
  if (!ids.ok()) {
    return Status(ids.status().code(), absl::StrCat(p.id, ": prompt: ", ids.status().message()));
  }
  g.prompt = std::move(*ids);
  if (p.target) {
    StatusOr<std::vector<int64_t>> target = s.tokenizer->encode(*p.target);
    if (!target.ok()) {
      return Status(target.status().code(),
                    absl::StrCat(p.id, ": target: ", target.status().message()));
    }
    g.target = std::move(*target);
  }
  return g;
}

rollout::EpisodeDriverOptions episode_driver_options(const RolloutSetup& s) {
  rollout::EpisodeDriverOptions o;
  o.chat_template = s.chat_template;
  o.step_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(s.config.task.environment_timeout_s * 1000)));
  return o;
}

std::unique_ptr<rollout::EpisodeDriver> episode_driver(const RolloutSetup& s,
                                                       rollout::Engine& engine) {
  if (!s.environment) return nullptr;
  return std::make_unique<rollout::EpisodeDriver>(engine, s.environment, s.tokenizer,
                                                  episode_driver_options(s));
}

env::EpisodeStart episode_start(const rollout::TaskPrompt& p) {
  return {p.id, p.prompt, p.reference};
}

Status score_group(const RolloutSetup& s, rollout::SafeVerifier& verifier,
                   const rollout::TaskPrompt& prompt, rollout::TrajectoryGroup& g,
                   const ScoredFn& on_scored) {
  auto score_one = [&](int64_t index, rollout::Trajectory& t) -> Status {
    // An episode's answer is its last model turn.
    RELAY_ASSIGN_OR_RETURN(std::string text, s.tokenizer->decode(t.answer_tokens()));
    std::string error;
    const rollout::Score score = rollout::episode_score(verifier.score(prompt, text, &error), t);
    t.reward = score.reward;
    t.sub_scores = score.sub_scores;
    if (on_scored) on_scored(index, t, text, score, error);
    return OkStatus();
  };
  for (size_t i = 0; i < g.trajectories.size(); ++i) {
    RELAY_RETURN_IF_ERROR(score_one(static_cast<int64_t>(i), g.trajectories[i]));
  }
  if (g.baseline) RELAY_RETURN_IF_ERROR(score_one(-1, *g.baseline));
  return OkStatus();
}

StatusOr<std::string> auth_token(const ServicesConfig& services, const std::string& flag) {
  if (!flag.empty()) return flag;
  if (!services.token_file.empty()) {
    StatusOr<std::string> text = read_file(services.token_file);
    if (!text.ok()) {
      return InvalidArgumentError(
          absl::StrCat("services.token_file: ", std::string(text.status().message())));
    }
    const std::string token = text->substr(0, text->find_first_of("\r\n"));
    if (token.empty()) {
      return InvalidArgumentError(
          absl::StrCat("services.token_file: ", services.token_file, " has an empty first line"));
    }
    return token;
  }
  const char* env = std::getenv("RELAY_TOKEN");
  return std::string(env != nullptr ? env : "");
}

}  // namespace relay::app
