#include "relay/app/evaluation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "relay/common/progress.h"
#include "relay/model/checkpoint.h"
#include "relay/rollout/eval_metrics.h"
#include "relay/rollout/generate.h"

namespace relay::app {

std::map<std::string, double> EvalResult::metrics() const {
  std::map<std::string, double> m = {{"accuracy", accuracy}, {"reward", reward}};
  if (n > 0) {
    for (const auto& [k, v] : pass_at_k) m[absl::StrCat("pass@", k)] = v;
    m["sample_reward"] = sample_reward;
  }
  if (tool_use >= 0) m["tool_use"] = tool_use;
  return m;
}

namespace {

// The held-out prompts, encoded, beside what the verifier scores them against.
struct EvalPrompts {
  std::vector<std::vector<int64_t>> ids;
  std::vector<rollout::TaskPrompt> tasks;
};

StatusOr<EvalPrompts> encode_eval_prompts(const RolloutSetup& s, const PromptSplit& split) {
  EvalPrompts p;
  for (int64_t i = 0; i < split.eval; ++i) {
    RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt t, s.task->prompt(split.eval_index(i)));
    RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, s.tokenizer->encode(t.prompt));
    p.ids.push_back(std::move(ids));
    p.tasks.push_back(std::move(t));
  }
  return p;
}

// Work items begin .. end - 1, split by decoding: item w is prompt
// w / per_prompt, greedy when it is the first of its prompt, sampled after.
struct EvalBatch {
  std::vector<std::vector<int64_t>> greedy_in, sampled_in;
  std::vector<int64_t> greedy_of, sampled_of;  // prompt index of each input
};

EvalBatch slice_work(const EvalPrompts& p, int64_t begin, int64_t end, int64_t per_prompt) {
  EvalBatch b;
  for (int64_t w = begin; w < end; ++w) {
    const int64_t i = w / per_prompt;
    if (w % per_prompt == 0) {
      b.greedy_in.push_back(p.ids[i]);
      b.greedy_of.push_back(i);
    } else {
      b.sampled_in.push_back(p.ids[i]);
      b.sampled_of.push_back(i);
    }
  }
  return b;
}

// Sums over the work items scored so far.
struct EvalTally {
  std::vector<int64_t> correct;  // per prompt: its correct samples
  double greedy_correct = 0, greedy_reward = 0, sample_reward = 0;
  int64_t greedy_seen = 0;
};

// What every batch of one evaluation shares. The scorer is a clone, so
// generating never touches the caller's policy.
struct EvalRun {
  const RolloutSetup& s;
  model::Policy scorer;
  const EvalPrompts& prompts;
  rollout::SafeVerifier& verifier;
  const EvalOptions& o;
};

// Generates for `in` (prompt indices `of`) and scores each output into `t`.
Status generate_and_score(EvalRun& run, int64_t begin, const std::vector<std::vector<int64_t>>& in,
                          const std::vector<int64_t>& of, bool greedy, EvalTally& t) {
  if (in.empty()) return OkStatus();
  rollout::GenerateOptions g;
  g.max_new_tokens = run.s.engine.max_new_tokens;
  g.stop_tokens = run.s.engine.stop_tokens;
  g.sampling.greedy = greedy;
  g.sampling.temperature = run.o.temperature;
  // Distinct from the training stream's seeds, and fixed per batch.
  g.seed =
      rollout::sequence_seed(run.s.config.run.seed ^ 0x6576616cULL, static_cast<uint64_t>(begin));
  RELAY_ASSIGN_OR_RETURN(std::vector<rollout::Generation> out,
                         rollout::generate(run.scorer, in, g));
  for (size_t k = 0; k < out.size(); ++k) {
    RELAY_ASSIGN_OR_RETURN(std::string text, run.s.tokenizer->decode(out[k].tokens));
    const rollout::Score score = run.verifier.score(run.prompts.tasks[of[k]], text);
    const bool ok = rollout::is_correct(score);
    if (greedy) {
      t.greedy_correct += ok ? 1 : 0;
      t.greedy_reward += score.reward;
    } else {
      t.correct[of[k]] += ok ? 1 : 0;
      t.sample_reward += score.reward;
    }
  }
  return OkStatus();
}

// The evaluation's own copy of `policy`, on the run's device: the weights
// it is given may be a host copy (rank 0's with trainer.sharding: full).
model::Policy eval_copy(const RolloutSetup& s, const model::Policy& policy) {
  model::Policy copy = model::clone_policy(*policy);
  if (s.policy) {
    const c10::Device device = s.policy->parameters().front().device();
    if (copy->parameters().front().device() != device) copy->to(device);
  }
  return copy;
}

