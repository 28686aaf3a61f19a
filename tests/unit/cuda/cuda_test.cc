// The CUDA checks (ctest label `cuda`, docs/gpu.md): what relay runs on a GPU,
// against the same code on the CPU or against the other path over the same
// weights. Every test needs a GPU (the data-parallel and two-member NCCL ones
// two) and is skipped, with the reason, where there is none: always in a
// build against a CPU-only LibTorch, which has no RELAY_WITH_CUDA.
//
// RELAY_CUDA_TESTS_ON_CPU=1 runs the bodies on the CPU instead, Gloo in place
// of NCCL: a check of the tests themselves on a machine without a GPU. It
// proves nothing about CUDA.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/weight_sync/sync_group.h"
#include "relay/comm/dist/trainer_group.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/comm/weight_sync/weight_sync.h"
#include "relay/model/attention_implementation.h"
#include "relay/model/decode_graphs.h"
#include "relay/model/device.h"
#include "relay/model/kv_cache.h"
#include "relay/model/lora.h"
#include "relay/model/policy.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/engine.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/trainer.h"
#include "testing/attention_agreement.h"
#include "testing/ports.h"
#include "testing/tensor_testing.h"

namespace relay {
namespace {

using relay::testing::AllClose;
using relay::testing::free_port;
using relay::testing::TinyConfig;
using std::chrono::milliseconds;

bool dry_run_on_cpu() {
  const char* v = std::getenv("RELAY_CUDA_TESTS_ON_CPU");
  return v != nullptr && std::string(v) == "1";
}

int visible_gpus() {
  return model::cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

// Empty when the test can run on `n` devices, else why it is skipped.
std::string missing_gpus(int n) {
  if (dry_run_on_cpu()) return "";
#ifndef RELAY_WITH_CUDA
  return "this build has no CUDA: it was built against a CPU-only LibTorch (docs/gpu.md)";
#else
  const int have = visible_gpus();
  if (have >= n) return "";
  if (have == 0) return "no CUDA device is visible to this process";
  return "needs " + std::to_string(n) + " GPUs, " + std::to_string(have) +
         " visible: NCCL refuses two ranks of one communicator on the same GPU";
#endif
}

#define RELAY_NEED_GPUS(n)                                     \
  if (const std::string why = missing_gpus(n); !why.empty()) { \
    GTEST_SKIP() << why;                                       \
  }

// Device i of the test: cuda:i, or the CPU in a dry run.
c10::Device device(int i = 0) {
  return dry_run_on_cpu() ? c10::Device(c10::DeviceType::CPU)
                          : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(i));
}

// Peaked distributions (weights of std 0.3), so that low precision shows.
model::Policy make_policy(uint64_t seed, c10::Device where) {
  model::Policy p(TinyConfig());
  p->to(where);
  model::init_weights(*p, seed, 0.3);
  p->eval();
  return p;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(torch::kCPU, torch::kFloat64) - b.detach().to(torch::kCPU, torch::kFloat64))
      .abs()
      .max()
      .item<double>();
}

// ---- devices and autocast ----

TEST(CudaDeviceTest, ParsesCudaDevicesAndMovesTensorsAndWeights) {
  RELAY_NEED_GPUS(1);
  if (dry_run_on_cpu()) GTEST_SKIP() << "parse_device(cuda) needs a GPU: nothing to dry-run";
  const int n = visible_gpus();
  auto cuda = model::parse_device("cuda", 0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_TRUE(cuda->is_cuda());
  EXPECT_EQ(cuda->index(), 0);
  auto last = model::parse_device("cuda:" + std::to_string(n - 1));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->index(), n - 1);
  auto past = model::parse_device("cuda:" + std::to_string(n));
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find(std::to_string(n) + " CUDA devices are visible"),
            std::string::npos)
      << past.status();
  auto rank_past = model::parse_device("cuda", n);  // $LOCAL_RANK past the GPUs
  ASSERT_FALSE(rank_past.ok());
  EXPECT_NE(rank_past.status().message().find("$LOCAL_RANK"), std::string::npos)
      << rank_past.status();

  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
    const at::Tensor x = torch::randn({5, 7}).to(dtype);
    const at::Tensor on = x.to(*cuda);
    EXPECT_TRUE(on.is_cuda());
    EXPECT_TRUE(torch::equal(on.cpu(), x)) << dtype;
  }
  // init_weights draws on the CPU and copies: the same weights on either device.
  model::Policy cpu = make_policy(5, c10::Device(c10::DeviceType::CPU));
  model::Policy gpu = make_policy(5, *cuda);
  const auto a = cpu->named_parameters();
  const auto b = gpu->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(b[i].value().is_cuda()) << b[i].key();
    EXPECT_TRUE(torch::equal(a[i].value(), b[i].value().cpu())) << a[i].key();
  }
}

