#pragma once

// What the benchmarks share: command-line and timing helpers, OpenBLAS's
// thread count, the qwen2-100m shape, and a synthetic scored trajectory group
// that passes submission validation. Header-only; each bench is one
// translation unit.

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "relay/model/cpu_memory.h"
#include "relay/model/policy_config.h"
#include "relay/rollout/trajectory.h"

namespace relay::bench {

using Clock = std::chrono::steady_clock;

// Ends the benchmark with a message (exit 1).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  std::exit(1);
}

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

// Median seconds of `reps` calls of f, after one untimed call.
template <typename F>
double time_median(int reps, F f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    f();
    t.push_back(seconds_since(start));
  }
  return median(t);
}

// Least seconds of `reps` calls of f, after one untimed call: for a bound,
// which interference from other processes can only lower.
template <typename F>
double time_best(int reps, F f) {
  f();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    f();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

// "0.91-1.02 s": the spread of repeated timings, for a notes column.
inline std::string spread(const std::vector<double>& t) {
  const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "runs %.3g-%.3g s", *lo, *hi);
  return buf;
}

// A pause before a timed run that follows another process's work: OpenBLAS's
// idle workers yield-spin for a while after each call, on the same cores.
inline void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

// Runs every mode once per repetition, in the given order on even
// repetitions and in reverse on odd ones (so drift falls on all alike), with
// settle() before each run. Each mode returns its own timed seconds.
// Returns seconds[mode][repetition].
inline std::vector<std::vector<double>> interleave(
    int reps, const std::vector<std::function<double()>>& modes) {
  std::vector<std::vector<double>> t(modes.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const size_t m = r % 2 == 0 ? k : modes.size() - 1 - k;
      settle();
      t[m].push_back(modes[m]());
    }
  }
  return t;
}

// Median over repetitions of base[r] / t[r]: each run against the baseline's
// run in the same repetition, which saw the same load. On a shared machine
// this is steadier than the ratio of the two medians.
inline double paired_ratio(const std::vector<double>& base, const std::vector<double>& t) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(base.size(), t.size()); ++i) r.push_back(base[i] / t[i]);
  return median(r);
}

// --name VALUE, or nullptr.
inline const char* flag(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return nullptr;
}

inline bool has(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

// Refuses any argument that is not one of the bench's flags, naming it (a
// mistyped flag would otherwise run the default suite for many minutes):
// `with_value` flags take the next argument, `switches` stand alone. --help
// lists them and exits 0.
inline void expect_flags(int argc, char** argv, std::initializer_list<const char*> with_value,
                         std::initializer_list<const char*> switches) {
  auto in = [](std::initializer_list<const char*> names, const char* a) {
    for (const char* n : names) {
      if (std::strcmp(n, a) == 0) return true;
    }
    return false;
  };
  auto listing = [&] {
    std::string s;
    for (const char* n : with_value) s += std::string(" [") + n + " VALUE]";
    for (const char* n : switches) s += std::string(" [") + n + "]";
    return s;
  };
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: %s%s\n", argv[0], listing().c_str());
      std::exit(0);
    }
    if (in(with_value, argv[i])) {
      if (i + 1 >= argc) fail(std::string(argv[i]) + " needs a value");
      ++i;
    } else if (!in(switches, argv[i])) {
      fail(std::string("unknown argument '") + argv[i] + "'; usage: " + argv[0] + listing());
    }
  }
}

// "a,b,,c" -> {"a", "b", "c"}
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// --cpu-memory keep|return (default keep): how the process holds freed
// memory, set as relay's binaries set it (model::configure_cpu_memory;
// `return` is relay's policy before 2026-11-29: every block of 1 MiB and up
// unmapped when freed). A Python baseline runs with glibc's defaults either
// way. Returns the choice's name.
inline std::string configure_cpu_memory(const char* value) {
  const std::string v = value ? value : "keep";
  const StatusOr<model::FreedMemory> freed = model::parse_freed_memory(v, "--cpu-memory");
  if (!freed.ok()) fail(std::string(freed.status().message()));
  model::configure_cpu_memory(*freed);
  return v;
}

// OpenBLAS keeps its own pthread pool next to LibTorch's OpenMP one. It is
// whatever libblas.so.3 resolves to at run time, so its setter is looked up,
// not linked. Sets it when set > 0; returns the count, -1 when the BLAS is
// not OpenBLAS.
inline int blas_threads(int set) {
  using Set = void (*)(int);
  using Get = int (*)();
  auto set_fn = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get_fn = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (set > 0 && set_fn) set_fn(set);
  return get_fn ? get_fn() : -1;
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

// Qwen2.5-0.5B's shape (494,032,768 parameters): 24 layers, hidden 896,
// FFN 4864, GQA 14/2, tied 151,936-token embeddings.
inline model::PolicyConfig qwen25_05b_config() {
  model::PolicyConfig q = qwen2_100m_config();
  q.vocab_size = 151936;
  q.hidden_size = 896;
  q.intermediate_size = 4864;
  q.num_hidden_layers = 24;
  q.num_attention_heads = 14;
  q.num_key_value_heads = 2;
  q.max_position_embeddings = 32768;
  return q;
}

// The shape a bench's --models names: tiny, qwen2-100m or qwen2.5-0.5b
// (fails naming `flag_name` otherwise).
inline model::PolicyConfig model_config(const std::string& name, const std::string& flag_name) {
  if (name == "tiny") return tiny_config();
  if (name == "qwen2-100m") return qwen2_100m_config();
  if (name == "qwen2.5-0.5b") return qwen25_05b_config();
  fail(flag_name + ": unknown '" + name + "' (tiny, qwen2-100m, qwen2.5-0.5b)");
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
