// Training-step throughput (tokens/s through forward + backward + optimizer
// step) of relay's trainer against the same step in plain PyTorch on the same
// LibTorch, for the models of rollout_bench (tiny, qwen2-100m and
// qwen2.5-0.5b, random weights, fp32) or a model directory (--model-dir,
// loaded as fp32).
// Results: docs/BENCHMARKS.md.
//
// A batch is B sequences of T tokens: a P-token prompt and a T - P token
// response, groups of 8 samples per prompt with rewards 0/1, behavior
// log-probs = the policy's own + noise (so PPO ratios are near 1, as on
// policy). Each step trains on all B x T positions in one micro-batch. Rows:
//
//   python   (baseline) bench/python/relay_ref.py on the same weights: full
//            forward, log_softmax + gather, relay's PPO clip loss (token-mean,
//            dual clip), backward, grad-norm clip, AdamW.
//   core     the same loop as python's through relay's own pieces, without
//            the Trainer: Policy::score (LM head in chunks, every position),
//            gather_response, ppo_clip_loss, backward, clip_grad_norm_,
//            torch's AdamW.
//   trainer  Trainer::step on the trajectory groups, with rollout correction
//            in bypass mode (the cheapest configuration: no no-grad pass
//            before the update; the default configuration adds one forward
//            pass over the batch). Includes batch building, advantages and
//            every metric, and what the Trainer does beyond core: the LM
//            head on response positions only, its first chunk's logits kept
//            for backward (trainer.lm_head_keep_mb), AdamW in one pass.
//   bound    the step at the machine's fp32 GEMM peak (2048^3 matmul measured
//            in the same run): FLOPs = 3 x forward (backward = 2 x forward),
//            forward = 2 x matmul parameters (LM head included) per token +
//            attention 4 L T D_attn per token (full T x T scores, as both
//            implementations compute them). Its ratio is the trainer's
//            fraction of it.
//
// Runs alternate in order (python, core, trainer, then the reverse) with a
// 150 ms pause before each; a row's ratio is the median over repetitions of
// its run against the python run of the same repetition.
//
// Each side's first step (untimed) starts from the same weights and must
// report the same loss and gradient norm (before clipping); the benchmark
// fails if python or Trainer::step disagrees with the core loop.
//
//   trainer_bench [--models tiny,qwen2-100m,qwen2.5-0.5b] [--model-dir DIR] [--shapes BxT,...]
//                 [--prompt P] [--reps R] [--quick] [--no-python] [--no-core]
//                 [--python-exe PATH] [--python-script PATH] [--threads N]
//                 [--blas-threads T] [--attn auto|eager|sdpa]
//                 [--cpu-memory keep|return] [--json]
//
// --model-dir DIR adds the model in DIR (config.json + safetensors, any
// dtype, trained in fp32; with --model-dir alone only that model runs).
// --no-core leaves out the core row and its model and optimizer: a
// Qwen2.5-0.5B step holds about 8 GB of weights, gradients and AdamW state
// on each side, and three sides do not fit in 24 GB. The first-step check
// then compares Trainer::step with python.
//
// --cpu-memory keep|return: how relay's process holds freed tensor memory,
// as relay's binaries do (bench_util.h, configure_cpu_memory).
//
// --attn sets model.attn_implementation for relay's rows (the Python
// reference computes its attention explicitly, as eager does); the end line
// gives the process's peak resident memory, which with one shape is that
// shape's step.
//
// Threads as relay's binaries set them (model::configure_threads), and the
// Python process gets the same settings. Shapes: 8x128 and 32x128 for tiny,
// 8x128 and 16x128 for qwen2-100m (a 32x128 step of it is 2.5 TFLOP, half a
// minute here), 4x128 for qwen2.5-0.5b and model directories; --shapes sets
// them for every model. Timed repetitions: 9 (tiny), 5 (qwen2-100m up to
// 1024 tokens a step), 3 (larger, and --model-dir); --quick: 1, and only
// the first shape of qwen2-100m.

