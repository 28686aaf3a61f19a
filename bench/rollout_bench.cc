// Decode throughput of the rollout engine (relay/rollout/engine.h) against
// baselines measured in the same run, for two randomly initialised models:
// "tiny" (the shape of configs/tiny.yaml) and "qwen2-100m" (Qwen2-shaped,
// about 100M parameters). Results: docs/BENCHMARKS.md.
//
// kv     B prompts of P tokens, N new tokens each, no stop tokens, so every
//        row decodes exactly N tokens. Three ways to produce them:
//          re-encode  (baseline) policy->forward over the whole [B, P + s]
//                     sequence at every step s, sampling the last position;
//          extend     the model's KV-cache path alone (Policy::extend, one
//                     token per step), without the engine;
//          engine     rollout::Engine, num_slots = B, B groups of k = 1.
//        All three draw from the engine's per-sequence random streams, so
//        they sample the same tokens up to floating-point rounding (the notes
//        column counts the rows that came out identical).
// mixed  S = max(8, c B) sequences (c = 8 tiny, 4 qwen2-100m) whose lengths
//        are roughly geometric (a fixed random set of stop tokens, capped at
//        max_new_tokens):
//          static     (baseline) B sequences at a time, each batch run to
//                     completion before the next is submitted;
//          continuous all S submitted to one engine with B slots; a finished
//                     sequence's slot is refilled at the next step.
//        Same seeds, so both produce the same trajectories (checked).
// attn   (--only attn) N decode steps of B rows at a context of P (the cache
//        filled with random keys and values, no prefill), greedy:
//          gathered   (baseline) attention over keys and values gathered out
//                     of the paged cache every layer and step;
//          in-place   the decode-attention kernel reading the cache where it
//                     lies (src/model/decode_attention.h).
// dtype  (--only dtype) the kv workload's engine with rollout.dtype:
//          fp32       (baseline) the engine on the fp32 weights;
//          bf16       an engine whose options say bfloat16: Engine::create
//                     converts its own copy of the same weights;
//        interleaved, sampled with the same seeds (the bf16 model's tokens
//        differ after a while: counted).
// sampler (--only sampler) rollout::sample() on random logits, no model:
//          batched    (baseline) the batched ops (log-softmax, cumulative
//                     sum, sorted search over [B, V]);
//          fused      the fused CPU path (relay/rollout/sampler.h);
//        at vocabularies of 32,000 (qwen2-100m) and 151,936 (Qwen2.5).
// py     (with --python) the kv workload (same B, P, N) three ways:
//          python     (baseline) bench/python/relay_ref.py: an HF-style
//                     generate loop in plain PyTorch on the same LibTorch and
//                     the same weights (written by relay, loaded by the
//                     script, logits checked against relay's: the benchmark
//                     fails above 1e-3), KV cache by torch.cat, softmax +
//                     multinomial; timed inside the Python process;
//          extend     as in kv;
//          engine     as in kv.
//        Runs alternate in order (python, extend, engine, then the reverse)
//        with a 150 ms pause before each; a row's ratio is the median over
//        repetitions of its run against the python run of the same one.
//        and the machine's limit for the same tokens, measured in the same
//        run (rows "bound"; their ratio is the engine's fraction of it):
//        Both bounds cover the work the timed runs do: the prefill (every
//        weight matrix but the LM head over the B x P prompt positions, the
//        head over the last one of each sequence) and N - 1 decode steps of
//        B rows (the prefill's logits give the first token):
//          roofline   max(prefill FLOPs / peak, W / bw) + (N - 1) max(B F /
//                     peak, W / bw): F = decode FLOPs per token (2 x matmul
//                     parameters, LM head included, + attention at the mean
//                     context), peak = GEMM GFLOP/s of a 2048^3 fp32
//                     matmul (with --device cuda: 8192^3 in --dtype),
//                     W = bytes of the weight matrices, read once per
//                     forward, bw = streaming bandwidth (the larger of a
//                     256 MB GEMV and a 256 MB copy);
//          gemm-only  the weight GEMMs alone: the prefill's products on
//                     [B P, in] ([B, in] for the head) plus N - 1 steps' on
//                     [B, in], weights streamed from memory as in decoding.
//                     (Until 2026-11-29 both bounds counted N decode steps
//                     and no prefill, which overstated them by up to 2x at
//                     batch 64, where the prefill's GEMMs are as many
//                     FLOPs as the decode's.)
//          products   gemm-only with each decode step's products run as
//                     the engine runs them (model::row_linear: relay's
//                     few-row kernels up to their row limit, the GEMM
//                     above; the prefill's stay GEMMs): what the engine's
//                     decode would take if norms, attention, sampling and
//                     scheduling cost nothing. At batch 1 the GEMM is the
//                     wrong bound (OpenBLAS runs one row at ~9 GFLOP/s);
//                     this one is not.
//
//   rollout_bench [--models tiny,qwen2-100m] [--batches 1,8,64] [--only
//   kv|mixed|py|attn|sampler|dtype]
//                 [--python] [--python-exe PATH] [--python-script PATH] [--quick]
//                 [--threads N] [--blas-threads T] [--kernel-threads K] [--reps R] [--prompt P]
//                 [--new N] [--json]
//                 [--device cpu|cuda[:i]] [--dtype float32|bfloat16] [--model-dir DIR]
//                 [--cpu-memory keep|return] [--py-attention eager|sdpa]
//                 [--decode-graphs auto|on|off]
//
// --decode-graphs: the engines' rollout.decode_graphs (default auto: CUDA
// graphs on a GPU, none on the CPU; off gives a GPU's figure without them).
//
// --cpu-memory: how relay's side holds freed tensor memory, as relay's
// binaries do (bench_util.h, configure_cpu_memory); default keep.
//
// --model-dir DIR adds the model in DIR (config.json + safetensors, any
// dtype, sharded or not; e.g. scripts/models/qwen2.5-0.5b.sh's) with its own
// weights, P = 16, N = 32; alone (no --models) it is the only model run. Its
// py rows also report memory: each process's resident set with the model
// loaded and the most one decode added to it (VmHWM after a reset), and the
// KV cache's bytes per position against the old preallocation
// (num_slots 64 x max_position_embeddings).
//
// --device runs the models (weights, KV caches) on a GPU (scripts/gpu/check.sh);
// timings then wait for the device. --dtype sets the weights' and caches'
// dtype. The Python loop of the py rows runs there too, in the same dtype,
// after the logits check has passed in fp32 on the CPU and again where it
// runs (python_ref.h); its attention is transformers' eager unless
// --py-attention sdpa (transformers' default on a GPU; torch >= 2.0). The
// bound rows then use the device's own limits, measured in that dtype
// (machine_limits.h), and the memory rows (host resident sets) are left out.
//
// --quick: fewer repetitions (tiny 3, qwen2-100m 1) for a smoke run of the
// same rows. --only py implies --python.
//
// Threads default to what relay's binaries use (model::configure_threads with
// every core: 1 intra-op thread, all cores to OpenBLAS). --threads sets
// LibTorch's intra-op pool and --blas-threads OpenBLAS's own pthread pool
// explicitly, to compare settings; --kernel-threads sets relay's kernel pool
// (src/model/kernel_pool.h: the few-row products; configure_threads gives it
// every core with OpenBLAS). All three are printed.
// tokens/s counts response tokens only (prompt positions are work, not output).

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "machine_limits.h"
#include "model/decode_attention.h"
#include "model/kernel_pool.h"
#include "model/row_linear.h"
#include "python_ref.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/checkpoint.h"
#include "relay/model/device.h"
#include "relay/model/hf_config.h"
#include "relay/model/kv_cache.h"
#include "relay/model/policy.h"
#include "relay/model/threads.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/sampler.h"

