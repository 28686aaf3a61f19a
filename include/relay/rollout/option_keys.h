#pragma once

// The `rollout:` and `task:` config sections' YAML keys (see
// relay/rollout/options.h). Included by the config binding only; the binding
// walks them as relay/trainer/option_keys.h describes.

#include "relay/rollout/options.h"

namespace relay {

template <class V>
void visit_fields(V& v, PrefixConfig& c) {
  v.field("n_prefix", c.n_prefix);
  v.field("strategy", c.strategy);
  v.field("min_ratio", c.min_ratio);
  v.field("max_ratio", c.max_ratio);
  v.field("steps", c.steps);
  v.field("share_across_group", c.share_across_group);
  v.field("max_len", c.max_len);
}

template <class V>
void visit_fields(V& v, RolloutConfig& c) {
  v.field("n", c.n);
  v.field("max_new_tokens", c.max_new_tokens);
  v.field("temperature", c.temperature);
  v.field("top_k", c.top_k);
  v.field("top_p", c.top_p);
  v.field("stop", c.stop);
  v.field("record_raw_logprobs", c.record_raw_logprobs);
  v.field("num_slots", c.num_slots);
  v.field("kv_cache_gb", c.kv_cache_gb);
  v.field("kv_cache_fraction", c.kv_cache_fraction);
  v.field("interrupt", c.interrupt);
  v.field("workers", c.workers);
  v.field("groups_in_flight", c.groups_in_flight);
  v.section("prefix", c.prefix);
}

template <class V>
void visit_fields(V& v, ArithmeticTaskConfig& c) {
  v.field("min_operands", c.min_operands);
  v.field("max_operands", c.max_operands);
  v.field("min_digits", c.min_digits);
  v.field("max_digits", c.max_digits);
  v.field("operators", c.operators);
}

template <class V>
void visit_fields(V& v, MathAnswerTaskConfig& c) {
  v.field("format_reward", c.format_reward);
}

template <class V>
void visit_fields(V& v, JsonlTaskConfig& c) {
  v.field("prompt_key", c.prompt_key);
  v.field("answer_key", c.answer_key);
  v.field("target_key", c.target_key);
  v.field("match", c.match);
}

template <class V>
void visit_fields(V& v, TaskConfig& c) {
  v.field("name", c.name);
  v.field("path", c.path);
  v.field("verifier_timeout_s", c.verifier_timeout_s);
  v.section("arithmetic", c.arithmetic);
  v.section("math_answer", c.math_answer);
  v.section("jsonl", c.jsonl);
}

}  // namespace relay
