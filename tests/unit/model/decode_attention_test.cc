// paged_decode_attention (src/model/decode_attention.h): attention of one
// new token per row, read from the cache's storage rows in place, equals
// grouped_attention over the gathered keys and values.

#include "model/decode_attention.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "model/cpu_features.h"
#include "model/kernel_pool.h"

#include "relay/model/layers.h"

namespace relay::model {
namespace {

struct Case {
  at::Tensor q, keys, values, read, mask;
};

// B rows over a storage of `rows` positions: row b sees its first
// valid[b] positions, each at a random storage row; the rest point at row 0
// and are masked out.
Case make_case(int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t S, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t rows = 64;
  Case c;
  c.q = torch::randn({B, H, 1, D});
  c.keys = torch::randn({rows, KVH, D});
  c.values = torch::randn({rows, KVH, D});
  c.read = torch::randint(1, rows, {B, S}, torch::kInt64);
  c.mask = torch::zeros({B, 1, 1, S}, torch::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t valid = 1 + (b * 5) % S;
    c.mask[b][0][0].narrow(0, 0, valid).fill_(true);
    if (valid < S) c.read[b].narrow(0, valid, S - valid).fill_(0);
  }
  return c;
}

at::Tensor reference(const Case& c) {
  const int64_t B = c.read.size(0), S = c.read.size(1);
  const int64_t KVH = c.keys.size(1), D = c.keys.size(2);
  auto gather = [&](const at::Tensor& storage) {
    return storage.index_select(0, c.read.view(-1)).view({B, S, KVH, D}).transpose(1, 2);
  };
  return grouped_attention(c.q, gather(c.keys), gather(c.values), c.mask);
}

TEST(DecodeAttentionTest, ReadsTheCacheInPlaceAsTheGatheredPathComputes) {
  if (!has_decode_attention_kernel()) GTEST_SKIP() << "no AVX2/FMA on this CPU: the kernel is off";
  torch::NoGradGuard no_grad;
  // Grouped queries (3 and 7 heads per kv head, as Qwen2.5-0.5B's 14/2),
  // one kv head per query head, a long context.
  for (const auto& [B, H, KVH, D, S] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{3, 6, 2, 16, 7},
        {2, 14, 2, 64, 33},
        {4, 4, 4, 8, 1},
        {1, 12, 4, 64, 300}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B " << B << " H " << H << " KVH " << KVH << " D " << D << " S " << S);
    const Case c = make_case(B, H, KVH, D, S, static_cast<uint64_t>(B * 100 + S));
    const at::Tensor got = paged_decode_attention(c.q, c.keys, c.values, c.read, c.mask);
    ASSERT_TRUE(got.defined());
    const at::Tensor want = reference(c);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>());
  }
}

// A bf16 or fp16 cache (rollout.dtype): keys and values widened as they are
// read, the sums in fp32, the output rounded once. Against the fp32 result
// on the same (rounded) values it is within a rounding step of the output
// precision, and no further from it than the general path in that
// precision, which rounds scores and probabilities on the way.
TEST(DecodeAttentionTest, ReadsBf16AndFp16CachesInFp32) {
  if (!has_decode_attention_kernel()) GTEST_SKIP() << "no AVX2/FMA on this CPU: the kernel is off";
  torch::NoGradGuard no_grad;
  std::vector<std::pair<c10::ScalarType, double>> dtypes = {{torch::kBFloat16, 1.0 / 256}};
  if (cpu_has_f16c()) dtypes.push_back({torch::kHalf, 1.0 / 2048});
  for (const auto& [dtype, step] : dtypes) {
    for (const auto& [B, H, KVH, D, S] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{3, 6, 2, 16, 7},
          {2, 14, 2, 64, 33},
          {1, 12, 4, 64, 300}}) {
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " B " << B << " H " << H
                                        << " KVH " << KVH << " D " << D << " S " << S);
      Case c = make_case(B, H, KVH, D, S, static_cast<uint64_t>(B * 100 + S));
      c.q = c.q.to(dtype);
      c.keys = c.keys.to(dtype);
      c.values = c.values.to(dtype);
      const at::Tensor got = paged_decode_attention(c.q, c.keys, c.values, c.read, c.mask);
      ASSERT_TRUE(got.defined());
      ASSERT_EQ(got.scalar_type(), dtype);
      Case wide = c;
      wide.q = c.q.to(torch::kFloat32);
      wide.keys = c.keys.to(torch::kFloat32);
      wide.values = c.values.to(torch::kFloat32);
      const at::Tensor exact = reference(wide);
      const double scale = exact.abs().max().item<double>();
      const double err = (got.to(torch::kFloat32) - exact).abs().max().item<double>();
      EXPECT_LE(err, step * scale);
      // (LibTorch 1.13 has no fp16 product on the CPU: no general path to
      // compare with there.)
      at::Tensor general;
      try {
        general = reference(c).to(torch::kFloat32);
      } catch (const c10::Error&) {
        ASSERT_EQ(dtype, torch::kHalf);
        continue;
      }
      EXPECT_LE(err, (general - exact).abs().max().item<double>())
          << "further from fp32 than the general path";
    }
  }
}

// Tasks split over the kernel pool or the intra-op pool, or run on one
// thread: the same bits, and each row's as when it is alone.
TEST(DecodeAttentionTest, GivesTheSameBitsOnAnyNumberOfThreads) {
  if (!has_decode_attention_kernel()) GTEST_SKIP() << "no AVX2/FMA on this CPU: the kernel is off";
  torch::NoGradGuard no_grad;
  const int threads = at::get_num_threads();
  const int kernel_threads = kernel_pool()->threads();
  const Case c = make_case(5, 12, 4, 64, 40, 7);
  at::Tensor first;
  for (const auto& [intra_op, pool] :
       std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}, {1, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << "intra-op threads " << intra_op << ", kernel-pool threads " << pool);
    at::set_num_threads(intra_op);
    set_kernel_threads(pool);
    const at::Tensor got = paged_decode_attention(c.q, c.keys, c.values, c.read, c.mask);
    ASSERT_TRUE(got.defined());
    if (!first.defined()) first = got;
    EXPECT_TRUE(torch::equal(got, first));
    const at::Tensor alone = paged_decode_attention(c.q.narrow(0, 3, 1), c.keys, c.values,
                                                    c.read.narrow(0, 3, 1), c.mask.narrow(0, 3, 1));
    EXPECT_TRUE(torch::equal(alone, first.narrow(0, 3, 1)));
  }
  at::set_num_threads(threads);
  set_kernel_threads(kernel_threads);
}

TEST(DecodeAttentionTest, DeclinesWhatItDoesNotCover) {
  torch::NoGradGuard no_grad;
  const Case c = make_case(2, 4, 2, 16, 5, 1);
  // Two new tokens per row, another dtype, D not a multiple of 8: the
  // general path's business.
  EXPECT_FALSE(paged_decode_attention(torch::randn({2, 4, 2, 16}), c.keys, c.values, c.read, c.mask)
                   .defined());
  EXPECT_FALSE(
      paged_decode_attention(c.q.to(torch::kFloat64), c.keys, c.values, c.read, c.mask).defined());
  // A query in another precision than the cache's.
  EXPECT_FALSE(
      paged_decode_attention(c.q.to(torch::kBFloat16), c.keys, c.values, c.read, c.mask).defined());
  const Case odd = make_case(2, 4, 2, 12, 5, 2);
  EXPECT_FALSE(paged_decode_attention(odd.q, odd.keys, odd.values, odd.read, odd.mask).defined());
}

}  // namespace
}  // namespace relay::model