TEST(CudaDeviceTest, AutocastGuardScopesCudaMatmulsOnly) {
  RELAY_NEED_GPUS(1);
  if (dry_run_on_cpu()) GTEST_SKIP() << "DeviceTest.AutocastGuard* covers the CPU";
  const at::Tensor a = torch::randn({4, 8}, device());
  const at::Tensor b = torch::randn({8, 3}, device());
  const at::Tensor a_cpu = a.cpu();
  const at::Tensor b_cpu = b.cpu();
  {
    model::AutocastGuard none(c10::DeviceType::CUDA, std::nullopt);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
  }
  {
    model::AutocastGuard outer(c10::DeviceType::CUDA, c10::ScalarType::BFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    EXPECT_EQ(torch::matmul(a_cpu, b_cpu).scalar_type(), torch::kFloat32)
        << "CPU autocast is apart";
    {
      model::AutocastGuard inner(c10::DeviceType::CUDA, c10::ScalarType::BFloat16);
      EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
    // log_softmax runs in fp32 under CUDA autocast.
    EXPECT_EQ(torch::log_softmax(torch::matmul(a, b), -1).scalar_type(), torch::kFloat32);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
  {
    model::AutocastGuard half(c10::DeviceType::CUDA, c10::ScalarType::Half);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kHalf);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat32);
}

// ---- the policy: the engine's decode path against the trainer's scoring path ----

// Greedy-decodes 8 tokens after three prompts of different lengths through a
// KV cache (the engine's path; one slot is refilled halfway), then scores the
// whole sequences with score() (the trainer's path). Returns the largest
// |log-prob difference| over the decoded tokens and checks that the first
// prompt's prefill logits equal forward()'s within `logit_tol`.
double decode_vs_score(model::Policy& p, c10::ScalarType cache_dtype,
                       std::optional<c10::ScalarType> autocast, double logit_tol) {
  torch::NoGradGuard no_grad;
  const c10::Device where = p->parameters().front().device();
  model::AutocastGuard guard(where.type(), autocast);
  model::KVCache cache(p->config(), 3, 32, cache_dtype, where);
  std::vector<std::vector<int64_t>> seqs = {{5, 3, 9}, {1, 2, 3, 4, 5, 6}, {7}};
  std::vector<std::vector<double>> decoded(3);  // log-probs of the decoded tokens
  std::vector<size_t> first(3);                 // index of the first decoded token
  auto extend = [&](const std::vector<std::vector<int64_t>>& chunks) {
    int64_t T = 0;
    for (const auto& c : chunks) T = std::max<int64_t>(T, static_cast<int64_t>(c.size()));
    at::Tensor ids = torch::zeros({3, T}, torch::kInt64);
    std::vector<int64_t> lens;
    for (size_t b = 0; b < chunks.size(); ++b) {
      for (size_t t = 0; t < chunks[b].size(); ++t) ids[b][t] = chunks[b][t];
      lens.push_back(static_cast<int64_t>(chunks[b].size()));
    }
    return p
        ->extend(ids.to(where), torch::tensor(lens).to(where),
                 torch::tensor(std::vector<int64_t>{0, 1, 2}).to(where), cache)
        .to(torch::kCPU, torch::kFloat32);
  };
  at::Tensor logits = extend(seqs);
  const at::Tensor full = p->forward(torch::tensor(seqs[0]).view({1, -1}).to(where))[0][2];
  EXPECT_LT(max_abs_diff(logits[0], full), logit_tol) << "prefill logits vs forward()";
  for (int b = 0; b < 3; ++b) first[b] = seqs[b].size();
  for (int step = 0; step < 8; ++step) {
    std::vector<std::vector<int64_t>> chunks(3);
    const at::Tensor logp = torch::log_softmax(logits, -1);
    for (int b = 0; b < 3; ++b) {
      if (step == 4 && b == 1) {  // slot 1 finishes; a new prompt takes it
        cache.reset(1);
        seqs[1] = {8, 8, 2, 30};
        first[1] = seqs[1].size();
        decoded[1].clear();
        chunks[1] = seqs[1];
        continue;
      }
      const int64_t next = logits[b].argmax().item<int64_t>();
      decoded[b].push_back(logp[b][next].item<double>());
      seqs[b].push_back(next);
      chunks[b] = {next};
    }
    logits = extend(chunks);
  }
  double worst = 0;
  for (int b = 0; b < 3; ++b) {
    const at::Tensor scored =
        p->score(torch::tensor(seqs[b]).view({1, -1}).to(where))[0].to(torch::kCPU);
    for (size_t j = 0; j < decoded[b].size(); ++j) {
      // Token at index first + j is scored at position first + j - 1.
      const double s = scored[static_cast<int64_t>(first[b] + j) - 1].item<double>();
      worst = std::max(worst, std::abs(s - decoded[b][j]));
    }
  }
  return worst;
}

// model.attn_implementation sdpa on the GPU (LibTorch's memory-efficient
// kernel with relay's bool masks) against the explicit products, values and
// gradients, in fp32 and bf16.
TEST(CudaAttentionTest, SdpaAgreesWithEagerInFp32AndBf16) {
  RELAY_NEED_GPUS(1);
  if (!model::sdpa_available()) {
    GTEST_SKIP() << "this LibTorch has no scaled_dot_product_attention (2.0+)";
  }
  relay::testing::expect_sdpa_agrees_with_eager(device(), torch::kFloat32, 1e-4);
  relay::testing::expect_sdpa_agrees_with_eager(device(), torch::kBFloat16, 5e-2);
}

TEST(CudaPolicyTest, IncrementalDecodeMatchesScoringInFp32) {
  RELAY_NEED_GPUS(1);
  model::Policy p = make_policy(21, device());
  const double worst = decode_vs_score(p, torch::kFloat32, std::nullopt, 1e-4);
  std::printf("fp32 decode vs score: max |logprob diff| %.3g\n", worst);
  RecordProperty("max_abs_logprob_diff", std::to_string(worst));
  EXPECT_LT(worst, 1e-4);
  // And both paths agree with the CPU's.
  model::Policy cpu = make_policy(21, c10::Device(c10::DeviceType::CPU));
  const at::Tensor ids = torch::tensor(std::vector<int64_t>{4, 9, 2, 2, 17, 3, 1}).view({1, -1});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(p->score(ids.to(device())), cpu->score(ids), 1e-4));
}

TEST(CudaPolicyTest, IncrementalDecodeMatchesScoringInBf16) {
  RELAY_NEED_GPUS(1);
  // model.dtype bfloat16: weights and cache in bf16.
  model::Policy p = make_policy(21, device());
  p->to(torch::kBFloat16);
  const double weights = decode_vs_score(p, torch::kBFloat16, std::nullopt, 0.25);
  // run.autocast bfloat16: fp32 weights and cache, matrix products in bf16.
  model::Policy q = make_policy(21, device());
  const double autocast = decode_vs_score(q, torch::kFloat32, c10::ScalarType::BFloat16, 0.25);
  std::printf("bf16 decode vs score: max |logprob diff| %.3g (bf16 weights), %.3g (autocast)\n",
              weights, autocast);
  RecordProperty("bf16_weights_max_abs_logprob_diff", std::to_string(weights));
  RecordProperty("autocast_max_abs_logprob_diff", std::to_string(autocast));
  // bf16 keeps 8 bits of mantissa; the two paths round differently.
  EXPECT_LT(weights, 0.15);
  EXPECT_LT(autocast, 0.15);
}

// ---- the engine's behavior log-probs against the trainer's ----

// Three groups of four sampled by an engine on `p`'s device, rewards 1 for
// responses containing token 5 (and one of each per group).
// `graphs` is the engine's rollout.decode_graphs; its stats go to `stats`.
std::vector<rollout::TrajectoryGroup> sample_groups(
    const model::Policy& p, std::optional<c10::ScalarType> autocast,
    rollout::DecodeGraphMode graphs = rollout::DecodeGraphMode::kAuto,
    rollout::EngineStats* stats = nullptr) {
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 8;
  eo.decode_graphs = graphs;
  eo.autocast = !autocast                                ? model::Autocast::kNone
                : *autocast == c10::ScalarType::BFloat16 ? model::Autocast::kBFloat16
                                                         : model::Autocast::kFloat16;
  auto engine = rollout::Engine::create(model::clone_policy(*p), eo, 0, 1);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  for (int g = 0; g < 3; ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(g);
    pg.prompt = {1, 3 + g, 7, 2 + g};
    pg.k = 4;
    pg.seed = 10 + g;
    EXPECT_TRUE((*engine)->submit(pg).ok());
  }
  auto groups = (*engine)->run();
  EXPECT_TRUE(groups.ok()) << groups.status();
  if (!groups.ok()) return {};
  if (stats != nullptr) *stats = (*engine)->stats();
  for (auto& g : *groups) {
    for (size_t i = 0; i < g.trajectories.size(); ++i) {
      auto& t = g.trajectories[i];
      t.reward = std::count(t.response_tokens.begin(), t.response_tokens.end(), 5) > 0 ? 1.0 : 0.0;
      if (i < 2) t.reward = static_cast<double>(i == 0);
    }
  }
  return *std::move(groups);
}

trainer::TrainerOptions step_options() {
  trainer::TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.optimizer.eps = 1e-3;  // the update a smooth function of the gradient
  o.micro_batch_tokens = 40;
  return o;
}

TEST(CudaEngineTest, BehaviorLogprobsMatchTheTrainersScoring) {
  RELAY_NEED_GPUS(1);
  model::Policy policy = make_policy(1, device());
  const auto groups = sample_groups(policy, std::nullopt);
  ASSERT_EQ(groups.size(), 3u);
  // The CPU samples the same tokens: the uniforms come from the same
  // per-sequence streams on the host, so only rounding at a boundary differs.
  const auto cpu_groups = sample_groups(make_policy(1, c10::Device(c10::DeviceType::CPU)), {});
  int same = 0, total = 0;
  model::Policy cpu = make_policy(1, c10::Device(c10::DeviceType::CPU));
  double worst_cpu = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].trajectories.size(); ++i) {
      const rollout::Trajectory& t = groups[g].trajectories[i];
      same += t.response_tokens == cpu_groups[g].trajectories[i].response_tokens;
      ++total;
      // Behavior log-probs of the GPU against the CPU's scoring of the same tokens.
      std::vector<int64_t> ids = t.prompt_tokens;
      ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
      torch::NoGradGuard no_grad;
      const at::Tensor lp = cpu->score(torch::tensor(ids).view({1, -1}))[0];
      const int64_t P = static_cast<int64_t>(t.prompt_tokens.size());
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        worst_cpu = std::max<double>(
            worst_cpu,
            std::abs(t.behavior_logprobs[j] - lp[P - 1 + static_cast<int64_t>(j)].item<double>()));
      }
    }
  }
  std::printf("GPU vs CPU: %d of %d responses identical; behavior vs CPU scoring max %.3g\n", same,
              total, worst_cpu);
  EXPECT_GE(same, total * 9 / 10);
  EXPECT_LT(worst_cpu, 1e-4);

  auto trainer = trainer::Trainer::create(model::clone_policy(*policy), step_options()).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  std::printf("fp32 on-policy step: mismatch max %.3g, k3 %.3g\n",
              m->at("mismatch/logprob_abs_diff_max"), m->at("mismatch/k3"));
  EXPECT_DOUBLE_EQ(m->at("frac_old_logprobs_valid"), 1.0);
  EXPECT_NEAR(m->at("mean_importance_ratio"), 1.0, 1e-5);
  EXPECT_EQ(m->at("clip_fraction"), 0.0);
  EXPECT_LT(m->at("mismatch/logprob_abs_diff_max"), 1e-4);
  EXPECT_LT(m->at("mismatch/k3"), 1e-8);
  EXPECT_GT(m->at("grad_norm"), 0.0);
}

