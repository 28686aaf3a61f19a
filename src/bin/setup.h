#pragma once

// What the command-line tools share: loading a config, model, tokenizer and
// task for rollouts; prompts as engine groups; scoring responses; held-out
// evaluation. Used by relay (rollout, train-local), relay-trainer and
// relay-rollout.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bin/commands.h"
#include "relay/common/config.h"
#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/task.h"
#include "relay/trainer/trainer.h"

namespace relay::cli {

struct RolloutSetup {
  ExperimentConfig config;
  model::Policy policy{nullptr};
  std::shared_ptr<model::Tokenizer> tokenizer;
  std::shared_ptr<rollout::Task> task;
  rollout::EngineOptions engine;
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
StatusOr<RolloutSetup> setup_rollout(const RolloutArgs& args);

// The manifest digest of a policy's weights (model/weight_manifest.h).
StatusOr<uint64_t> weights_digest(const model::PolicyImpl& policy);

// One task prompt as an engine group: rollout.n samples, the prompt (and
// target, for prefix guidance) tokenized; errors name the prompt.
StatusOr<rollout::PromptGroup> prompt_group(const RolloutSetup& s, const rollout::TaskPrompt& p,
                                            std::string group_id, uint64_t seed);

// Decodes and scores every response of `g` (samples and greedy baseline) in
// place; `on_scored` sees each (index, trajectory, text, score, verifier
// error), the baseline with index -1.
Status score_group(const RolloutSetup& s, rollout::SafeVerifier& verifier,
                   const rollout::TaskPrompt& prompt, rollout::TrajectoryGroup& g,
                   const ScoredFn& on_scored = nullptr);

// Greedy accuracy (mean reward) on the held-out prompts.
StatusOr<double> evaluate(const RolloutSetup& s, const model::Policy& policy,
                          const PromptSplit& split, rollout::SafeVerifier& verifier);

// A demonstration for supervised steps: the task's target solution as the
// response (FailedPrecondition naming the prompt when the task has none).
StatusOr<rollout::TrajectoryGroup> demonstration(const RolloutSetup& s, int64_t index,
                                                 int64_t version);

struct WarmStart {
  int64_t steps = 0;
  double lr = 1e-3;
  int64_t batch = 32;  // demonstrations per step
};
// Supervised warm start of s.policy from `version`: `ws.steps` SFT steps on
// the training prompts' targets, with an optimizer of its own (Adam's
// moments from supervised steps are no guide for the RL objective). Returns
// the version after it; `on_step(k, metrics)` sees each step.
StatusOr<int64_t> warm_start(
    const RolloutSetup& s, const trainer::TrainerOptions& options, const PromptSplit& split,
    int64_t version, const WarmStart& ws,
    const std::function<void(int64_t, const trainer::StepMetrics&)>& on_step);

// The shared bearer token: `flag` when given, else services.token_file's
// first line, else $RELAY_TOKEN, else none (empty). Errors name the field.
StatusOr<std::string> auth_token(const ServicesConfig& services, const std::string& flag);

}  // namespace relay::cli
