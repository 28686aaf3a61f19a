#pragma once

// The rollout side's options: sampling and the generation engine
// (`rollout:`), prefix guidance (`rollout.prefix:`) and the task (`task:`),
// each with its rules in check() and its YAML keys in
// relay/rollout/option_keys.h. No LibTorch: tasks build without it.

#include <string>
#include <vector>

#include "relay/common/problems.h"

namespace relay {

// Prefix-guided (off-policy) sampling, as in LUFFY: some of a group's samples
// start from a forced prefix of the prompt's target solution. The prefix
// length is floor(ratio x target length), capped at max_len.
struct PrefixConfig {
  int n_prefix = 0;                 // samples per group given a prefix; -1 = all K; 0 = off
  std::string strategy = "random";  // random | linear | linear_max | reverse_linear | fixed
  double min_ratio = 0.0;           // ratios lie in [min_ratio, max_ratio] within [0, 1]
  double max_ratio = 0.8;
  int steps = 300;                  // training steps over which linear schedules move
  bool share_across_group = false;  // one ratio for all prefixed samples of a group
  int max_len = 8192;               // at most this many forced tokens
};

// Sampling and the generation engine for rollouts.
struct RolloutConfig {
  int n = 8;  // responses sampled per prompt (the group size K)
  int max_new_tokens = 32;
  double temperature = 1.0;       // > 0; sampling is greedy only through `relay generate --greedy`
  int top_k = 0;                  // 0 = off
  double top_p = 1.0;             // 1 = off; in (0, 1]
  std::vector<std::string> stop;  // extra stop strings, each one token; the task adds its own
  bool record_raw_logprobs = false;  // also keep log p(token) at temperature 1, untruncated
  int num_slots = 64;                // sequences decoding at once, at most
  // KV-cache memory of one worker, in GiB; 0 = kv_cache_fraction of the
  // memory free when the worker starts, and never more than num_slots full
  // sequences. Sequences are admitted while the budget can hold
  // prompt + max_new_tokens for each; the others wait.
  double kv_cache_gb = 0;
  double kv_cache_fraction =
      0.5;  // (0, 1]: share of free memory for the KV cache when kv_cache_gb is 0
  // What a weight update does to sequences in flight: recompute | keep | finish | restart.
  std::string interrupt = "recompute";
  int workers = 1;            // relay-rollout processes `relay run` starts on this machine
  int groups_in_flight = 16;  // prompt leases one worker holds at once
  PrefixConfig prefix;
};

struct ArithmeticTaskConfig {
  int min_operands = 2;
  int max_operands = 3;
  int min_digits = 1;  // digits per operand
  int max_digits = 1;
  std::string operators = "+";  // any of + - *
};

struct MathAnswerTaskConfig {
  double format_reward = 0.0;  // weight in [0, 1] of the "answer is in \boxed{}" sub-score
};

struct JsonlTaskConfig {
  std::string prompt_key = "prompt";
  std::string answer_key = "answer";
  std::string target_key = "target";  // optional field: a target solution for prefix guidance
  std::string match = "exact";  // exact | regex (the answer is a regex the response must match)
};

// Where prompts come from and how responses are scored.
struct TaskConfig {
  std::string name = "arithmetic";  // arithmetic | math_answer | jsonl
  std::string path;                 // JSONL file for math_answer and jsonl
  double verifier_timeout_s = 5.0;  // a verifier running longer scores 0 and counts an error
  ArithmeticTaskConfig arithmetic;
  MathAnswerTaskConfig math_answer;
  JsonlTaskConfig jsonl;
};

// Every rule on the rollout and task options, with YAML key paths relative
// to `problems` ("n", "prefix.max_ratio"; the binding checks them under
// "rollout" and "task").
void check(const RolloutConfig& options, Problems problems);
void check(const TaskConfig& options, Problems problems);

}  // namespace relay
