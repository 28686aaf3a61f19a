#include "relay/model/kv_cache.h"

#include <string>

#include <torch/torch.h>

namespace relay::model {

KVCache::KVCache(const PolicyConfig& config, int64_t num_slots, int64_t max_seq_len,
                 c10::ScalarType dtype, c10::Device device)
    : max_seq_len_(max_seq_len), lengths_(num_slots, 0) {
  TORCH_CHECK(num_slots >= 1, "KVCache: num_slots must be >= 1, got ", num_slots);
  TORCH_CHECK(max_seq_len >= 1, "KVCache: max_seq_len must be >= 1, got ", max_seq_len);
  auto options = torch::TensorOptions().dtype(dtype).device(device);
  const std::vector<int64_t> shape = {num_slots, max_seq_len, config.num_key_value_heads,
                                      config.resolved_head_dim()};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    keys_.push_back(torch::zeros(shape, options));
    values_.push_back(torch::zeros(shape, options));
  }
}

void KVCache::check_slot(int64_t slot) const {
  TORCH_CHECK(slot >= 0 && slot < num_slots(), "KVCache: slot ", slot, " out of range [0, ",
              num_slots(), ")");
}

int64_t KVCache::length(int64_t slot) const {
  check_slot(slot);
  return lengths_[slot];
}

void KVCache::reset(int64_t slot) {
  check_slot(slot);
  lengths_[slot] = 0;
}

void KVCache::copy_slot(int64_t src, int64_t dst) { copy_prefix(src, dst, length(src)); }

void KVCache::copy_prefix(int64_t src, int64_t dst, int64_t n) {
  check_slot(src);
  check_slot(dst);
  TORCH_CHECK(n >= 0 && n <= lengths_[src], "KVCache: cannot copy ", n, " positions of slot ", src,
              ", which holds ", lengths_[src]);
  if (src == dst) {
    lengths_[dst] = n;
    return;
  }
  if (n > 0) {
    for (size_t l = 0; l < keys_.size(); ++l) {
      keys_[l][dst].narrow(0, 0, n).copy_(keys_[l][src].narrow(0, 0, n));
      values_[l][dst].narrow(0, 0, n).copy_(values_[l][src].narrow(0, 0, n));
    }
  }
  lengths_[dst] = n;
}

void KVCache::advance(int64_t slot, int64_t count) {
  check_slot(slot);
  TORCH_CHECK(count >= 0 && lengths_[slot] + count <= max_seq_len_, "KVCache: slot ", slot,
              " holds ", lengths_[slot], " positions; appending ", count, " exceeds max_seq_len ",
              max_seq_len_);
  lengths_[slot] += count;
}

int64_t KVCache::bytes() const {
  int64_t total = 0;
  for (size_t l = 0; l < keys_.size(); ++l) {
    total += keys_[l].numel() * keys_[l].element_size();
    total += values_[l].numel() * values_[l].element_size();
  }
  return total;
}

}  // namespace relay::model
