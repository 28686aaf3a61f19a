#pragma once

// The `rollout:` and `task:` config sections' YAML keys (see
// relay/rollout/options.h). Included by the config binding only; the binding
// walks them as relay/trainer/option_keys.h describes.

#include "relay/rollout/options.h"

namespace relay {
namespace rollout {

// Found by argument-dependent lookup, so beside PrefixOptions' namespace.
template <class V>
void visit_fields(V& v, PrefixOptions& c) {
  v.field("n_prefix", c.n_prefix);
  v.field("strategy", c.strategy, kPrefixStrategyNames);
  v.field("min_ratio", c.min_ratio);
  v.field("max_ratio", c.max_ratio);
  v.field("steps", c.steps);
  v.field("share_across_group", c.share_across_group);
  v.field("max_len", c.max_len);
}

template <class V>
void visit_fields(V& v, EpisodeOptions& c) {
  v.field("max_turns", c.max_turns);
  v.field("max_tokens", c.max_tokens);
}

}  // namespace rollout

template <class V>
void visit_fields(V& v, AgentConfig& c) {
  v.field("listen", c.listen);
  v.field("command", c.command);
  v.field("episode_timeout_s", c.episode_timeout_s);
}

// The engine's keys sit flat in the section (rollout.temperature, not
// rollout.engine.sampling.temperature), in the order docs/config.md lists them.
template <class V>
void visit_fields(V& v, RolloutConfig& c) {
  rollout::EngineOptions& e = c.engine;
  v.field("n", c.n);
  v.field("max_new_tokens", e.max_new_tokens);
  v.field("temperature", e.sampling.temperature);
  v.field("top_k", e.sampling.top_k);
  v.field("top_p", e.sampling.top_p);
  v.field("stop", c.stop);
  v.field("record_raw_logprobs", e.sampling.record_raw_logprobs);
  v.field("num_slots", e.num_slots);
  v.field("kv_cache_gb", e.kv_cache_gb);
  v.field("kv_cache_fraction", e.kv_cache_fraction);
  v.field("interrupt", e.interrupt, rollout::kInterruptPolicyNames);
  v.field("dtype", e.dtype, rollout::kEngineDtypeNames);
  v.field("fp32_lm_head", e.fp32_lm_head);
  v.field("decode_graphs", e.decode_graphs, rollout::kDecodeGraphModeNames);
  v.field("workers", c.workers);
  v.field("groups_in_flight", c.groups_in_flight);
  v.section("prefix", e.prefix);
  v.section("episode", e.episode);
  v.section("agent", c.agent);
}

template <class V>
void visit_fields(V& v, ArithmeticTaskConfig& c) {
  v.field("format", c.format, rollout::kArithmeticFormatNames);
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
  v.field("match", c.match, rollout::kAnswerMatchNames);
}

template <class V>
void visit_fields(V& v, TaskConfig& c) {
  v.field("name", c.name, rollout::kTaskKindNames);
  v.field("path", c.path);
  v.field("verifier_timeout_s", c.verifier_timeout_s);
  v.field("environment", c.environment, rollout::kEnvironmentKindNames);
  v.field("environment_address", c.environment_address);
  v.field("environment_timeout_s", c.environment_timeout_s);
  v.section("arithmetic", c.arithmetic);
  v.section("math_answer", c.math_answer);
  v.section("jsonl", c.jsonl);
}

}  // namespace relay
