#pragma once

// XXH3-64 (xxHash 0.8, seed 0): the checksum of relay's weight manifests,
// weight-sync buckets and fetch chunks. Values are libxxhash's exactly; where
// the CPU has AVX2 an AVX2 build of the same algorithm runs instead (Debian's
// libxxhash is built for SSE2: 19 GB/s here, the AVX2 build 48 GB/s on data in
// cache, see docs/BENCHMARKS.md "Weight sync"). Chosen once per process.

#include <cstddef>
#include <cstdint>
#include <memory>

namespace relay {

uint64_t xxh3_64(const void* data, size_t size);

// The hash of bytes that arrive in pieces: equal to xxh3_64 of their
// concatenation.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(Xxh3Stream&&) noexcept;
  Xxh3Stream& operator=(Xxh3Stream&&) noexcept;

  void reset();
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Whether the AVX2 build is the one in use (for benchmarks and tests).
bool xxh3_uses_avx2();

}  // namespace relay
