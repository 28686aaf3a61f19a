#pragma once

// What the benchmarks share: timing helpers, the qwen2-100m shape, and a
// synthetic scored trajectory group that passes submission validation.
// Header-only; each bench is one translation unit.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "relay/model/policy_config.h"
#include "relay/rollout/trajectory.h"

namespace relay::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The shape of configs/tiny.yaml (75,840 parameters): llama, 2 layers,
// hidden 64, 4 heads / 2 KV heads, FFN 128, the char tokenizer's 28 tokens.
inline model::PolicyConfig tiny_config() {
  model::PolicyConfig t;
  t.model_type = "llama";
  t.vocab_size = 28;
  t.hidden_size = 64;
  t.intermediate_size = 128;
  t.num_hidden_layers = 2;
  t.num_attention_heads = 4;
  t.num_key_value_heads = 2;
  t.max_position_embeddings = 128;
  t.tie_word_embeddings = true;
  return t;
}

// A ~100M-parameter Qwen2 (100,108,032 parameters): 12 layers, hidden 768,
// GQA 12/4, tied 32k embeddings.
inline model::PolicyConfig qwen2_100m_config() {
  model::PolicyConfig q;
  q.model_type = "qwen2";
  q.vocab_size = 32000;
  q.hidden_size = 768;
  q.intermediate_size = 2048;
  q.num_hidden_layers = 12;
  q.num_attention_heads = 12;
  q.num_key_value_heads = 4;
  q.max_position_embeddings = 2048;
  q.rope_theta = 1000000.0;
  q.tie_word_embeddings = true;
  q.attention_bias = true;
  return q;
}

// k trajectories of `response` random tokens (ids below `vocab`) after one
// shared `prompt`-token prompt, every token of `version`, log-probs in
// [-8, 0), rewards alternating 0/1.
inline rollout::TrajectoryGroup synthetic_group(int index, int k, int prompt, int response,
                                                int64_t version, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::uniform_real_distribution<float> lp(-8.0f, 0.0f);
  rollout::TrajectoryGroup g;
  g.group_id = "bench/" + std::to_string(index);
  std::vector<int64_t> prompt_tokens(prompt);
  for (auto& t : prompt_tokens) t = token(rng);
  for (int j = 0; j < k; ++j) {
    rollout::Trajectory t;
    t.prompt_tokens = prompt_tokens;
    for (int i = 0; i < response; ++i) {
      t.response_tokens.push_back(token(rng));
      t.behavior_logprobs.push_back(lp(rng));
      t.token_versions.push_back(version);
      t.proximal_logprobs.push_back(lp(rng));
      t.proximal_versions.push_back(version);
      t.offpolicy_mask.push_back(0);
    }
    t.finish_reason = rollout::FinishReason::kStop;
    t.version_digests = {{version, 12345}};
    t.reward = j % 2;
    g.trajectories.push_back(std::move(t));
  }
  return g;
}

// One machine-readable result row: a JSON object printed on one line
// (scripts/bench.sh reads them). Keys and string values are plain ASCII.
class JsonRow {
 public:
  explicit JsonRow(const std::string& bench) { add("bench", bench); }
  JsonRow& add(const std::string& key, const std::string& value) {
    std::string v;
    for (char c : value) {
      if (c == '"' || c == '\\') v += '\\';
      v += (c == '\n' || c == '\t') ? ' ' : c;
    }
    return raw(key, "\"" + v + "\"");
  }
  JsonRow& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonRow& add(const std::string& key, double value) {
    if (!std::isfinite(value)) return raw(key, "null");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", value);
    return raw(key, buf);
  }
  JsonRow& add(const std::string& key, int64_t value) { return raw(key, std::to_string(value)); }
  JsonRow& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  // Prints the row and a newline on `f`.
  void print(std::FILE* f = stdout) const {
    std::fprintf(f, "{%s}\n", body_.c_str());
    std::fflush(f);
  }

 private:
  JsonRow& raw(const std::string& key, const std::string& value) {
    if (!body_.empty()) body_ += ", ";
    body_ += "\"" + key + "\": " + value;
    return *this;
  }
  std::string body_;
};

}  // namespace relay::bench
