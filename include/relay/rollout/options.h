#pragma once

// The rollout side's config sections: `rollout:` (the group size, worker
// processes, and the generation engine's own options, EngineOptions from
// relay/rollout/engine_options.h) and `task:` (where prompts come from, how
// responses are scored). Rules in check(), YAML keys in
// relay/rollout/option_keys.h. No LibTorch: tasks build without it.

#include <cstdint>
#include <string>
#include <vector>

#include "relay/common/name_table.h"
#include "relay/common/problems.h"
#include "relay/rollout/engine_options.h"

namespace relay {
namespace rollout {

// Where a task's prompts come from and how they are scored (relay/rollout/task.h).
enum class TaskKind { kArithmetic, kMathAnswer, kJsonl };
inline const NameTable<TaskKind> kTaskKindNames{"task",
                                                {{"arithmetic", TaskKind::kArithmetic},
                                                 {"math_answer", TaskKind::kMathAnswer},
                                                 {"jsonl", TaskKind::kJsonl}}};

// The environment that answers a model's turns (relay/env/environment.h):
// none = single-turn responses; calculator = multi-turn episodes with the
// built-in calculator tool (env/tool_environment.h); remote = episodes whose
// turns a server at task.environment_address answers
// (env/remote_environment.h, proto/relay/v1/environment.proto).
enum class EnvironmentKind { kNone, kCalculator, kRemote };
inline const NameTable<EnvironmentKind> kEnvironmentKindNames{
    "environment",
    {{"none", EnvironmentKind::kNone},
     {"calculator", EnvironmentKind::kCalculator},
     {"remote", EnvironmentKind::kRemote}}};

// How a jsonl task compares a response's answer with the prompt's.
enum class AnswerMatch {
  kExact,  // the extracted answer equals the expected text
  kRegex,  // the expected text is a regex the extracted answer must match in full
};
inline const NameTable<AnswerMatch> kAnswerMatchNames{
    "answer match", {{"exact", AnswerMatch::kExact}, {"regex", AnswerMatch::kRegex}}};

// How an arithmetic prompt reads and what its target is.
enum class ArithmeticFormat {
  kBrackets,    // `<3+4*5>` -> `23#` (the char tokenizer's toy)
  kCalculator,  // "What is 37*48?" -> "1776", the target a calculator tool call
};
inline const NameTable<ArithmeticFormat> kArithmeticFormatNames{
    "arithmetic format",
    {{"brackets", ArithmeticFormat::kBrackets}, {"calculator", ArithmeticFormat::kCalculator}}};

}  // namespace rollout

// Sampling and the generation engine for rollouts. The engine's keys
// (max_new_tokens, temperature, top_k, top_p, record_raw_logprobs, num_slots,
// kv_cache_gb, kv_cache_fraction, interrupt, prefix) bind straight onto
// `engine`; the process fills in what the section cannot know (stop tokens
// from the tokenizer, run.autocast, the vocabulary limit).
// rollout.agent: agents play the episodes (docs/serve.md, "Inside
// training"). Each worker serves the OpenAI endpoint on `listen` with the
// weights it holds, hands each leased prompt's K samples out as episodes
// (POST /v1/episodes), and submits a group once its K episodes have ended.
// A task.environment then answers only relay's own episodes: the warm
// start's demonstrations and the held-out evaluation, which should match
// the agents' tools.
struct AgentConfig {
  // host:port of the worker's endpoint (port 0 = any free one); "" = off:
  // the worker samples its groups itself.
  std::string listen;
  // The agent program each relay-rollout starts once its endpoint listens,
  // with OPENAI_BASE_URL, OPENAI_API_KEY and RELAY_MODEL set (PATH is
  // searched for its first word); [] = none: agents run elsewhere.
  std::vector<std::string> command;
  // An episode handed out and not ended within this drops its group (the
  // lease goes back to the trainer).
  double episode_timeout_s = 600.0;
};

struct RolloutConfig {
  int n = 8;                      // responses sampled per prompt (the group size K)
  std::vector<std::string> stop;  // extra stop strings, each one token; the task adds its own
  int workers = 1;                // relay-rollout processes `relay run` starts on this machine
  int groups_in_flight = 16;      // prompt leases one worker holds at once
  rollout::EngineOptions engine;
  AgentConfig agent;
};

struct ArithmeticTaskConfig {
  int min_operands = 2;
  int max_operands = 3;
  int min_digits = 1;  // digits per operand
  int max_digits = 1;
  std::string operators = "+";  // any of + - *
  // (Last, so that brace initialisers of the five above still read.)
  // brackets: `<3+4>` answered `7#` ('#' ends it). calculator: "What is 3+4?"
  // answered "7", whose target (for warm starts) is the call
  // <tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>:
  // with task.environment calculator (or a remote one with that tool) the
  // tool answers it, and the answer is the turn after (docs/environments.md).
  rollout::ArithmeticFormat format = rollout::ArithmeticFormat::kBrackets;
};

struct MathAnswerTaskConfig {
  double format_reward = 0.0;  // weight in [0, 1] of the "answer is in \boxed{}" sub-score
};

struct JsonlTaskConfig {
  std::string prompt_key = "prompt";
  std::string answer_key = "answer";
  std::string target_key = "target";  // optional field: a target solution for prefix guidance
  rollout::AnswerMatch match = rollout::AnswerMatch::kExact;  // exact | regex
};

// Where prompts come from and how responses are scored.
struct TaskConfig {
  rollout::TaskKind name = rollout::TaskKind::kArithmetic;  // arithmetic | math_answer | jsonl
  std::string path;                                         // JSONL file for math_answer and jsonl
  double verifier_timeout_s = 5.0;  // a verifier running longer scores 0 and counts an error
  // none: one response per sample. Otherwise every sample is an episode
  // (rollout.episode) whose turns this environment answers; the verifier
  // scores the last model turn, and the environment's rewards add to it.
  rollout::EnvironmentKind environment = rollout::EnvironmentKind::kNone;
  // remote: host:port of the environment server; required then, and only then.
  std::string environment_address;
  // One environment call (reset + step) running longer ends its episode as
  // env_error; the call is abandoned, the worker goes on.
  double environment_timeout_s = 60.0;
  ArithmeticTaskConfig arithmetic;
  MathAnswerTaskConfig math_answer;
  JsonlTaskConfig jsonl;
};

// Every rule on the rollout and task options, with YAML key paths relative
// to `problems` ("n", "prefix.max_ratio"; the binding checks them under
// "rollout" and "task"). check(RolloutConfig) includes the engine's own
// check; make_task runs check(TaskConfig) too, for options built in code.
void check(const RolloutConfig& options, Problems problems);
void check(const TaskConfig& options, Problems problems);
// The arithmetic task's rules (in arithmetic_task.cc, beside the bound on
// the values its expressions can reach).
void check(const ArithmeticTaskConfig& options, Problems problems);

}  // namespace relay
