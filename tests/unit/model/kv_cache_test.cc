#include "relay/model/kv_cache.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <vector>

#include "relay/model/policy.h"
#include "testing/tensor_testing.h"

namespace relay::model {
namespace {

using relay::testing::AllClose;
using relay::testing::TinyConfig;
using Seq = std::vector<int64_t>;

constexpr double kTol = 1e-4;  // the bound for fp32

class KVCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    policy_ = Policy(TinyConfig());
    init_weights(*policy_, 21);
    policy_->eval();
  }

  // Logits at the last position of `seq` from the full (uncached) forward.
  at::Tensor FullLast(const Seq& seq) {
    at::Tensor ids = torch::tensor(seq, torch::kInt64).view({1, -1});
    return policy_->forward(ids)[0][static_cast<int64_t>(seq.size()) - 1];
  }

  // One extend() call: row b appends chunks[b] to slot slots[b].
  at::Tensor Extend(KVCache& cache, const std::vector<Seq>& chunks, const Seq& slots,
                    ExtendLogits which = ExtendLogits::kLast) {
    int64_t T = 0;
    for (const Seq& c : chunks) T = std::max<int64_t>(T, c.size());
    at::Tensor ids = torch::zeros({static_cast<int64_t>(chunks.size()), T}, torch::kInt64);
    std::vector<int64_t> lens;
    for (size_t b = 0; b < chunks.size(); ++b) {
      for (size_t t = 0; t < chunks[b].size(); ++t) ids[b][t] = chunks[b][t];
      lens.push_back(static_cast<int64_t>(chunks[b].size()));
    }
    return policy_->extend(ids, torch::tensor(lens), torch::tensor(slots), cache, which);
  }

  torch::NoGradGuard no_grad_;
  Policy policy_{nullptr};
};

// Prompts of different lengths decode together; each step's logits equal the
// full forward over the whole sequence so far. Halfway, slot 1 finishes and
// is refilled with a new prompt in the same extend() call that decodes the
// other slots (continuous batching).
TEST_F(KVCacheTest, DecodeReproducesFullForwardIncludingRefilledSlot) {
  KVCache cache(policy_->config(), /*num_slots=*/3, /*max_seq_len=*/32, torch::kFloat32,
                torch::kCPU);
  std::vector<Seq> seqs = {{5, 3, 9}, {1, 2, 3, 4, 5, 6}, {7}};
  Seq slots = {0, 1, 2};
  at::Tensor logits = Extend(cache, seqs, slots);
  for (int b = 0; b < 3; ++b) EXPECT_TRUE(AllClose(logits[b], FullLast(seqs[b]), kTol)) << b;

  double worst = 0.0;
  for (int step = 0; step < 8; ++step) {
    std::vector<Seq> chunks;
    for (int b = 0; b < 3; ++b) {
      if (step == 4 && b == 1) {
        cache.reset(1);
        seqs[1] = {8, 8, 2, 30};  // a new sequence takes the freed slot
        chunks.push_back(seqs[1]);
        continue;
      }
      const int64_t next = logits[b].argmax().item<int64_t>();
      seqs[b].push_back(next);
      chunks.push_back({next});
    }
    logits = Extend(cache, chunks, slots);
    for (int b = 0; b < 3; ++b) {
      at::Tensor full = FullLast(seqs[b]);
      worst = std::max(worst, (logits[b] - full).abs().max().item<double>());
      ASSERT_TRUE(AllClose(logits[b], full, kTol)) << "step " << step << " row " << b;
      EXPECT_EQ(cache.length(b), static_cast<int64_t>(seqs[b].size()));
    }
  }
  RecordProperty("max_abs_diff", std::to_string(worst));
}

// Re-prefill (used when weights change mid-generation): one extend() over a
// whole sequence returns every position's logits, equal to the full forward.
TEST_F(KVCacheTest, ExtendAllLogitsEqualsForward) {
  KVCache cache(policy_->config(), 2, 16, torch::kFloat32, torch::kCPU);
  const std::vector<Seq> seqs = {{4, 9, 2, 2, 17}, {3, 1}};
  at::Tensor all = Extend(cache, seqs, {1, 0}, ExtendLogits::kAll);
  ASSERT_EQ(all.sizes(), (at::IntArrayRef{2, 5, 37}));
  for (int b = 0; b < 2; ++b) {
    const int64_t n = seqs[b].size();
    at::Tensor full = policy_->forward(torch::tensor(seqs[b]).view({1, -1}))[0];
    EXPECT_TRUE(AllClose(all[b].narrow(0, 0, n), full, kTol)) << b;
  }
}