#include <sys/resource.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "machine_limits.h"
#include "python_ref.h"
#include "relay/model/attention_implementation.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/checkpoint.h"
#include "relay/model/cpu_memory.h"
#include "relay/model/policy.h"
#include "relay/model/safetensors.h"
#include "relay/model/threads.h"
#include "relay/trainer/advantages.h"
#include "relay/trainer/batch.h"
#include "relay/trainer/policy_loss.h"
#include "relay/trainer/trainer.h"

namespace {

using relay::bench::Clock;
using relay::bench::fail;
using relay::bench::median;
using relay::bench::seconds_since;
using relay::model::Policy;
using relay::model::PolicyConfig;
using relay::rollout::TrajectoryGroup;
using relay::trainer::TrainBatch;

struct Shape {
  int64_t batch = 8, seq = 128;
  std::string name() const { return std::to_string(batch) + "x" + std::to_string(seq); }
};

struct Row {
  std::string model, shape, mode;
  int64_t tokens = 0;
  double seconds = 0;  // median
  double ratio = 1;    // median per-repetition speed over python's (bound: the trainer's / it)
  std::string notes;
};

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, a, b, c);
  return buf;
}

template <typename T>
T value_or_die(relay::StatusOr<T> s, const char* what) {
  if (!s.ok()) fail(std::string(what) + ": " + std::string(s.status().message()));
  return *std::move(s);
}

// B / 8 groups of 8 samples (one group of B when B < 8), random tokens,
// rewards alternating 0/1; behavior log-probs are `policy`'s own + N(0, 0.05).
std::vector<TrajectoryGroup> make_groups(Policy& policy, const Shape& s, int64_t prompt) {
  const int64_t k = std::min<int64_t>(8, s.batch);
  std::mt19937 rng(7);
  std::vector<TrajectoryGroup> groups;
  for (int64_t g = 0; g < s.batch / k; ++g) {
    groups.push_back(relay::bench::synthetic_group(
        static_cast<int>(g), static_cast<int>(k), static_cast<int>(prompt),
        static_cast<int>(s.seq - prompt), 0, policy->config().vocab_size, rng));
  }
  const TrainBatch batch = value_or_die(relay::trainer::build_batch(groups, {}), "build_batch");
  at::Tensor logp;
  {
    torch::NoGradGuard no_grad;
    logp = relay::trainer::gather_response(policy->score(batch.input_ids, batch.lengths), batch);
  }
  std::normal_distribution<float> noise(0.0f, 0.05f);
  int64_t row = 0;
  for (TrajectoryGroup& g : groups) {
    for (auto& t : g.trajectories) {
      const float* lp = logp[row++].data_ptr<float>();
      for (size_t j = 0; j < t.behavior_logprobs.size(); ++j) {
        t.behavior_logprobs[j] = lp[j] + noise(rng);
      }
    }
  }
  return groups;
}

// The tensors of one step, as the trainer derives them from the groups.
struct StepInputs {
  TrainBatch batch;
  at::Tensor advantages;  // [B, L]
};

StepInputs step_inputs(const std::vector<TrajectoryGroup>& groups) {
  StepInputs in;
  in.batch = value_or_die(relay::trainer::build_batch(groups, {}), "build_batch");
  relay::trainer::AdvantageInputs ai;
  ai.rewards = in.batch.rewards;
  ai.group_index = in.batch.group_index;
  ai.response_mask = in.batch.response_mask;
  in.advantages = value_or_die(relay::trainer::compute_advantages(ai, {}), "advantages").advantages;
  return in;
}

// relay's pieces, without the Trainer: one optimizer step. Returns the loss
// and the gradient norm before clipping.
struct CoreResult {
  double loss = 0, grad_norm = 0;
};
CoreResult core_step(Policy& policy, torch::optim::AdamW& opt, const StepInputs& in) {
  opt.zero_grad();
  relay::trainer::PolicyLossInputs li;
  li.logprobs = relay::trainer::gather_response(policy->score(in.batch.input_ids, in.batch.lengths),
                                                in.batch);
  li.old_logprobs = in.batch.behavior_logprobs;
  li.advantages = in.advantages;
  li.response_mask = in.batch.response_mask;
  const at::Tensor loss = relay::trainer::ppo_clip_loss(li, {}).loss;
  loss.backward();
  CoreResult r;
  r.loss = loss.item<double>();
  r.grad_norm = torch::nn::utils::clip_grad_norm_(policy->parameters(), 1.0);
  opt.step();
  return r;
}

