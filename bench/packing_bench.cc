// Sequence packing (trainer.pack_sequences): how much of a step's forward
// and backward work is padding with and without it, and Trainer::step's time
// either way, on the same batch and weights. Results: docs/BENCHMARKS.md.
//
// The batch: B rows whose prompt and response lengths are drawn from a
// long-tailed mix (prompts uniform in [20, 60] tokens, responses log-normal
// with median --median tokens and sigma 0.6, cut at --max-new tokens, as
// reasoning responses spread), random tokens, rewards 0/1. Padding fraction
// = 1 - real tokens / tokens computed, over the micro-batches the trainer
// makes at --budget tokens each: rows x longest row when padded, packed
// rows x longest row when packed.
//
//   packing_bench [--model tiny|qwen2-100m] [--rows B] [--median N] [--max-new N]
//                 [--budget TOKENS] [--reps R] [--cpu-memory keep|return] [--json]
//
// The padded and packed steps alternate, each from a fresh trainer over the
// same weights; the ratio is the median of the per-repetition ratios.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/policy.h"
#include "relay/trainer/batch.h"
#include "relay/trainer/trainer.h"

namespace {

using relay::bench::fail;
using relay::bench::flag;
using relay::rollout::TrajectoryGroup;
using relay::trainer::TokenBudget;
using relay::trainer::TrainBatch;

struct Padding {
  double computed = 0, real = 0;
  double fraction() const { return 1.0 - real / computed; }
};

Padding padding_of(const TrainBatch& batch, int64_t budget, bool packed) {
  Padding p;
  for (const auto& rows : relay::trainer::split_by_token_budget(
           batch, budget, packed ? TokenBudget::kReal : TokenBudget::kPadded)) {
    const TrainBatch mb = relay::trainer::select_rows(batch, rows);
    const double width = static_cast<double>(mb.input_ids.size(1));
    p.real += mb.lengths.sum().item<double>();
    p.computed +=
        packed ? relay::trainer::pack_rows(mb, mb.input_ids.size(1), 0).input_ids.size(0) * width
               : static_cast<double>(mb.size()) * width;
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  relay::model::choose_blas_kernels(argv);  // first: it may start the program again
  relay::bench::configure_cpu_memory(relay::bench::flag(argc, argv, "--cpu-memory"));
  relay::bench::expect_flags(
      argc, argv,
      {"--cpu-memory", "--model", "--rows", "--median", "--max-new", "--budget", "--reps"},
      {"--json"});
  const std::string model =
      flag(argc, argv, "--model") ? flag(argc, argv, "--model") : "qwen2-100m";
  auto number = [&](const char* name, int64_t fallback) {
    const char* v = flag(argc, argv, name);
    return v != nullptr ? std::stoll(v) : fallback;
  };
  const int64_t rows = number("--rows", 8), median = number("--median", 100);
  const int64_t max_new = number("--max-new", 256), budget = number("--budget", 4096);
  const int reps = static_cast<int>(number("--reps", 3));
  const bool json = relay::bench::has(argc, argv, "--json");
  // With --json the row goes to stdout and the line to stderr (scripts/bench.sh).
  FILE* table = json ? stderr : stdout;
  relay::model::PolicyConfig config;
  if (model == "tiny")
    config = relay::bench::tiny_config();
  else if (model == "qwen2-100m")
    config = relay::bench::qwen2_100m_config();
  else
    fail("--model: tiny or qwen2-100m");
  relay::model::Policy initial(config);
  relay::model::init_weights(*initial, 1, 0.02);

  std::mt19937 rng(11);
  std::uniform_int_distribution<int> prompt_len(20, 60);
  std::lognormal_distribution<double> response_len(std::log(static_cast<double>(median)), 0.6);
  std::vector<TrajectoryGroup> groups;
  for (int64_t r = 0; r < rows; r += 2) {
    // Groups of two (one rewarded): each row its own lengths.
    TrajectoryGroup g;
    const int p = prompt_len(rng);
    std::vector<int> n(2);
    for (int& x : n) {
      x = static_cast<int>(
          std::clamp<double>(std::round(response_len(rng)), 1, static_cast<double>(max_new)));
    }
    g = relay::bench::synthetic_group(static_cast<int>(r), 2, p, std::max(n[0], n[1]), 0,
                                      config.vocab_size, rng);
    g.group_id = "pack/" + std::to_string(r);
    for (int j = 0; j < 2; ++j) {
      // Each response cut to its own length.
      relay::rollout::Trajectory& t = g.trajectories[static_cast<size_t>(j)];
      const size_t len = static_cast<size_t>(n[static_cast<size_t>(j)]);
      t.response_tokens.resize(len);
      t.behavior_logprobs.resize(len);
      t.token_versions.resize(len);
      t.proximal_logprobs.resize(len);
      t.proximal_versions.resize(len);
      t.offpolicy_mask.resize(len);
      t.reward = j;
    }
    groups.push_back(std::move(g));
  }
  const TrainBatch batch = relay::trainer::build_batch(groups, {}).value();
  const Padding padded = padding_of(batch, budget, false), packed = padding_of(batch, budget, true);

  relay::trainer::TrainerOptions o;
  o.rollout_correction.bypass = true;
  o.max_staleness = -1;
  o.optimizer.lr = 1e-5;
  o.micro_batch_tokens = budget;
  std::vector<double> t_padded, t_packed;
  for (int rep = 0; rep <= reps; ++rep) {
    for (int k = 0; k < 2; ++k) {
      const bool pack = (rep + k) % 2 == 1;
      o.pack_sequences = pack;
      auto t = relay::trainer::Trainer::create(relay::model::clone_policy(*initial), o).value();
      relay::bench::settle();
      const auto t0 = relay::bench::Clock::now();
      auto m = t->step(groups);
      const double s = relay::bench::seconds_since(t0);
      if (!m.ok()) fail(std::string(m.status().message()));
      if (rep > 0) (pack ? t_packed : t_padded).push_back(s);
    }
  }
  std::vector<double> ratio;
  for (size_t i = 0; i < t_padded.size(); ++i) ratio.push_back(t_padded[i] / t_packed[i]);
  std::fprintf(table,
               "%s, %lld rows (%.0f real tokens), budget %lld: padding %.1f%% -> %.1f%% of the "
               "tokens computed; step %.2f s padded, %.2f s packed: packed/padded speed %.2f "
               "(%s / %s)\n",
               model.c_str(), static_cast<long long>(rows), padded.real,
               static_cast<long long>(budget), 100 * padded.fraction(), 100 * packed.fraction(),
               relay::bench::median(t_padded), relay::bench::median(t_packed),
               relay::bench::median(ratio), relay::bench::spread(t_padded).c_str(),
               relay::bench::spread(t_packed).c_str());
  if (json) {
    relay::bench::JsonRow("packing")
        .add("model", model)
        .add("rows", rows)
        .add("budget", budget)
        .add("padding_padded", padded.fraction())
        .add("padding_packed", packed.fraction())
        .add("step_padded_s", relay::bench::median(t_padded))
        .add("step_packed_s", relay::bench::median(t_packed))
        .add("speedup", relay::bench::median(ratio))
        .print(stdout);
  }
  return 0;
}
