#pragma once

// Key/value cache for incremental decoding, organised in fixed slots.
//
// A slot holds one sequence's keys and values for every layer. The rollout
// engine gives each live sequence a slot; when a sequence finishes, reset()
// frees its slot and the next pending sequence is prefilled into it while the
// other slots keep decoding (continuous batching). copy_slot() shares one
// prompt's prefill among the K samples drawn from it.
//
// Thread-safety: none; one engine thread owns a cache.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/model/policy_config.h"

namespace relay::model {

class KVCache {
 public:
  // Allocates zeroed storage of num_slots x max_seq_len positions per layer.
  KVCache(const PolicyConfig& config, int64_t num_slots, int64_t max_seq_len, c10::ScalarType dtype,
          c10::Device device);

  int64_t num_slots() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }

  // Number of positions already cached for `slot`.
  int64_t length(int64_t slot) const;
  // Forgets the slot's contents (its storage is reused; nothing is zeroed).
  void reset(int64_t slot);
  // Makes `dst` a copy of `src`: its first length(src) positions and length.
  void copy_slot(int64_t src, int64_t dst);
  // Makes `dst` hold a copy of the first `length` positions of `src`
  // (length <= length(src)): a shared prompt prefix without what follows.
  void copy_prefix(int64_t src, int64_t dst, int64_t length);
  // Records that `count` positions were appended to `slot` (the policy's
  // extend() calls this after writing them).
  void advance(int64_t slot, int64_t count);

  // Per-layer storage, [num_slots, max_seq_len, kv_heads, head_dim]; keys are
  // stored after RoPE.
  at::Tensor& keys(int64_t layer) { return keys_[layer]; }
  at::Tensor& values(int64_t layer) { return values_[layer]; }

  // Bytes held by the cache (keys and values of every layer).
  int64_t bytes() const;

 private:
  void check_slot(int64_t slot) const;

  int64_t max_seq_len_;
  std::vector<int64_t> lengths_;
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
};

}  // namespace relay::model
