#include "relay/common/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

// yaml-cpp is used here and nowhere else. It throws; every entry point below
// catches and returns a Status instead.

namespace relay {
namespace {

// ---------------------------------------------------------------------------
// The schema: one list of fields per struct, walked by both the Reader (YAML ->
// struct, which also learns the known keys from it) and the Writer (struct ->
// YAML). A new field added here is read, checked for typos and printed.

template <class V>
void visit_fields(V& v, WarmStartConfig& c) {
  v.field("sft_steps", c.sft_steps);
  v.field("sft_lr", c.sft_lr);
  v.field("batch", c.batch);
}

template <class V>
void visit_fields(V& v, ExperimentSection& c) {
  v.field("name", c.name);
  v.field("output_dir", c.output_dir);
  v.field("steps", c.steps);
  v.field("groups_per_step", c.groups_per_step);
  v.field("checkpoint_every", c.checkpoint_every);
  v.field("keep_checkpoints", c.keep_checkpoints);
  v.field("keep_best_checkpoint", c.keep_best_checkpoint);
  v.section("warm_start", c.warm_start);
}

template <class V>
void visit_fields(V& v, EvalConfig& c) {
  v.field("prompts", c.prompts);
  v.field("every", c.every);
  v.field("n", c.n);
  v.field("temperature", c.temperature);
}

template <class V>
void visit_fields(V& v, TlsConfig& c) {
  v.field("cert", c.cert);
  v.field("key", c.key);
  v.field("ca", c.ca);
  v.field("mutual", c.mutual);
}

template <class V>
void visit_fields(V& v, ServicesConfig& c) {
  v.field("listen", c.listen);
  v.field("http_listen", c.http_listen);
  v.field("token_file", c.token_file);
  v.section("tls", c.tls);
  v.field("lease_timeout_s", c.lease_timeout_s);
  v.field("group_wait_s", c.group_wait_s);
  v.field("rpc_timeout_s", c.rpc_timeout_s);
  v.field("worker_timeout_s", c.worker_timeout_s);
  v.field("weight_sync", c.weight_sync);
  v.field("weight_sync_port", c.weight_sync_port);
  v.field("weight_sync_bucket_mb", c.weight_sync_bucket_mb);
  v.field("weight_sync_timeout_s", c.weight_sync_timeout_s);
}

template <class V>
void visit_fields(V& v, RunConfig& c) {
  v.field("seed", c.seed);
  v.field("threads", c.threads);
  v.field("log_level", c.log_level);
  v.field("device", c.device);
  v.field("autocast", c.autocast);
}

template <class V>
void visit_fields(V& v, ModelInitConfig& c) {
  v.field("arch", c.arch);
  v.field("layers", c.layers);
  v.field("hidden", c.hidden);
  v.field("heads", c.heads);
  v.field("kv_heads", c.kv_heads);
  v.field("head_dim", c.head_dim);
  v.field("ffn", c.ffn);
  v.field("experts", c.experts);
  v.field("experts_per_tok", c.experts_per_tok);
  v.field("moe_ffn", c.moe_ffn);
  v.field("vocab", c.vocab);
  v.field("max_seq_len", c.max_seq_len);
  v.field("rope_theta", c.rope_theta);
  v.field("rms_norm_eps", c.rms_norm_eps);
  v.field("tie_embeddings", c.tie_embeddings);
}

template <class V>
void visit_fields(V& v, ModelConfig& c) {
  v.field("path", c.path);
  v.field("dtype", c.dtype);
  v.field("tokenizer", c.tokenizer);
  v.field("chat_template", c.chat_template);
  v.field("system_prompt", c.system_prompt);
  v.section("init", c.init);
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

template <class V>
void visit_fields(V& v, AdvantageConfig& c) {
  v.field("estimator", c.estimator);
  v.field("norm_by_std", c.norm_by_std);
  v.field("std_scale", c.std_scale);
  v.field("epsilon", c.epsilon);
  v.field("gamma", c.gamma);
  v.field("lambda", c.lambda);
  v.field("prefix_reward_weight_alpha", c.prefix_reward_weight_alpha);
  v.field("prefix_reward_weight_beta", c.prefix_reward_weight_beta);
}

template <class V>
void visit_fields(V& v, PpoConfig& c) {
  v.field("clip_low", c.clip_low);
  v.field("clip_high", c.clip_high);
  v.field("clip_c", c.clip_c);
  v.field("clip_delta", c.clip_delta);
  v.field("log_ratio_clamp", c.log_ratio_clamp);
  v.field("behav_imp_weight_cap", c.behav_imp_weight_cap);
  v.field("agg_mode", c.agg_mode);
}

template <class V>
void visit_fields(V& v, GspoConfig& c) {
  v.field("clip_low", c.clip_low);
  v.field("clip_high", c.clip_high);
}

template <class V>
void visit_fields(V& v, GmpoConfig& c) {
  v.field("clip_low", c.clip_low);
  v.field("clip_high", c.clip_high);
}

template <class V>
void visit_fields(V& v, CispoConfig& c) {
  v.field("clip_low", c.clip_low);
  v.field("clip_high", c.clip_high);
}

template <class V>
void visit_fields(V& v, SapoConfig& c) {
  v.field("tau_pos", c.tau_pos);
  v.field("tau_neg", c.tau_neg);
}

template <class V>
void visit_fields(V& v, ClipCovConfig& c) {
  v.field("ratio", c.ratio);
  v.field("lb", c.lb);
  v.field("ub", c.ub);
}

template <class V>
void visit_fields(V& v, KlCovConfig& c) {
  v.field("ratio", c.ratio);
  v.field("coef", c.coef);
}

template <class V>
void visit_fields(V& v, LuffyConfig& c) {
  v.field("off_policy_reshape", c.off_policy_reshape);
  v.field("gamma", c.gamma);
  v.field("reshape_weight", c.reshape_weight);
  v.field("reshape_pow_exp", c.reshape_pow_exp);
  v.field("off_max_clip", c.off_max_clip);
  v.field("off_min_clip", c.off_min_clip);
  v.field("clip_upper_bound", c.clip_upper_bound);
  v.field("loss_remove_clip", c.loss_remove_clip);
  v.field("on_policy_reshape", c.on_policy_reshape);
  v.field("on_reshape_weight", c.on_reshape_weight);
  v.field("on_reshape_pow_exp", c.on_reshape_pow_exp);
}

template <class V>
void visit_fields(V& v, EntropyConfig& c) {
  v.field("coef", c.coef);
  v.field("target", c.target);
  v.field("delta", c.delta);
  v.field("max_coef", c.max_coef);
}

template <class V>
void visit_fields(V& v, RewardKlConfig& c) {
  v.field("coef", c.coef);
  v.field("controller", c.controller);
  v.field("target_kl", c.target_kl);
  v.field("horizon", c.horizon);
  v.field("estimator", c.estimator);
}

template <class V>
void visit_fields(V& v, RolloutCorrectionConfig& c) {
  v.field("is_level", c.is_level);
  v.field("is_mode", c.is_mode);
  v.field("is_threshold", c.is_threshold);
  v.field("is_threshold_lower", c.is_threshold_lower);
  v.field("is_batch_normalize", c.is_batch_normalize);
  v.field("rs_level", c.rs_level);
  v.field("rs_criterion", c.rs_criterion);
  v.field("rs_threshold", c.rs_threshold);
  v.field("rs_threshold_lower", c.rs_threshold_lower);
  v.field("veto_threshold", c.veto_threshold);
  v.field("bypass", c.bypass);
  v.field("log_clamp", c.log_clamp);
}

template <class V>
void visit_fields(V& v, OptimizerConfig& c) {
  v.field("weight_decay", c.weight_decay);
  v.field("beta1", c.beta1);
  v.field("beta2", c.beta2);
  v.field("eps", c.eps);
  v.field("max_grad_norm", c.max_grad_norm);
  v.field("schedule", c.schedule);
  v.field("warmup_steps", c.warmup_steps);
  v.field("total_steps", c.total_steps);
  v.field("min_lr_ratio", c.min_lr_ratio);
  v.field("fp32_master_weights", c.fp32_master_weights);
}

template <class V>
void visit_fields(V& v, TrainerConfig& c) {
  v.field("max_staleness", c.max_staleness);
  v.field("lr", c.lr);
  v.field("loss", c.loss);
  v.field("proximal", c.proximal);
  v.field("micro_batch_tokens", c.micro_batch_tokens);
  v.field("ppo_epochs", c.ppo_epochs);
  v.field("mini_batches", c.mini_batches);
  v.field("allow_missing_logprobs", c.allow_missing_logprobs);
  v.field("drop_equal_reward_groups", c.drop_equal_reward_groups);
  v.field("mask_truncated", c.mask_truncated);
  v.field("kl_coef", c.kl_coef);
  v.field("kl_estimator", c.kl_estimator);
  v.field("sft_coef", c.sft_coef);
  v.field("loss_scale_factor", c.loss_scale_factor);
  v.field("reference", c.reference);
  v.field("max_reuse", c.max_reuse);
  v.field("max_extra_batches", c.max_extra_batches);
  v.field("world_size", c.world_size);
  v.field("rendezvous", c.rendezvous);
  v.field("allreduce_bucket_mb", c.allreduce_bucket_mb);
  v.field("collective_timeout_s", c.collective_timeout_s);
  v.field("activation_checkpointing", c.activation_checkpointing);
  v.field("router_replay", c.router_replay);
  v.section("advantage", c.advantage);
  v.section("ppo", c.ppo);
  v.section("gspo", c.gspo);
  v.section("gmpo", c.gmpo);
  v.section("cispo", c.cispo);
  v.section("sapo", c.sapo);
  v.section("clip_cov", c.clip_cov);
  v.section("kl_cov", c.kl_cov);
  v.section("luffy", c.luffy);
  v.section("entropy", c.entropy);
  v.section("reward_kl", c.reward_kl);
  v.section("rollout_correction", c.rollout_correction);
  v.section("optimizer", c.optimizer);
}

template <class V>
void visit_fields(V& v, ExperimentConfig& c) {
  v.section("experiment", c.experiment);
  v.section("eval", c.eval);
  v.section("run", c.run);
  v.section("model", c.model);
  v.section("rollout", c.rollout);
  v.section("task", c.task);
  v.section("trainer", c.trainer);
  v.section("services", c.services);
}

// ---------------------------------------------------------------------------
// Small helpers.

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : absl::StrCat(prefix, ".", key);
}

// Shortest text that parses back to exactly `x` ("1e-06", "0.95", "10000").
std::string format_double(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

// A user-supplied string for a one-line message: quoted, escaped, shortened.
std::string quote(const std::string& s) {
  constexpr size_t kMaxShown = 60;
  std::string shown = absl::CHexEscape(s.substr(0, kMaxShown));
  return absl::StrCat("'", shown, s.size() > kMaxShown ? "...'" : "'");
}

// What a node is, for "expected X, got <describe>".
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Scalar:
      return quote(node.Scalar());
    default:
      return "null";
  }
}

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i-1][j-1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "unknown key; did you mean 'x'?" when a known key is close enough (distance
// <= max(2, len/3)), else the list of known keys.
std::string unknown_key_message(const std::string& key, const std::vector<std::string>& known) {
  const std::string* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& k : known) {
    size_t d = levenshtein(key, k);
    if (d < best_distance) {
      best = &k;
      best_distance = d;
    }
  }
  if (best != nullptr && best_distance <= std::max<size_t>(2, key.size() / 3)) {
    return absl::StrCat("unknown key; did you mean '", *best, "'?");
  }
  return absl::StrCat("unknown key; known keys: ", absl::StrJoin(known, ", "));
}

// Parses all of `text` as a decimal number, as YAML's core schema writes it:
// an optional sign, no hex, no spaces. (from_chars alone rejects a '+'.)
template <class T>
bool parse_number(const std::string& text, T& out) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') {
    ++begin;
    if (begin != end && *begin == '-') return false;
  }
  auto [ptr, ec] = std::from_chars(begin, end, out);
  return begin != end && ec == std::errc() && ptr == end;
}

