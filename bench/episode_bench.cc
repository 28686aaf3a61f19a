// Multi-turn episodes in the rollout engine (relay/rollout/engine.h,
// "Episodes") against single-turn decoding of the same turns, measured in the
// same run. A randomly initialised model ("tiny" or "qwen2-100m"), B slots,
// a fixed random set of stop tokens so turns end after a roughly geometric
// number of tokens (at most --new per turn).
//
//   single    (baseline) S x T independent single-turn sequences: the turns
//             of the episodes below as separate responses, no observations;
//   episodes  S episodes of up to T model turns; after each turn an
//             environment thread waits L ms (a tool's latency), then appends
//             O observation tokens (the last turn is answered with `stop`).
//             The turn handler hands each turn to a pool of 8 threads, so the
//             engine keeps decoding the other sequences meanwhile.
//
// Rows report model tokens/s (observation tokens are not output), the ratio
// to the single-turn baseline of the same repetition (median over
// repetitions), the model turns the episodes ended with a stop token (the
// environment was called), and how much of the slots' time went to waiting:
// parked = EngineStats::parked_sequence_steps / (steps x B). When every live
// sequence is parked the engine waits for an answer (bounded at 100 ms)
// rather than spinning.
//
//   episode_bench [--model tiny|qwen2-100m] [--slots B] [--episodes S] [--turns T]
//                 [--new N] [--obs O] [--latency-ms 0,5,20,50] [--reps R]
//                 [--cpu-memory keep|return]

#include <torch/types.h>
#include <torch/utils.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "bench_util.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/threads.h"
#include "relay/rollout/engine.h"

namespace relay::bench {
namespace {

struct Workload {
  model::PolicyConfig config;
  int slots = 8;
  int episodes = 16;
  int turns = 3;
  int64_t max_new = 32;
  int obs = 8;
  std::vector<int64_t> stops;
};

struct Result {
  double seconds = 0;
  int64_t model_tokens = 0;
  double parked = 0;  // parked slot-steps / (steps x slots)
  int64_t turns = 0;  // model turns ended by a stop token
};

rollout::EngineOptions engine_options(const Workload& w) {
  rollout::EngineOptions o;
  o.num_slots = w.slots;
  o.max_new_tokens = w.max_new;
  o.stop_tokens = w.stops;
  o.max_seq_len = 16 + w.turns * (w.max_new + w.obs) + 8;
  o.episode.max_turns = w.turns;
  o.episode.max_tokens = w.turns * (w.max_new + w.obs);
  return o;
}

std::vector<int64_t> prompt_of(int i, int64_t vocab) {
  std::vector<int64_t> p;
  for (int j = 0; j < 16; ++j) p.push_back((i * 7 + j * 3) % vocab);
  return p;
}

Result run_single(const Workload& w, model::Policy& policy) {
  auto engine = rollout::Engine::create(policy, engine_options(w), 0, 1).value();
  for (int i = 0; i < w.episodes * w.turns; ++i) {
    rollout::PromptGroup g;
    g.group_id = std::to_string(i);
    g.prompt = prompt_of(i, w.config.vocab_size);
    g.seed = static_cast<uint64_t>(i);
    if (!engine->submit(std::move(g)).ok()) std::abort();
  }
  const auto t0 = Clock::now();
  if (!engine->run().ok()) std::abort();
  Result r;
  r.seconds = seconds_since(t0);
  r.model_tokens = engine->stats().sampled_tokens;
  return r;
}

// The environment: a pool of threads that answer each turn after `latency`.
class SleepyEnvironment {
 public:
  SleepyEnvironment(rollout::Engine& engine, const Workload& w, int latency_ms)
      : engine_(engine), w_(w), latency_(latency_ms) {
    for (int i = 0; i < 8; ++i) threads_.emplace_back([this] { work(); });
  }
  ~SleepyEnvironment() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void on_turn(rollout::TurnEnd end) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(end));
    }
    cv_.notify_one();
  }

 private:
  void work() {
    while (true) {
      rollout::TurnEnd end;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        end = std::move(queue_.front());
        queue_.pop_front();
      }
      if (latency_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(latency_));
      rollout::TurnReply r;
      if (end.turn + 1 >= w_.turns) {
        r.end = rollout::FinishReason::kStop;
      } else {
        for (int j = 0; j < w_.obs; ++j) r.observation.push_back((end.turn * 5 + j) % 16 + 1);
      }
      (void)engine_.reply(end.group_id, end.sample, std::move(r));
    }
  }
  rollout::Engine& engine_;
  const Workload& w_;
  const int latency_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rollout::TurnEnd> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

