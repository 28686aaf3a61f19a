#pragma once

// The AVX2 build of XXH3 (xxh3_avx2.cc, compiled with -mavx2), private to
// src/common/xxh3.cc. Called only where the CPU has AVX2. The state is
// xxhash's XXH3_state_t, allocated by the caller (xxh3_avx2_state_size bytes,
// 64-byte aligned).

#include <cstddef>
#include <cstdint>

namespace relay::internal {

uint64_t xxh3_avx2_hash(const void* data, size_t size);
size_t xxh3_avx2_state_size();
void xxh3_avx2_reset(void* state);
void xxh3_avx2_update(void* state, const void* data, size_t size);
uint64_t xxh3_avx2_digest(const void* state);

}  // namespace relay::internal