TEST(CudaEngineTest, AutocastEngineAndTrainerAgreeWithinBf16) {
  RELAY_NEED_GPUS(1);
  model::Policy policy = make_policy(2, device());
  const auto groups = sample_groups(policy, c10::ScalarType::BFloat16);
  ASSERT_EQ(groups.size(), 3u);
  trainer::TrainerOptions o = step_options();
  o.autocast = c10::ScalarType::BFloat16;
  auto trainer = trainer::Trainer::create(model::clone_policy(*policy), o).value();
  auto m = trainer->step(groups);
  ASSERT_TRUE(m.ok()) << m.status();
  std::printf("bf16 autocast engine vs trainer: mismatch max %.3g, k3 %.3g\n",
              m->at("mismatch/logprob_abs_diff_max"), m->at("mismatch/k3"));
  EXPECT_LT(m->at("mismatch/logprob_abs_diff_max"), 0.5);
  EXPECT_LT(m->at("mismatch/k3"), 1e-3);
  EXPECT_NEAR(m->at("mean_importance_ratio"), 1.0, 0.02);
}

// ---- decode steps replayed as CUDA graphs (rollout.decode_graphs) ----

// Decodes `steps` tokens for three sequences in fixed shapes and with
// extend(), on two caches of the same prompts, under `autocast`; returns the
// largest logit difference. The weights change in place halfway: a graph
// reads them where they are.
double graph_against_eager(model::Policy& policy, std::optional<c10::ScalarType> autocast,
                           model::DecodeGraphs& graphs, int steps) {
  torch::NoGradGuard no_grad;
  const model::AutocastGuard guard(device().type(), autocast);
  model::KVCacheOptions co;
  co.num_slots = 4;
  co.max_seq_len = 96;
  co.device = device();
  model::KVCache fixed(policy->config(), co), eager(policy->config(), co);
  const at::Tensor prompt =
      torch::tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, torch::kInt64).view({3, 4});
  const at::Tensor lens = torch::tensor({4, 2, 3}, torch::kInt64);
  const at::Tensor slots = torch::tensor({0, 1, 2}, torch::kInt64);
  policy->extend(prompt, lens, slots, fixed, model::ExtendLogits::kNone);
  policy->extend(prompt, lens, slots, eager, model::ExtendLogits::kNone);
  std::vector<int64_t> next = {13, 14, 15};
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    if (step == steps / 2) {
      model::Policy other = make_policy(99, device());
      auto mine = policy->named_parameters();
      for (const auto& item : other->named_parameters()) mine[item.key()].copy_(item.value());
    }
    const at::Tensor got = graphs.step(*policy, fixed, next, {0, 1, 2}, 0);
    const at::Tensor want =
        policy->extend(torch::tensor(next).view({3, 1}), torch::ones({3}, torch::kInt64), slots,
                       eager, model::ExtendLogits::kLast);
    EXPECT_TRUE(got.defined()) << "step " << step;
    if (!got.defined()) return 1e9;
    worst = std::max(worst, max_abs_diff(got.to(torch::kFloat32), want.to(torch::kFloat32)));
    const at::Tensor chosen = want.argmax(-1).to(torch::kCPU);
    for (size_t b = 0; b < next.size(); ++b) next[b] = chosen[b].item<int64_t>();
  }
  return worst;
}

