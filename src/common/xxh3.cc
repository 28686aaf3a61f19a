#include "relay/common/xxh3.h"

#define XXH_STATIC_LINKING_ONLY  // sizeof(XXH3_state_t)
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/xxh3_avx2.h"

namespace relay {
namespace {

bool use_avx2() {
#ifdef RELAY_XXH3_AVX2
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

}  // namespace

bool xxh3_uses_avx2() { return use_avx2(); }

uint64_t xxh3_64(const void* data, size_t size) {
  return use_avx2() ? internal::xxh3_avx2_hash(data, size) : XXH3_64bits(data, size);
}

// One XXH3_state_t, updated by one build for its whole life (use_avx2 does
// not change within a process).
struct Xxh3Stream::State {
  static constexpr size_t kAlign = 64;  // XXH3_state_t's accumulators
  void* p = nullptr;
  State() {
    const size_t size = use_avx2() ? internal::xxh3_avx2_state_size() : sizeof(XXH3_state_t);
    p = ::operator new(size, std::align_val_t(kAlign));
    std::memset(p, 0, size);
  }
  ~State() { ::operator delete(p, std::align_val_t(kAlign)); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) { reset(); }
Xxh3Stream::~Xxh3Stream() = default;
Xxh3Stream::Xxh3Stream(Xxh3Stream&&) noexcept = default;
Xxh3Stream& Xxh3Stream::operator=(Xxh3Stream&&) noexcept = default;

void Xxh3Stream::reset() {
  if (use_avx2()) {
    internal::xxh3_avx2_reset(state_->p);
  } else {
    XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_->p));
  }
}

void Xxh3Stream::update(const void* data, size_t size) {
  if (use_avx2()) {
    internal::xxh3_avx2_update(state_->p, data, size);
  } else {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_->p), data, size);
  }
}

uint64_t Xxh3Stream::digest() const {
  return use_avx2() ? internal::xxh3_avx2_digest(state_->p)
                    : XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_->p));
}

}  // namespace relay
