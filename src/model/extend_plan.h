#pragma once

// The host-side half of PolicyImpl::extend (policy.h), shared with the
// fixed-shape decode step (decode_graphs.h): checks a batch of appends
// against a KVCache, makes room for them, and lists where each new position
// is written and where each row's keys are read from.

#include <cstdint>
#include <vector>

namespace relay::model {

class KVCache;

// Checks row b's append of lengths[b] positions to slots[b] (slot in range
// and not repeated, 1 <= lengths[b] <= T, room within the cache's
// max_seq_len), then prepares every row's writes (KVCache::prepare_write).
// Every check runs before any block is taken, so bad input changes nothing.
// Returns each row's cache length before the append; *kv_len = the largest
// length after it. Throws c10::Error.
std::vector<int64_t> prepare_extend(KVCache& cache, const int64_t* lengths, const int64_t* slots,
                                    int64_t B, int64_t T, int64_t* kv_len);

// Row b's storage rows for key positions [0, past[b] + lengths[b]) into
// read[b * width ...], KVCache::kZeroRow past them (width >= that end).
// Appends to rows / write_rows, for each new position t of row b, its input
// row b * T + t and the storage row it is written to.
void extend_rows(const KVCache& cache, const std::vector<int64_t>& past, const int64_t* lengths,
                 const int64_t* slots, int64_t T, int64_t width, int64_t* read,
                 std::vector<int64_t>& rows, std::vector<int64_t>& write_rows);

}  // namespace relay::model
