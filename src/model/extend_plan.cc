#include "model/extend_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "relay/model/kv_cache.h"

namespace relay::model {

std::vector<int64_t> prepare_extend(KVCache& cache, const int64_t* lengths, const int64_t* slots,
                                    int64_t B, int64_t T, int64_t* kv_len) {
  std::vector<int64_t> past(B);
  std::vector<bool> seen(cache.num_slots(), false);
  *kv_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t slot = slots[b], n = lengths[b];
    TORCH_CHECK(slot >= 0 && slot < cache.num_slots(), "Policy::extend: slot ", slot,
                " out of range");
    TORCH_CHECK(!seen[slot], "Policy::extend: slot ", slot, " appears twice in one batch");
    seen[slot] = true;
    TORCH_CHECK(n >= 1 && n <= T, "Policy::extend: new_lengths[", b, "] = ", n, " must be in [1, ",
                T, "]");
    past[b] = cache.length(slot);
    TORCH_CHECK(past[b] + n <= cache.max_seq_len(), "Policy::extend: slot ", slot, " holds ",
                past[b], " positions; ", n, " more exceed the cache's max_seq_len ",
                cache.max_seq_len());
    *kv_len = std::max(*kv_len, past[b] + n);
  }
  for (int64_t b = 0; b < B; ++b) cache.prepare_write(slots[b], past[b] + lengths[b]);
  return past;
}

void extend_rows(const KVCache& cache, const std::vector<int64_t>& past, const int64_t* lengths,
                 const int64_t* slots, int64_t T, int64_t width, int64_t* read,
                 std::vector<int64_t>& rows, std::vector<int64_t>& write_rows) {
  const auto B = static_cast<int64_t>(past.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t end = past[b] + lengths[b];
    int64_t* row_read = read + b * width;
    cache.storage_rows(slots[b], end, row_read);
    std::fill(row_read + end, row_read + width, KVCache::kZeroRow);
    for (int64_t t = 0; t < lengths[b]; ++t) {
      rows.push_back(b * T + t);
      write_rows.push_back(row_read[past[b] + t]);
    }
  }
}

}  // namespace relay::model