// ---------------------------------------------------------------------------
// Reader: decodes a YAML tree into the structs. It records every problem
// (unknown or duplicate key, wrong type, out-of-range integer) rather than
// stopping at the first, each as "<source>[:<line>]: <path>: <what>".

class Reader {
 public:
  // `use_marks`: add line numbers (false when the tree holds override values,
  // whose marks point into the override string, not the file).
  Reader(std::string source, bool use_marks) : source_(std::move(source)), use_marks_(use_marks) {}

  const std::vector<std::string>& errors() const { return errors_; }

  // Reads the fields of `c` from `node`, a map or null (null = all defaults).
  template <class C>
  void read_map(const YAML::Node& node, const std::string& path, C& c) {
    Scope scope;
    scope.path = path;
    if (node.IsMap()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) {
          error(it->first, path, absl::StrCat("keys must be strings, got ", describe(it->first)));
          continue;
        }
        scope.entries.push_back({it->first.Scalar(), it->first, it->second});
      }
    }
    Scope* outer = scope_;
    scope_ = &scope;
    visit_fields(*this, c);
    scope_ = outer;
    check_keys(scope);
  }

  template <class C>
  void section(const char* key, C& c) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    std::string path = join_path(scope_->path, key);
    if (node.IsMap() || node.IsNull()) {
      read_map(node, path, c);
    } else {
      error(node, path, absl::StrCat("expected a map, got ", describe(node)));
    }
  }

  void field(const char* key, std::string& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    if (node.IsScalar()) {
      out = node.Scalar();
    } else {
      type_error(*entry, key, "a string");
    }
  }

  void field(const char* key, std::vector<std::string>& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    if (!node.IsSequence()) {
      type_error(*entry, key, "a sequence of strings");
      return;
    }
    std::vector<std::string> items;
    for (size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) {
        error(node[i], absl::StrCat(join_path(scope_->path, key), "[", i, "]"),
              absl::StrCat("expected a string, got ", describe(node[i])));
        return;
      }
      items.push_back(node[i].Scalar());
    }
    out = std::move(items);
  }

  void field(const char* key, bool& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    // Only true/false: YAML 1.1's yes/no/on/off are too easy to write by accident.
    if (node.IsScalar() && node.Scalar() == "true") {
      out = true;
    } else if (node.IsScalar() && node.Scalar() == "false") {
      out = false;
    } else {
      type_error(*entry, key, "true or false");
    }
  }

  void field(const char* key, int& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    int64_t v = 0;
    if (!node.IsScalar() || !parse_number(node.Scalar(), v)) {
      type_error(*entry, key, "an integer");
    } else if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      type_error(*entry, key,
                 absl::StrCat("an integer in [", std::numeric_limits<int>::min(), ", ",
                              std::numeric_limits<int>::max(), "]"));
    } else {
      out = static_cast<int>(v);
    }
  }

  void field(const char* key, uint64_t& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    uint64_t v = 0;  // from_chars rejects a leading '-' for unsigned types
    if (node.IsScalar() && parse_number(node.Scalar(), v)) {
      out = v;
    } else {
      type_error(*entry, key,
                 absl::StrCat("an integer in [0, ", std::numeric_limits<uint64_t>::max(), "]"));
    }
  }

  void field(const char* key, double& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    double v = 0;
    if (node.IsScalar() && parse_number(node.Scalar(), v) && std::isfinite(v)) {
      out = v;
    } else {
      type_error(*entry, key, "a number");
    }
  }

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };
  // The map being read: its entries, and the keys the schema asked for.
  struct Scope {
    std::string path;
    std::vector<Entry> entries;
    std::vector<std::string> known;
  };

  // Records `key` as known in the current map and returns its entry (the
  // first one if repeated), or nullptr when absent.
  const Entry* find(const char* key) {
    scope_->known.emplace_back(key);
    for (const Entry& e : scope_->entries) {
      if (e.key == key) return &e;
    }
    return nullptr;
  }

  void check_keys(const Scope& scope) {
    for (size_t i = 0; i < scope.entries.size(); ++i) {
      const Entry& e = scope.entries[i];
      std::string path = join_path(scope.path, e.key);
      bool known = std::find(scope.known.begin(), scope.known.end(), e.key) != scope.known.end();
      if (!known) {
        error(e.key_node, path, unknown_key_message(e.key, scope.known));
        continue;
      }
      for (size_t j = 0; j < i; ++j) {
        if (scope.entries[j].key == e.key) {
          error(e.key_node, path, "duplicate key");
          break;
        }
      }
    }
  }

  // Points at the value's line, or the key's when the value is null (a null
  // value's mark is wherever the parser went next).
  void type_error(const Entry& entry, const char* key, const std::string& expected) {
    const YAML::Node& at = entry.value.IsNull() ? entry.key_node : entry.value;
    error(at, join_path(scope_->path, key),
          absl::StrCat("expected ", expected, ", got ", describe(entry.value)));
  }

  void error(const YAML::Node& at, const std::string& path, const std::string& what) {
    std::string where = source_;
    YAML::Mark mark = at.Mark();
    if (use_marks_ && !mark.is_null()) absl::StrAppend(&where, ":", mark.line + 1);
    errors_.push_back(path.empty() ? absl::StrCat(where, ": ", what)
                                   : absl::StrCat(where, ": ", path, ": ", what));
  }

  std::string source_;
  bool use_marks_;
  Scope* scope_ = nullptr;
  std::vector<std::string> errors_;
};

