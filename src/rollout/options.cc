#include "relay/rollout/options.h"

#include "absl/strings/str_cat.h"

namespace relay {

void check(const RolloutConfig& r, Problems p) {
  p.at_least("n", r.n, 1);
  p.at_least("workers", r.workers, 1);
  p.at_least("groups_in_flight", r.groups_in_flight, 1);
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty()) p.add(absl::StrCat("stop[", i, "]"), "must be non-empty, got ''");
  }
  // The section's keys are the engine's, at the same level.
  check(r.engine, p);
  const int n_prefix = r.engine.prefix.n_prefix;
  if (n_prefix > r.n) {
    p.at("prefix").add("n_prefix", absl::StrCat("must be <= ", p.path("n"), " (", r.n, ")"),
                       n_prefix);
  }
}

void check(const TaskConfig& task, Problems p) {
  if (task.name != rollout::TaskKind::kArithmetic && task.path.empty()) {
    p.add("path",
          absl::StrCat("must name a JSONL file for task '", rollout::kTaskKindNames.name(task.name),
                       "'"),
          task.path);
  }
  p.positive("verifier_timeout_s", task.verifier_timeout_s);
  p.positive("environment_timeout_s", task.environment_timeout_s);
  const bool remote = task.environment == rollout::EnvironmentKind::kRemote;
  if (remote && task.environment_address.empty()) {
    p.add("environment_address",
          "must name the environment server (host:port) for environment 'remote'",
          task.environment_address);
  } else if (!remote && !task.environment_address.empty()) {
    p.add("environment_address",
          absl::StrCat("is only read with environment 'remote', and environment is '",
                       rollout::kEnvironmentKindNames.name(task.environment), "'"),
          task.environment_address);
  }
  check(task.arithmetic, p.at("arithmetic"));
  if (task.name == rollout::TaskKind::kArithmetic &&
      task.arithmetic.format == rollout::ArithmeticFormat::kCalculator &&
      task.environment == rollout::EnvironmentKind::kNone) {
    p.at("arithmetic")
        .add("format",
             "calculator's targets are tool calls: it needs task.environment calculator or "
             "remote (a tool to answer them)");
  }
  p.at("math_answer").in_range("format_reward", task.math_answer.format_reward, 0, 1);
  Problems jsonl = p.at("jsonl");
  jsonl.non_empty("prompt_key", task.jsonl.prompt_key);
  jsonl.non_empty("answer_key", task.jsonl.answer_key);
}

}  // namespace relay