namespace {

using relay::bench::blas_threads;
using relay::bench::Clock;
using relay::bench::flag;
using relay::bench::has;
using relay::bench::MachineLimits;
using relay::bench::measure_limits;
using relay::bench::median;
using relay::bench::settle;
using relay::bench::split;
using relay::bench::spread;
using relay::bench::time_best;
using relay::model::Policy;
using relay::model::PolicyConfig;
using relay::rollout::Engine;
using relay::rollout::EngineOptions;
using relay::rollout::PromptGroup;
using relay::rollout::SamplingOptions;
using relay::rollout::SequenceRng;
using relay::rollout::TrajectoryGroup;
using Tokens = std::vector<std::vector<int64_t>>;  // one response per sequence

// Where the models run (--device, --dtype); set once in main().
c10::Device g_device(c10::DeviceType::CPU);
c10::ScalarType g_dtype = c10::ScalarType::Float;
// --decode-graphs, for every engine.
relay::rollout::DecodeGraphMode g_decode_graphs = relay::rollout::DecodeGraphMode::kAuto;

// Waits for the device's queued work, so that a timing covers it.
void sync_device() {
  if (g_device.is_cuda()) torch::cuda::synchronize(g_device.index());
}

// What one model is benchmarked with.
struct Workload {
  std::string name;
  PolicyConfig config;
  std::string model_dir;         // --model-dir: its weights instead of a random init
  int64_t prompt_len = 16;       // P, both benchmarks
  int64_t new_tokens = 32;       // N, kv
  int64_t mixed_max_new = 64;    // cap on a mixed-length response
  double mixed_mean_len = 16.0;  // sets the stop-token count: vocab / mean
  int64_t mixed_per_slot = 4;    // mixed: S = max(8, mixed_per_slot * B) sequences
  int reps = 1;                  // timed repetitions per row at batch < 64 (median reported)
  int reps_64 = 1;               // at batch >= 64
};

std::vector<Workload> workloads() {
  Workload tiny;
  tiny.name = "tiny";
  tiny.config = relay::bench::tiny_config();
  tiny.prompt_len = 16;
  tiny.new_tokens = 64;
  tiny.mixed_max_new = 96;
  tiny.mixed_mean_len = 14.0;
  tiny.mixed_per_slot = 8;
  tiny.reps = 5;
  tiny.reps_64 = 5;

  Workload qwen;
  qwen.name = "qwen2-100m";
  qwen.config = relay::bench::qwen2_100m_config();
  qwen.prompt_len = 16;
  qwen.new_tokens = 16;  // re-encoding [64, P + N] every step bounds this on 2 cores
  qwen.mixed_max_new = 64;
  qwen.mixed_mean_len = 16.0;
  qwen.mixed_per_slot = 4;
  qwen.reps = 3;
  qwen.reps_64 = 1;
  return {tiny, qwen};
}

struct Row {
  std::string model, bench, mode;
  int64_t batch = 0, tokens = 0;
  double seconds = 0.0, ratio = 1.0;  // ratio = this row's tokens/s over the baseline's
  std::string notes;
};

// Memory of one decode mode (py): the resident set with the model loaded,
// and the most the decode added to it (the peak over repetitions), each
// process measured by itself. KV rows: the engine's cache.
struct MemRow {
  std::string model, mode;
  int64_t batch = 0;
  double rss_mb = 0, decode_peak_mb = 0;
  std::string notes;
};

// ---------------------------------------------------------------------------
// Helpers.

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Policy make_policy(const PolicyConfig& config) {
  Policy policy(config);
  relay::model::init_weights(*policy, /*seed=*/0);
  policy->to(g_device, g_dtype);
  policy->eval();
  return policy;
}

int64_t count_parameters(Policy& policy) {
  int64_t n = 0;
  for (const at::Tensor& p : policy->parameters()) n += p.numel();
  return n;
}

// `count` prompts of `len` tokens, uniform over the vocabulary.
Tokens random_prompts(int64_t count, int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  Tokens out(count, std::vector<int64_t>(len));
  for (auto& p : out) {
    for (int64_t& t : p) t = token(gen);
  }
  return out;
}

at::Tensor to_tensor(const Tokens& rows) {
  const int64_t B = static_cast<int64_t>(rows.size()), T = static_cast<int64_t>(rows[0].size());
  at::Tensor t = torch::empty({B, T}, torch::kInt64);
  for (int64_t b = 0; b < B; ++b)
    std::copy(rows[b].begin(), rows[b].end(), t[b].data_ptr<int64_t>());
  return t;
}

Tokens to_rows(const at::Tensor& t) {
  at::Tensor c = t.to(torch::kCPU).contiguous();
  Tokens out(c.size(0));
  for (int64_t b = 0; b < c.size(0); ++b) {
    const int64_t* p = c[b].data_ptr<int64_t>();
    out[b].assign(p, p + c.size(1));
  }
  return out;
}

int64_t identical(const Tokens& a, const Tokens& b) {
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] == b[i];
  return n;
}

int64_t total_tokens(const Tokens& t) {
  int64_t n = 0;
  for (const auto& r : t) n += static_cast<int64_t>(r.size());
  return n;
}

// Sequence i of a run is group "i" with seed i, k = 1: its stream is
// SequenceRng(sequence_seed(i, 0)), which the baselines reproduce.
std::vector<SequenceRng> row_streams(int64_t count) {
  std::vector<SequenceRng> out;
  for (int64_t i = 0; i < count; ++i) {
    out.emplace_back(relay::rollout::sequence_seed(static_cast<uint64_t>(i), 0));
  }
  return out;
}

at::Tensor draw(std::vector<SequenceRng>& streams) {
  std::vector<double> u;
  for (SequenceRng& s : streams) u.push_back(s.uniform());
  return torch::tensor(u, torch::kFloat64);
}