void write_batch(const StepInputs& in, const std::string& path) {
  const TrainBatch& b = in.batch;
  relay::Status s =
      relay::model::write_safetensors(path, {{"input_ids", b.input_ids.contiguous()},
                                             {"prompt_len", b.prompt_lengths[0].clone()},
                                             {"old_logprobs", b.behavior_logprobs.contiguous()},
                                             {"advantages", in.advantages.contiguous()},
                                             {"response_mask", b.response_mask.contiguous()}});
  if (!s.ok()) fail("write_safetensors: " + std::string(s.message()));
  const at::Tensor p = b.prompt_lengths;
  if (!p.eq(p[0]).all().item<bool>()) fail("batch: prompts must share a length");
}

// Within `rel` of the larger, or `abs` apart: the PPO loss is a mean of
// per-token terms of order 1 that nearly cancel on a batch like this one
// (rewards 0/1, ratios near 1), so its value can be ~1e-4 while its rounding
// error is that of the terms' sum.
bool close(double a, double b, double rel, double abs = 0) {
  return std::abs(a - b) <= std::max(abs, rel * std::max(std::abs(a), std::abs(b)));
}

// One shape, from the initial weights `init` on every side: relay's two
// copies are clones of it with fresh optimizers, and the Python process
// reloads `model_dir` (which holds them).
// Made into a "bound" row at the end of the run, with the better of the GEMM
// peaks measured at its start and end.
struct PendingBound {
  std::string model, shape;
  int64_t tokens = 0;
  double flops = 0;  // one step
  double trainer_s = 0;
};