// Episodes of every held-out prompt, k each, greedy or sampled at the eval
// temperature, through an engine and the run's environment.
StatusOr<std::vector<rollout::TrajectoryGroup>> run_episodes(const RolloutSetup& s,
                                                             const model::Policy& policy,
                                                             const EvalPrompts& prompts,
                                                             const EvalOptions& o, bool greedy,
                                                             int64_t k) {
  rollout::EngineOptions eo = s.engine;
  eo.sampling.greedy = greedy;
  eo.sampling.temperature = o.temperature;
  eo.prefix = {};  // no forced prefixes in an evaluation
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Engine> engine,
                         rollout::Engine::create(eval_copy(s, policy), eo, 0, 0));
  std::unique_ptr<rollout::EpisodeDriver> driver = episode_driver(s, *engine);
  for (size_t i = 0; i < prompts.ids.size(); ++i) {
    rollout::PromptGroup g;
    g.group_id = std::to_string(i);
    g.prompt = prompts.ids[i];
    g.k = static_cast<int>(k);
    g.seed = rollout::sequence_seed(s.config.run.seed ^ 0x6576616cULL, i);
    g.episode = true;
    driver->begin_group(g.group_id, episode_start(prompts.tasks[i]));
    RELAY_RETURN_IF_ERROR(engine->submit(std::move(g)));
  }
  return engine->run();
}

// A greedy episode used its tools well: at least one call ran, none refused.
bool used_tools(const rollout::Trajectory& t) {
  int64_t calls = 0, errors = 0;
  for (const rollout::EpisodeTurn& turn : t.turns) {
    calls += turn.tool_calls;
    errors += turn.tool_errors;
  }
  return calls > 0 && errors == 0;
}

StatusOr<EvalResult> evaluate_episodes(const RolloutSetup& s, const model::Policy& policy,
                                       const EvalPrompts& prompts, rollout::SafeVerifier& verifier,
                                       const EvalOptions& o) {
  EvalResult r;
  r.prompts = static_cast<int64_t>(prompts.ids.size());
  r.n = o.n;
  if (prompts.ids.empty()) return r;
  std::vector<int64_t> correct(prompts.ids.size(), 0);
  double tool_use = 0, greedy_correct = 0, greedy_reward = 0, sample_reward = 0;
  for (const bool greedy : {true, false}) {
    if (!greedy && o.n == 0) break;
    RELAY_ASSIGN_OR_RETURN(std::vector<rollout::TrajectoryGroup> groups,
                           run_episodes(s, policy, prompts, o, greedy, greedy ? 1 : o.n));
    for (rollout::TrajectoryGroup& g : groups) {
      const size_t i = std::stoul(g.group_id);
      RELAY_RETURN_IF_ERROR(score_group(s, verifier, prompts.tasks[i], g, nullptr));
      for (const rollout::Trajectory& t : g.trajectories) {
        rollout::Score score;
        score.reward = t.reward;
        score.sub_scores = t.sub_scores;
        const bool ok = rollout::is_correct(score);
        if (greedy) {
          greedy_correct += ok ? 1 : 0;
          greedy_reward += t.reward;
          tool_use += used_tools(t) ? 1 : 0;
        } else {
          correct[i] += ok ? 1 : 0;
          sample_reward += t.reward;
        }
      }
    }
  }
  const auto P = static_cast<double>(r.prompts);
  r.accuracy = greedy_correct / P;
  r.reward = greedy_reward / P;
  r.tool_use = tool_use / P;
  if (o.n > 0) {
    r.pass_at_k = rollout::mean_pass_at_k(correct, o.n);
    r.sample_reward = sample_reward / (P * static_cast<double>(o.n));
  }
  return r;
}

}  // namespace