TEST(CudaDecodeGraphTest, ReplaysComputeWhatEagerDecodeComputes) {
  RELAY_NEED_GPUS(1);
  model::Policy policy = make_policy(1, device());
  model::DecodeGraphs graphs;
  const double fp32 = graph_against_eager(policy, std::nullopt, graphs, 24);
  const model::DecodeGraphStats after_fp32 = graphs.stats();
  model::DecodeGraphs autocast_graphs;
  const double bf16 = graph_against_eager(policy, c10::ScalarType::BFloat16, autocast_graphs, 24);
  std::printf(
      "decode graphs: fp32 max logit diff %.3g (%lld captures, %lld replays of %lld steps); "
      "bf16 autocast %.3g (%lld captures)\n",
      fp32, static_cast<long long>(after_fp32.captures), static_cast<long long>(after_fp32.replays),
      static_cast<long long>(after_fp32.steps), bf16,
      static_cast<long long>(autocast_graphs.stats().captures));
  RecordProperty("graph_fp32_max_abs_logit_diff", std::to_string(fp32));
  RecordProperty("graph_bf16_max_abs_logit_diff", std::to_string(bf16));
  EXPECT_EQ(after_fp32.steps, 24);
  if (!dry_run_on_cpu()) {
    // At most 4 + 24 keys: the first key bucket (64), one graph, replayed.
    EXPECT_EQ(after_fp32.captures, 1) << graphs.capture_error();
    EXPECT_EQ(after_fp32.replays, 24);
    EXPECT_GE(autocast_graphs.stats().captures, 1) << autocast_graphs.capture_error();
  }
  EXPECT_LT(fp32, 1e-4);
  // Both sides under autocast: the same bf16 products, summed in another
  // order over the padded keys (0.148 in the dry run on the CPU, at logits
  // near 20); a graph that read autocast's freed casts would be far off.
  EXPECT_LT(bf16, 0.5);
}

