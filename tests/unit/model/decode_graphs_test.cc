// The fixed-shape decode step (decode_graphs.h) on the CPU, where it runs
// eagerly: the same logits and the same cache as PolicyImpl::extend, with
// padded rows and padded key ranges that never leak into real sequences.
// Capture and replay are covered where a GPU is (tests/unit/cuda).

#include "relay/model/decode_graphs.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <string>
#include <vector>

#include "relay/model/kv_cache.h"
#include "relay/model/policy.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

using relay::testing::AllClose;
using relay::testing::TinyConfig;
using Seq = std::vector<int64_t>;

// Padded keys only add masked terms, which change the order of the sums.
constexpr double kTol = 1e-5;

class DecodeGraphsTest : public ::testing::Test {
 protected:
  void Build(const PolicyConfig& config) {
    torch::manual_seed(0);
    policy_ = Policy(config);
    init_weights(*policy_, 5);
    policy_->eval();
  }
  void SetUp() override { Build(TinyConfig("qwen2")); }

  KVCache MakeCache(int64_t slots = 4, int64_t max_len = 64) {
    KVCacheOptions o;
    o.num_slots = slots;
    o.max_seq_len = max_len;
    o.block_size = 4;
    return KVCache(policy_->config(), o);
  }

  // Prefills slot s with prompts[s] (the whole prompt, as the engine's
  // context pass and first decode step would).
  void Prefill(KVCache& cache, const std::vector<Seq>& prompts) {
    int64_t T = 0;
    for (const Seq& p : prompts) T = std::max<int64_t>(T, p.size());
    at::Tensor ids = torch::zeros({static_cast<int64_t>(prompts.size()), T}, torch::kInt64);
    std::vector<int64_t> lens, slots;
    for (size_t b = 0; b < prompts.size(); ++b) {
      for (size_t t = 0; t < prompts[b].size(); ++t) ids[b][t] = prompts[b][t];
      lens.push_back(static_cast<int64_t>(prompts[b].size()));
      slots.push_back(static_cast<int64_t>(b));
    }
    policy_->extend(ids, torch::tensor(lens), torch::tensor(slots), cache, ExtendLogits::kNone);
  }

  at::Tensor Extend(KVCache& cache, const Seq& ids, const Seq& slots, int64_t vocab_limit = 0) {
    ExtendOptions o;
    o.vocab_limit = vocab_limit;
    return policy_->extend(torch::tensor(ids).view({-1, 1}),
                           torch::ones({static_cast<int64_t>(ids.size())}, torch::kInt64),
                           torch::tensor(slots), cache, o);
  }

  // Every position of `slot` in both caches holds the same keys and values.
  static void ExpectSameSlot(KVCache& a, KVCache& b, int64_t slot) {
    ASSERT_EQ(a.length(slot), b.length(slot));
    const int64_t n = a.length(slot);
    std::vector<int64_t> ra(n), rb(n);
    a.storage_rows(slot, n, ra.data());
    b.storage_rows(slot, n, rb.data());
    for (int64_t l = 0; l < a.num_layers(); ++l) {
      EXPECT_TRUE(AllClose(a.keys(l).index_select(0, torch::tensor(ra)),
                           b.keys(l).index_select(0, torch::tensor(rb)), kTol, 0))
          << "layer " << l << " slot " << slot;
      EXPECT_TRUE(AllClose(a.values(l).index_select(0, torch::tensor(ra)),
                           b.values(l).index_select(0, torch::tensor(rb)), kTol, 0))
          << "layer " << l << " slot " << slot;
    }
  }

  torch::NoGradGuard no_grad_;
  Policy policy_{nullptr};
};

TEST(DecodeGraphBucketsTest, PadBatchesAndKeyRangesToTheirBuckets) {
  DecodeGraphs g;
  EXPECT_EQ(g.batch_bucket(1), 1);
  EXPECT_EQ(g.batch_bucket(3), 4);
  EXPECT_EQ(g.batch_bucket(33), 48);
  EXPECT_EQ(g.batch_bucket(256), 256);
  EXPECT_EQ(g.batch_bucket(257), 0);
  EXPECT_EQ(g.context_bucket(1, 4096), 64);
  EXPECT_EQ(g.context_bucket(64, 4096), 64);
  EXPECT_EQ(g.context_bucket(65, 4096), 128);
  EXPECT_EQ(g.context_bucket(1000, 4096), 1024);
  EXPECT_EQ(g.context_bucket(1025, 4096), 2048);
  EXPECT_EQ(g.context_bucket(2049, 4096), 3072);
  EXPECT_EQ(g.context_bucket(100, 100), 100);  // never past the cache
  EXPECT_EQ(g.context_bucket(101, 100), 0);
  EXPECT_EQ(g.context_bucket(0, 100), 0);
}

