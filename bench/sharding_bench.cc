// What trainer.sharding: optimizer and full save and cost: the bytes one
// trainer rank holds (weights, gradients, fp32 master copies, AdamW moments;
// with full, the weights between passes and at a pass's peak) and the time
// of Trainer::step, for world sizes 1, 2 and 4, against sharding: none at
// the same world size. Results: docs/BENCHMARKS.md.
//
// The ranks are threads of this process in one Gloo group on loopback (as
// the unit tests run them), each with its own copy of the model, so every
// rank's tensors are its own and are counted exactly from the trainer's
// memory/* metrics; the process's resident set is the sum over ranks and is
// not a per-rank figure. Activations do not depend on the sharding (they
// follow trainer.micro_batch_tokens); they are left out.
//
// A configuration whose ranks would not fit in this machine's memory
// (estimated from the parameter count) is skipped with a note.
//
//   sharding_bench [--models tiny,qwen2-100m,qwen2.5-0.5b] [--worlds 1,2,4]
//                  [--shardings none,optimizer,full] [--shape BxT] [--reps R]
//                  [--dtype fp32|bf16] [--checkpointing] [--critic]
//                  [--cpu-memory keep|return] [--json]
//
// --critic measures PPO's critic instead (advantage.estimator gae against
// grpo, back to back for each model, world size and sharding, both with the
// pass before the update): the critic's weights and optimizer state per
// rank (with full, its shards between passes) and the step time with it
// over the step time without.
//
// --checkpointing turns trainer.activation_checkpointing on for every
// sharding: full always recomputes its layers, so this is the baseline that
// isolates what the sharding itself costs.
//
// Step time is rank 0's wall time of Trainer::step (the ranks meet in every
// collective), the median of --reps timed steps after one untimed step; the
// unsharded and the sharded run of a world size go back to back, and the
// ratio is that of their medians. All ranks share this machine's cores, so
// the step time at world size W is W ranks' work on the same cores: compare
// the sharded and unsharded rows of one W, not rows of different W.

#include <torch/torch.h>

#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "relay/comm/dist/trainer_group.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/policy.h"
#include "relay/trainer/trainer.h"
#include "testing/ports.h"

namespace {

using relay::bench::fail;
using relay::bench::flag;
using relay::bench::has;
using relay::bench::median;
using relay::model::Policy;
using relay::model::PolicyConfig;
using relay::rollout::TrajectoryGroup;
using relay::trainer::AdvantageEstimator;
using relay::trainer::Sharding;
using relay::trainer::StepMetrics;

const char* mode_name(Sharding s) {
  return s == Sharding::kNone ? "none" : s == Sharding::kOptimizer ? "optimizer" : "full";
}

struct Run {
  std::vector<StepMetrics> last;  // each rank's metrics of its last step
  std::vector<double> seconds;    // rank 0's timed steps
};

constexpr double kGiB = 1ull << 30;

// `reps` timed steps (after one untimed) of `world` ranks, each over its own
// `make_initial()` (deterministic): no shared copy of the weights outlives
// the ranks' own, which is what lets a 0.5B model with a critic fit two
// ranks in this process.
Run run(const std::function<Policy()>& make_initial, int world, Sharding sharding,
        const std::vector<TrajectoryGroup>& groups, int reps, bool checkpointing,
        std::optional<AdvantageEstimator> critic_bench = std::nullopt) {
  relay::trainer::TrainerOptions o;
  // full recomputes its layers whatever this says; with it on, none and
  // optimizer recompute too, and the step ratio is the sharding's alone.
  o.activation_checkpointing = checkpointing;
  o.rollout_correction.bypass = true;  // no pass before the update: the update is what differs
  if (critic_bench) {
    // gae against grpo: both with the pass before the update (the critic
    // scores there), so the difference is the critic's pass and update.
    o.advantage.estimator = *critic_bench;
    o.rollout_correction.bypass = false;
  }
  o.max_staleness = -1;
  o.optimizer.lr = 1e-5;
  o.micro_batch_tokens = 1 << 20;
  o.sharding = sharding;
  const int port = relay::testing::free_port();
  Run out;
  out.last.resize(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      relay::trainer::DataParallel dp;
      if (world > 1) {
        relay::comm::TrainerGroupOptions go;
        go.rank.rank = rank;
        go.rank.world_size = world;
        go.rank.host = "127.0.0.1";
        go.rank.port = port;
        go.timeout = std::chrono::seconds(600);
        auto group = relay::comm::join_trainer_group(go);
        if (!group.ok()) {
          errors[rank] = std::string(group.status().message());
          return;
        }
        dp.group = *group;
      }
      auto t = relay::trainer::Trainer::create(make_initial(), o, 0, nullptr, dp);
      if (!t.ok()) {
        errors[rank] = std::string(t.status().message());
        return;
      }
      for (int i = 0; i <= reps; ++i) {
        const auto t0 = relay::bench::Clock::now();
        auto m = (*t)->step(groups);
        if (!m.ok()) {
          errors[rank] = std::string(m.status().message());
          return;
        }
        if (rank == 0 && i > 0) out.seconds.push_back(relay::bench::seconds_since(t0));
        out.last[rank] = *m;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) fail("world " + std::to_string(world) + ": " + e);
  }
  return out;
}

// The trainer's own tensors on rank 0 of a run, GiB, as its memory/*
// metrics count them: the policy's weights (with full, at a pass's peak),
// gradients, master copies and moments, the KL reference, and PPO's
// critic's weights, gradients and optimizer state. Activations and rank 0's
// host copies are not in it.
double rank_gib(const StepMetrics& m) {
  auto at = [&m](const char* key) { return m.count(key) ? m.at(key) : 0.0; };
  const double weights =
      m.count("memory/weights_peak_gb") ? at("memory/weights_peak_gb") : at("memory/weights_gb");
  return weights + at("memory/gradients_gb") + at("memory/master_weights_gb") +
         at("memory/optimizer_gb") + at("memory/reference_gb") + at("memory/critic_weights_gb") +
         at("memory/critic_gradients_gb") + at("memory/critic_optimizer_gb");
}

// Bytes the ranks of one configuration hold at their peak, roughly: each a
// copy of the weights and their gradients, plus (replicated) master copies,
// fp32 gradients and moments, or (sharded) a 1/world share of them.
double estimate_gib(int64_t params, int64_t weight_bytes, bool master, int world,
                    Sharding sharding) {
  const double n = static_cast<double>(params);
  const double state = n * 4 * (master ? 4 : 2);  // moments (+ master and fp32 gradients)
  const double weights = n * weight_bytes * 2;
  const double per_rank = sharding == Sharding::kNone        ? weights + state
                          : sharding == Sharding::kOptimizer ? weights + state / world
                                                             : (weights + state) / world;
  return per_rank * world * 1.3 / kGiB;  // + activations and temporaries
}

// The weights every configuration starts from: random, in `dtype`.
Policy initial_policy(const PolicyConfig& config, const std::string& dtype) {
  Policy initial(config);
  relay::model::init_weights(*initial, 1, 0.02);
  if (dtype == "bf16") initial->to(torch::kBFloat16);
  return initial;
}

// `batch` sequences of `seq` tokens (8 of prompt), in groups of up to 4.
std::vector<TrajectoryGroup> synthetic_batch(const PolicyConfig& config, int64_t batch,
                                             int64_t seq) {
  std::mt19937 rng(3);
  std::vector<TrajectoryGroup> groups;
  const int k = static_cast<int>(std::min<int64_t>(batch, 4));
  for (int g = 0; g < batch / k; ++g) {
    groups.push_back(relay::bench::synthetic_group(g, k, 8, static_cast<int>(seq - 8), 0,
                                                   config.vocab_size, rng));
  }
  return groups;
}

}  // namespace

