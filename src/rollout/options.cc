#include "relay/rollout/options.h"

#include "absl/strings/str_cat.h"

namespace relay {
namespace {

void check_prefix(const PrefixConfig& prefix, int n, Problems p) {
  if (prefix.n_prefix < -1) p.add("n_prefix", "must be >= -1", prefix.n_prefix);
  if (prefix.n_prefix > n) {
    p.add("n_prefix", absl::StrCat("must be <= rollout.n (", n, ")"), prefix.n_prefix);
  }
  p.one_of("strategy", prefix.strategy,
           {"random", "linear", "linear_max", "reverse_linear", "fixed"});
  p.in_range("min_ratio", prefix.min_ratio, 0, 1);
  if (!(prefix.max_ratio >= 0 && prefix.max_ratio <= 1)) {
    p.add("max_ratio", "must be in [0, 1]", prefix.max_ratio);
  } else if (prefix.min_ratio >= 0 && prefix.min_ratio <= 1 &&
             prefix.max_ratio < prefix.min_ratio) {
    p.add("max_ratio",
          absl::StrCat("must be >= ", p.path("min_ratio"), " (", format_double(prefix.min_ratio),
                       ")"),
          prefix.max_ratio);
  }
  p.at_least("steps", prefix.steps, 1);
  p.at_least("max_len", prefix.max_len, 0);
  if (prefix.strategy == "fixed" && prefix.share_across_group) {
    // A fixed set gives each prefixed sample its own ratio; sharing one contradicts it.
    p.add("share_across_group", "must be false with strategy 'fixed', got true");
  }
}

}  // namespace

void check(const RolloutConfig& r, Problems p) {
  p.at_least("n", r.n, 1);
  p.at_least("max_new_tokens", r.max_new_tokens, 1);
  p.positive("temperature", r.temperature);
  p.at_least("top_k", r.top_k, 0);
  if (!(r.top_p > 0 && r.top_p <= 1)) p.add("top_p", "must be in (0, 1]", r.top_p);
  p.at_least("num_slots", r.num_slots, 1);
  if (!(r.kv_cache_gb >= 0)) {
    p.add("kv_cache_gb", "must be >= 0 (0 = kv_cache_fraction of free memory)", r.kv_cache_gb);
  }
  if (!(r.kv_cache_fraction > 0 && r.kv_cache_fraction <= 1)) {
    p.add("kv_cache_fraction", "must be in (0, 1]", r.kv_cache_fraction);
  }
  p.at_least("workers", r.workers, 1);
  p.at_least("groups_in_flight", r.groups_in_flight, 1);
  p.one_of("interrupt", r.interrupt, {"recompute", "keep", "finish", "restart"});
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty()) p.add(absl::StrCat("stop[", i, "]"), "must be non-empty, got ''");
  }
  check_prefix(r.prefix, r.n, p.at("prefix"));
}

void check(const TaskConfig& task, Problems p) {
  p.one_of("name", task.name, {"arithmetic", "math_answer", "jsonl"});
  if ((task.name == "math_answer" || task.name == "jsonl") && task.path.empty()) {
    p.add("path", absl::StrCat("must name a JSONL file for task '", task.name, "'"), task.path);
  }
  p.positive("verifier_timeout_s", task.verifier_timeout_s);
  const ArithmeticTaskConfig& arith = task.arithmetic;
  Problems a = p.at("arithmetic");
  a.at_least("min_operands", arith.min_operands, 1);
  a.at_least("max_operands", arith.max_operands, arith.min_operands);
  a.at_least("min_digits", arith.min_digits, 1);
  a.at_least("max_digits", arith.max_digits, arith.min_digits);
  if (arith.max_digits > 9) a.add("max_digits", "must be <= 9", arith.max_digits);
  if (arith.operators.empty() || arith.operators.find_first_not_of("+-*") != std::string::npos) {
    a.add("operators", "must be a non-empty string of + - *", arith.operators);
  }
  p.at("math_answer").in_range("format_reward", task.math_answer.format_reward, 0, 1);
  Problems jsonl = p.at("jsonl");
  jsonl.one_of("match", task.jsonl.match, {"exact", "regex"});
  jsonl.non_empty("prompt_key", task.jsonl.prompt_key);
  jsonl.non_empty("answer_key", task.jsonl.answer_key);
}

}  // namespace relay
