// What trainer.lora saves and costs against full fine-tuning, on the same
// weights: the bytes a weight version ships to rollout workers, the bytes
// the trainer holds (weights, trainable weights, gradients, master copies,
// AdamW moments) and Trainer::step's time; and for the rollout side, decode
// throughput with the adapters as a side path (x A^T B^T on every adapted
// projection) against the same model with them merged into its weights
// (which decodes as the base does, but costs a merge per version), plus
// that merge's time. Results: docs/BENCHMARKS.md.
//
//   lora_bench [--models tiny,qwen2-100m,qwen2.5-0.5b] [--rank R] [--targets all-linear]
//              [--shape BxT] [--reps N] [--decode-tokens N] [--cpu-memory keep|return]
//              [--json]
//
// Full and LoRA steps alternate, each from a fresh trainer over the same base
// weights; step time is the median of --reps timed steps after one untimed
// one. Decode: one engine per variant, 8 sequences of --decode-tokens new
// tokens each after an 8-token prompt (greedy, no stop), timed end to end,
// the variants alternating --reps times; the ratio is that of the medians.

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/lora.h"
#include "relay/model/policy.h"
#include "relay/rollout/engine.h"
#include "relay/trainer/trainer.h"

namespace {

using relay::bench::fail;
using relay::bench::flag;
using relay::bench::has;
using relay::bench::median;
using relay::model::Policy;
using relay::model::PolicyConfig;
using relay::rollout::TrajectoryGroup;
using relay::trainer::StepMetrics;

constexpr double kGiB = 1ull << 30;
constexpr double kMiB = 1ull << 20;

double bytes_of(const std::unordered_map<std::string, at::Tensor>& tensors) {
  double total = 0;
  for (const auto& [name, t] : tensors) total += static_cast<double>(t.numel() * t.element_size());
  return total;
}

struct StepRun {
  StepMetrics last;
  std::vector<double> seconds;
};

StepRun train(const Policy& initial, const relay::model::LoraConfig& lora,
              const std::vector<TrajectoryGroup>& groups, int reps) {
  relay::trainer::TrainerOptions o;
  o.rollout_correction.bypass = true;
  o.max_staleness = -1;
  o.optimizer.lr = 1e-5;
  o.micro_batch_tokens = 1 << 20;
  o.lora = lora;
  Policy copy = relay::model::clone_policy(*initial);  // keeps what is frozen
  auto t = relay::trainer::Trainer::create(copy, o);
  if (!t.ok()) fail(std::string(t.status().message()));
  StepRun out;
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = relay::bench::Clock::now();
    auto m = (*t)->step(groups);
    if (!m.ok()) fail(std::string(m.status().message()));
    if (i > 0) out.seconds.push_back(relay::bench::seconds_since(t0));
    out.last = *m;
  }
  return out;
}