void die_if(const relay::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "rollout_bench: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

std::unique_ptr<Engine> make_engine(
    Policy policy, int64_t slots, int64_t max_seq_len, int64_t max_new,
    std::vector<int64_t> stop_tokens,
    relay::rollout::EngineDtype dtype = relay::rollout::EngineDtype::kModel) {
  EngineOptions o;
  o.dtype = dtype;
  o.decode_graphs = g_decode_graphs;
  o.num_slots = slots;
  o.max_seq_len = max_seq_len;
  o.max_new_tokens = max_new;
  o.stop_tokens = std::move(stop_tokens);
  auto engine = Engine::create(std::move(policy), std::move(o), 0, 0);
  die_if(engine.status(), "Engine::create");
  return std::move(engine).value();
}

void submit(Engine& engine, const Tokens& prompts, int64_t first, int64_t count) {
  for (int64_t i = first; i < first + count; ++i) {
    PromptGroup g;
    g.group_id = std::to_string(i);
    g.prompt = prompts[i];
    g.k = 1;
    g.seed = static_cast<uint64_t>(i);
    die_if(engine.submit(std::move(g)), "Engine::submit");
  }
}

// Runs the engine to idle and files each response under its sequence index.
void drain(Engine& engine, Tokens* out) {
  auto done = engine.run();
  die_if(done.status(), "Engine::run");
  for (TrajectoryGroup& g : *done) {
    (*out)[std::stoll(g.group_id)] = std::move(g.trajectories[0].response_tokens);
  }
}

// ---------------------------------------------------------------------------
// kv: three ways to decode N tokens for each of B prompts. Each returns
// seconds and writes the responses to *out.

double kv_reencode(Policy& p, const Tokens& prompts, int64_t N, Tokens* out) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  auto streams = row_streams(B);
  const SamplingOptions so;
  torch::NoGradGuard no_grad;
  const auto start = Clock::now();
  at::Tensor seq = to_tensor(prompts);
  for (int64_t s = 0; s < N; ++s) {
    at::Tensor logits = p->forward(seq).select(1, seq.size(1) - 1);
    at::Tensor next = relay::rollout::sample(logits, draw(streams), so).tokens;
    seq = torch::cat({seq, next.view({B, 1}).to(torch::kCPU)}, 1);
  }
  sync_device();
  const double t = since(start);
  *out = to_rows(seq.narrow(1, seq.size(1) - N, N));
  return t;
}

double kv_extend(Policy& p, const Tokens& prompts, int64_t N, Tokens* out) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t P = static_cast<int64_t>(prompts[0].size());
  auto streams = row_streams(B);
  const SamplingOptions so;
  torch::NoGradGuard no_grad;
  relay::model::KVCache cache(p->config(), B, P + N, g_dtype, g_device);
  const at::Tensor slots = torch::arange(B);
  const auto start = Clock::now();
  at::Tensor logits =
      p->extend(to_tensor(prompts), torch::full({B}, P, torch::kInt64), slots, cache);
  std::vector<at::Tensor> tokens;
  for (int64_t s = 0; s < N; ++s) {
    at::Tensor next = relay::rollout::sample(logits, draw(streams), so).tokens;
    tokens.push_back(next);
    if (s + 1 < N) {
      logits = p->extend(next.view({B, 1}), torch::ones({B}, torch::kInt64), slots, cache);
    }
  }
  sync_device();
  const double t = since(start);
  *out = to_rows(torch::stack(tokens, 1));
  return t;
}

double kv_engine(Policy& p, const Tokens& prompts, int64_t N, Tokens* out, int64_t* steps,
                 relay::rollout::EngineStats* stats = nullptr,
                 relay::rollout::EngineDtype dtype = relay::rollout::EngineDtype::kModel) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  const int64_t P = static_cast<int64_t>(prompts[0].size());
  auto engine = make_engine(p, B, P + N, N, {}, dtype);
  out->assign(B, {});
  const auto start = Clock::now();
  submit(*engine, prompts, 0, B);
  drain(*engine, out);
  const double t = since(start);
  *steps = engine->stats().steps;
  if (stats != nullptr) *stats = engine->stats();
  return t;
}

// rollout.dtype bfloat16 against the fp32 engine on the same weights. The
// bf16 engine converts a clone (Engine::create converts the policy it is
// given), created before the clock starts.
void bench_dtype(const Workload& w, Policy& p, int64_t B, int reps, int64_t N,
                 std::vector<Row>* rows) {
  using relay::rollout::EngineDtype;
  const int64_t P = w.prompt_len;
  const Tokens prompts = random_prompts(B, P, w.config.vocab_size, 1000 + B);
  Policy low = relay::model::clone_policy(*p);
  Tokens warm;
  int64_t steps = 0;
  kv_engine(p, prompts, 2, &warm, &steps);
  kv_engine(low, prompts, 2, &warm, &steps, nullptr, EngineDtype::kBFloat16);
  std::vector<double> t32, t16;
  Tokens a, b;
  for (int r = 0; r < reps; ++r) {
    t32.push_back(kv_engine(p, prompts, N, &a, &steps));
    t16.push_back(kv_engine(low, prompts, N, &b, &steps, nullptr, EngineDtype::kBFloat16));
  }
  const double base = median(t32);
  const std::string shape = "P=" + std::to_string(P) + " N=" + std::to_string(N);
  rows->push_back({w.name, "dtype", "fp32", B, B * N, base, 1.0, shape});
  rows->push_back(
      {w.name, "dtype", "bf16", B, B * N, median(t16), base / median(t16),
       "same tokens as fp32: " + std::to_string(identical(a, b)) + "/" + std::to_string(B)});
}

void bench_kv(const Workload& w, Policy& p, int64_t B, int reps, int64_t N,
              std::vector<Row>* rows) {
  const int64_t P = w.prompt_len;
  const Tokens prompts = random_prompts(B, P, w.config.vocab_size, 1000 + B);
  // Warm-up: a short run of each, untimed.
  Tokens warm;
  int64_t steps = 0;
  kv_reencode(p, prompts, 2, &warm);
  kv_extend(p, prompts, 2, &warm);
  kv_engine(p, prompts, 2, &warm, &steps);

  std::vector<double> tr, te, tg;
  Tokens a, b, c;
  for (int r = 0; r < reps; ++r) {  // interleaved, so drift hits all three alike
    tr.push_back(kv_reencode(p, prompts, N, &a));
    te.push_back(kv_extend(p, prompts, N, &b));
    tg.push_back(kv_engine(p, prompts, N, &c, &steps));
  }
  const int64_t tokens = B * N;
  const double base = median(tr);
  auto row = [&](const char* mode, double secs, std::string notes) {
    rows->push_back({w.name, "kv", mode, B, tokens, secs, base / secs, std::move(notes)});
  };
  const std::string shape = "P=" + std::to_string(P) + " N=" + std::to_string(N);
  row("re-encode", base, shape);
  row("extend", median(te),
      "same tokens as re-encode: " + std::to_string(identical(a, b)) + "/" + std::to_string(B));
  row("engine", median(tg),
      "same as extend: " + std::to_string(identical(b, c)) + "/" + std::to_string(B) + ", steps " +
          std::to_string(steps));
}

// ---------------------------------------------------------------------------
// sampler (--only sampler): one sample() call on [B, V] random logits
// (temperature 1, no truncation, raw log-probs recorded as the trainer's
// config asks), the batched ops (baseline) against the fused CPU path, for
// qwen2-100m's vocabulary (32,000) and Qwen's (151,936). Calls alternate,
// 20 per repetition; tokens are draws (rows).

