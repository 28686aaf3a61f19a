// The version-switch pause on a rollout worker: how long the rollout engine
// (relay/rollout/engine.h) stops decoding when a new weight version arrives.
// Results: docs/BENCHMARKS.md ("Version-switch pause").
//
// What relay-rollout does with a version (comm/worker/rollout_worker.cc): the
// weights are received off the generation loop (the WeightReceiver's thread
// for broadcast), and the loop, between two engine steps, stages them
// (Engine::update_weights: checks every name and shape, queues the tensors).
// The next Engine::step applies them before it decodes: it copies every
// parameter in place, then treats the sequences in flight by the interrupt
// policy (rollout.interrupt):
//   recompute (default) keeps every sequence and rebuilds its KV cache under
//             the new weights: prompt + response so far re-run in that step,
//             which also records the proximal log-probs; nothing is dropped;
//   keep      keeps the old KV cache (trajectories flagged stale_kv): the
//             copy alone;
//   restart   drops the partial responses and samples them again from the
//             prompt: the step re-prefills the prompts, and the dropped
//             tokens must be decoded again later (counted, not timed here);
//   finish    (not measured) applies the version only once every sequence in
//             flight has finished, admitting nothing meanwhile: no step is
//             slower, but slots idle while the batch drains, which depends on
//             the length mix.
//
// One repetition per policy: B sequences of P random prompt tokens (no stop
// tokens) decode W tokens; then update_weights is called and the next step
// runs, then 4 more. The pause is
//     update_weights time + (that step's time - one decode step's time),
// where the decode step is the median of the 4 steps before and the 4 after
// the switch at the same batch: the time the engine did not spend decoding
// because of the switch. Ratios: pause / one decode step at batch B (how
// many steps of generation a switch costs, the cost in the unit a worker
// produces), and pause / a plain copy of the parameters (copy_ of every
// parameter from warm source to warm destination tensors, timed in the same
// repetition: the floor any in-place switch pays). The staged tensors are
// another policy's parameters; relay-rollout stages views into its receive
// buffer, which copy the same.
//
//   version_switch_bench [--models tiny,qwen2-100m] [--batch 8] [--in-flight W]
//                        [--policies recompute,keep,restart] [--reps R] [--quick]
//                        [--cpu-memory keep|return] [--json]
// --cpu-memory: the malloc policy, as relay's binaries set it (bench_util.h);
// default keep, set before the first model is built.
// Defaults: W = 32, R = 7 for tiny and 5 for qwen2-100m; --quick: R = 3 and
// policies recompute,keep. Threads as relay's binaries (model::configure_threads).

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_util.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/policy.h"
#include "relay/model/threads.h"
#include "relay/rollout/engine.h"