void bench_shape(const std::string& model_name, Policy& init, const std::string& model_dir,
                 const Shape& s, int64_t prompt, int reps, bool with_core,
                 relay::bench::PythonRef* py, const std::string& scratch, std::vector<Row>* rows,
                 std::vector<PendingBound>* bounds) {
  relay::trainer::TrainerOptions o;
  o.rollout_correction.bypass = true;
  o.micro_batch_tokens = 1 << 20;  // one micro-batch per step, as the Python side
  // Every step trains on the same groups, sampled at version 0: no staleness
  // bound (the default, 0, would drop them from the second step on).
  o.max_staleness = -1;

  const std::vector<TrajectoryGroup> groups = make_groups(init, s, prompt);
  const StepInputs in = step_inputs(groups);
  const int64_t tokens = s.batch * s.seq;

  Policy core_policy{nullptr};
  std::unique_ptr<torch::optim::AdamW> core_opt;
  if (with_core) {
    core_policy = relay::model::clone_policy(*init);
    core_policy->train();
    core_opt = std::make_unique<torch::optim::AdamW>(
        core_policy->parameters(), torch::optim::AdamWOptions(o.optimizer.lr)
                                       .betas({o.optimizer.beta1, o.optimizer.beta2})
                                       .eps(o.optimizer.eps)
                                       .weight_decay(o.optimizer.weight_decay));
  }
  auto trainer = value_or_die(relay::trainer::Trainer::create(relay::model::clone_policy(*init), o),
                              "Trainer");

  // Equal work: each side's first step (untimed, also its warm-up) starts
  // from the same weights and must report the same loss and gradient norm as
  // the reference: the core loop, or without it the Python step.
  std::string notes;
  std::optional<CoreResult> ref;
  const char* ref_name = with_core ? "relay core" : "python";
  auto check = [&](const char* who, double loss, double norm) {
    if (!ref) {
      ref = CoreResult{loss, norm};
      return;
    }
    if (close(loss, ref->loss, 1e-4, 1e-6) && close(norm, ref->grad_norm, 1e-3)) return;
    fail(model_name + " " + s.name() + ": " + who +
         fmt(" first step: loss %.7f, grad norm %.7f; ", loss, norm) + ref_name +
         fmt(": %.7f, %.7f", ref->loss, ref->grad_norm));
  };
  if (with_core) {
    const CoreResult c = core_step(core_policy, *core_opt, in);
    check("relay core", c.loss, c.grad_norm);
    notes = fmt("first step: loss %.6f, grad norm %.6f", c.loss, c.grad_norm);
  }
  if (py != nullptr) {
    const std::string file = scratch + "/" + model_name + "." + s.name() + ".batch.safetensors";
    write_batch(in, file);
    py->call({{"cmd", "load"}, {"dir", model_dir}});
    py->call({{"cmd", "train_setup"}, {"file", file}, {"lr", 1e-5}});
    const nlohmann::json r = py->call({{"cmd", "train_step"}});
    check("python", r.at("loss").get<double>(), r.at("grad_norm").get<double>());
    notes += (notes.empty() ? "first step: " : "; ") +
             fmt("python %.6f, %.6f", r.at("loss").get<double>(), r.at("grad_norm").get<double>());
  }
  auto trainer_step = [&] { return value_or_die(trainer->step(groups), "Trainer::step"); };
  const auto first = trainer_step();
  check("Trainer::step", first.at("pg_loss"), first.at("grad_norm"));
  notes += (notes.empty() ? "first step: " : "; ") +
           fmt("trainer %.6f, %.6f", first.at("pg_loss"), first.at("grad_norm"));

  // Interleaved (alternating order, a pause before each run); each ratio is
  // the median of per-repetition ratios against that repetition's baseline
  // (python, or without it the first relay row).
  std::vector<std::function<double()>> modes;
  if (py != nullptr) {
    modes.push_back([&] { return py->call({{"cmd", "train_step"}}).at("seconds").get<double>(); });
  }
  if (with_core) {
    modes.push_back([&] {
      const auto start = Clock::now();
      core_step(core_policy, *core_opt, in);
      return seconds_since(start);
    });
  }
  modes.push_back([&] {
    const auto start = Clock::now();
    trainer_step();
    return seconds_since(start);
  });
  const auto t = relay::bench::interleave(reps, modes);
  const std::vector<double>& base = t[0];
  const std::vector<double>& tt = t.back();
  auto row = [&](const char* mode, const std::vector<double>& secs, std::string n) {
    rows->push_back({model_name, s.name(), mode, tokens, median(secs),
                     relay::bench::paired_ratio(base, secs), std::move(n)});
  };
  if (py != nullptr) row("python", base, relay::bench::spread(base) + "; " + notes);
  if (with_core) {
    const std::vector<double>& tc = t[t.size() - 2];
    row("core", tc, relay::bench::spread(tc) + (py != nullptr ? "" : "; " + notes));
  }
  const double trainer_s = median(tt);
  row("trainer", tt,
      relay::bench::spread(tt) + "; Trainer::step, bypass" +
          (py == nullptr && !with_core ? "; " + notes : ""));

  // The step's FLOPs, for the bound.
  const PolicyConfig& cfg = init->config();
  double matmul = 0;
  for (const auto& item : init->named_parameters()) {
    if (item.value().dim() != 2) continue;
    if (!cfg.tie_word_embeddings && item.key() == "model.embed_tokens.weight") continue;
    matmul += item.value().numel();
  }
  const double fwd = 2.0 * matmul + 4.0 * cfg.num_hidden_layers * s.seq * cfg.num_attention_heads *
                                        cfg.resolved_head_dim();
  bounds->push_back({model_name, s.name(), tokens, 3.0 * fwd * tokens, trainer_s});
}

void print_table(const std::vector<Row>& rows, FILE* f) {
  std::fprintf(f, "%-11s %-7s %-8s %7s %9s %10s %7s  %s\n", "model", "shape", "mode", "tokens",
               "seconds", "tokens/s", "ratio", "notes");
  for (const Row& r : rows) {
    std::fprintf(f, "%-11s %-7s %-8s %7lld %9.3f %10.1f %6.2fx  %s\n", r.model.c_str(),
                 r.shape.c_str(), r.mode.c_str(), (long long)r.tokens, r.seconds,
                 r.tokens / r.seconds, r.ratio, r.notes.c_str());
  }
  std::fflush(f);
}