std::string ms_note(const char* format, double ms) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, ms);
  return buf;
}

void bench_sampler(int64_t V, int64_t B, int reps, std::vector<Row>* rows) {
  torch::manual_seed(static_cast<uint64_t>(V + B));
  const at::Tensor logits = 3 * torch::randn({B, V});
  relay::rollout::SequenceRng rng(5);
  std::vector<double> u(static_cast<size_t>(B));
  for (double& x : u) x = rng.uniform();
  const at::Tensor uniforms = torch::tensor(u, torch::kFloat64);
  relay::rollout::SamplingOptions o;
  o.record_raw_logprobs = true;
  constexpr int kCalls = 20;
  auto time = [&](bool fused) {
    relay::rollout::set_fused_sampler(fused);
    relay::rollout::sample(logits, uniforms, o);  // warm
    const auto start = Clock::now();
    for (int i = 0; i < kCalls; ++i) relay::rollout::sample(logits, uniforms, o);
    relay::rollout::set_fused_sampler(true);
    return since(start);
  };
  std::vector<double> tb, tf;
  for (int r = 0; r < reps; ++r) {
    tb.push_back(time(false));
    tf.push_back(time(true));
  }
  relay::rollout::set_fused_sampler(false);
  const at::Tensor want = relay::rollout::sample(logits, uniforms, o).tokens;
  relay::rollout::set_fused_sampler(true);
  const at::Tensor got = relay::rollout::sample(logits, uniforms, o).tokens;
  const std::string name = "vocab-" + std::to_string(V);
  const double base = median(tb);
  const double per_call_ms = 1e3 / kCalls;
  rows->push_back({name, "sampler", "batched", B, B * kCalls, base, 1.0,
                   ms_note("%.2f ms a call", base * per_call_ms)});
  rows->push_back({name, "sampler", "fused", B, B * kCalls, median(tf), base / median(tf),
                   ms_note("%.2f ms a call", median(tf) * per_call_ms) +
                       ", same tokens: " + std::to_string(got.eq(want).sum().item<int64_t>()) +
                       "/" + std::to_string(B)});
}

// ---------------------------------------------------------------------------
// attn: decode steps at a long context, attention over keys and values
// gathered out of the paged cache (the baseline) against read in place
// (model/decode_attention.h). The cache is filled with random keys and values
// for P positions instead of a prefill (the step's cost does not depend on
// them, and a real prefill of B x P tokens would take minutes); then N steps
// of one token per row, greedy, are timed.

double decode_steps(Policy& p, int64_t B, int64_t P, int64_t N, bool in_place, Tokens* out) {
  relay::model::set_decode_attention_kernel(in_place);
  torch::NoGradGuard no_grad;
  relay::model::KVCache cache(p->config(), B, P + N, g_dtype, g_device);
  for (int64_t b = 0; b < B; ++b) {
    cache.prepare_write(b, P);
    cache.advance(b, P);
  }
  torch::manual_seed(7);
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    for (at::Tensor* t : {&cache.keys(l), &cache.values(l)}) {
      t->normal_();
      t->narrow(0, 0, cache.block_size()).zero_();  // the zero block stays zero
    }
  }
  const at::Tensor slots = torch::arange(B);
  const at::Tensor one = torch::ones({B}, torch::kInt64);
  at::Tensor next = torch::randint(0, p->config().vocab_size, {B}, torch::kInt64);
  std::vector<at::Tensor> tokens;
  const auto start = Clock::now();
  for (int64_t s = 0; s < N; ++s) {
    const at::Tensor logits = p->extend(next.view({B, 1}), one, slots, cache);
    next = logits.argmax(-1).cpu();
    tokens.push_back(next);
  }
  sync_device();
  const double t = since(start);
  relay::model::set_decode_attention_kernel(true);
  *out = to_rows(torch::stack(tokens, 1));
  return t;
}

void bench_attn(const Workload& w, Policy& p, int64_t B, int reps, int64_t N,
                std::vector<Row>* rows) {
  const int64_t P = w.prompt_len;
  Tokens a, b;
  decode_steps(p, B, P, 2, false, &a);  // warm-up
  decode_steps(p, B, P, 2, true, &b);
  std::vector<double> tg, ti;
  for (int r = 0; r < reps; ++r) {  // interleaved
    tg.push_back(decode_steps(p, B, P, N, false, &a));
    ti.push_back(decode_steps(p, B, P, N, true, &b));
  }
  const int64_t tokens = B * N;
  const double base = median(tg);
  const int64_t S = P + N / 2;
  const double kv_mb =
      static_cast<double>(B * S * 2 * p->config().num_hidden_layers *
                          p->config().num_key_value_heads * p->config().resolved_head_dim() *
                          static_cast<int64_t>(c10::elementSize(g_dtype))) /
      1e6;
  rows->push_back({w.name, "attn", "gathered", B, tokens, base, 1.0,
                   "P=" + std::to_string(P) + " N=" + std::to_string(N) + ", " +
                       std::to_string(static_cast<int64_t>(kv_mb)) +
                       " MB of keys and values per step"});
  rows->push_back(
      {w.name, "attn", "in-place", B, tokens, median(ti), base / median(ti),
       "same tokens: " + std::to_string(identical(a, b)) + "/" + std::to_string(B) +
           (relay::model::has_decode_attention_kernel() ? "" : " (no kernel on this CPU)")});
}

// ---------------------------------------------------------------------------
// mixed: S sequences of geometric-ish lengths, static vs continuous batching.

// A fixed random set of about vocab / mean_len tokens; at random init the
// next-token distribution is close to uniform, so lengths are close to
// geometric with that mean (capped at max_new_tokens).
std::vector<int64_t> stop_set(int64_t vocab, double mean_len) {
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(vocab / mean_len + 0.5));
  std::vector<int64_t> all(vocab);
  for (int64_t i = 0; i < vocab; ++i) all[i] = i;
  std::mt19937_64 gen(7);
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(n);
  std::sort(all.begin(), all.end());
  return all;
}

double mixed_run(Policy& p, const Workload& w, const Tokens& prompts, int64_t B, bool continuous,
                 Tokens* out, int64_t* steps) {
  const int64_t S = static_cast<int64_t>(prompts.size());
  auto engine = make_engine(p, B, w.prompt_len + w.mixed_max_new, w.mixed_max_new,
                            stop_set(w.config.vocab_size, w.mixed_mean_len));
  out->assign(S, {});
  const auto start = Clock::now();
  if (continuous) {
    submit(*engine, prompts, 0, S);
    drain(*engine, out);
  } else {
    for (int64_t first = 0; first < S; first += B) {
      submit(*engine, prompts, first, std::min(B, S - first));
      drain(*engine, out);
    }
  }
  const double t = since(start);
  *steps = engine->stats().steps;
  return t;
}

