// relay eval: held-out accuracy and pass@k of a model directory on a task,
// with the same engine, prompts and scoring the trainer's evaluations use,
// so `relay eval --model runs/x/checkpoints/step_000060 --task x.yaml`
// reproduces the trainer's eval/accuracy for that step.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bin/commands.h"
#include "relay/app/evaluation.h"
#include "relay/app/setup.h"

namespace relay::cli {
namespace {

struct EvalArgs {
  std::string model_dir;    // HF-layout model directory (weights and tokenizer)
  std::string config_file;  // experiment config: its task and eval sections
  std::vector<std::string> overrides;
  std::optional<int64_t> n, prompts;  // eval.n, eval.prompts
  std::optional<double> temperature;  // eval.temperature
  bool json = false;
};

int fail(const Status& s) { return cli::fail("eval", s); }

int eval_model(const EvalArgs& args) {
  app::SetupArgs ra;
  ra.config_file = args.config_file;
  ra.overrides = args.overrides;
  if (args.n) ra.overrides.push_back(absl::StrCat("eval.n=", *args.n));
  if (args.prompts) ra.overrides.push_back(absl::StrCat("eval.prompts=", *args.prompts));
  if (args.temperature) {
    ra.overrides.push_back(absl::StrCat("eval.temperature=", *args.temperature));
  }
  ra.model_dir = args.model_dir;
  StatusOr<app::RolloutSetup> s = app::setup_rollout(ra);
  if (!s.ok()) return fail(s.status());
  const EvalConfig& ev = s->config.eval;
  if (ev.prompts < 1) {
    return fail(InvalidArgumentError(absl::StrCat(
        "eval.prompts: ", args.config_file,
        " holds out no prompts (eval.prompts is 0); set it there or pass --prompts N")));
  }
  app::PromptSplit split{s->task->size(), ev.prompts};
  if (split.size >= 0 && split.eval > split.size) {
    return fail(InvalidArgumentError(absl::StrCat("eval.prompts: task '", s->task->name(), "' has ",
                                                  split.size, " prompts, asked for ", split.eval)));
  }
  rollout::SafeVerifier verifier(
      s->task,
      std::chrono::milliseconds(static_cast<int64_t>(s->config.task.verifier_timeout_s * 1000)));
  app::EvalOptions o;
  o.n = ev.n;
  o.temperature = ev.temperature;
  if (!args.json) o.progress = "eval";
  StatusOr<app::EvalResult> r = app::evaluate_held_out(*s, s->policy, split, verifier, o);
  if (!r.ok()) return fail(r.status());
  if (args.json) {
    nlohmann::json j = {
        {"model", args.model_dir}, {"task", s->task->name()}, {"prompts", r->prompts}, {"n", r->n}};
    for (const auto& [k, v] : r->metrics()) j[k] = v;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s on %lld held-out prompts of task '%s'\n", args.model_dir.c_str(),
              static_cast<long long>(r->prompts), s->task->name().c_str());
  std::printf("  accuracy (greedy)  %.4f\n", r->accuracy);
  std::printf("  reward (greedy)    %.4f\n", r->reward);
  for (const auto& [k, v] : r->pass_at_k) {
    std::printf("  pass@%-13lld %.4f   (%lld samples per prompt, temperature %g)\n",
                static_cast<long long>(k), v, static_cast<long long>(r->n), ev.temperature);
  }
  if (r->n > 0) std::printf("  sample reward      %.4f\n", r->sample_reward);
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& relay) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* eval = relay.add_subcommand(
      "eval", "Held-out greedy accuracy and pass@k of a model on a task, with the rollout engine");
  eval->add_option("--model", args->model_dir, "HF-layout model directory")->required();
  eval->add_option("--task", args->config_file,
                   "Experiment config whose task and eval sections to use")
      ->required();
  eval->add_option("overrides", args->overrides, "key.path=value overrides");
  eval->add_option("--n", args->n, "Samples per prompt for pass@k (eval.n; 0 = greedy only)");
  eval->add_option("--prompts", args->prompts, "Held-out prompts (eval.prompts)");
  eval->add_option("--temperature", args->temperature,
                   "Sampling temperature of the n samples (eval.temperature)");
  eval->add_flag("--json", args->json, "Print one JSON object");
  return {eval, [args] { return eval_model(*args); }};
}

}  // namespace relay::cli