// ---------------------------------------------------------------------------
// Writer: prints the structs as block YAML through the same schema.

// A real number as the Writer prints it: "10000" -> "10000.0", so the file
// shows the field is a real number.
std::string real_text(double value) {
  std::string text = format_double(value);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

class Writer {
 public:
  explicit Writer(YAML::Emitter& out) : out_(out) {}

  template <class C>
  void section(const char* key, C& c) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    visit_fields(*this, c);
    out_ << YAML::EndMap;
  }

  template <class T>
  void field(const char* key, T& value) {
    out_ << YAML::Key << key << YAML::Value << value;
  }

  void field(const char* key, std::vector<std::string>& value) {
    out_ << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const std::string& item : value) out_ << item;
    out_ << YAML::EndSeq;
  }

  void field(const char* key, double& value) {
    out_ << YAML::Key << key << YAML::Value << real_text(value);
  }

 private:
  YAML::Emitter& out_;
};

// ---------------------------------------------------------------------------
// FieldLister: the leaf keys as dotted paths with the values the Writer prints.

class FieldLister {
 public:
  template <class C>
  void section(const char* key, C& c) {
    const std::string outer = prefix_;
    prefix_ = join_path(prefix_, key);
    visit_fields(*this, c);
    prefix_ = outer;
  }
  void field(const char* key, std::string& value) { add(key, value); }
  void field(const char* key, bool& value) { add(key, value ? "true" : "false"); }
  void field(const char* key, int& value) { add(key, absl::StrCat(value)); }
  void field(const char* key, uint64_t& value) { add(key, absl::StrCat(value)); }
  void field(const char* key, double& value) { add(key, real_text(value)); }
  void field(const char* key, std::vector<std::string>& value) {
    add(key, absl::StrCat("[", absl::StrJoin(value, ", "), "]"));
  }