void bench_mixed(const Workload& w, Policy& p, int64_t B, int reps, std::vector<Row>* rows) {
  const int64_t S = std::max<int64_t>(8, w.mixed_per_slot * B);
  const Tokens prompts = random_prompts(S, w.prompt_len, w.config.vocab_size, 2000 + B);
  Tokens st, ct;
  int64_t st_steps = 0, ct_steps = 0;
  {
    // Warm-up: one batch, untimed.
    Tokens head(prompts.begin(), prompts.begin() + B);
    mixed_run(p, w, head, B, true, &ct, &ct_steps);
  }
  std::vector<double> ts, tc;
  for (int r = 0; r < reps; ++r) {
    ts.push_back(mixed_run(p, w, prompts, B, false, &st, &st_steps));
    tc.push_back(mixed_run(p, w, prompts, B, true, &ct, &ct_steps));
  }
  const int64_t tokens = total_tokens(ct);
  int64_t longest = 0;
  for (const auto& r : ct) longest = std::max<int64_t>(longest, r.size());
  const double base = median(ts), cont = median(tc);
  // Slot occupancy: response tokens over (steps x slots).
  auto occupancy = [&](int64_t n, int64_t steps) {
    return std::to_string(static_cast<int>(100.0 * n / (steps * B) + 0.5)) + "%";
  };
  const int64_t st_tokens = total_tokens(st);
  char shape[160];
  std::snprintf(shape, sizeof(shape), "S=%lld mean len %.1f max %lld, steps %lld, slots %s",
                (long long)S, double(st_tokens) / S, (long long)longest, (long long)st_steps,
                occupancy(st_tokens, st_steps).c_str());
  rows->push_back({w.name, "mixed", "static", B, st_tokens, base, 1.0, shape});
  rows->push_back(
      {w.name, "mixed", "continuous", B, tokens, cont, (tokens / cont) / (st_tokens / base),
       "same trajectories: " + std::to_string(identical(st, ct)) + "/" + std::to_string(S) +
           (tokens == st_tokens ? ", same total" : ", TOTALS DIFFER") + ", steps " +
           std::to_string(ct_steps) + ", slots " + occupancy(tokens, ct_steps)});
}

// ---------------------------------------------------------------------------
// py: relay against the plain-PyTorch loop, and the machine's limit.

// The weight matrices of a forward: every 2-D parameter but an untied input
// embedding (a lookup), each marked whether it is the LM head
// (lm_head.weight, or the tied embedding).
struct ForwardMatrix {
  at::Tensor weight;
  bool head = false;
};
std::vector<ForwardMatrix> forward_matrices(Policy& p) {
  const bool tied = p->config().tie_word_embeddings;
  std::vector<ForwardMatrix> out;
  for (const auto& item : p->named_parameters()) {
    if (item.value().dim() != 2) continue;
    const bool embedding = item.key() == "model.embed_tokens.weight";
    if (embedding && !tied) continue;
    out.push_back({item.value(), item.key() == "lm_head.weight" || embedding});
  }
  return out;
}

// Seconds for one forward's weight GEMMs: linear([rows, in], W) for every
// matrix in turn (the model's own, so they come from memory), the LM head on
// `head_rows` rows; best of `reps` calls. A decode step at batch B is
// (B, B); the prefill of B prompts of P tokens is (B P, B).
// With `kernels`, each product runs as the engine's decode step runs it:
// model::row_linear (relay's few-row kernels up to their row limit, linear
// above).
double step_gemm_seconds(Policy& p, int64_t rows, int64_t head_rows, int reps,
                         bool kernels = false) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> ws, xs;
  for (const ForwardMatrix& m : forward_matrices(p)) {
    ws.push_back(m.weight);
    xs.push_back(torch::randn({m.head ? head_rows : rows, m.weight.size(1)}, m.weight.options()));
  }
  return time_best(reps, [&] {
    for (size_t i = 0; i < ws.size(); ++i) {
      if (kernels) {
        relay::model::row_linear(xs[i], ws[i], at::Tensor());
      } else {
        torch::nn::functional::linear(xs[i], ws[i]);
      }
    }
    sync_device();
  });
}

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, a, b, c, d);
  return buf;
}

// The resident set a run started from and the most any run added to it.
struct PeakGrowth {
  double rss = 0, peak = 0;  // bytes
  void add(double start, double peak_seen) {
    rss = start;
    peak = std::max(peak, peak_seen - start);
  }
  // Runs `f` (which returns seconds) between a reset of this process's peak
  // resident set and a read of it.
  template <typename F>
  double track(F f) {
    relay::model::reset_peak_rss();
    const double start = static_cast<double>(relay::model::current_rss_bytes());
    const double secs = f();
    add(start, static_cast<double>(relay::model::peak_rss_bytes()));
    return secs;
  }
};

double kv_python(relay::bench::PythonRef& py, const Tokens& prompts, int64_t N,
                 PeakGrowth* mem = nullptr) {
  nlohmann::json reply =
      py.call({{"cmd", "decode"}, {"prompts", prompts}, {"new", N}, {"seed", 0}});
  const int64_t B = static_cast<int64_t>(prompts.size());
  if (reply.value("tokens", int64_t{0}) != B * N) relay::bench::fail("python decode: token count");
  if (mem != nullptr) {
    mem->add(reply.value("rss_bytes", -1.0), reply.value("peak_rss_bytes", -1.0));
  }
  return reply.at("seconds").get<double>();
}

// What a bound row needs; the rows are made at the end of the run, from the
// machine's limits measured at its start and end (the better of the two).
struct PendingBound {
  std::string model;
  int64_t batch = 0, tokens = 0, steps = 0;
  double flops_per_token = 0;  // 2 x matmul parameters + attention at the mean context
  double prefill_flops = 0;    // the B x P prompt positions, the head on B of them
  double weight_bytes = 0;     // read once per forward
  double weight_params = 0;    // the matrices' parameters (2 FLOPs each per row)
  double gemm_step_s = 0;      // one decode step's weight GEMMs, best of several
  double gemm_prefill_s = 0;   // the prefill's
  double kernel_step_s = 0;    // one decode step's products as the engine runs them
  double engine_s = 0;
};

