#include "bin/setup.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "relay/model/checkpoint.h"
#include "relay/model/threads.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/generate.h"

namespace relay::cli {

StatusOr<int64_t> stop_token(const model::Tokenizer& tokenizer, const std::string& text,
                             const std::string& field) {
  if (std::optional<int64_t> id = tokenizer.token_id(text)) return *id;
  StatusOr<std::vector<int64_t>> ids = tokenizer.encode(text);
  if (ids.ok() && ids->size() == 1) return (*ids)[0];
  return InvalidArgumentError(
      absl::StrCat(field, ": stop text '", text, "' is not a single token of the tokenizer"));
}

StatusOr<RolloutSetup> setup_rollout(const RolloutArgs& args) {
  RolloutSetup s;
  RELAY_ASSIGN_OR_RETURN(s.config, load_config(args.config_file, args.overrides));
  if (args.prompts < 1) {
    return InvalidArgumentError(absl::StrCat("--prompts: must be >= 1, got ", args.prompts));
  }
  if (args.start < 0) {
    return InvalidArgumentError(absl::StrCat("--start: must be >= 0, got ", args.start));
  }
  const std::string dir = args.model_dir.empty() ? s.config.model.path : args.model_dir;
  if (dir.empty()) {
    return InvalidArgumentError("model.path: empty; give a model directory with --model");
  }
  model::configure_threads(s.config.run.threads);
  RELAY_ASSIGN_OR_RETURN(s.policy, model::load_policy(dir));
  RELAY_ASSIGN_OR_RETURN(s.tokenizer, model::load_tokenizer(dir));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Task> task,
                         rollout::make_task(s.config.task, s.config.run.seed));
  s.task = std::move(task);
  if (s.task->size() >= 0 && args.start + args.prompts > s.task->size()) {
    return InvalidArgumentError(absl::StrCat("--prompts: task '", s.task->name(), "' has ",
                                             s.task->size(), " prompts; asked for [", args.start,
                                             ", ", args.start + args.prompts, ")"));
  }
  std::vector<int64_t> stops;
  if (s.tokenizer->eos_id() >= 0) stops.push_back(s.tokenizer->eos_id());
  for (size_t i = 0; i < s.config.rollout.stop.size(); ++i) {
    RELAY_ASSIGN_OR_RETURN(int64_t id, stop_token(*s.tokenizer, s.config.rollout.stop[i],
                                                  absl::StrCat("rollout.stop[", i, "]")));
    stops.push_back(id);
  }
  for (const std::string& text : s.task->stop_strings()) {
    RELAY_ASSIGN_OR_RETURN(
        int64_t id, stop_token(*s.tokenizer, text, absl::StrCat("task '", s.task->name(), "'")));
    stops.push_back(id);
  }
  RELAY_ASSIGN_OR_RETURN(s.engine, rollout::engine_options(s.config.rollout, stops));
  return s;
}

StatusOr<uint64_t> weights_digest(const model::PolicyImpl& policy) {
  RELAY_ASSIGN_OR_RETURN(model::WeightManifest m, model::weight_manifest(policy, 0));
  return m.digest;
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
  g.greedy_baseline = s.config.trainer.advantage.estimator == "remax";
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

Status score_group(const RolloutSetup& s, rollout::SafeVerifier& verifier,
                   const rollout::TaskPrompt& prompt, rollout::TrajectoryGroup& g,
                   const ScoredFn& on_scored) {
  auto score_one = [&](int64_t index, rollout::Trajectory& t) -> Status {
    RELAY_ASSIGN_OR_RETURN(std::string text, s.tokenizer->decode(t.response_tokens));
    std::string error;
    rollout::Score score = verifier.score(prompt, text, &error);
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

// Greedy accuracy (mean reward) on the held-out prompts.
StatusOr<double> evaluate(const RolloutSetup& s, const model::Policy& policy,
                          const PromptSplit& split, rollout::SafeVerifier& verifier) {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<rollout::TaskPrompt> task_prompts;
  for (int64_t i = 0; i < split.eval; ++i) {
    RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p, s.task->prompt(split.eval_index(i)));
    RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, s.tokenizer->encode(p.prompt));
    prompts.push_back(std::move(ids));
    task_prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return 0.0;
  rollout::GenerateOptions g;
  g.max_new_tokens = s.engine.max_new_tokens;
  g.sampling.greedy = true;
  g.stop_tokens = s.engine.stop_tokens;
  RELAY_ASSIGN_OR_RETURN(std::vector<rollout::Generation> out,
                         rollout::generate(model::clone_policy(*policy), prompts, g));
  double total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    RELAY_ASSIGN_OR_RETURN(std::string text, s.tokenizer->decode(out[i].tokens));
    total += verifier.score(task_prompts[i], text).reward;
  }
  return total / static_cast<double>(out.size());
}

}  // namespace relay::cli