namespace {

using relay::bench::Clock;
using relay::bench::median;
using relay::bench::seconds_since;
using namespace relay;

constexpr int kAround = 4;  // decode steps timed before and after each switch
constexpr int64_t kPrompt = 16;

template <typename T>
T check(StatusOr<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "version_switch_bench: %s: %s\n", what,
                 std::string(r.status().message()).c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "version_switch_bench: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

struct Sample {
  double stage_s = 0, switch_step_s = 0, decode_step_s = 0, copy_s = 0;
  int64_t recomputed = 0;  // positions re-run by recompute
  int64_t dropped = 0;     // response tokens dropped by restart
  double pause_s() const { return stage_s + switch_step_s - decode_step_s; }
};

// One engine per interrupt policy, reused across repetitions.
class Switcher {
 public:
  Switcher(const model::Policy& base, rollout::InterruptPolicy policy, int64_t batch,
           int64_t in_flight)
      : batch_(batch), in_flight_(in_flight), vocab_(base->config().vocab_size) {
    rollout::EngineOptions o;
    o.num_slots = batch;
    o.max_new_tokens = in_flight + 2 * kAround + 4;
    o.max_seq_len = kPrompt + o.max_new_tokens + 8;
    o.interrupt = policy;
    engine_ = check(rollout::Engine::create(model::clone_policy(*base), o, 0, 0), "Engine::create");
  }

  // Decodes W tokens on B fresh sequences, switches to `tensors`, decodes on.
  Sample run(const std::unordered_map<std::string, at::Tensor>& tensors,
             std::unordered_map<std::string, at::Tensor>& scratch, std::mt19937& rng) {
    std::uniform_int_distribution<int64_t> token(0, vocab_ - 1);
    for (int64_t i = 0; i < batch_; ++i) {
      rollout::PromptGroup g;
      g.group_id = "g" + std::to_string(next_group_++);
      for (int64_t p = 0; p < kPrompt; ++p) g.prompt.push_back(token(rng));
      g.seed = rng();
      check(engine_->submit(std::move(g)), "submit");
    }
    std::vector<double> steps;
    for (int64_t s = 0; s < in_flight_; ++s) {  // the first step admits and prefills
      const auto t = Clock::now();
      check(engine_->step(), "step");
      if (s >= in_flight_ - kAround) steps.push_back(seconds_since(t));
    }
    if (engine_->live_sequences() != batch_) {
      std::fprintf(stderr, "version_switch_bench: %lld sequences live, expected %lld\n",
                   (long long)engine_->live_sequences(), (long long)batch_);
      std::exit(1);
    }
    Sample out;
    {  // the floor: the same bytes copied in place, warm to warm
      torch::NoGradGuard no_grad;
      const auto t = Clock::now();
      for (const auto& [name, src] : tensors) scratch.at(name).copy_(src);
      out.copy_s = seconds_since(t);
    }
    const rollout::EngineStats before = engine_->stats();
    auto t = Clock::now();
    check(engine_->update_weights(++version_, 0, tensors), "update_weights");
    out.stage_s = seconds_since(t);
    t = Clock::now();
    check(engine_->step(), "step");
    out.switch_step_s = seconds_since(t);
    const rollout::EngineStats after = engine_->stats();
    out.recomputed = after.recomputed_tokens - before.recomputed_tokens;
    if (engine_->options().interrupt == rollout::InterruptPolicy::kRestart) {
      out.dropped = batch_ * in_flight_;
    }
    for (int s = 0; s < kAround; ++s) {
      t = Clock::now();
      check(engine_->step(), "step");
      steps.push_back(seconds_since(t));
    }
    out.decode_step_s = median(steps);
    engine_->abort();
    check(engine_->run(), "run");
    return out;
  }

 private:
  std::unique_ptr<rollout::Engine> engine_;
  int64_t batch_, in_flight_, vocab_;
  int64_t version_ = 0;
  int64_t next_group_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  relay::model::choose_blas_kernels(argv);  // first: it may start the program again
  std::vector<std::string> models = {"tiny", "qwen2-100m"};
  std::vector<std::string> policies = {"recompute", "keep", "restart"};
  int64_t batch = 8;
  int64_t in_flight = 32;
  int reps = 0;  // 0 = per model
  bool json = false;
  const char* cpu_memory = nullptr;  // keep
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--models" && has_value) {
      models = split(argv[++i]);
    } else if (a == "--policies" && has_value) {
      policies = split(argv[++i]);
    } else if (a == "--batch" && has_value) {
      batch = std::max(1LL, std::atoll(argv[++i]));
    } else if (a == "--in-flight" && has_value) {
      in_flight = std::max(kAround + 1LL, std::atoll(argv[++i]));
    } else if (a == "--reps" && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      reps = 3;
      policies = {"recompute", "keep"};
    } else if (a == "--json") {
      json = true;
    } else if (a == "--cpu-memory" && has_value) {
      cpu_memory = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: version_switch_bench [--models tiny,qwen2-100m] [--batch 8] "
                   "[--in-flight 32] [--policies recompute,keep,restart] [--reps R] [--quick] "
                   "[--cpu-memory keep|return] [--json]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  relay::bench::configure_cpu_memory(cpu_memory);
  std::FILE* out = json ? stderr : stdout;
  const model::ThreadSettings threads = model::configure_threads(0);
  const auto begin = Clock::now();
  std::fprintf(out,
               "version_switch_bench: batch %lld, %lld tokens in flight per sequence after a "
               "%lld-token prompt; %d intra-op thread(s), %d OpenBLAS threads\n",
               (long long)batch, (long long)in_flight, (long long)kPrompt, threads.intra_op,
               threads.blas);
  std::fprintf(out, "%-11s %-9s %9s %9s %8s %9s %8s %8s %8s %9s\n", "model", "interrupt",
               "pause ms", "step ms", "copy ms", "stage ms", "x step", "x copy", "recomp",
               "dropped");
  for (const std::string& name : models) {
    model::PolicyConfig config;
    if (name == "tiny") {
      config = relay::bench::tiny_config();
    } else if (name == "qwen2-100m") {
      config = relay::bench::qwen2_100m_config();
    } else {
      std::fprintf(stderr, "version_switch_bench: unknown model %s\n", name.c_str());
      return 2;
    }
    const int model_reps = reps > 0 ? reps : (name == "tiny" ? 7 : 5);
    model::Policy base(config);
    model::init_weights(*base, 0);
    model::Policy next(config);
    model::init_weights(*next, 1);
    // Two versions to alternate between, so the weights really change.
    const std::unordered_map<std::string, at::Tensor> versions[2] = {
        model::parameter_tensors(*next), model::parameter_tensors(*base)};
    std::unordered_map<std::string, at::Tensor> scratch;
    for (const auto& [n, t] : versions[0]) scratch[n] = torch::zeros_like(t);
    std::vector<std::unique_ptr<Switcher>> switchers;
    for (const std::string& p : policies) {
      switchers.push_back(std::make_unique<Switcher>(
          base, check(rollout::kInterruptPolicyNames.parse(p), "--policies"), batch, in_flight));
    }
    std::mt19937 rng(0);
    std::vector<std::vector<Sample>> samples(policies.size());
    // One untimed warm-up, then the policies take turns in each repetition.
    for (int rep = 0; rep < model_reps + 1; ++rep) {
      for (size_t p = 0; p < policies.size(); ++p) {
        Sample s = switchers[p]->run(versions[rep % 2], scratch, rng);
        if (rep > 0) samples[p].push_back(s);
      }
    }
    for (size_t p = 0; p < policies.size(); ++p) {
      auto med = [&](auto f) {
        std::vector<double> v;
        for (const Sample& s : samples[p]) v.push_back(f(s));
        return median(v);
      };
      const double pause = med([](const Sample& s) { return s.pause_s(); });
      const double step = med([](const Sample& s) { return s.decode_step_s; });
      const double copy = med([](const Sample& s) { return s.copy_s; });
      const double stage = med([](const Sample& s) { return s.stage_s; });
      const int64_t recomputed = samples[p].front().recomputed;
      const int64_t dropped = samples[p].front().dropped;
      std::fprintf(out, "%-11s %-9s %9.2f %9.2f %8.2f %9.3f %8.1f %8.1f %8lld %9lld\n",
                   name.c_str(), policies[p].c_str(), 1e3 * pause, 1e3 * step, 1e3 * copy,
                   1e3 * stage, pause / step, pause / copy, (long long)recomputed,
                   (long long)dropped);
      if (json) {
        relay::bench::JsonRow("version_switch")
            .add("model", name)
            .add("interrupt", policies[p])
            .add("batch", batch)
            .add("in_flight_tokens", in_flight)
            .add("pause_ms", 1e3 * pause)
            .add("decode_step_ms", 1e3 * step)
            .add("copy_ms", 1e3 * copy)
            .add("stage_ms", 1e3 * stage)
            .add("pause_vs_step", pause / step)
            .add("pause_vs_copy", pause / copy)
            .add("recomputed_tokens", recomputed)
            .add("dropped_tokens", dropped)
            .add("reps", model_reps)
            .print();
      }
    }
    std::fflush(out);
  }
  std::fprintf(out, "version_switch_bench: %.0f s\n", seconds_since(begin));
  return 0;
}