void bench_py(const Workload& w, Policy& p, int64_t B, int reps, int64_t N,
              relay::bench::PythonRef& py, const std::string& check, std::vector<Row>* rows,
              std::vector<PendingBound>* bounds, std::vector<MemRow>* mem) {
  const int64_t P = w.prompt_len;
  const Tokens prompts = random_prompts(B, P, w.config.vocab_size, 1000 + B);
  Tokens warm, b, c;
  int64_t steps = 0;
  kv_python(py, prompts, 2);
  kv_extend(p, prompts, 2, &warm);
  kv_engine(p, prompts, 2, &warm, &steps);

  // Interleaved (alternating order, a pause before each run); each ratio is
  // the median of per-repetition ratios against that repetition's python run.
  // Each run's peak resident set above the one it started from is kept.
  PeakGrowth py_mem, extend_mem, engine_mem;
  relay::rollout::EngineStats engine_stats;
  const auto t = relay::bench::interleave(
      reps, {[&] { return kv_python(py, prompts, N, &py_mem); },
             [&] { return extend_mem.track([&] { return kv_extend(p, prompts, N, &b); }); },
             [&] {
               return engine_mem.track(
                   [&] { return kv_engine(p, prompts, N, &c, &steps, &engine_stats); });
             }});
  const std::vector<double>&tp = t[0], &te = t[1], &tg = t[2];
  const int64_t tokens = B * N;
  auto row = [&](const char* mode, const std::vector<double>& secs, std::string notes) {
    rows->push_back({w.name, "py", mode, B, tokens, median(secs),
                     relay::bench::paired_ratio(tp, secs), std::move(notes)});
  };
  row("python", tp,
      "P=" + std::to_string(P) + " N=" + std::to_string(N) + ", " + spread(tp) + ", " + check);
  row("extend", te, spread(te));
  const double engine = median(tg);
  row("engine", tg, spread(tg) + ", steps " + std::to_string(steps));
  if (mem != nullptr) {
    auto mrow = [&](const char* mode, const PeakGrowth& g, std::string notes) {
      mem->push_back({w.name, mode, B, g.rss / 1e6, g.peak / 1e6, std::move(notes)});
    };
    mrow("python", py_mem, "torch.cat KV cache, no preallocation");
    mrow("extend", extend_mem,
         "KVCache for B x (P + N) positions: " +
             fmt("%.1f MB", B * (P + N) * engine_stats.kv_bytes_per_position / 1e6));
    mrow("engine", engine_mem,
         fmt("KV cache peak %.1f MB (%.0f positions in blocks), budget %.1f MB",
             engine_stats.kv_peak_positions * engine_stats.kv_bytes_per_position / 1e6,
             double(engine_stats.kv_peak_positions),
             engine_stats.kv_capacity_positions * engine_stats.kv_bytes_per_position / 1e6));
  }

  PendingBound pb;
  pb.model = w.name;
  pb.batch = B;
  pb.tokens = tokens;
  pb.steps = N;
  const PolicyConfig& cfg = w.config;
  double matmul_params = 0, head_params = 0;  // the head's apart: the prefill runs it on B rows
  for (const ForwardMatrix& m : forward_matrices(p)) {
    (m.head ? head_params : matmul_params) += static_cast<double>(m.weight.numel());
  }
  // Attention FLOPs per token at a context of c: 4 x layers x heads x head_dim x c.
  const double attention = 4.0 * cfg.num_hidden_layers * cfg.num_attention_heads *
                           static_cast<double>(cfg.resolved_head_dim());
  pb.flops_per_token = 2.0 * (matmul_params + head_params) + attention * (P + N / 2.0);
  pb.prefill_flops = B * (P * (2.0 * matmul_params + attention * P / 2.0) + 2.0 * head_params);
  pb.weight_params = matmul_params + head_params;
  pb.weight_bytes = static_cast<double>(c10::elementSize(g_dtype)) * pb.weight_params;
  pb.gemm_step_s = step_gemm_seconds(p, B, B, 5);
  pb.gemm_prefill_s = step_gemm_seconds(p, B * P, B, 3);
  pb.kernel_step_s = step_gemm_seconds(p, B, B, 5, /*kernels=*/true);
  pb.engine_s = engine;
  bounds->push_back(pb);
}

// The limit for the same tokens; the ratio column of these rows is the
// engine's tokens/s over the bound's.
void bound_rows(const std::vector<PendingBound>& bounds, const MachineLimits& lim,
                std::vector<Row>* rows) {
  for (const PendingBound& b : bounds) {
    const double compute_s = b.batch * b.flops_per_token / (lim.peak_gflops * 1e9);
    const double memory_s = b.weight_bytes / (lim.bandwidth() * 1e9);
    const double prefill_s = std::max(b.prefill_flops / (lim.peak_gflops * 1e9), memory_s);
    const double roofline_s = prefill_s + std::max(compute_s, memory_s) * (b.steps - 1);
    const double gemm_s = b.gemm_prefill_s + b.gemm_step_s * (b.steps - 1);
    auto row = [&](const char* mode, double secs, std::string notes) {
      rows->push_back(
          {b.model, "bound", mode, b.batch, b.tokens, secs, secs / b.engine_s, std::move(notes)});
    };
    row("roofline", roofline_s,
        fmt("%.3g MFLOP/token, peak %.0f GFLOP/s, %.3g MB at %.1f GB/s: ", b.flops_per_token / 1e6,
            lim.peak_gflops, b.weight_bytes / 1e6, lim.bandwidth()) +
            (compute_s >= memory_s ? "compute-bound" : "memory-bound"));
    row("gemm-only", gemm_s,
        fmt("prefill's weight GEMMs %.1f ms, one step's %.2f ms = %.1f GFLOP/s",
            1e3 * b.gemm_prefill_s, 1e3 * b.gemm_step_s,
            2.0 * b.batch * b.weight_params / b.gemm_step_s / 1e9));
    row("products", b.gemm_prefill_s + b.kernel_step_s * (b.steps - 1),
        fmt("prefill's weight GEMMs %.1f ms, one step's products as the engine runs them %.2f "
            "ms = %.1f GB/s of weights, %.1f GFLOP/s",
            1e3 * b.gemm_prefill_s, 1e3 * b.kernel_step_s, b.weight_bytes / b.kernel_step_s / 1e9,
            2.0 * b.batch * b.weight_params / b.kernel_step_s / 1e9));
  }
}

// ---------------------------------------------------------------------------
// --model-dir: a model directory as a user brings it (config.json, sharded
// safetensors in any dtype), run in --dtype on --device like the random ones.

Policy load_directory(const std::string& dir) {
  relay::model::LoadOptions lo;
  lo.dtype = g_dtype;
  lo.device = g_device;
  auto p = relay::model::load_policy(dir, lo);
  die_if(p.status(), ("--model-dir " + dir).c_str());
  (*p)->eval();
  return *std::move(p);
}

Workload directory_workload(const std::string& dir) {
  auto config = relay::model::read_hf_config(dir + "/config.json");
  die_if(config.status(), ("--model-dir " + dir).c_str());
  Workload w;
  w.name = std::filesystem::path(dir).filename().string();
  if (w.name.empty()) w.name = std::filesystem::path(dir).parent_path().filename().string();
  w.config = *std::move(config);
  w.model_dir = dir;
  w.prompt_len = 16;
  w.new_tokens = 32;
  w.mixed_max_new = 64;
  w.mixed_mean_len = 16.0;
  w.mixed_per_slot = 2;
  w.reps = 3;
  w.reps_64 = 1;
  return w;
}

// ---------------------------------------------------------------------------
// Output.