  std::vector<std::pair<std::string, std::string>> fields;

 private:
  void add(const char* key, std::string value) {
    fields.emplace_back(join_path(prefix_, key), std::move(value));
  }
  std::string prefix_;
};

// ---------------------------------------------------------------------------
// Validation problems, kept as (path, text) so parse_config can name the file
// or the override that set each path.

struct Problem {
  std::string path;
  std::string what;  // "must be >= 1, got 0"
};

class ProblemList {
 public:
  template <class T>
  void add(const std::string& path, const std::string& rule, const T& got) {
    problems.push_back({path, absl::StrCat(rule, ", got ", got)});
  }
  void add(const std::string& path, const std::string& rule, double got) {
    problems.push_back({path, absl::StrCat(rule, ", got ", format_double(got))});
  }
  void add_string(const std::string& path, const std::string& rule, const std::string& got) {
    problems.push_back({path, absl::StrCat(rule, ", got ", quote(got))});
  }
  void at_least(const std::string& path, int value, int min) {
    if (value < min) add(path, absl::StrCat("must be >= ", min), value);
  }
  void positive(const std::string& path, double value) {
    if (!(value > 0)) add(path, "must be > 0", value);  // also rejects NaN
  }
  void non_negative(const std::string& path, double value) {
    if (!(value >= 0)) add(path, "must be >= 0", value);
  }
  // In [lo, hi] or, with `open_hi`, [lo, hi).
  void in_range(const std::string& path, double value, double lo, double hi, bool open_hi = false) {
    bool ok = value >= lo && (open_hi ? value < hi : value <= hi);
    if (!ok) {
      add(path,
          absl::StrCat("must be in [", format_double(lo), ", ", format_double(hi),
                       open_hi ? ")" : "]"),
          value);
    }
  }
  // 0 (off) or above `min`.
  void zero_or_above(const std::string& path, double value, double min, const std::string& what) {
    if (!(value == 0 || value > min)) add(path, absl::StrCat("must be 0 (off) or > ", what), value);
  }
  void one_of(const std::string& path, const std::string& value,
              const std::vector<std::string>& allowed) {
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      add_string(path, absl::StrCat("must be one of ", absl::StrJoin(allowed, ", ")), value);
    }
  }

  std::vector<Problem> problems;
};

bool is_run_name_char(char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
         ch == '.' || ch == '_' || ch == '-';
}

