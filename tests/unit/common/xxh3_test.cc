// relay's XXH3 (AVX2 build where the CPU has it) against libxxhash itself.

#include "relay/common/xxh3.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace relay {
namespace {

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Every size class of XXH3's code paths: empty, 1-3, 4-8, 9-16, 17-128,
// 129-240, long (stripes and whole blocks), and an odd tail.
const size_t kSizes[] = {
    0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1000, 1024, 4096, 65537, (1u << 20) + 7};

TEST(Xxh3Test, OneShotMatchesLibxxhash) {
  for (size_t n : kSizes) {
    const auto bytes = random_bytes(n, static_cast<uint32_t>(n));
    EXPECT_EQ(xxh3_64(bytes.data(), n), XXH3_64bits(bytes.data(), n)) << n << " bytes";
  }
}

TEST(Xxh3Test, StreamInPiecesMatchesOneShot) {
  std::mt19937 rng(7);
  for (size_t n : kSizes) {
    const auto bytes = random_bytes(n, static_cast<uint32_t>(n) + 1);
    Xxh3Stream s;
    for (size_t at = 0; at < n;) {
      const size_t take = std::min<size_t>(n - at, 1 + rng() % 5000);
      s.update(bytes.data() + at, take);
      at += take;
    }
    EXPECT_EQ(s.digest(), XXH3_64bits(bytes.data(), n)) << n << " bytes";
    // reset starts over; a moved stream keeps its state
    s.reset();
    s.update(bytes.data(), n);
    Xxh3Stream moved = std::move(s);
    EXPECT_EQ(moved.digest(), XXH3_64bits(bytes.data(), n)) << n << " bytes";
  }
}

TEST(Xxh3Test, UsesAvx2WhereTheCpuHasIt) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  EXPECT_EQ(xxh3_uses_avx2(), static_cast<bool>(__builtin_cpu_supports("avx2")));
#else
  EXPECT_FALSE(xxh3_uses_avx2());
#endif
}

}  // namespace
}  // namespace relay