TEST(CudaDecodeGraphTest, TheEngineDecodesThroughGraphsOnAGpuByDefault) {
  RELAY_NEED_GPUS(1);
  model::Policy policy = make_policy(1, device());
  rollout::EngineStats with, without;
  // auto on a GPU; the dry run on the CPU asks for the fixed shapes.
  const rollout::DecodeGraphMode mode =
      dry_run_on_cpu() ? rollout::DecodeGraphMode::kOn : rollout::DecodeGraphMode::kAuto;
  const auto graphs = sample_groups(policy, std::nullopt, mode, &with);
  const auto plain = sample_groups(policy, std::nullopt, rollout::DecodeGraphMode::kOff, &without);
  ASSERT_EQ(graphs.size(), plain.size());
  int same = 0, total = 0;
  double worst = 0;
  for (size_t g = 0; g < graphs.size(); ++g) {
    for (size_t i = 0; i < graphs[g].trajectories.size(); ++i) {
      const rollout::Trajectory& a = graphs[g].trajectories[i];
      const rollout::Trajectory& b = plain[g].trajectories[i];
      ++total;
      if (a.response_tokens != b.response_tokens) continue;
      ++same;
      for (size_t j = 0; j < a.behavior_logprobs.size(); ++j) {
        worst = std::max<double>(worst, std::abs(a.behavior_logprobs[j] - b.behavior_logprobs[j]));
      }
    }
  }
  std::printf(
      "engine with graphs: %lld of %lld steps in fixed shapes, %lld replayed; %d of %d responses "
      "identical, "
      "behavior log-probs max diff %.3g\n",
      static_cast<long long>(with.graph_steps), static_cast<long long>(with.steps),
      static_cast<long long>(with.graph_replays), same, total, worst);
  EXPECT_GT(with.graph_steps, 0);
  if (!dry_run_on_cpu()) {
    EXPECT_EQ(with.graph_replays, with.graph_steps);
  }
  EXPECT_EQ(without.graph_steps, 0);
  EXPECT_GE(same, total * 9 / 10);
  EXPECT_LT(worst, 1e-4);
}

// ---- a trainer step on the GPU ----

TEST(CudaTrainerTest, AutocastStepStaysCloseToFp32AndToTheCpu) {
  RELAY_NEED_GPUS(1);
  model::Policy initial = make_policy(1, device());
  const auto groups = sample_groups(initial, std::nullopt);
  trainer::TrainerOptions o = step_options();
  model::Policy fp32 = model::clone_policy(*initial);
  model::Policy bf16 = model::clone_policy(*initial);
  model::Policy cpu = make_policy(1, c10::Device(c10::DeviceType::CPU));
  auto m_cpu = trainer::Trainer::create(cpu, o).value()->step(groups);
  auto m32 = trainer::Trainer::create(fp32, o).value()->step(groups);
  o.autocast = c10::ScalarType::BFloat16;
  auto m16 = trainer::Trainer::create(bf16, o).value()->step(groups);
  ASSERT_TRUE(m_cpu.ok()) << m_cpu.status();
  ASSERT_TRUE(m32.ok()) << m32.status();
  ASSERT_TRUE(m16.ok()) << m16.status();
  EXPECT_EQ(bf16->lm_head->weight.scalar_type(), torch::kFloat32);
  EXPECT_EQ(bf16->lm_head->weight.device(), device());
  EXPECT_GT(m16->at("mismatch/logprob_abs_diff_max"), 1e-4) << "autocast changed nothing";
  EXPECT_LT(m16->at("mismatch/logprob_abs_diff_max"), 0.5);
  // 4% apart on the CPU (RELAY_CUDA_TESTS_ON_CPU=1).
  EXPECT_NEAR(m16->at("grad_norm"), m32->at("grad_norm"), 0.1 * m32->at("grad_norm"));
  EXPECT_NEAR(m32->at("grad_norm"), m_cpu->at("grad_norm"), 1e-4 * m_cpu->at("grad_norm"));
  const at::Tensor start = initial->lm_head->weight.detach().cpu();
  const at::Tensor d_cpu = cpu->lm_head->weight.detach() - start;
  const at::Tensor d32 = fp32->lm_head->weight.detach().cpu() - start;
  const at::Tensor d16 = bf16->lm_head->weight.detach().cpu() - start;
  const double scale = d_cpu.abs().max().item<double>();
  ASSERT_GT(scale, 0) << "the step changed nothing";
  EXPECT_LT(max_abs_diff(d32, d_cpu), 1e-3 * scale) << "fp32 step on the GPU vs on the CPU";
  const double cosine = (d16 * d32).sum().item<double>() / (d16.norm() * d32.norm()).item<double>();
  std::printf("autocast step: grad_norm %.5g (bf16) %.5g (fp32) %.5g (cpu), cosine %.4f\n",
              m16->at("grad_norm"), m32->at("grad_norm"), m_cpu->at("grad_norm"), cosine);
  EXPECT_GT(cosine, 0.9);
}