StatusOr<EvalResult> evaluate_held_out(const RolloutSetup& s, const model::Policy& policy,
                                       const PromptSplit& split, rollout::SafeVerifier& verifier,
                                       const EvalOptions& o) {
  if (o.n < 0) return InvalidArgumentError(absl::StrCat("eval.n: must be >= 0, got ", o.n));
  RELAY_ASSIGN_OR_RETURN(const EvalPrompts prompts, encode_eval_prompts(s, split));
  if (s.environment) return evaluate_episodes(s, policy, prompts, verifier, o);
  EvalResult r;
  r.prompts = static_cast<int64_t>(prompts.ids.size());
  r.n = o.n;
  if (prompts.ids.empty()) return r;
  // Work items: prompt i greedily, then its n samples.
  const int64_t per_prompt = 1 + o.n;
  const int64_t total = r.prompts * per_prompt;
  const int64_t batch = std::max<int64_t>(1, o.batch) * per_prompt;
  std::optional<Progress> progress;
  if (!o.progress.empty()) progress.emplace(o.progress, total);
  EvalRun run{s, eval_copy(s, policy), prompts, verifier, o};
  EvalTally t;
  t.correct.assign(prompts.ids.size(), 0);
  for (int64_t begin = 0; begin < total; begin += batch) {
    const int64_t end = std::min(total, begin + batch);
    const EvalBatch b = slice_work(prompts, begin, end, per_prompt);
    RELAY_RETURN_IF_ERROR(generate_and_score(run, begin, b.greedy_in, b.greedy_of, true, t));
    RELAY_RETURN_IF_ERROR(generate_and_score(run, begin, b.sampled_in, b.sampled_of, false, t));
    if (progress) {
      t.greedy_seen += static_cast<int64_t>(b.greedy_in.size());
      progress->update(end, absl::StrFormat("accuracy %.3f", t.greedy_correct / t.greedy_seen));
    }
  }
  r.accuracy = t.greedy_correct / static_cast<double>(r.prompts);
  r.reward = t.greedy_reward / static_cast<double>(r.prompts);
  if (o.n > 0) {
    r.pass_at_k = rollout::mean_pass_at_k(t.correct, o.n);
    r.sample_reward = t.sample_reward / static_cast<double>(r.prompts * o.n);
  }
  if (progress) progress->finish(absl::StrFormat("accuracy %.3f", r.accuracy));
  return r;
}

StatusOr<double> evaluate(const RolloutSetup& s, const model::Policy& policy,
                          const PromptSplit& split, rollout::SafeVerifier& verifier) {
  RELAY_ASSIGN_OR_RETURN(EvalResult r, evaluate_held_out(s, policy, split, verifier, {}));
  return r.accuracy;
}

HeldOutEvaluator::HeldOutEvaluator(const RolloutSetup& s, const PromptSplit& split,
                                   rollout::SafeVerifier* verifier, MetricsSink* metrics,
                                   EvalReport report, const EvalOptions& options)
    : s_(s),
      split_(split),
      verifier_(verifier),
      metrics_(metrics),
      report_(report),
      options_(options) {}

StatusOr<double> HeldOutEvaluator::evaluate(int64_t step, const std::string& label,
                                            const model::Policy& policy) {
  if (report_ == EvalReport::kLocal) return evaluate_local(step, label, policy);
  if (split_.eval == 0) return std::nan("");
  EvalOptions eo = options_;
  eo.progress = absl::StrCat("eval ", label);
  RELAY_ASSIGN_OR_RETURN(EvalResult r, evaluate_held_out(s_, policy, split_, *verifier_, eo));
  std::string passes;
  for (const auto& [k, v] : r.pass_at_k) passes += absl::StrFormat("  pass@%d %.3f", k, v);
  std::printf("eval %s: accuracy %.3f on %lld held-out prompts%s\n", label.c_str(), r.accuracy,
              static_cast<long long>(r.prompts), passes.c_str());
  std::fflush(stdout);
  metrics_->record("eval", step, r.metrics());
  return r.accuracy;
}

StatusOr<double> HeldOutEvaluator::evaluate_local(int64_t step, const std::string& label,
                                                  const model::Policy& policy) {
  RELAY_ASSIGN_OR_RETURN(double accuracy, app::evaluate(s_, policy, split_, *verifier_));
  if (label == "before") {
    std::printf("eval before: accuracy %.3f on %lld held-out prompts\n", accuracy,
                static_cast<long long>(split_.eval));
  } else if (label == "after") {
    std::printf("eval after: accuracy %.3f; verifier errors %lld, timeouts %lld\n", accuracy,
                static_cast<long long>(verifier_->errors()),
                static_cast<long long>(verifier_->timeouts()));
  } else {
    std::printf("eval %s: accuracy %.3f\n", label.c_str(), accuracy);
  }
  metrics_->record("eval", step, {{"accuracy", accuracy}});
  return accuracy;
}

}  // namespace relay::app
