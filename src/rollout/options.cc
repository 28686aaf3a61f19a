#include "relay/rollout/options.h"

#include "absl/strings/numbers.h"
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
  Problems agent = p.at("agent");
  agent.positive("episode_timeout_s", r.agent.episode_timeout_s);
  if (!r.agent.listen.empty()) {
    const size_t colon = r.agent.listen.rfind(':');
    int port = -1;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(r.agent.listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
      agent.add("listen", "must be host:port (port 0 = any free one)", r.agent.listen);
    } else if (r.workers > 1 && port != 0) {
      agent.add("listen",
                absl::StrCat("names port ", port, ", which the ", r.workers,
                             " workers of rollout.workers cannot all listen on; use port 0"),
                r.agent.listen);
    }
  } else if (!r.agent.command.empty()) {
    agent.add("command", "needs rollout.agent.listen: the endpoint the agent plays through",
              r.agent.command.front());
  }
  for (size_t i = 0; i < r.agent.command.size(); ++i) {
    if (r.agent.command[i].empty()) {
      agent.add(absl::StrCat("command[", i, "]"), "must be non-empty, got ''");
    }
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
  p.at("math_answer").in_range("format_reward", task.math_answer.format_reward, 0, 1);
  Problems jsonl = p.at("jsonl");
  jsonl.non_empty("prompt_key", task.jsonl.prompt_key);
  jsonl.non_empty("answer_key", task.jsonl.answer_key);
}

}  // namespace relay