// Prefill a prompt once and share it among K samples by copying the slot.
TEST_F(KVCacheTest, CopiedSlotDecodesLikeItsOwnPrefill) {
  KVCache cache(policy_->config(), 3, 16, torch::kFloat32, torch::kCPU);
  const Seq prompt = {6, 1, 8, 0, 3};
  Extend(cache, {prompt}, {0});
  cache.copy_slot(0, 1);
  cache.copy_slot(0, 2);
  EXPECT_EQ(cache.length(2), 5);
  const Seq next = {11, 12, 13};
  at::Tensor logits = Extend(cache, {{next[0]}, {next[1]}, {next[2]}}, {0, 1, 2});
  for (int b = 0; b < 3; ++b) {
    Seq seq = prompt;
    seq.push_back(next[b]);
    EXPECT_TRUE(AllClose(logits[b], FullLast(seq), kTol)) << b;
  }
}

// A prompt's context without its last token (what the engine shares among
// a group's samples), filled with kNone, then each sample runs that last
// token itself: the same logits as a full prefill.
TEST_F(KVCacheTest, CopiedPrefixThenLastTokenMatchesFullPrefill) {
  KVCache cache(policy_->config(), 3, 16, torch::kFloat32, torch::kCPU);
  const Seq prompt = {6, 1, 8, 0, 3};
  const Seq context(prompt.begin(), prompt.end() - 1);
  at::Tensor none = Extend(cache, {context, {2, 2, 2, 2, 2, 2}}, {0, 1}, ExtendLogits::kNone);
  EXPECT_FALSE(none.defined());
  EXPECT_EQ(cache.length(0), 4);
  cache.copy_prefix(0, 2, 4);
  cache.copy_prefix(1, 1, 2);  // in place: truncates
  EXPECT_EQ(cache.length(2), 4);
  EXPECT_EQ(cache.length(1), 2);
  EXPECT_THROW(cache.copy_prefix(0, 1, 5), c10::Error);
  at::Tensor logits = Extend(cache, {{prompt.back()}, {prompt.back()}}, {0, 2});
  EXPECT_TRUE(AllClose(logits[0], FullLast(prompt), kTol));
  EXPECT_TRUE(AllClose(logits[1], FullLast(prompt), kTol));
  at::Tensor truncated = Extend(cache, {{9}}, {1});
  EXPECT_TRUE(AllClose(truncated[0], FullLast({2, 2, 9}), kTol));
}

TEST_F(KVCacheTest, OverflowThrowsAndLeavesLengthsUnchanged) {
  KVCache cache(policy_->config(), 2, 4, torch::kFloat32, torch::kCPU);
  Extend(cache, {{1, 2, 3}, {4}}, {0, 1});
  EXPECT_THROW(Extend(cache, {{5, 6}, {7}}, {0, 1}), c10::Error);
  EXPECT_EQ(cache.length(0), 3);
  EXPECT_EQ(cache.length(1), 1);
}

TEST_F(KVCacheTest, RejectsDuplicateAndOutOfRangeSlots) {
  KVCache cache(policy_->config(), 2, 8, torch::kFloat32, torch::kCPU);
  EXPECT_THROW(Extend(cache, {{1}, {2}}, {0, 0}), c10::Error);
  EXPECT_THROW(Extend(cache, {{1}}, {2}), c10::Error);
  EXPECT_THROW(cache.length(-1), c10::Error);
  EXPECT_EQ(cache.length(0), 0);
}

TEST_F(KVCacheTest, BytesCountsEveryLayer) {
  KVCache cache(policy_->config(), 3, 10, torch::kFloat32, torch::kCPU);
  // Blocks of 16: one per slot, plus the zero block. layers 2 x (k, v) x
  // blocks 4 x 16 positions x kv_heads 2 x head_dim 8 x 4 bytes.
  EXPECT_EQ(cache.num_blocks(), 3);
  EXPECT_EQ(cache.bytes(), 2 * 2 * 4 * 16 * 2 * 8 * 4);
  EXPECT_EQ(cache.bytes_per_position(), 2 * 2 * 2 * 8 * 4);
}

KVCacheOptions Paged(int64_t slots, int64_t max_len, int64_t block, int64_t blocks) {
  KVCacheOptions o;
  o.num_slots = slots;
  o.max_seq_len = max_len;
  o.block_size = block;
  o.num_blocks = blocks;
  return o;
}