Result run_episodes(const Workload& w, model::Policy& policy, int latency_ms) {
  auto engine = rollout::Engine::create(policy, engine_options(w), 0, 1).value();
  SleepyEnvironment env(*engine, w, latency_ms);
  engine->set_turn_handler([&env](rollout::TurnEnd end) { env.on_turn(std::move(end)); });
  for (int i = 0; i < w.episodes; ++i) {
    rollout::PromptGroup g;
    g.group_id = std::to_string(i);
    g.prompt = prompt_of(i, w.config.vocab_size);
    g.seed = static_cast<uint64_t>(i * w.turns);
    g.episode = true;
    if (!engine->submit(std::move(g)).ok()) std::abort();
  }
  const auto t0 = Clock::now();
  if (!engine->run().ok()) std::abort();
  Result r;
  r.seconds = seconds_since(t0);
  const rollout::EngineStats s = engine->stats();
  r.model_tokens = s.sampled_tokens;
  r.parked =
      static_cast<double>(s.parked_sequence_steps) / (static_cast<double>(s.steps) * w.slots);
  r.turns = s.turns_ended;
  return r;
}

}  // namespace
}  // namespace relay::bench

int main(int argc, char** argv) {
  relay::model::choose_blas_kernels(argv);  // first: it may start the program again
  relay::bench::configure_cpu_memory(relay::bench::flag(argc, argv, "--cpu-memory"));
  relay::bench::expect_flags(argc, argv,
                             {"--cpu-memory", "--episodes", "--latency-ms", "--model", "--new",
                              "--obs", "--reps", "--slots", "--turns"},
                             {});
  using namespace relay;
  using namespace relay::bench;
  const model::ThreadSettings threads = model::configure_threads(0);
  Workload w;
  const std::string name = flag(argc, argv, "--model") ? flag(argc, argv, "--model") : "tiny";
  w.config = name == "qwen2-100m" ? qwen2_100m_config() : tiny_config();
  if (const char* v = flag(argc, argv, "--slots")) w.slots = std::atoi(v);
  if (const char* v = flag(argc, argv, "--episodes")) w.episodes = std::atoi(v);
  if (const char* v = flag(argc, argv, "--turns")) w.turns = std::atoi(v);
  if (const char* v = flag(argc, argv, "--new")) w.max_new = std::atoi(v);
  if (const char* v = flag(argc, argv, "--obs")) w.obs = std::atoi(v);
  const int reps = flag(argc, argv, "--reps") ? std::atoi(flag(argc, argv, "--reps")) : 3;
  std::vector<int> latencies = {0, 5, 20, 50};
  if (const char* v = flag(argc, argv, "--latency-ms")) {
    latencies.clear();
    for (const std::string& s : split(v)) latencies.push_back(std::stoi(s));
  }
  w.config.max_position_embeddings =
      std::max<int64_t>(w.config.max_position_embeddings, 16 + w.turns * (w.max_new + w.obs) + 8);
  // A fixed random set of stop tokens, one id in 8 (at least 3) outside the
  // observation's ids (1..16), so most turns end by themselves before --new.
  std::vector<int64_t> ids;
  for (int64_t id = 17; id < w.config.vocab_size; ++id) ids.push_back(id);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(7));
  ids.resize(std::min<size_t>(ids.size(), std::max<size_t>(3, w.config.vocab_size / 8)));
  w.stops = ids;
  torch::manual_seed(0);
  model::Policy policy(w.config);
  model::init_weights(*policy, 0, 0.3);
  policy->eval();
  std::printf(
      "episode_bench: model %s, %d slots, %d episodes x %d turns, <= %lld new per turn, "
      "%d observation tokens, %zu stop ids, %d threads, %d reps\n",
      name.c_str(), w.slots, w.episodes, w.turns, static_cast<long long>(w.max_new), w.obs,
      w.stops.size(), threads.intra_op, reps);
  std::vector<std::function<double()>> modes;
  std::vector<Result> last(1 + latencies.size());
  modes.push_back([&] {
    last[0] = run_single(w, policy);
    return last[0].seconds / static_cast<double>(last[0].model_tokens);
  });
  for (size_t k = 0; k < latencies.size(); ++k) {
    modes.push_back([&, k] {
      last[k + 1] = run_episodes(w, policy, latencies[k]);
      return last[k + 1].seconds / static_cast<double>(last[k + 1].model_tokens);
    });
  }
  // Seconds per model token, so a ratio is the throughput ratio.
  const auto t = interleave(reps, modes);
  std::printf("%-22s %10s %12s %8s %8s %8s\n", "mode", "tokens", "tokens/s", "ratio", "turns",
              "parked");
  for (size_t m = 0; m < modes.size(); ++m) {
    const std::string label =
        m == 0 ? "single (baseline)" : "episodes, env " + std::to_string(latencies[m - 1]) + " ms";
    std::printf("%-22s %10lld %12.0f %8.2f %8lld %8.2f\n", label.c_str(),
                static_cast<long long>(last[m].model_tokens), 1.0 / median(t[m]),
                paired_ratio(t[0], t[m]), static_cast<long long>(last[m].turns), last[m].parked);
  }
  return 0;
}