TEST(CudaTrainerTest, Bf16WeightsTrainThroughFp32MasterCopies) {
  RELAY_NEED_GPUS(1);
  model::Policy policy = make_policy(13, device());
  const auto groups = sample_groups(policy, std::nullopt);
  policy->to(torch::kBFloat16);
  trainer::TrainerOptions o;  // AdamW's own eps: each step moves a weight by about lr
  o.max_staleness = -1;       // the same groups are trained on at every step
  o.optimizer.lr = 1e-4;      // below bf16's spacing for weights of ~0.3
  o.allow_missing_logprobs = true;
  auto trainer = trainer::Trainer::create(policy, o).value();
  const at::Tensor before = policy->lm_head->weight.detach().clone();
  for (int i = 0; i < 8; ++i) {  // as TrainerTest.Fp32MasterWeights*: about 6 to flip a bf16 value
    auto m = trainer->step(groups);
    ASSERT_TRUE(m.ok()) << m.status();
  }
  EXPECT_EQ(policy->lm_head->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(policy->lm_head->weight.device(), device());
  const double changed =
      policy->lm_head->weight.ne(before).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(changed, 0.5) << "the fp32 master copies did not carry the small updates";
}

// ---- LoRA on the GPU ----

// trainer.lora on the device: versions that carry only the adapters (and
// the base's digest) keep the engine's behavior log-probs equal to the
// trainer's at every version, in fp32 (1e-6, as on the CPU) and under bf16
// autocast (within bf16's rounding); the base never moves.
TEST(CudaLoraTest, AdapterOnlyVersionsKeepTheEngineAndTheTrainerTogether) {
  RELAY_NEED_GPUS(1);
  for (const bool bf16 : {false, true}) {
    model::Policy policy = make_policy(3, device());
    trainer::TrainerOptions o = step_options();
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.targets = {"all-linear"};
    o.kl_coef = 0.05;
    if (bf16) o.autocast = c10::ScalarType::BFloat16;
    ASSERT_TRUE(model::attach_lora(*policy, o.lora, 0).ok());
    const at::Tensor base_before = policy->lm_head->weight.detach().clone();
    auto trainer = trainer::Trainer::create(policy, o).value();
    rollout::EngineOptions eo;
    eo.num_slots = 8;
    eo.max_new_tokens = 8;
    eo.autocast = bf16 ? model::Autocast::kBFloat16 : model::Autocast::kNone;
    auto engine = rollout::Engine::create(model::clone_policy(*policy), eo, 0, 1).value();
    std::optional<uint64_t> base_digest;
    for (int round = 0; round < 3; ++round) {
      for (int g = 0; g < 3; ++g) {
        rollout::PromptGroup pg;
        pg.group_id = std::to_string(round) + "-" + std::to_string(g);
        pg.prompt = {1, 3 + g, 7, 2 + g};
        pg.k = 4;
        pg.seed = 10 * round + g;
        ASSERT_TRUE(engine->submit(pg).ok());
      }
      auto groups = engine->run().value();
      for (auto& grp : groups) {
        for (size_t i = 0; i < grp.trajectories.size(); ++i) {
          grp.trajectories[i].reward = static_cast<double>(i % 2 == 0);
        }
      }
      auto m = trainer->step(groups);
      ASSERT_TRUE(m.ok()) << m.status();
      std::printf("LoRA %s, version %d: engine vs trainer mismatch max %.3g, k3 %.3g\n",
                  bf16 ? "bf16 autocast" : "fp32", round, m->at("mismatch/logprob_abs_diff_max"),
                  m->at("mismatch/k3"));
      // The CPU dry run: k3 about 4e-13 in fp32, 4e-4 to 7e-4 under bf16 autocast.
      EXPECT_LT(m->at("mismatch/k3"), bf16 ? 3e-3 : 1e-6);
      auto published = model::published_weights(*policy, &base_digest).value();
      const model::WeightManifest manifest =
          model::weight_manifest(published, trainer->version()).value();
      ASSERT_TRUE(engine->update_weights(trainer->version(), manifest.digest, published).ok());
    }
    EXPECT_TRUE(torch::equal(policy->lm_head->weight.detach(), base_before));
  }
}

// ---- NCCL: the trainer group and the weight sync ----

std::string device_name(int i) { return device(i).str(); }

TEST(CudaCommTest, TrainerGroupOfOneRank) {
  RELAY_NEED_GPUS(1);
  comm::TrainerGroupOptions go;
  go.rank.host = "127.0.0.1";
  go.rank.port = free_port();
  go.device = device_name(0);
  go.timeout = std::chrono::seconds(60);
  auto group = comm::join_trainer_group(go);
  ASSERT_TRUE(group.ok()) << group.status();
  at::Tensor on_device = torch::arange(10, torch::kFloat32).to(device());
  ASSERT_TRUE((*group)->all_reduce_sum(on_device).ok());
  EXPECT_TRUE(torch::equal(on_device.cpu(), torch::arange(10, torch::kFloat32)));
  at::Tensor on_host = torch::arange(6, torch::kFloat32).view({2, 3});  // goes through the device
  ASSERT_TRUE((*group)->all_reduce_sum(on_host).ok());
  EXPECT_TRUE(on_host.device().is_cpu());
  EXPECT_TRUE(torch::equal(on_host, torch::arange(6, torch::kFloat32).view({2, 3})));
  ASSERT_TRUE((*group)->broadcast(on_device, 0).ok());
  EXPECT_EQ((*group)->add_counter("cuda-test", 2).value(), 2);
  // What the sharded optimizer stands on: NCCL's own reduce-scatter and
  // all-gather (of one rank: the identity), bf16 included.
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    at::Tensor shard = torch::arange(5, torch::kFloat32).to(device(), dtype);
    at::Tensor gathered = torch::zeros({5}, shard.options());
    ASSERT_TRUE((*group)->all_gather(shard, gathered).ok());
    EXPECT_TRUE(torch::equal(gathered, shard)) << dtype;
  }
  at::Tensor full = torch::arange(4, torch::kFloat32).to(device());
  at::Tensor mine = torch::zeros({4}, full.options());
  ASSERT_TRUE((*group)->reduce_scatter_sum(full, mine).ok());
  EXPECT_TRUE(torch::equal(mine, full));
}

