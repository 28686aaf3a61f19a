#pragma once

// What the programs share: loading a config, model, tokenizer and task for
// rollouts; prompts as engine groups; scoring responses. Used by relay
// (rollout, train-local, eval), relay-trainer and relay-rollout, compiled
// once into relay_app (evaluation.h and warm_start.h build on it).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/config/config.h"
#include "relay/env/environment.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/episode_driver.h"
#include "relay/rollout/task.h"
#include "relay/rollout/teacher.h"
#include "relay/serve/openai_server.h"
#include "relay/trainer/trainer.h"

namespace relay::app {

// Makes std::terminate print an exception that escaped (from main or any
// thread) as one line, "<program>: uncaught exception: <message>", without
// the C++ stack trace a c10::Error's what() carries, and then abort as it
// would have. A last resort: errors are Status values, and this only
// catches what was missed. Call first thing in main.
void report_uncaught_exceptions(const char* program);

// What setup_rollout loads.
struct SetupArgs {
  std::string config_file;
  std::vector<std::string> overrides;  // key.path=value
  std::string model_dir;               // default: model.path
  // The task prompts the caller samples, [start, start + prompts): checked
  // against a finite task's size.
  int64_t prompts = 1;
  int64_t start = 0;
  // false: the caller samples no task prompt (relay serve), so a task read
  // from a file is built without reading it (rollout::make_task_without_prompts):
  // only its stop strings and chat format are used.
  bool read_task_prompts = true;
};

struct RolloutSetup {
  ExperimentConfig config;
  std::string model_dir;  // where the policy came from; empty = built from model.init
  model::Policy policy{nullptr};
  std::shared_ptr<model::Tokenizer> tokenizer;
  std::shared_ptr<rollout::Task> task;
  rollout::EngineOptions engine;
  model::ChatTemplate chat_template = model::ChatTemplate::kNone;  // model.chat_template, resolved
  // task.environment: what answers the turns of every sample, which is then
  // an episode (rollout/episode_driver.h); null = single-turn responses.
  std::shared_ptr<const env::EnvironmentFactory> environment;
};

// Prompt indices: a finite task keeps its last `eval` prompts for evaluation
// and cycles through the rest; a generated stream evaluates far from where
// training reads.
struct PromptSplit {
  int64_t size = -1;
  int64_t eval = 0;
  int64_t train_index(int64_t k) const { return size < 0 ? k : k % (size - eval); }
  int64_t eval_index(int64_t i) const {
    return size < 0 ? (int64_t{1} << 40) + i : size - eval + i;
  }
};

// Decodes and scores every response of `g` (samples and greedy baseline) in
// place; `on_scored` sees each sample (index, text, score, verifier error),
// the baseline with index -1.
using ScoredFn = std::function<void(int64_t, const rollout::Trajectory&, const std::string&,
                                    const rollout::Score&, const std::string&)>;

// Each stop string must be exactly one token of the tokenizer.
StatusOr<int64_t> stop_token(const model::Tokenizer& tokenizer, const std::string& text,
                             const std::string& field);

// The architecture model.init describes, for `tokenizer`'s vocabulary.
StatusOr<model::PolicyConfig> policy_config_from_init(const ExperimentConfig& config,
                                                      const model::Tokenizer& tokenizer);

// Config, model (args.model_dir or model.path; when both are empty, a fresh
// model from model.init seeded by run.seed), tokenizer, task and engine
// options with every stop token resolved. Errors name the flag or field.
StatusOr<RolloutSetup> setup_rollout(const SetupArgs& args);

// The trainer's options for this setup: config.trainer with share_ppo_settings,
// the sampling temperature, run.seed, run.autocast, the
// tokenizer's pad id and the vocabulary support the engine samples from.
StatusOr<trainer::TrainerOptions> trainer_options(const RolloutSetup& s);

// How to write s's policy as a model directory others can load: the
// tokenizer goes with it (relay's char tokenizer file, or the Hugging Face
// tokenizer files of the directory the model came from).
StatusOr<model::SaveOptions> model_save_options(const RolloutSetup& s);

// The manifest digest of a policy's weights (model/weight_manifest.h).
StatusOr<uint64_t> weights_digest(const model::PolicyImpl& policy);

// What the OpenAI endpoint must know of the model (relay serve, and a
// worker's endpoint for agents): tokenizer, chat template, stop tokens, and
// the context (rollout.max_seq_len, else the model's positions).
serve::ServedModel served_model(const RolloutSetup& s);

// One task prompt as an engine group: rollout.n samples, the prompt (and
// target, for prefix guidance) tokenized; errors name the prompt.
StatusOr<rollout::PromptGroup> prompt_group(const RolloutSetup& s, const rollout::TaskPrompt& p,
                                            std::string group_id, uint64_t seed);

// The episode driver's options: the resolved chat template and
// task.environment_timeout_s.
rollout::EpisodeDriverOptions episode_driver_options(const RolloutSetup& s);
// The driver that answers `engine`'s episode turns with s.environment, or
// null without one (single-turn). It must go before the engine.
std::unique_ptr<rollout::EpisodeDriver> episode_driver(const RolloutSetup& s,
                                                       rollout::Engine& engine);
// A task prompt as the start of an episode.
env::EpisodeStart episode_start(const rollout::TaskPrompt& p);

// Decodes and scores every response of `g` (samples and greedy baseline) in
// place; `on_scored` sees each (index, trajectory, text, score, verifier
// error), the baseline with index -1. An episode's text is its last model
// turn (Trajectory::answer_tokens), and the environment's turn rewards add
// to the verifier's (sub-score "environment").
Status score_group(const RolloutSetup& s, rollout::SafeVerifier& verifier,
                   const rollout::TaskPrompt& prompt, rollout::TrajectoryGroup& g,
                   const ScoredFn& on_scored = nullptr);

// On-policy distillation's teacher for s's student (trainer.distill.teacher),
// or null when distillation is off: the model directory loaded in
// model.dtype onto the student's device, refused (naming both) when its
// tokenizer is not the student's, scoring over the student's vocabulary.
StatusOr<std::unique_ptr<rollout::Teacher>> load_teacher(const RolloutSetup& s);

// The shared bearer token: `flag` when given, else services.token_file's
// first line, else $RELAY_TOKEN, else none (empty). Errors name the field.
StatusOr<std::string> auth_token(const ServicesConfig& services, const std::string& flag);

}  // namespace relay::app