int main(int argc, char** argv) {
  relay::model::choose_blas_kernels(argv);  // first: it may start the program again
  relay::bench::configure_cpu_memory(relay::bench::flag(argc, argv, "--cpu-memory"));
  relay::bench::expect_flags(
      argc, argv,
      {"--cpu-memory", "--dtype", "--models", "--reps", "--shape", "--shardings", "--worlds"},
      {"--checkpointing", "--critic", "--json"});
  const std::vector<std::string> models = relay::bench::split(
      flag(argc, argv, "--models") ? flag(argc, argv, "--models") : "qwen2-100m,qwen2.5-0.5b");
  std::vector<int> worlds;
  for (const std::string& w :
       relay::bench::split(flag(argc, argv, "--worlds") ? flag(argc, argv, "--worlds") : "1,2,4")) {
    worlds.push_back(std::stoi(w));
  }
  int64_t batch = 4, seq = 64;
  if (const char* s = flag(argc, argv, "--shape")) {
    if (std::sscanf(s, "%ldx%ld", &batch, &seq) != 2 || batch < 1 || seq < 9) {
      fail("--shape: expected BxT with T > 8");
    }
  }
  std::vector<Sharding> shardings;
  for (const std::string& m :
       relay::bench::split(flag(argc, argv, "--shardings") ? flag(argc, argv, "--shardings")
                                                           : "none,optimizer,full")) {
    const auto parsed = relay::trainer::kShardingNames.parse(m);
    if (!parsed.ok()) fail("--shardings: " + std::string(parsed.status().message()));
    shardings.push_back(*parsed);
  }
  const int reps = flag(argc, argv, "--reps") ? std::stoi(flag(argc, argv, "--reps")) : 3;
  const std::string dtype = flag(argc, argv, "--dtype") ? flag(argc, argv, "--dtype") : "fp32";
  if (dtype != "fp32" && dtype != "bf16") fail("--dtype: fp32 or bf16");
  const bool json = has(argc, argv, "--json");
  const bool checkpointing = has(argc, argv, "--checkpointing");
  const bool critic = has(argc, argv, "--critic");
  // With --json the rows go to stdout and the table to stderr (scripts/bench.sh).
  FILE* table = json ? stderr : stdout;
  struct sysinfo si {};
  ::sysinfo(&si);
  const double machine_gib = static_cast<double>(si.totalram) * si.mem_unit / kGiB;

  if (critic) {
    std::fprintf(table,
                 "| model | W | sharding | critic weights GiB | critic master+moments GiB | rank "
                 "GiB (grpo) | rank GiB (gae) | step s (grpo) | step s (gae) | gae vs grpo "
                 "|\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& name : models) {
      const PolicyConfig config = relay::bench::model_config(name, "--models");
      const auto initial = [&config, &dtype] { return initial_policy(config, dtype); };
      const std::vector<TrajectoryGroup> groups = synthetic_batch(config, batch, seq);
      for (int world : worlds) {
        at::set_num_threads(
            std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world));
        for (Sharding sh : shardings) {
          if (world == 1 && sh != Sharding::kNone) continue;
          const Run without =
              run(initial, world, sh, groups, reps, checkpointing, AdvantageEstimator::kGrpo);
          const Run with =
              run(initial, world, sh, groups, reps, checkpointing, AdvantageEstimator::kGae);
          const StepMetrics& m = with.last[0];
          const double state = m.at("memory/critic_optimizer_gb");
          std::fprintf(table, "| %s | %d | %s | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f | %.3f |\n",
                       name.c_str(), world, mode_name(sh), m.at("memory/critic_weights_gb"), state,
                       rank_gib(without.last[0]), rank_gib(m), median(without.seconds),
                       median(with.seconds), median(with.seconds) / median(without.seconds));
          std::fflush(table);
        }
      }
    }
    return 0;
  }
  std::fprintf(
      table,
      "| model | W | sharding | weights GiB | weights peak GiB | gradients GiB | master GiB "
      "| moments GiB | master+moments vs W=1 | step s | step vs none "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& name : models) {
    const PolicyConfig config = relay::bench::model_config(name, "--models");
    const auto initial = [&config, &dtype] { return initial_policy(config, dtype); };
    int64_t params = 0;
    for (const at::Tensor& p : initial()->parameters()) params += p.numel();
    const std::vector<TrajectoryGroup> groups = synthetic_batch(config, batch, seq);
    double single_state = 0;  // master + moments of one unsharded rank
    for (int world : worlds) {
      // none first: the others' step time is relative to it.
      std::vector<Sharding> modes = {Sharding::kNone};
      for (Sharding sh : shardings) {
        if (world > 1 && sh != Sharding::kNone) modes.push_back(sh);
      }
      at::set_num_threads(
          std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world));
      std::vector<Run> runs(modes.size());
      std::vector<bool> skipped(modes.size(), false);
      for (size_t i = 0; i < modes.size(); ++i) {
        const double need =
            estimate_gib(params, dtype == "bf16" ? 2 : 4, dtype == "bf16", world, modes[i]);
        if (need > machine_gib * 0.85) {
          skipped[i] = true;
          std::fprintf(
              table,
              "| %s | %d | %s | skipped: needs about %.0f GiB, the machine has %.0f ||||||||\n",
              name.c_str(), world, mode_name(modes[i]), need, machine_gib);
          continue;
        }
        runs[i] = run(initial, world, modes[i], groups, reps, checkpointing);
      }
      for (size_t i = 0; i < modes.size(); ++i) {
        if (skipped[i]) continue;
        const StepMetrics& m = runs[i].last[0];
        const double state = m.at("memory/master_weights_gb") + m.at("memory/optimizer_gb");
        if (world == 1) single_state = state;
        const double vs_none =
            i > 0 && !skipped[0] ? median(runs[i].seconds) / median(runs[0].seconds) : NAN;
        const char* mode = mode_name(modes[i]);
        const double peak = m.count("memory/weights_peak_gb") ? m.at("memory/weights_peak_gb")
                                                              : m.at("memory/weights_gb");
        std::fprintf(
            table, "| %s | %d | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.3f |\n",
            name.c_str(), world, mode, m.at("memory/weights_gb"), peak, m.at("memory/gradients_gb"),
            m.at("memory/master_weights_gb"), m.at("memory/optimizer_gb"),
            single_state > 0 ? state / single_state : NAN, median(runs[i].seconds), vs_none);
        if (json) {
          relay::bench::JsonRow("sharding")
              .add("model", name)
              .add("world", world)
              .add("sharding", mode)
              .add("dtype", dtype)
              .add("checkpointing", checkpointing ? 1 : 0)
              .add("weights_gib", m.at("memory/weights_gb"))
              .add("weights_peak_gib", peak)
              .add("gradients_gib", m.at("memory/gradients_gb"))
              .add("master_gib", m.at("memory/master_weights_gb"))
              .add("moments_gib", m.at("memory/optimizer_gb"))
              .add("state_vs_w1", single_state > 0 ? state / single_state : NAN)
              .add("step_s", median(runs[i].seconds))
              .add("step_vs_none", vs_none)
              .print(stdout);
        }
        std::fflush(table);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