void print_memory(const std::vector<MemRow>& mem, const std::vector<Workload>& runs, FILE* f) {
  std::fprintf(f, "\nmemory (py rows; each process by itself, peak over repetitions)\n");
  std::fprintf(f, "%-14s %5s %-8s %12s %16s  %s\n", "model", "batch", "mode", "RSS MB",
               "decode peak MB", "notes");
  for (const MemRow& r : mem) {
    std::fprintf(f, "%-14s %5lld %-8s %12.0f %16.1f  %s\n", r.model.c_str(), (long long)r.batch,
                 r.mode.c_str(), r.rss_mb, r.decode_peak_mb, r.notes.c_str());
  }
  for (const Workload& w : runs) {
    if (w.model_dir.empty()) continue;
    const PolicyConfig& c = w.config;
    const double per_position = 2.0 * c.num_hidden_layers * c.num_key_value_heads *
                                c.resolved_head_dim() * c10::elementSize(g_dtype);
    std::fprintf(f,
                 "%s KV cache: %.0f bytes per position; the old preallocation, rollout.num_slots "
                 "64 x max_position_embeddings %lld: %.1f GB\n",
                 w.name.c_str(), per_position, (long long)c.max_position_embeddings,
                 64.0 * c.max_position_embeddings * per_position / 1e9);
  }
  std::fflush(f);
}

void print_table(const std::vector<Row>& rows, FILE* f) {
  std::fprintf(f, "%-11s %-6s %5s %-11s %7s %9s %10s %7s  %s\n", "model", "bench", "batch", "mode",
               "tokens", "seconds", "tokens/s", "ratio", "notes");
  for (const Row& r : rows) {
    std::fprintf(f, "%-11s %-6s %5lld %-11s %7lld %9.3f %10.1f %6.2fx  %s\n", r.model.c_str(),
                 r.bench.c_str(), (long long)r.batch, r.mode.c_str(), (long long)r.tokens,
                 r.seconds, r.tokens / r.seconds, r.ratio, r.notes.c_str());
  }
  std::fflush(f);
}

void print_json(const std::vector<Row>& rows) {
  std::printf("[\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf(
        "  {\"model\": \"%s\", \"bench\": \"%s\", \"batch\": %lld, \"mode\": \"%s\", "
        "\"tokens\": %lld, \"seconds\": %.6f, \"tokens_per_s\": %.3f, \"ratio\": %.4f, "
        "\"notes\": \"%s\"}%s\n",
        r.model.c_str(), r.bench.c_str(), (long long)r.batch, r.mode.c_str(), (long long)r.tokens,
        r.seconds, r.tokens / r.seconds, r.ratio, r.notes.c_str(), i + 1 < rows.size() ? "," : "");
  }
  std::printf("]\n");
}

}  // namespace