std::vector<Problem> find_problems(const ExperimentConfig& config) {
  ProblemList p;
  const ExperimentSection& ex = config.experiment;
  if (ex.name.empty()) {
    p.add_string("experiment.name", "must be non-empty", ex.name);
  } else if (!std::all_of(ex.name.begin(), ex.name.end(), is_run_name_char)) {
    p.add_string("experiment.name", "must contain only [A-Za-z0-9._-]", ex.name);
  } else if (ex.name == "." || ex.name == "..") {
    // The run directory is <output_dir>/<name>; these would escape it.
    p.add_string("experiment.name", "must not be '.' or '..'", ex.name);
  }
  if (ex.output_dir.empty()) p.add_string("experiment.output_dir", "must be non-empty", "");
  p.at_least("experiment.steps", ex.steps, 0);
  p.at_least("experiment.groups_per_step", ex.groups_per_step, 1);
  p.at_least("eval.prompts", config.eval.prompts, 0);
  p.at_least("eval.every", config.eval.every, 0);
  p.at_least("eval.n", config.eval.n, 0);
  p.positive("eval.temperature", config.eval.temperature);
  p.at_least("experiment.checkpoint_every", ex.checkpoint_every, 0);
  p.at_least("experiment.keep_checkpoints", ex.keep_checkpoints, 1);
  p.at_least("experiment.warm_start.sft_steps", ex.warm_start.sft_steps, 0);
  p.positive("experiment.warm_start.sft_lr", ex.warm_start.sft_lr);
  p.at_least("experiment.warm_start.batch", ex.warm_start.batch, 1);

  const ServicesConfig& sv = config.services;
  if (sv.listen.empty() || sv.listen.rfind(':') == std::string::npos) {
    p.add_string("services.listen", "must be host:port", sv.listen);
  }
  if (!sv.http_listen.empty() && sv.http_listen.rfind(':') == std::string::npos) {
    p.add_string("services.http_listen", "must be host:port or empty (off)", sv.http_listen);
  }
  p.positive("services.lease_timeout_s", sv.lease_timeout_s);
  p.positive("services.group_wait_s", sv.group_wait_s);
  p.positive("services.rpc_timeout_s", sv.rpc_timeout_s);
  p.non_negative("services.worker_timeout_s", sv.worker_timeout_s);
  p.one_of("services.weight_sync", sv.weight_sync, {"fetch", "broadcast", "auto"});
  if (sv.weight_sync_port < 0 || sv.weight_sync_port > 65535) {
    p.add("services.weight_sync_port", "must be in [0, 65535]", sv.weight_sync_port);
  }
  p.at_least("services.weight_sync_bucket_mb", sv.weight_sync_bucket_mb, 1);
  p.positive("services.weight_sync_timeout_s", sv.weight_sync_timeout_s);
  if (sv.tls.cert.empty() != sv.tls.key.empty()) {
    p.add_string(sv.tls.cert.empty() ? "services.tls.cert" : "services.tls.key",
                 "services.tls.cert and services.tls.key go together", "");
  }
  if (!sv.tls.cert.empty() && sv.tls.ca.empty()) {
    p.add_string(
        "services.tls.ca",
        "must name the CA that signed services.tls.cert (workers verify the trainer with it)", "");
  }
  if (sv.tls.mutual && (sv.tls.ca.empty() || sv.tls.cert.empty())) {
    p.add_string("services.tls.mutual", "needs services.tls.ca, cert and key", "true");
  }

  const RunConfig& run = config.run;
  p.at_least("run.threads", run.threads, 0);
  p.one_of("run.log_level", run.log_level, {"trace", "debug", "info", "warn", "error", "off"});
  {
    const std::string& d = run.device;
    const bool cuda_index =
        d.size() > 5 && d.rfind("cuda:", 0) == 0 &&
        std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (d != "cpu" && d != "cuda" && !cuda_index) {
      p.add_string("run.device", "must be cpu, cuda or cuda:<index>", d);
    }
  }
  p.one_of("run.autocast", run.autocast, {"none", "bfloat16", "float16"});

  p.one_of("model.dtype", config.model.dtype, {"float32", "bfloat16", "float16"});
  // Whether the tokenizer has the format's special tokens is known only once
  // it is loaded (rollout setup checks it, naming model.chat_template).
  p.one_of("model.chat_template", config.model.chat_template, {"none", "chatml", "llama3", "auto"});
  if (config.model.chat_template == "none" && !config.model.system_prompt.empty()) {
    // A system message exists only in a chat format; ignoring it would
    // silently train on other prompts than the ones configured.
    p.add_string("model.system_prompt",
                 "needs model.chat_template (chatml, llama3 or auto); without a chat format there "
                 "is no system message",
                 config.model.system_prompt);
  }
  const ModelInitConfig& init = config.model.init;
  p.one_of("model.init.arch", init.arch, {"llama", "qwen2", "qwen3", "qwen3_moe"});
  p.at_least("model.init.head_dim", init.head_dim, 0);
  if (init.head_dim % 2 != 0) p.add("model.init.head_dim", "must be even (RoPE)", init.head_dim);
  if (init.arch == "qwen3_moe") {
    p.at_least("model.init.experts", init.experts, 1);
    p.at_least("model.init.experts_per_tok", init.experts_per_tok, 1);
    if (init.experts_per_tok > init.experts) {
      p.add("model.init.experts_per_tok",
            absl::StrCat("must be <= model.init.experts (", init.experts, ")"),
            init.experts_per_tok);
    }
    p.at_least("model.init.moe_ffn", init.moe_ffn, 0);
  }
  p.at_least("model.init.layers", init.layers, 1);
  p.at_least("model.init.hidden", init.hidden, 1);
  p.at_least("model.init.heads", init.heads, 1);
  p.at_least("model.init.kv_heads", init.kv_heads, 1);
  p.at_least("model.init.ffn", init.ffn, 1);
  p.at_least("model.init.vocab", init.vocab, 0);
  p.at_least("model.init.max_seq_len", init.max_seq_len, 1);
  if (init.heads >= 1 && init.kv_heads >= 1 && init.heads % init.kv_heads != 0) {
    p.add("model.init.kv_heads", absl::StrCat("must divide model.init.heads (", init.heads, ")"),
          init.kv_heads);
  }
  if (init.heads >= 1 && init.hidden >= 1 && init.head_dim == 0) {
    if (init.hidden % init.heads != 0) {
      p.add("model.init.hidden",
            absl::StrCat("must be divisible by model.init.heads (", init.heads, ")"), init.hidden);
    } else if ((init.hidden / init.heads) % 2 != 0) {
      p.add("model.init.hidden", "must give an even head dim (hidden / model.init.heads) for RoPE",
            absl::StrCat(init.hidden, " / ", init.heads, " = ", init.hidden / init.heads));
    }
  }
  p.positive("model.init.rope_theta", init.rope_theta);
  p.positive("model.init.rms_norm_eps", init.rms_norm_eps);

  const RolloutConfig& rollout = config.rollout;
  p.at_least("rollout.n", rollout.n, 1);
  p.at_least("rollout.max_new_tokens", rollout.max_new_tokens, 1);
  p.positive("rollout.temperature", rollout.temperature);
  p.at_least("rollout.top_k", rollout.top_k, 0);
  if (!(rollout.top_p > 0 && rollout.top_p <= 1)) {
    p.add("rollout.top_p", "must be in (0, 1]", rollout.top_p);
  }

  p.at_least("rollout.num_slots", rollout.num_slots, 1);
  if (!(rollout.kv_cache_gb >= 0)) {
    p.add("rollout.kv_cache_gb", "must be >= 0 (0 = kv_cache_fraction of free memory)",
          rollout.kv_cache_gb);
  }
  if (!(rollout.kv_cache_fraction > 0 && rollout.kv_cache_fraction <= 1)) {
    p.add("rollout.kv_cache_fraction", "must be in (0, 1]", rollout.kv_cache_fraction);
  }
  p.at_least("rollout.workers", rollout.workers, 1);
  p.at_least("rollout.groups_in_flight", rollout.groups_in_flight, 1);
  p.one_of("rollout.interrupt", rollout.interrupt, {"recompute", "keep", "finish", "restart"});
  for (size_t i = 0; i < rollout.stop.size(); ++i) {
    if (rollout.stop[i].empty())
      p.add_string(absl::StrCat("rollout.stop[", i, "]"), "must be non-empty", "");
  }
  const PrefixConfig& prefix = rollout.prefix;
  if (prefix.n_prefix < -1) p.add("rollout.prefix.n_prefix", "must be >= -1", prefix.n_prefix);
  if (prefix.n_prefix > rollout.n) {
    p.add("rollout.prefix.n_prefix", absl::StrCat("must be <= rollout.n (", rollout.n, ")"),
          prefix.n_prefix);
  }
  p.one_of("rollout.prefix.strategy", prefix.strategy,
           {"random", "linear", "linear_max", "reverse_linear", "fixed"});
  if (!(prefix.min_ratio >= 0 && prefix.min_ratio <= 1)) {
    p.add("rollout.prefix.min_ratio", "must be in [0, 1]", prefix.min_ratio);
  }
  if (!(prefix.max_ratio >= 0 && prefix.max_ratio <= 1)) {
    p.add("rollout.prefix.max_ratio", "must be in [0, 1]", prefix.max_ratio);
  } else if (prefix.min_ratio >= 0 && prefix.min_ratio <= 1 &&
             prefix.max_ratio < prefix.min_ratio) {
    p.add(
        "rollout.prefix.max_ratio",
        absl::StrCat("must be >= rollout.prefix.min_ratio (", format_double(prefix.min_ratio), ")"),
        prefix.max_ratio);
  }
  p.at_least("rollout.prefix.steps", prefix.steps, 1);
  p.at_least("rollout.prefix.max_len", prefix.max_len, 0);
  if (prefix.strategy == "fixed" && prefix.share_across_group) {
    // A fixed set gives each prefixed sample its own ratio; sharing one contradicts it.
    p.add("rollout.prefix.share_across_group", "must be false with strategy 'fixed'", "true");
  }

  const TaskConfig& task = config.task;
  p.one_of("task.name", task.name, {"arithmetic", "math_answer", "jsonl"});
  if ((task.name == "math_answer" || task.name == "jsonl") && task.path.empty()) {
    p.add_string("task.path", absl::StrCat("must name a JSONL file for task '", task.name, "'"),
                 task.path);
  }
  p.positive("task.verifier_timeout_s", task.verifier_timeout_s);
  const ArithmeticTaskConfig& arith = task.arithmetic;
  p.at_least("task.arithmetic.min_operands", arith.min_operands, 1);
  p.at_least("task.arithmetic.max_operands", arith.max_operands, arith.min_operands);
  p.at_least("task.arithmetic.min_digits", arith.min_digits, 1);
  p.at_least("task.arithmetic.max_digits", arith.max_digits, arith.min_digits);
  if (arith.max_digits > 9) p.add("task.arithmetic.max_digits", "must be <= 9", arith.max_digits);
  if (arith.operators.empty() || arith.operators.find_first_not_of("+-*") != std::string::npos) {
    p.add_string("task.arithmetic.operators", "must be a non-empty string of + - *",
                 arith.operators);
  }
  if (!(task.math_answer.format_reward >= 0 && task.math_answer.format_reward <= 1)) {
    p.add("task.math_answer.format_reward", "must be in [0, 1]", task.math_answer.format_reward);
  }
  p.one_of("task.jsonl.match", task.jsonl.match, {"exact", "regex"});
  if (task.jsonl.prompt_key.empty()) {
    p.add_string("task.jsonl.prompt_key", "must be non-empty", task.jsonl.prompt_key);
  }
  if (task.jsonl.answer_key.empty()) {
    p.add_string("task.jsonl.answer_key", "must be non-empty", task.jsonl.answer_key);
  }

  // The trainer's enum names are listed here rather than parsed by the trainer
  // library, which needs LibTorch; relay::trainer::trainer_options() maps them.
  const TrainerConfig& trainer = config.trainer;
  p.at_least("trainer.max_staleness", trainer.max_staleness, 0);
  p.positive("trainer.lr", trainer.lr);
  p.one_of("trainer.loss", trainer.loss,
           {"ppo", "decoupled_ppo", "gspo", "gmpo", "cispo", "sapo", "clip_cov", "kl_cov", "gpg",
            "reinforce", "luffy"});
  p.one_of("trainer.proximal", trainer.proximal, {"recorded", "recompute", "loglinear"});
  p.at_least("trainer.micro_batch_tokens", trainer.micro_batch_tokens, 1);
  p.at_least("trainer.ppo_epochs", trainer.ppo_epochs, 1);
  p.at_least("trainer.mini_batches", trainer.mini_batches, 1);
  p.non_negative("trainer.kl_coef", trainer.kl_coef);
  p.one_of("trainer.kl_estimator", trainer.kl_estimator,
           {"k1", "abs", "k2", "k3", "k1+", "abs+", "k3+", "kl", "mse", "low_var_kl", "kl+", "mse+",
            "k2+", "low_var_kl+"});
  p.non_negative("trainer.sft_coef", trainer.sft_coef);
  p.non_negative("trainer.loss_scale_factor", trainer.loss_scale_factor);
  p.at_least("trainer.max_reuse", trainer.max_reuse, 0);
  p.at_least("trainer.max_extra_batches", trainer.max_extra_batches, 0);
  p.at_least("trainer.world_size", trainer.world_size, 1);
  p.at_least("trainer.allreduce_bucket_mb", trainer.allreduce_bucket_mb, 1);
  p.positive("trainer.collective_timeout_s", trainer.collective_timeout_s);
  p.one_of("trainer.router_replay", trainer.router_replay, {"off", "replay"});

  const auto clip_pair = [&p](const std::string& section, double low, double high) {
    p.in_range(section + ".clip_low", low, 0, 1, /*open_hi=*/true);
    p.non_negative(section + ".clip_high", high);
  };
  clip_pair("trainer.gspo", trainer.gspo.clip_low, trainer.gspo.clip_high);
  p.non_negative("trainer.gmpo.clip_low", trainer.gmpo.clip_low);
  p.non_negative("trainer.gmpo.clip_high", trainer.gmpo.clip_high);
  clip_pair("trainer.cispo", trainer.cispo.clip_low, trainer.cispo.clip_high);
  p.positive("trainer.sapo.tau_pos", trainer.sapo.tau_pos);
  p.positive("trainer.sapo.tau_neg", trainer.sapo.tau_neg);
  if (!(trainer.clip_cov.ratio > 0 && trainer.clip_cov.ratio <= 1)) {
    p.add("trainer.clip_cov.ratio", "must be in (0, 1]", trainer.clip_cov.ratio);
  }
  if (!(trainer.clip_cov.lb < trainer.clip_cov.ub)) {
    p.add("trainer.clip_cov.lb",
          absl::StrCat("must be < trainer.clip_cov.ub (", format_double(trainer.clip_cov.ub), ")"),
          trainer.clip_cov.lb);
  }
  if (!(trainer.kl_cov.ratio > 0 && trainer.kl_cov.ratio <= 1)) {
    p.add("trainer.kl_cov.ratio", "must be in (0, 1]", trainer.kl_cov.ratio);
  }
  p.non_negative("trainer.kl_cov.coef", trainer.kl_cov.coef);
  const LuffyConfig& luffy = trainer.luffy;
  p.one_of("trainer.luffy.off_policy_reshape", luffy.off_policy_reshape,
           {"p_div_p", "p_div_p_0.1", "p_div_p_0.3", "p_div_p_0.5", "no_reshape", "logp", "p_logp",
            "square_root", "pow"});
  p.one_of("trainer.luffy.on_policy_reshape", luffy.on_policy_reshape,
           {"p_div_p", "p_div_p_0.1", "p_div_p_0.3", "p_div_p_0.5", "no_reshape", "logp", "p_logp",
            "square_root", "pow"});
  p.positive("trainer.luffy.gamma", luffy.gamma);
  p.positive("trainer.luffy.reshape_pow_exp", luffy.reshape_pow_exp);
  p.positive("trainer.luffy.on_reshape_pow_exp", luffy.on_reshape_pow_exp);
  p.non_negative("trainer.luffy.off_max_clip", luffy.off_max_clip);
  p.non_negative("trainer.luffy.off_min_clip", luffy.off_min_clip);
  p.non_negative("trainer.luffy.clip_upper_bound", luffy.clip_upper_bound);
  const EntropyConfig& ent = trainer.entropy;
  p.non_negative("trainer.entropy.coef", ent.coef);
  p.non_negative("trainer.entropy.target", ent.target);
  if (ent.target > 0) {
    p.positive("trainer.entropy.delta", ent.delta);
    if (!(ent.max_coef >= ent.coef)) {
      p.add("trainer.entropy.max_coef",
            absl::StrCat("must be >= trainer.entropy.coef (", format_double(ent.coef), ")"),
            ent.max_coef);
    }
  }
  const RewardKlConfig& rkl = trainer.reward_kl;
  p.non_negative("trainer.reward_kl.coef", rkl.coef);
  p.one_of("trainer.reward_kl.controller", rkl.controller, {"fixed", "adaptive"});
  p.positive("trainer.reward_kl.target_kl", rkl.target_kl);
  p.positive("trainer.reward_kl.horizon", rkl.horizon);
  p.one_of("trainer.reward_kl.estimator", rkl.estimator,
           {"k1", "abs", "k2", "k3", "k1+", "abs+", "k3+", "kl", "mse", "low_var_kl", "kl+", "mse+",
            "k2+", "low_var_kl+"});

  const AdvantageConfig& adv = trainer.advantage;
  p.one_of("trainer.advantage.estimator", adv.estimator,
           {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
            "grpo_passk", "grpo_split", "remax", "gae"});
  p.one_of("trainer.advantage.std_scale", adv.std_scale, {"none", "group", "batch"});
  p.positive("trainer.advantage.epsilon", adv.epsilon);
  p.in_range("trainer.advantage.gamma", adv.gamma, 0, 1);
  p.in_range("trainer.advantage.lambda", adv.lambda, 0, 1);

  const PpoConfig& ppo = trainer.ppo;
  p.in_range("trainer.ppo.clip_low", ppo.clip_low, 0, 1, /*open_hi=*/true);
  p.non_negative("trainer.ppo.clip_high", ppo.clip_high);
  p.zero_or_above("trainer.ppo.clip_c", ppo.clip_c, 1, "1");
  if (ppo.clip_high >= 0) {
    p.zero_or_above(
        "trainer.ppo.clip_delta", ppo.clip_delta, 1 + ppo.clip_high,
        absl::StrCat("1 + trainer.ppo.clip_high (", format_double(1 + ppo.clip_high), ")"));
  }
  p.non_negative("trainer.ppo.log_ratio_clamp", ppo.log_ratio_clamp);
  p.zero_or_above("trainer.ppo.behav_imp_weight_cap", ppo.behav_imp_weight_cap, 1, "1");
  p.one_of("trainer.ppo.agg_mode", ppo.agg_mode,
           {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"});

  // Ranges of rollout_correction's thresholds depend on the criterion; the
  // trainer's validate() checks them (trainer_options()).
  const RolloutCorrectionConfig& rc = trainer.rollout_correction;
  p.one_of("trainer.rollout_correction.is_level", rc.is_level,
           {"none", "token", "sequence", "geometric"});
  p.one_of("trainer.rollout_correction.is_mode", rc.is_mode, {"truncate", "clip"});
  p.one_of("trainer.rollout_correction.rs_level", rc.rs_level,
           {"none", "token", "sequence", "geometric"});
  p.one_of("trainer.rollout_correction.rs_criterion", rc.rs_criterion, {"ratio", "k1", "k2", "k3"});
  p.positive("trainer.rollout_correction.log_clamp", rc.log_clamp);

  const OptimizerConfig& opt = trainer.optimizer;
  p.non_negative("trainer.optimizer.weight_decay", opt.weight_decay);
  p.in_range("trainer.optimizer.beta1", opt.beta1, 0, 1, /*open_hi=*/true);
  p.in_range("trainer.optimizer.beta2", opt.beta2, 0, 1, /*open_hi=*/true);
  p.positive("trainer.optimizer.eps", opt.eps);
  p.one_of("trainer.optimizer.schedule", opt.schedule, {"constant", "linear_warmup", "cosine"});
  p.at_least("trainer.optimizer.warmup_steps", opt.warmup_steps, 0);
  p.at_least("trainer.optimizer.total_steps", opt.total_steps, 0);
  if (opt.schedule == "cosine" && opt.total_steps == 0) {
    p.add("trainer.optimizer.total_steps", "must be >= 1 with schedule 'cosine'", opt.total_steps);
  }
  p.in_range("trainer.optimizer.min_lr_ratio", opt.min_lr_ratio, 0, 1);
  return std::move(p.problems);
}

// ---------------------------------------------------------------------------
// Overrides: "key.path=value", applied to the YAML tree before decoding.

struct Override {
  std::string text;               // as given, for messages
  std::string key;                // "rollout.n"
  std::vector<std::string> path;  // {"rollout", "n"}
  YAML::Node value;
};

std::string override_source(const std::string& text) {
  return absl::StrCat("override ", quote(text));
}

StatusOr<Override> parse_override(const std::string& text) {
  const std::string source = override_source(text);
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    return InvalidArgumentError(absl::StrCat(source, ": expected key.path=value"));
  }
  Override o;
  o.text = text;
  o.key = std::string(absl::StripAsciiWhitespace(text.substr(0, eq)));
  if (o.key.empty()) return InvalidArgumentError(absl::StrCat(source, ": empty key"));
  o.path = absl::StrSplit(o.key, '.');
  for (const std::string& part : o.path) {
    if (part.empty()) {
      return InvalidArgumentError(absl::StrCat(source, ": empty component in key ", quote(o.key)));
    }
  }
  std::string value = text.substr(eq + 1);
  if (absl::StripAsciiWhitespace(value).empty()) {
    o.value = YAML::Node(std::string());  // "key=" sets an empty string, not null
    return o;
  }
  try {
    o.value = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(absl::StrCat(source, ": malformed value: ", e.msg));
  }
  return o;
}

// Sets root[path...] = value, turning missing or non-map intermediates into
// maps (a non-map that was a leaf is then reported by the decoder as a type
// error at its path). Uses fresh Node handles per level: assigning to a
// yaml-cpp Node that refers into a tree rewrites the tree.
void set_path(YAML::Node map, const std::vector<std::string>& path, size_t i,
              const YAML::Node& value) {
  if (i + 1 == path.size()) {
    map[path[i]] = value;
    return;
  }
  YAML::Node child = map[path[i]];
  if (!child.IsMap()) child = YAML::Node(YAML::NodeType::Map);
  set_path(child, path, i + 1, value);
}

// ---------------------------------------------------------------------------

Status decode(const YAML::Node& root, const std::string& source, bool use_marks,
              ExperimentConfig& out) {
  ExperimentConfig config;
  Reader reader(source, use_marks);
  reader.read_map(root, "", config);
  if (!reader.errors().empty()) {
    return InvalidArgumentError(absl::StrJoin(reader.errors(), "\n"));
  }
  out = std::move(config);
  return OkStatus();
}

// Receives a document's events and ignores them: count_documents() only
// needs HandleNextDocument's answer.
class IgnoreEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The documents in `yaml_text`, counted up to `limit`. Not YAML::LoadAll:
// in yaml-cpp 0.7 a stray ',' at the top level makes it return empty
// documents without end, until memory runs out (found by tests/fuzz).
// Throws YAML::ParserException.
size_t count_documents(const std::string& yaml_text, size_t limit) {
  std::istringstream in(yaml_text);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  size_t docs = 0;
  while (docs < limit && parser.HandleNextDocument(ignore)) ++docs;
  return docs;
}

// Parses the text into a map node (an empty document becomes an empty map).
StatusOr<YAML::Node> load_root(const std::string& yaml_text, const std::string& source) {
  constexpr size_t kCountUpTo = 16;
  YAML::Node root;
  try {
    const size_t docs = count_documents(yaml_text, kCountUpTo + 1);
    if (docs > 1) {
      return InvalidArgumentError(absl::StrCat(source, ": expected one YAML document, got ",
                                               docs > kCountUpTo ? "more than " : "",
                                               std::min(docs, kCountUpTo)));
    }
    if (docs == 1) root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    return InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": malformed YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    std::string where = source;
    if (!root.Mark().is_null()) absl::StrAppend(&where, ":", root.Mark().line + 1);
    return InvalidArgumentError(
        absl::StrCat(where, ": expected a map at the top level, got ", describe(root)));
  }
  return root;
}

StatusOr<ExperimentConfig> parse_config_impl(const std::string& yaml_text,
                                             const std::string& source,
                                             const std::vector<std::string>& overrides) {
  RELAY_ASSIGN_OR_RETURN(YAML::Node root, load_root(yaml_text, source));
  ExperimentConfig config;
  RELAY_RETURN_IF_ERROR(decode(root, source, /*use_marks=*/true, config));
  // Decode again after each override: the tree decoded cleanly before it, so
  // any new error is that override's, and is reported under its name.
  std::vector<Override> applied;
  for (const std::string& text : overrides) {
    RELAY_ASSIGN_OR_RETURN(Override o, parse_override(text));
    set_path(root, o.path, 0, o.value);
    RELAY_RETURN_IF_ERROR(decode(root, override_source(text), /*use_marks=*/false, config));
    applied.push_back(std::move(o));
  }

  std::vector<Problem> problems = find_problems(config);
  if (problems.empty()) return config;
  std::vector<std::string> lines;
  for (const Problem& problem : problems) {
    // Blame the last override that set this path or a section holding it.
    std::string blamed = source;
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
      if (problem.path == it->key || absl::StartsWith(problem.path, it->key + ".")) {
        blamed = override_source(it->text);
        break;
      }
    }
    lines.push_back(absl::StrCat(blamed, ": ", problem.path, ": ", problem.what));
  }
  return InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace

StatusOr<ExperimentConfig> load_config(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFoundError(absl::StrCat("config file not found: ", path));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgumentError(absl::StrCat(path, ": is a directory, expected a YAML file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(absl::StrCat(path, ": cannot open file"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return InvalidArgumentError(absl::StrCat(path, ": cannot read file"));
  return parse_config(text, path, overrides);
}

StatusOr<ExperimentConfig> parse_config(const std::string& yaml_text, const std::string& source,
                                        const std::vector<std::string>& overrides) {
  try {
    return parse_config_impl(yaml_text, source, overrides);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  } catch (const std::exception& e) {
    return InternalError(absl::StrCat(source, ": ", e.what()));
  }
}

Status validate(const ExperimentConfig& config) {
  std::vector<Problem> problems = find_problems(config);
  if (problems.empty()) return OkStatus();
  std::vector<std::string> lines;
  for (const Problem& problem : problems) {
    lines.push_back(absl::StrCat(problem.path, ": ", problem.what));
  }
  return InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

std::string to_yaml(const ExperimentConfig& config) {
  ExperimentConfig copy = config;  // the schema walks mutable structs
  YAML::Emitter out;
  out << YAML::BeginMap;
  Writer writer(out);
  visit_fields(writer, copy);
  out << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

std::vector<std::pair<std::string, std::string>> config_fields(const ExperimentConfig& config) {
  ExperimentConfig copy = config;  // the schema walks mutable structs
  FieldLister lister;
  visit_fields(lister, copy);
  return std::move(lister.fields);
}

}  // namespace relay