TEST(CudaCommTest, WeightSyncGroupOfOneRankBroadcasts) {
  RELAY_NEED_GPUS(1);
  auto store = comm::internal::SyncStore::connect("127.0.0.1", 0, milliseconds(10000), true);
  ASSERT_TRUE(store.ok()) << store.status();
  comm::internal::SyncGroupOptions o;
  o.store_host = "127.0.0.1";
  o.store_port = (*store)->port();
  o.generation = 1;
  o.rank = 0;
  o.size = 1;
  o.timeout = milliseconds(20000);
  o.device = device_name(0);
  auto group = comm::internal::SyncGroup::create(o);
  ASSERT_TRUE(group.ok()) << group.status();
  const at::Tensor host = torch::randn({4096});
  at::Tensor wire = (*group)->on_wire(host, /*copy=*/true);
  EXPECT_EQ(wire.device(), device());
  auto op = (*group)->start(wire, "one-rank broadcast");
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE((*op)->wait().ok());
  at::Tensor back = torch::zeros_like(host);
  (*group)->to_host(wire, back);
  EXPECT_TRUE(torch::equal(back, host));
}

// `floats` float32 values in two tensors plus a bf16 one.
comm::WeightSnapshot snapshot(int64_t version, int64_t floats) {
  torch::manual_seed(version);
  comm::WeightPublisher p;
  EXPECT_TRUE(p.publish(version, {{"big", torch::randn({floats - 1000})},
                                  {"small", torch::randn({1000})},
                                  {"half", torch::randn({333}).to(torch::kBFloat16)}})
                  .ok());
  return *p.snapshot(version).value();
}

std::unique_ptr<comm::WeightSyncServer> start_server(const std::string& on) {
  comm::WeightSyncServerOptions o;
  o.bucket_bytes = 4096;
  o.timeout = milliseconds(20000);
  o.device = on;
  auto s = comm::WeightSyncServer::start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::unique_ptr<comm::WeightSyncClient> connect(const comm::WeightSyncServer& server,
                                                const std::string& on) {
  comm::WeightSyncClientOptions o;
  o.endpoint = server.endpoint();
  o.member_name = "worker-" + on;
  o.timeout = milliseconds(20000);
  o.device = on;
  auto c = comm::WeightSyncClient::connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

void expect_same(const comm::WeightSnapshot& snap, const comm::ReceivedVersion& got,
                 const c10::Device& where) {
  EXPECT_EQ(got.version, snap.manifest.version);
  EXPECT_EQ(got.manifest.digest, snap.manifest.digest);
  ASSERT_EQ(got.tensors.size(), snap.tensors.size());
  for (size_t i = 0; i < snap.tensors.size(); ++i) {
    const at::Tensor& t = got.tensors.at(snap.manifest.tensors[i].name);
    EXPECT_EQ(t.device(), where);
    EXPECT_TRUE(torch::equal(t.cpu(), snap.tensors[i])) << snap.manifest.tensors[i].name;
  }
}

// A member's receive() on a thread of its own, `count` times or until an error.
struct Member {
  std::vector<comm::ReceivedVersion> versions;
  Status error = OkStatus();
  std::atomic<bool> done{false};
  std::atomic<bool> stop{false};
  std::thread thread;

  ~Member() {
    if (thread.joinable()) finish(std::chrono::seconds(0));
  }

  Member(comm::WeightSyncClient* client, int count) {
    thread = std::thread([this, client, count] {
      for (int i = 0; i < count; ++i) {
        auto r = client->receive([this] { return stop.load(); });
        if (!r.ok()) {
          error = r.status();
          break;
        }
        versions.push_back(*std::move(r));
      }
      done = true;
    });
  }
  // Waits up to `limit` for the thread to finish by itself, then stops it.
  bool finish(std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    const bool by_itself = done;
    stop = true;
    thread.join();
    return by_itself;
  }
};

TEST(CudaCommTest, WeightSyncBetweenTwoGpusIsBitIdentical) {
  RELAY_NEED_GPUS(2);
  auto server = start_server(device_name(0));
  ASSERT_NE(server, nullptr);
  auto client = connect(*server, device_name(1));
  ASSERT_NE(client, nullptr);
  std::vector<comm::WeightSnapshot> snaps;
  for (int64_t v = 1; v <= 3; ++v) snaps.push_back(snapshot(v, 10000));  // 40 KB: 10+ buckets
  Member member(client.get(), 3);
  for (const comm::WeightSnapshot& snap : snaps) {
    auto report = server->broadcast(snap);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->members, 1);
  }
  ASSERT_TRUE(member.finish(std::chrono::seconds(30)));
  ASSERT_TRUE(member.error.ok()) << member.error;
  ASSERT_EQ(member.versions.size(), 3u);
  for (size_t i = 0; i < snaps.size(); ++i) expect_same(snaps[i], member.versions[i], device(1));
}

// A trainer and a worker on one GPU (relay run with run.device=cuda and
// services.weight_sync=broadcast on a one-GPU machine): NCCL refuses two
// ranks on one device. Either way the broadcast must end within its timeout,
// without taking the process down, and a refused group must leave both
// sides with Unavailable, from which a worker fetches over gRPC instead.
TEST(CudaCommTest, WeightSyncOnOneGpuWorksOrFailsOverCleanly) {
  RELAY_NEED_GPUS(1);
  auto server = start_server(device_name(0));
  ASSERT_NE(server, nullptr);
  auto client = connect(*server, device_name(0));
  ASSERT_NE(client, nullptr);
  const comm::WeightSnapshot snap = snapshot(1, 5000);
  Member member(client.get(), 1);
  const auto start = std::chrono::steady_clock::now();
  auto report = server->broadcast(snap);
  const bool member_finished = member.finish(std::chrono::seconds(30));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report.ok()) {
    std::printf("one GPU: the group formed; broadcast took %.2f s\n", seconds);
    RecordProperty("one_gpu_group", "formed");
    ASSERT_TRUE(member_finished);
    ASSERT_TRUE(member.error.ok()) << member.error;
    ASSERT_EQ(member.versions.size(), 1u);
    expect_same(snap, member.versions[0], device(0));
  } else {
    std::printf("one GPU: the group was refused after %.2f s: %s\n", seconds,
                std::string(report.status().message()).c_str());
    RecordProperty("one_gpu_group", "refused");
    EXPECT_EQ(report.status().code(), absl::StatusCode::kUnavailable) << report.status();
    EXPECT_TRUE(member_finished) << "the member did not see the broken group";
    EXPECT_EQ(member.error.code(), absl::StatusCode::kUnavailable) << member.error;
  }
  EXPECT_LT(seconds, 45.0);
}