// Seconds to decode 8 sequences of `tokens` new tokens each.
double decode_seconds(const Policy& policy, int tokens) {
  relay::rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = tokens;
  eo.max_seq_len = tokens + 16;
  eo.sampling.greedy = true;  // the same work whatever the weights
  auto engine = relay::rollout::Engine::create(relay::model::clone_policy(*policy), eo, 0, 0);
  if (!engine.ok()) fail(std::string(engine.status().message()));
  relay::rollout::PromptGroup g;
  g.group_id = "decode";
  g.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  g.k = 8;
  g.seed = 1;
  if (!(*engine)->submit(g).ok()) fail("decode: submit");
  const auto t0 = relay::bench::Clock::now();
  auto out = (*engine)->run();
  if (!out.ok()) fail(std::string(out.status().message()));
  return relay::bench::seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  relay::model::choose_blas_kernels(argv);  // first: it may start the program again
  relay::bench::configure_cpu_memory(relay::bench::flag(argc, argv, "--cpu-memory"));
  relay::bench::expect_flags(
      argc, argv,
      {"--cpu-memory", "--decode-tokens", "--models", "--rank", "--reps", "--shape", "--targets"},
      {"--json"});
  const std::vector<std::string> models = relay::bench::split(
      flag(argc, argv, "--models") ? flag(argc, argv, "--models") : "qwen2-100m,qwen2.5-0.5b");
  relay::model::LoraConfig lora;
  lora.rank = flag(argc, argv, "--rank") ? std::stoi(flag(argc, argv, "--rank")) : 16;
  lora.alpha = 2.0 * static_cast<double>(lora.rank);
  lora.targets = relay::bench::split(flag(argc, argv, "--targets") ? flag(argc, argv, "--targets")
                                                                   : "all-linear");
  int64_t batch = 4, seq = 64;
  if (const char* s = flag(argc, argv, "--shape")) {
    if (std::sscanf(s, "%ldx%ld", &batch, &seq) != 2 || batch < 1 || seq < 9) {
      fail("--shape: expected BxT with T > 8");
    }
  }
  const int reps = flag(argc, argv, "--reps") ? std::stoi(flag(argc, argv, "--reps")) : 3;
  const int decode_tokens =
      flag(argc, argv, "--decode-tokens") ? std::stoi(flag(argc, argv, "--decode-tokens")) : 32;
  const bool json = has(argc, argv, "--json");
  FILE* table = json ? stderr : stdout;

  std::fprintf(table,
               "| model | LoRA | params trained | version MiB | version vs full | trainer GiB "
               "(weights+grads+master+moments) | step s | step vs full |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> decode_rows;
  for (const std::string& name : models) {
    const PolicyConfig config = relay::bench::model_config(name, "--models");
    Policy base(config);
    relay::model::init_weights(*base, 1, 0.02);
    base->eval();
    Policy adapted = relay::model::clone_policy(*base);
    if (auto s = relay::model::attach_lora(*adapted, lora, 1); !s.ok()) {
      fail(std::string(s.message()));
    }
    {
      // Adapters as they are after some training (B = 0 would make the
      // merge and the side path trivially equal, not slower).
      torch::NoGradGuard no_grad;
      for (auto& item : adapted->named_parameters()) {
        if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0, 0.01);
      }
    }
    const double full_bytes = bytes_of(relay::model::published_weights(*base).value());
    const double lora_bytes = bytes_of(relay::model::published_weights(*adapted).value());

    std::mt19937 rng(3);
    std::vector<TrajectoryGroup> groups;
    const int k = static_cast<int>(std::min<int64_t>(batch, 4));
    for (int g = 0; g < batch / k; ++g) {
      groups.push_back(relay::bench::synthetic_group(g, k, 8, static_cast<int>(seq - 8), 0,
                                                     config.vocab_size, rng));
    }
    // One trainer each; its steps are the repetitions.
    const StepRun full_run = train(base, relay::model::LoraConfig{}, groups, reps);
    const StepRun lora_run = train(adapted, lora, groups, reps);
    auto held = [](const StepMetrics& m) {
      return m.at("memory/weights_gb") + m.at("memory/gradients_gb") +
             m.at("memory/master_weights_gb") + m.at("memory/optimizer_gb");
    };
    const double full_step = median(full_run.seconds), lora_step = median(lora_run.seconds);
    int64_t trained = 0, total = 0;  // total: the base model's parameters
    for (const auto& p : adapted->parameters()) {
      if (p.requires_grad()) trained += p.numel();
    }
    for (const auto& p : base->parameters()) total += p.numel();
    std::string spec = "r" + std::to_string(lora.rank);
    for (size_t i = 0; i < lora.targets.size(); ++i) {
      spec += (i == 0 ? " " : ",") + lora.targets[i];
    }
    std::fprintf(table, "| %s | none | %lld | %.1f | 1.000 | %.3f | %.3f | 1.000 |\n", name.c_str(),
                 static_cast<long long>(total), full_bytes / kMiB, held(full_run.last), full_step);
    std::fprintf(table, "| %s | %s | %lld (%.2f%%) | %.2f | %.4f | %.3f | %.3f | %.3f |\n",
                 name.c_str(), spec.c_str(), static_cast<long long>(trained),
                 100.0 * static_cast<double>(trained) / static_cast<double>(total),
                 lora_bytes / kMiB, lora_bytes / full_bytes, held(lora_run.last), lora_step,
                 lora_step / full_step);
    if (json) {
      relay::bench::JsonRow("lora")
          .add("model", name)
          .add("lora", spec)
          .add("params", static_cast<double>(total))
          .add("trained_params", static_cast<double>(trained))
          .add("version_bytes_full", full_bytes)
          .add("version_bytes_lora", lora_bytes)
          .add("version_ratio", lora_bytes / full_bytes)
          .add("trainer_gib_full", held(full_run.last))
          .add("trainer_gib_lora", held(lora_run.last))
          .add("step_s_full", full_step)
          .add("step_s_lora", lora_step)
          .add("step_ratio", lora_step / full_step)
          .print();
    }

    // Decode: side path vs merged weights, alternating.
    Policy merged = relay::model::merged_policy(*adapted);
    std::vector<double> side_s, merged_s, merge_s;
    for (int r = 0; r < reps; ++r) {
      side_s.push_back(decode_seconds(adapted, decode_tokens));
      merged_s.push_back(decode_seconds(merged, decode_tokens));
      const auto t0 = relay::bench::Clock::now();
      auto w = relay::model::merged_weights(*adapted);
      merge_s.push_back(relay::bench::seconds_since(t0));
    }
    const double side = median(side_s), merged_t = median(merged_s), merge = median(merge_s);
    const double tokens = 8.0 * decode_tokens;
    char row[256];
    std::snprintf(row, sizeof(row), "| %s | %s | %.1f | %.1f | %.3f | %.3f |\n", name.c_str(),
                  spec.c_str(), tokens / side, tokens / merged_t, merged_t / side, merge);
    decode_rows.push_back(row);
    if (json) {
      relay::bench::JsonRow("lora_decode")
          .add("model", name)
          .add("lora", spec)
          .add("side_tokens_per_s", tokens / side)
          .add("merged_tokens_per_s", tokens / merged_t)
          .add("side_vs_merged_time", side / merged_t)
          .add("merge_s", merge)
          .print();
    }
  }
  std::fprintf(table,
               "\n| model | LoRA | side path tok/s | merged tok/s | merged time / side time | "
               "merge s per version |\n|---|---|---:|---:|---:|---:|\n");
  for (const std::string& r : decode_rows) std::fprintf(table, "%s", r.c_str());
  return 0;
}