TEST(DecodeGraphBucketsTest, RefusesBadOptions) {
  DecodeGraphOptions o;
  o.batch_buckets = {8, 4};
  EXPECT_THROW(DecodeGraphs{o}, c10::Error);
  o.batch_buckets = {};
  EXPECT_THROW(DecodeGraphs{o}, c10::Error);
}

// Three sequences of different lengths decode 20 steps in a batch bucket of
// 4 (one padding row), crossing key buckets 4 -> 8 -> 16 -> 32; one stops
// halfway and the batch shrinks to 2. Each step's logits, and every cached
// key and value, equal extend()'s; the zero row stays zero.
TEST_F(DecodeGraphsTest, StepsMatchExtendAcrossBucketsAndAShrinkingBatch) {
  DecodeGraphOptions o;
  o.batch_buckets = {2, 4};
  o.min_context = 4;
  o.context_step = 16;
  DecodeGraphs graphs(o);
  EXPECT_FALSE(graphs.captures_on(torch::kCPU));
  KVCache fixed = MakeCache(), eager = MakeCache();
  const std::vector<Seq> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10}, {11}};
  Prefill(fixed, prompts);
  Prefill(eager, prompts);

  Seq slots = {0, 1, 2};
  Seq next = {12, 13, 14};
  for (int step = 0; step < 20; ++step) {
    if (step == 10) {  // slot 1 is done
      slots = {0, 2};
      next = {next[0], next[2]};
    }
    const at::Tensor got = graphs.step(*policy_, fixed, next, slots, /*vocab_limit=*/0);
    const at::Tensor want = Extend(eager, next, slots);
    ASSERT_TRUE(got.defined()) << "step " << step;
    ASSERT_EQ(got.sizes(), want.sizes());
    ASSERT_TRUE(AllClose(got, want, kTol, 0)) << "step " << step;
    for (size_t b = 0; b < next.size(); ++b) next[b] = want[b].argmax().item<int64_t>();
  }
  for (int64_t s = 0; s < 3; ++s) ExpectSameSlot(fixed, eager, s);
  for (int64_t l = 0; l < fixed.num_layers(); ++l) {
    EXPECT_EQ(fixed.keys(l)[KVCache::kZeroRow].abs().max().item<float>(), 0.0f);
    EXPECT_EQ(fixed.values(l)[KVCache::kZeroRow].abs().max().item<float>(), 0.0f);
  }
  EXPECT_EQ(graphs.stats().steps, 20);
  EXPECT_EQ(graphs.stats().replays, 0);  // no graph on the CPU
  EXPECT_EQ(graphs.stats().declined, 0);
  // (4, 8), (4, 16), (4, 32) for the three rows; (2, 16), (2, 32) for two.
  EXPECT_EQ(graphs.buckets(), 5);
}

TEST_F(DecodeGraphsTest, VocabLimitAndBf16WeightsMatchExtend) {
  policy_->to(torch::kBFloat16);
  KVCacheOptions co;
  co.num_slots = 2;
  co.max_seq_len = 32;
  co.dtype = torch::kBFloat16;
  KVCache fixed(policy_->config(), co), eager(policy_->config(), co);
  Prefill(fixed, {{1, 2, 3, 4}, {5, 6}});
  Prefill(eager, {{1, 2, 3, 4}, {5, 6}});
  DecodeGraphs graphs;
  for (int step = 0; step < 4; ++step) {
    const at::Tensor got = graphs.step(*policy_, fixed, {7, 8}, {0, 1}, /*vocab_limit=*/30);
    const at::Tensor want = Extend(eager, {7, 8}, {0, 1}, /*vocab_limit=*/30);
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(got.size(1), 30);
    // bf16 activations: each side rounds at the same points.
    ASSERT_TRUE(AllClose(got.to(torch::kFloat32), want.to(torch::kFloat32), 2e-2, 0))
        << "step " << step;
  }
}

TEST_F(DecodeGraphsTest, DeclinesABatchPastItsBucketsAndLeavesTheCache) {
  DecodeGraphOptions o;
  o.batch_buckets = {1, 2};
  DecodeGraphs graphs(o);
  KVCache cache = MakeCache();
  Prefill(cache, {{1, 2}, {3}, {4, 5, 6}});
  EXPECT_FALSE(graphs.step(*policy_, cache, {7, 8, 9}, {0, 1, 2}, 0).defined());
  EXPECT_EQ(cache.length(0), 2);
  EXPECT_EQ(cache.length(2), 3);
  EXPECT_EQ(graphs.stats().declined, 1);
  EXPECT_EQ(graphs.stats().steps, 0);
}