// ---- the data-parallel trainer on NCCL ----

struct RankResult {
  Status status = OkStatus();
  std::vector<trainer::StepMetrics> metrics;
  at::Tensor weights;  // every parameter, flattened, on the CPU
};

at::Tensor flat_cpu(const model::Policy& p) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : p->parameters()) parts.push_back(t.detach().reshape({-1}).cpu());
  return torch::cat(parts);
}

RankResult train(model::Policy policy, const std::vector<rollout::TrajectoryGroup>& groups,
                 trainer::DataParallel dp, trainer::Sharding sharding = trainer::Sharding::kNone) {
  RankResult out;
  trainer::TrainerOptions o = step_options();
  o.mini_batches = 2;
  o.entropy.coef = 0.01;
  o.sharding = sharding;
  auto t = trainer::Trainer::create(policy, o, 0, nullptr, std::move(dp));
  if (!t.ok()) {
    out.status = t.status();
    return out;
  }
  for (const char* call : {"sft", "step", "step"}) {
    auto m = std::string(call) == "sft" ? (*t)->sft_step(groups) : (*t)->step(groups);
    if (!m.ok()) {
      out.status = m.status();
      return out;
    }
    out.metrics.push_back(*m);
  }
  // The trainer's weights: the module, or with sharding: full rank 0's host
  // copy (the other ranks' modules hold nothing).
  out.weights = flat_cpu((*t)->policy());
  return out;
}

// Two ranks on GPUs 0 and 1 train on copies of `initial` with `sharding`;
// they must end with the same weights, and with the update one rank makes.
void expect_two_gpus_match_one_rank(trainer::Sharding sharding, const char* what) {
  model::Policy initial = make_policy(3, device(0));
  const auto groups = sample_groups(initial, std::nullopt);
  const RankResult single = train(model::clone_policy(*initial), groups, {});
  ASSERT_TRUE(single.status.ok()) << single.status;
  const int port = free_port();
  std::vector<RankResult> ranks(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      comm::TrainerGroupOptions go;
      go.rank.rank = r;
      go.rank.world_size = 2;
      go.rank.local_rank = r;
      go.rank.host = "127.0.0.1";
      go.rank.port = port;
      go.device = device_name(r);
      go.timeout = std::chrono::seconds(60);
      auto group = comm::join_trainer_group(go);
      if (!group.ok()) {
        ranks[r].status = group.status();
        return;
      }
      model::Policy policy = model::clone_policy(*initial);
      policy->to(device(r));
      trainer::DataParallel dp;
      dp.group = *group;
      dp.bucket_bytes = 4096;  // many buckets
      ranks[r] = train(policy, groups, dp, sharding);
    });
  }
  for (auto& t : threads) t.join();
  for (const RankResult& r : ranks) ASSERT_TRUE(r.status.ok()) << r.status;
  if (sharding == trainer::Sharding::kFull) {
    EXPECT_EQ(ranks[1].weights.numel(), 0) << "rank 1 kept whole weights";
  } else {
    EXPECT_TRUE(torch::equal(ranks[0].weights, ranks[1].weights)) << "the ranks diverged";
  }
  const at::Tensor before = flat_cpu(initial);
  const double scale = (single.weights - before).abs().max().item<double>();
  ASSERT_GT(scale, 0) << "the weights did not change";
  const double diff = max_abs_diff(ranks[0].weights - before, single.weights - before);
  std::printf("two GPUs (%s) vs one: max |update diff| %.3g of %.3g\n", what, diff, scale);
  EXPECT_LT(diff, 1e-4 * scale);
}

TEST(CudaCommTest, DataParallelTrainerOnTwoGpusMatchesOneRank) {
  RELAY_NEED_GPUS(2);
  expect_two_gpus_match_one_rank(trainer::Sharding::kNone, "sharding none");
}

// trainer.sharding: optimizer under NCCL: its reduce-scatter and the
// all-gather of the updated ranges.
TEST(CudaCommTest, ShardedOptimizerOnTwoGpusMatchesOneRank) {
  RELAY_NEED_GPUS(2);
  expect_two_gpus_match_one_rank(trainer::Sharding::kOptimizer, "sharding optimizer");
}

// trainer.sharding: full under NCCL: each layer all-gathered in its dtype
// on the GPU, its gradients reduce-scattered by NCCL, rank 0's host copy.
TEST(CudaCommTest, FullShardingOnTwoGpusMatchesOneRank) {
  RELAY_NEED_GPUS(2);
  expect_two_gpus_match_one_rank(trainer::Sharding::kFull, "sharding full");
}

}  // namespace
}  // namespace relay