int main(int argc, char** argv) {
  // First: it may start the program again with other BLAS kernels (and the
  // Python baseline, a child, inherits the choice).
  relay::model::choose_blas_kernels(argv);
  relay::bench::expect_flags(
      argc, argv,
      {"--batches", "--blas-threads", "--cpu-memory", "--decode-graphs", "--device", "--dtype",
       "--kernel-threads", "--model-dir", "--models", "--new", "--only", "--prompt",
       "--py-attention", "--python-exe", "--python-script", "--reps", "--threads"},
      {"--json", "--python", "--quick"});
  const char* models_flag = flag(argc, argv, "--models");
  const char* batches_flag = flag(argc, argv, "--batches");
  const char* only = flag(argc, argv, "--only");
  const char* threads_flag = flag(argc, argv, "--threads");
  const char* blas_flag = flag(argc, argv, "--blas-threads");
  const char* kernel_flag = flag(argc, argv, "--kernel-threads");
  const char* reps_flag = flag(argc, argv, "--reps");
  const char* prompt_flag = flag(argc, argv, "--prompt");
  const char* new_flag = flag(argc, argv, "--new");
  const bool json = has(argc, argv, "--json");
  const bool quick = has(argc, argv, "--quick");
  const char* python_exe = flag(argc, argv, "--python-exe");
  const char* python_script = flag(argc, argv, "--python-script");
  const char* model_dir = flag(argc, argv, "--model-dir");
  // With --model-dir alone, only that model runs.
  const std::vector<std::string> models =
      split(models_flag ? models_flag : (model_dir ? "" : "tiny,qwen2-100m"));
  std::vector<int64_t> batches;
  for (const std::string& b : split(batches_flag ? batches_flag : "1,8,64")) {
    batches.push_back(std::atoll(b.c_str()));
  }
  const bool do_kv = !only || std::strcmp(only, "kv") == 0;
  const bool do_mixed = !only || std::strcmp(only, "mixed") == 0;
  const bool do_attn = only && std::strcmp(only, "attn") == 0;
  const bool do_sampler = only && std::strcmp(only, "sampler") == 0;
  const bool do_dtype = only && std::strcmp(only, "dtype") == 0;
  const bool do_py =
      (!only && has(argc, argv, "--python")) || (only && std::strcmp(only, "py") == 0);

  if (const char* d = flag(argc, argv, "--device")) {
    try {
      g_device = c10::Device(d);
    } catch (const std::exception&) {
      relay::bench::fail(std::string("--device ") + d + ": not cpu or cuda[:i]");
    }
    if (g_device.is_cuda() && !torch::cuda::is_available()) {
      relay::bench::fail(std::string("--device ") + d +
                         ": no CUDA device (or a CPU-only LibTorch)");
    }
  }
  if (const char* t = flag(argc, argv, "--dtype")) {
    if (std::strcmp(t, "bfloat16") == 0) {
      g_dtype = c10::ScalarType::BFloat16;
    } else if (std::strcmp(t, "float32") != 0) {
      relay::bench::fail(std::string("--dtype ") + t + ": float32 or bfloat16");
    }
  }
  if (const char* g = flag(argc, argv, "--decode-graphs")) {
    const auto mode = relay::rollout::kDecodeGraphModeNames.parse(g);
    if (!mode.ok()) relay::bench::fail("--decode-graphs: " + std::string(mode.status().message()));
    g_decode_graphs = *mode;
  }
  relay::bench::PyPlacement py_at;
  py_at.device = g_device.str();
  py_at.dtype = g_dtype == c10::ScalarType::BFloat16 ? "bfloat16" : "float32";
  if (const char* a = flag(argc, argv, "--py-attention")) {
    if (std::strcmp(a, "eager") != 0 && std::strcmp(a, "sdpa") != 0) {
      relay::bench::fail(std::string("--py-attention ") + a + ": eager or sdpa");
    }
    py_at.attention = a;
  }
  if (do_dtype && g_dtype != c10::ScalarType::Float) {
    relay::bench::fail("--only dtype compares bfloat16 with float32 weights: drop --dtype");
  }
  if (only && !do_kv && !do_mixed && !do_attn && !do_sampler && !do_dtype && !do_py) {
    relay::bench::fail(std::string("--only ") + only + ": kv, mixed, py, attn, sampler or dtype");
  }

  const std::string cpu_memory =
      relay::bench::configure_cpu_memory(flag(argc, argv, "--cpu-memory"));
  relay::model::configure_threads(0);
  if (threads_flag) at::set_num_threads(std::atoi(threads_flag));
  const int blas = blas_threads(blas_flag ? std::atoi(blas_flag) : 0);
  if (kernel_flag) relay::model::set_kernel_threads(std::atoi(kernel_flag));
  const int kernel_threads = relay::model::kernel_pool()->threads();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* blas_env = std::getenv("OPENBLAS_NUM_THREADS");
  // Progress and set-up go to stderr, so --json leaves stdout clean.
  std::fprintf(stderr,
               "rollout_bench: LibTorch %s, device %s, %s, at::get_num_threads() = %d, OpenBLAS "
               "threads %d (OMP_NUM_THREADS=%s, OPENBLAS_NUM_THREADS=%s)\n",
               TORCH_VERSION, g_device.str().c_str(), c10::toString(g_dtype), at::get_num_threads(),
               blas, omp ? omp : "(unset)", blas_env ? blas_env : "(unset)");
  const std::string kernels = relay::model::describe(relay::model::blas_kernels());
  std::fprintf(stderr, "rollout_bench: BLAS %s; %d kernel-pool threads; freed CPU memory: %s\n",
               kernels.c_str(), kernel_threads, cpu_memory.c_str());

  std::vector<Row> rows;
  const auto start = Clock::now();
  // The Python reference runs with relay's thread settings, in a process of
  // its own that stays up for the whole run (start-up and loads untimed).
  std::unique_ptr<relay::bench::TempDir> scratch;
  std::unique_ptr<relay::bench::PythonRef> py;
  MachineLimits limits;
  std::vector<PendingBound> bounds;
  if (do_py) {
    scratch = std::make_unique<relay::bench::TempDir>();
    py = std::make_unique<relay::bench::PythonRef>(
        python_exe ? python_exe : relay::bench::default_python(),
        python_script ? python_script : relay::bench::default_python_script(),
        at::get_num_threads(), blas);
    std::fprintf(stderr, "python reference: %s\n", py->hello().dump().c_str());
    limits = measure_limits(g_device, g_dtype);
    std::fprintf(stderr,
                 "machine (%s, %s): GEMM peak %.1f GFLOP/s; bandwidth: GEMV %.1f GB/s, "
                 "copy %.1f GB/s\n",
                 g_device.str().c_str(), c10::toString(g_dtype), limits.peak_gflops,
                 limits.gemv_gbs, limits.copy_gbs);
  }
  if (do_sampler) {
    const int reps = reps_flag ? std::atoi(reps_flag) : (quick ? 1 : 5);
    for (int64_t V : {int64_t{32000}, int64_t{151936}}) {
      const size_t first = rows.size();
      for (int64_t B : batches) bench_sampler(V, B, reps, &rows);
      print_table({rows.begin() + first, rows.end()}, stderr);
    }
  }
  std::vector<Workload> runs;
  for (Workload& w : workloads()) {
    if (!do_sampler && std::find(models.begin(), models.end(), w.name) != models.end()) {
      runs.push_back(w);
    }
  }
  if (model_dir != nullptr) runs.push_back(directory_workload(model_dir));
  std::vector<MemRow> mem;
  for (Workload w : runs) {
    if (prompt_flag) w.prompt_len = std::atoll(prompt_flag);
    if (new_flag) w.new_tokens = std::atoll(new_flag);
    if (quick) {
      w.reps = std::min(w.reps, 3);
      w.reps_64 = std::min(w.reps_64, 3);
      if (w.name != "tiny") w.reps = w.reps_64 = 1;
    }
    if (reps_flag) w.reps = w.reps_64 = std::atoi(reps_flag);
    die_if(relay::model::validate(w.config), w.name.c_str());
    Policy policy = w.model_dir.empty() ? make_policy(w.config) : load_directory(w.model_dir);
    const PolicyConfig& c = w.config;
    std::fprintf(stderr,
                 "%s: %s, %lld layers, hidden %lld, %lld heads / %lld kv heads, ffn %lld, vocab "
                 "%lld, tied %s, attention bias %s: %lld parameters\n",
                 w.name.c_str(), c.model_type.c_str(), (long long)c.num_hidden_layers,
                 (long long)c.hidden_size, (long long)c.num_attention_heads,
                 (long long)c.num_key_value_heads, (long long)c.intermediate_size,
                 (long long)c.vocab_size, c.tie_word_embeddings ? "yes" : "no",
                 c.attention_bias || c.model_type == "qwen2" ? "yes" : "no",
                 (long long)count_parameters(policy));
    std::string check;
    if (do_py) {
      const nlohmann::json c =
          relay::bench::load_and_check(*py, *policy, scratch->path(), w.name, 1e-3, py_at);
      check = c.at("summary").get<std::string>();
      std::fprintf(stderr, "%s: %s\n", w.name.c_str(), check.c_str());
    }
    // What relay's setup does after loading a model (the load's buffers, and
    // here the check's probe model, are freed but kept by malloc).
    relay::model::release_free_cpu_memory();
    for (int64_t B : batches) {
      const size_t first = rows.size();
      const int reps = B >= 64 ? w.reps_64 : w.reps;
      if (do_kv) bench_kv(w, policy, B, reps, w.new_tokens, &rows);
      if (do_mixed) bench_mixed(w, policy, B, reps, &rows);
      if (do_attn) bench_attn(w, policy, B, reps, w.new_tokens, &rows);
      if (do_dtype) bench_dtype(w, policy, B, reps, w.new_tokens, &rows);
      if (do_py) {
        // At least 5 repetitions each (9 for tiny, whose runs take ms) (a median), unless asked
        // otherwise.
        const int py_reps = quick || reps_flag ? reps : std::max(reps, w.name == "tiny" ? 9 : 5);
        bench_py(w, policy, B, py_reps, w.new_tokens, *py, check, &rows, &bounds,
                 w.model_dir.empty() || !g_device.is_cpu() ? nullptr : &mem);
      }
      print_table({rows.begin() + first, rows.end()}, stderr);
      std::fprintf(stderr, "  (%.0f s so far)\n", since(start));
    }
  }
  if (do_py) {
    limits = relay::bench::best_of(limits, measure_limits(g_device, g_dtype));
    const size_t first = rows.size();
    bound_rows(bounds, limits, &rows);
    print_table({rows.begin() + first, rows.end()}, stderr);
  }
  if (json) {
    print_json(rows);
  } else {
    std::printf(
        "rollout_bench: LibTorch %s, device %s, %s, %d intra-op threads, %d OpenBLAS threads, "
        "%.0f s\n",
        TORCH_VERSION, g_device.str().c_str(), c10::toString(g_dtype), at::get_num_threads(), blas,
        since(start));
    std::printf("BLAS %s; %d kernel-pool threads\n", kernels.c_str(), kernel_threads);
    if (do_py) {
      std::printf(
          "machine (best of start and end; %s, %s): GEMM peak %.1f GFLOP/s; bandwidth: GEMV "
          "%.1f GB/s, copy %.1f GB/s; python %s\n",
          g_device.str().c_str(), c10::toString(g_dtype), limits.peak_gflops, limits.gemv_gbs,
          limits.copy_gbs, py->hello().dump().c_str());
    }
    print_table(rows, stdout);
    if (!mem.empty()) print_memory(mem, runs, stdout);
  }
  return 0;
}