// Dynamic NTK RoPE depends on the length past max_position_embeddings
// (64 here): a key range padded past it would rotate with other
// frequencies than extend() uses, so it is capped there, and a step
// reaching past it is left to extend().
TEST_F(DecodeGraphsTest, DynamicRopeKeepsTheKeyRangeWithinMaxPositions) {
  PolicyConfig c = TinyConfig("llama");
  c.rope_scaling.rope_type = "dynamic";
  c.rope_scaling.factor = 2.0;
  Build(c);
  DecodeGraphOptions o;
  o.min_context = 128;  // would pad every step to 128 keys
  DecodeGraphs graphs(o);
  KVCache fixed = MakeCache(1, 80), eager = MakeCache(1, 80);
  Seq prompt(60);
  for (int64_t i = 0; i < 60; ++i) prompt[i] = i % 37;
  Prefill(fixed, {prompt});
  Prefill(eager, {prompt});
  int64_t token = 3;
  for (int step = 0; step < 8; ++step) {  // the cache reaches 61 .. 68
    const at::Tensor want = Extend(eager, {token}, {0});
    const at::Tensor got = graphs.step(*policy_, fixed, {token}, {0}, 0);
    if (fixed.length(0) < eager.length(0)) {  // declined: run it as the engine would
      EXPECT_GT(eager.length(0), 64) << "step " << step;
      Extend(fixed, {token}, {0});
    } else {
      ASSERT_TRUE(got.defined());
      EXPECT_LE(eager.length(0), 64);
      ASSERT_TRUE(AllClose(got, want, kTol, 0)) << "step " << step;
    }
    token = want[0].argmax().item<int64_t>();
  }
  EXPECT_EQ(graphs.stats().steps, 4);  // lengths 61 .. 64
  EXPECT_EQ(graphs.stats().declined, 4);
}

// Past max_buckets shapes the least recently used one goes: here batch
// buckets 1, 2, 4 in turn with a cap of 2, then 1 again (its buffers made
// anew), each step still what extend() computes.
TEST_F(DecodeGraphsTest, KeepsAtMostMaxBucketsDroppingTheLeastRecentlyUsed) {
  DecodeGraphOptions o;
  o.batch_buckets = {1, 2, 4};
  o.max_buckets = 2;
  DecodeGraphs graphs(o);
  KVCache fixed = MakeCache(), eager = MakeCache();
  Prefill(fixed, {{1}, {2}, {3}});
  Prefill(eager, {{1}, {2}, {3}});
  const std::vector<Seq> batches = {{0}, {0, 1}, {0, 1, 2}, {0}, {0, 1, 2}};
  for (size_t i = 0; i < batches.size(); ++i) {
    const Seq& slots = batches[i];
    const Seq ids(slots.size(), 5);
    const at::Tensor got = graphs.step(*policy_, fixed, ids, slots, 0);
    const at::Tensor want = Extend(eager, ids, slots);
    ASSERT_TRUE(got.defined());
    ASSERT_TRUE(AllClose(got, want, kTol, 0)) << "step " << i;
    EXPECT_LE(graphs.buckets(), 2);
  }
  // (1) (2) (4: drops 1) (1: drops 2) (4: kept, used at step 2)
  EXPECT_EQ(graphs.stats().evicted, 2);
  EXPECT_EQ(graphs.buckets(), 2);
  o.max_buckets = 0;
  EXPECT_THROW(DecodeGraphs{o}, c10::Error);
}

TEST_F(DecodeGraphsTest, AnotherCacheDropsTheBuffersOfTheFirst) {
  DecodeGraphs graphs;
  KVCache a = MakeCache(), b = MakeCache();
  Prefill(a, {{1, 2}});
  Prefill(b, {{1, 2}});
  ASSERT_TRUE(graphs.step(*policy_, a, {3}, {0}, 0).defined());
  EXPECT_EQ(graphs.stats().resets, 0);
  ASSERT_TRUE(graphs.step(*policy_, b, {3}, {0}, 0).defined());
  EXPECT_EQ(graphs.stats().resets, 1);
  EXPECT_EQ(graphs.buckets(), 1);
}

TEST_F(DecodeGraphsTest, SupportsDenseModelsWithScratchRowsOnly) {
  std::string why;
  EXPECT_TRUE(DecodeGraphs::supports(*policy_, 16, &why)) << why;
  EXPECT_FALSE(DecodeGraphs::supports(*policy_, 1, &why));
  EXPECT_NE(why.find("1 position"), std::string::npos) << why;
  PolicyConfig moe = TinyConfig("qwen3_moe");
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 16;
  Build(moe);
  EXPECT_FALSE(DecodeGraphs::supports(*policy_, 16, &why));
  EXPECT_NE(why.find("MoE"), std::string::npos) << why;
}

}  // namespace
}  // namespace relay::model