// Blocks are taken as positions are first written, whatever the slots'
// capacity, and come back when a slot is released.
TEST_F(KVCacheTest, BlocksFollowWhatSequencesHold) {
  KVCache cache(policy_->config(), Paged(4, 64, 4, 100));
  EXPECT_EQ(cache.blocks_in_use(), 0);
  Extend(cache, {{1, 2, 3, 4, 5}, {6}}, {0, 3});
  EXPECT_EQ(cache.blocks_in_use(), 2 + 1);  // 5 positions = 2 blocks of 4; 1 position = 1
  Extend(cache, {{7, 8, 9}}, {0});
  EXPECT_EQ(cache.blocks_in_use(), 2 + 1);  // 8 positions still fit 2 blocks
  Extend(cache, {{10}}, {0});
  EXPECT_EQ(cache.blocks_in_use(), 3 + 1);
  cache.release(0);
  EXPECT_EQ(cache.blocks_in_use(), 1);
  EXPECT_EQ(cache.peak_blocks_in_use(), 4);
}

// K samples of one prompt hold its full blocks once; only the partial last
// block is copied, and a shared block is copied before it is written.
TEST_F(KVCacheTest, PrefixBlocksAreSharedAndCopiedOnWrite) {
  KVCache cache(policy_->config(), Paged(4, 32, 4, 100));
  const Seq prompt = {6, 1, 8, 0, 3, 9, 9, 4, 2, 5};  // 10 positions: 2 full blocks + 2
  Extend(cache, {prompt}, {0});
  EXPECT_EQ(cache.blocks_in_use(), 3);
  for (int64_t s = 1; s < 4; ++s) cache.copy_prefix(0, s, 10);
  EXPECT_EQ(cache.blocks_in_use(), 3 + 3);  // one partial copy per sample
  // Each sample decodes its own token; every one matches its full forward.
  at::Tensor logits = Extend(cache, {{11}, {12}, {13}, {14}}, {0, 1, 2, 3});
  for (int b = 0; b < 4; ++b) {
    Seq seq = prompt;
    seq.push_back(11 + b);
    EXPECT_TRUE(AllClose(logits[b], FullLast(seq), kTol)) << b;
  }
  // Truncate slot 1 into a shared full block (position 6 of block 1), then
  // write there: slot 1 gets its own copy, and slot 0 is untouched.
  cache.copy_prefix(1, 1, 6);
  at::Tensor rewritten = Extend(cache, {{20, 21}}, {1});
  Seq branch(prompt.begin(), prompt.begin() + 6);
  branch.insert(branch.end(), {20, 21});
  EXPECT_TRUE(AllClose(rewritten[0], FullLast(branch), kTol));
  Seq main = prompt;
  main.insert(main.end(), {11, 30});
  at::Tensor after = Extend(cache, {{30}}, {0});
  EXPECT_TRUE(AllClose(after[0], FullLast(main), kTol));
}

TEST_F(KVCacheTest, ReservationsPromiseRoomAndRefuseWhatIsPromised) {
  KVCache cache(policy_->config(), Paged(3, 32, 4, 10));
  EXPECT_EQ(cache.available_blocks(), 10);
  EXPECT_TRUE(cache.reserve(0, 24));  // 6 blocks
  EXPECT_EQ(cache.available_blocks(), 4);
  EXPECT_FALSE(cache.reserve(1, 20));  // 5 > 4: refused, nothing changes
  EXPECT_EQ(cache.available_blocks(), 4);
  EXPECT_TRUE(cache.reserve(1, 16));
  EXPECT_EQ(cache.available_blocks(), 0);
  // Slot 2 has no reservation and nothing is left to take.
  EXPECT_THROW(Extend(cache, {{1}}, {2}), c10::Error);
  EXPECT_EQ(cache.length(2), 0);
  // Slot 0 grows within its promise; what it holds stays promised to it.
  Extend(cache, {Seq(9, 3)}, {0});
  EXPECT_EQ(cache.blocks_in_use(), 3);
  EXPECT_EQ(cache.available_blocks(), 0);
  cache.release(0);
  EXPECT_EQ(cache.available_blocks(), 6);
  EXPECT_THROW(cache.reserve(0, 33), c10::Error);  // beyond max_seq_len: a caller bug
}

TEST_F(KVCacheTest, ResetKeepsTheReservationReleaseDropsIt) {
  KVCache cache(policy_->config(), Paged(2, 16, 4, 4));
  ASSERT_TRUE(cache.reserve(0, 16));
  Extend(cache, {Seq(10, 2)}, {0});
  cache.reset(0);  // a re-prefill after a weight update keeps its room
  EXPECT_EQ(cache.available_blocks(), 0);
  EXPECT_FALSE(cache.reserve(1, 4));
  cache.release(0);
  EXPECT_TRUE(cache.reserve(1, 16));
}

}  // namespace
}  // namespace relay::model