void print_json(const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    out.push_back({{"model", r.model},
                   {"shape", r.shape},
                   {"mode", r.mode},
                   {"tokens", r.tokens},
                   {"seconds", r.seconds},
                   {"tokens_per_s", r.tokens / r.seconds},
                   {"ratio", r.ratio},
                   {"notes", r.notes}});
  }
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // First: it may start the program again with other BLAS kernels (and the
  // Python baseline, a child, inherits the choice).
  relay::model::choose_blas_kernels(argv);
  relay::bench::expect_flags(
      argc, argv,
      {"--attn", "--blas-threads", "--cpu-memory", "--model-dir", "--models", "--prompt",
       "--python-exe", "--python-script", "--reps", "--shapes", "--threads"},
      {"--json", "--no-core", "--no-python", "--quick"});
  using relay::bench::flag;
  using relay::bench::has;
  const char* models_flag = flag(argc, argv, "--models");
  const char* shapes_flag = flag(argc, argv, "--shapes");
  const char* prompt_flag = flag(argc, argv, "--prompt");
  const char* reps_flag = flag(argc, argv, "--reps");
  const char* threads_flag = flag(argc, argv, "--threads");
  const char* blas_flag = flag(argc, argv, "--blas-threads");
  const char* attn_flag = flag(argc, argv, "--attn");
  const std::string cpu_memory =
      relay::bench::configure_cpu_memory(flag(argc, argv, "--cpu-memory"));
  const char* python_exe = flag(argc, argv, "--python-exe");
  const char* python_script = flag(argc, argv, "--python-script");
  const bool json = has(argc, argv, "--json");
  const bool quick = has(argc, argv, "--quick");
  const bool python = !has(argc, argv, "--no-python");
  const bool with_core = !has(argc, argv, "--no-core");
  const char* model_dir = flag(argc, argv, "--model-dir");
  const int64_t prompt = prompt_flag ? std::atoll(prompt_flag) : 32;
  // With --model-dir alone, only that model runs.
  std::vector<std::string> models =
      relay::bench::split(models_flag ? models_flag : (model_dir ? "" : "tiny,qwen2-100m"));
  if (model_dir != nullptr) models.push_back(model_dir);
  auto parse_shapes = [&](const std::string& list) {
    std::vector<Shape> out;
    for (const std::string& s : relay::bench::split(list)) {
      Shape sh;
      if (std::sscanf(s.c_str(), "%" SCNd64 "x%" SCNd64, &sh.batch, &sh.seq) != 2 || sh.batch < 1 ||
          sh.seq <= prompt) {
        fail("--shapes: '" + s + "' is not BxT with T > the prompt length");
      }
      out.push_back(sh);
    }
    return out;
  };

  if (attn_flag != nullptr) {
    const auto choice = relay::model::kAttentionChoiceNames.parse(attn_flag);
    if (!choice.ok()) fail("--attn: " + std::string(choice.status().message()));
    const relay::Status applied = relay::model::apply_attention_choice(*choice);
    if (!applied.ok()) fail("--attn: " + std::string(applied.message()));
  }
  const char* attention =
      relay::model::attention_implementation_name(relay::model::attention_implementation());
  relay::model::configure_threads(0);
  if (threads_flag) at::set_num_threads(std::atoi(threads_flag));
  const int blas = relay::bench::blas_threads(blas_flag ? std::atoi(blas_flag) : 0);
  std::fprintf(
      stderr,
      "trainer_bench: LibTorch %s, %d intra-op threads, %d OpenBLAS threads, attention %s, "
      "freed CPU memory: %s\n",
      TORCH_VERSION, at::get_num_threads(), blas, attention, cpu_memory.c_str());
  const std::string kernels = relay::model::describe(relay::model::blas_kernels());
  std::fprintf(stderr, "trainer_bench: BLAS %s\n", kernels.c_str());

  const auto start = Clock::now();
  relay::bench::TempDir scratch;
  std::unique_ptr<relay::bench::PythonRef> py;
  if (python) {
    py = std::make_unique<relay::bench::PythonRef>(
        python_exe ? python_exe : relay::bench::default_python(),
        python_script ? python_script : relay::bench::default_python_script(),
        at::get_num_threads(), blas);
    std::fprintf(stderr, "python reference: %s\n", py->hello().dump().c_str());
  }
  relay::bench::MachineLimits limits = relay::bench::measure_limits();
  std::fprintf(stderr, "machine: fp32 GEMM peak %.1f GFLOP/s (2048^3)\n", limits.peak_gflops);

  std::vector<Row> rows;
  std::vector<PendingBound> bounds;
  for (const std::string& entry : models) {
    const bool from_dir = model_dir != nullptr && entry == model_dir;
    std::string name = entry;
    Policy init{nullptr};
    if (from_dir) {
      // A model as a user brings it, trained in fp32 as model.dtype's default.
      init = value_or_die(relay::model::load_policy(entry), "--model-dir");
      const std::filesystem::path path(entry);
      name = path.filename().empty() ? path.parent_path().filename().string()
                                     : path.filename().string();
    } else {
      init = Policy(relay::bench::model_config(entry, "--models"));
    }
    if (!from_dir) relay::model::init_weights(*init, /*seed=*/0);
    init->eval();
    const PolicyConfig& config = init->config();
    std::vector<Shape> shapes = parse_shapes(shapes_flag                          ? shapes_flag
                                             : from_dir || name == "qwen2.5-0.5b" ? "4x128"
                                             : name == "tiny"                     ? "8x128,32x128"
                                                                                  : "8x128,16x128");
    for (const Shape& s : shapes) {
      if (s.seq > config.max_position_embeddings) fail(name + ": sequence longer than the model");
    }
    // The weights go to the Python process once (and are checked); each
    // shape reloads them there.
    if (py != nullptr) {
      const nlohmann::json c = relay::bench::load_and_check(*py, *init, scratch.path(), name);
      std::fprintf(stderr, "%s: %s\n", name.c_str(), c.at("summary").get<std::string>().c_str());
    }
    const bool big = name != "tiny";
    if (quick && big) shapes.resize(1);
    for (const Shape& s : shapes) {
      const int reps = reps_flag                            ? std::atoi(reps_flag)
                       : quick                              ? 1
                       : !big                               ? 9
                       : from_dir || name == "qwen2.5-0.5b" ? 3
                       : s.batch * s.seq > 1024             ? 3
                                                            : 5;
      const size_t first = rows.size();
      bench_shape(name, init, scratch.path() + "/" + name, s, prompt, reps, with_core, py.get(),
                  scratch.path(), &rows, &bounds);
      print_table({rows.begin() + first, rows.end()}, stderr);
      std::fprintf(stderr, "  (%.0f s so far)\n", seconds_since(start));
    }
  }
  // The bound: each step's FLOPs at the GEMM peak; ratio = the trainer's
  // fraction of it.
  limits = relay::bench::best_of(limits, relay::bench::measure_limits());
  const size_t first = rows.size();
  for (const PendingBound& b : bounds) {
    const double bound_s = b.flops / (limits.peak_gflops * 1e9);
    rows.push_back({b.model, b.shape, "bound", b.tokens, bound_s, bound_s / b.trainer_s,
                    fmt("%.1f GFLOP/step at peak %.0f GFLOP/s; trainer at %.0f GFLOP/s",
                        b.flops / 1e9, limits.peak_gflops, b.flops / b.trainer_s / 1e9)});
  }
  print_table({rows.begin() + first, rows.end()}, stderr);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak_gib = static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // KiB
  std::fprintf(stderr, "trainer_bench: attention %s, peak resident memory %.2f GiB\n", attention,
               peak_gib);
  if (const relay::model::CpuMemoryStats heap = relay::model::cpu_memory_stats(); heap.known) {
    std::fprintf(stderr,
                 "trainer_bench: malloc at the end: %.2f GiB in use, %.2f GiB freed and kept\n",
                 static_cast<double>(heap.in_use_bytes) / (1 << 30),
                 static_cast<double>(heap.free_bytes) / (1 << 30));
  }
  if (json) {
    print_json(rows);
  } else {
    std::printf(
        "trainer_bench: LibTorch %s, %d intra-op threads, %d OpenBLAS threads, attention %s, "
        "%.0f s, peak resident memory %.2f GiB\n",
        TORCH_VERSION, at::get_num_threads(), blas, attention, seconds_since(start), peak_gib);
    std::printf("BLAS %s\n", kernels.c_str());
    std::printf("machine: fp32 GEMM peak %.1f GFLOP/s (2048^3, best of start and end)%s%s\n",
                limits.peak_gflops, py ? "; python " : "", py ? py->hello().dump().c_str() : "");
    print_table(rows, stdout);
  }
  return 0;
}
