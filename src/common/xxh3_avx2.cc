// XXH3 inlined and compiled for AVX2 (this file alone gets -mavx2; see
// src/CMakeLists.txt). Only xxhash.h is included and all of it is static
// under XXH_INLINE_ALL, so no AVX2 code can leak into a function another
// file shares.

#ifdef RELAY_XXH3_AVX2
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

#include "common/xxh3_avx2.h"

namespace relay::internal {

#ifdef RELAY_XXH3_AVX2
uint64_t xxh3_avx2_hash(const void* data, size_t size) { return XXH3_64bits(data, size); }
size_t xxh3_avx2_state_size() { return sizeof(XXH3_state_t); }
void xxh3_avx2_reset(void* state) { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state)); }
void xxh3_avx2_update(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t xxh3_avx2_digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}
#else
// Not an x86-64 build: never called (xxh3.cc checks RELAY_XXH3_AVX2 too).
uint64_t xxh3_avx2_hash(const void*, size_t) { return 0; }
size_t xxh3_avx2_state_size() { return 0; }
void xxh3_avx2_reset(void*) {}
void xxh3_avx2_update(void*, const void*, size_t) {}
uint64_t xxh3_avx2_digest(const void*) { return 0; }
#endif

}  // namespace relay::internal
