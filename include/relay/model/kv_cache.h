#pragma once

// Key/value cache for incremental decoding: a pool of fixed-size blocks of
// positions (PagedAttention's layout, as in vLLM), handed to sequences as
// they grow.
//
// A sequence lives in a slot. Each slot has a block table: position p of the
// slot is row block_table[p / block_size] * block_size + p % block_size of
// every layer's flat storage. Blocks are taken from the pool only when a
// position is first written, so memory follows what sequences hold rather
// than num_slots x max_seq_len; on the CPU the storage is allocated
// uncommitted (torch::empty), so pages the pool never touches cost nothing.
//
// Sharing: copy_prefix() gives the destination the source's full blocks of
// the prefix by reference (a count per block) and copies only a partial last
// block; a block shared by several slots is copied before anyone writes into
// it (copy on write). The K samples of one prompt thus hold its context once.
//
// Admission: reserve(slot, positions) promises a slot room to grow to
// `positions`; the promise holds as long as every slot stays within its
// reservation, so a sequence admitted with room for prompt + max_new_tokens
// never runs out mid-decode. Sharing is not credited to reservations (a
// shared block counts for each slot that reserved it), which keeps the
// promise simple to keep; available_blocks() says what can still be promised.
//
// Block 0 is a zero block that is never handed out: padding keys of a
// batched read point at its first row, so uninitialised storage is never
// read; its second row is a scratch row padding writes may land in.
//
// Thread-safety: none; one engine thread owns a cache.

#include <cstdint>
#include <set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "relay/model/policy_config.h"

namespace relay::model {

struct KVCacheOptions {
  int64_t num_slots = 1;    // sequences held at once
  int64_t max_seq_len = 0;  // positions one slot may hold, >= 1
  int64_t block_size = 16;  // positions per block
  // Blocks in the pool (the zero block not counted); 0 = enough for every
  // slot at max_seq_len at once.
  int64_t num_blocks = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

class KVCache {
 public:
  KVCache(const PolicyConfig& config, const KVCacheOptions& options);
  // Every slot able to hold max_seq_len positions at once.
  KVCache(const PolicyConfig& config, int64_t num_slots, int64_t max_seq_len, c10::ScalarType dtype,
          c10::Device device);

  int64_t num_slots() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }

  // Number of positions already cached for `slot`.
  int64_t length(int64_t slot) const;
  // Forgets the slot's contents and frees its blocks; its reservation stays
  // (a sequence re-prefilled after a weight update keeps its room).
  void reset(int64_t slot);
  // reset() and drop the reservation: the slot's sequence is done.
  void release(int64_t slot);
  // Makes `dst` a copy of `src`: its first length(src) positions and length.
  void copy_slot(int64_t src, int64_t dst);
  // Makes `dst` hold the first `length` positions of `src` (length <=
  // length(src)): full blocks shared, a partial last block copied. Throws
  // when the pool has no block for the partial one (dst is then empty).
  void copy_prefix(int64_t src, int64_t dst, int64_t length);
  // Records that `count` positions were appended to `slot` (the policy's
  // extend() calls this after writing them).
  void advance(int64_t slot, int64_t count);

  // Blocks that hold `positions` positions.
  int64_t blocks_for(int64_t positions) const;
  // Free blocks not promised to any slot.
  int64_t available_blocks() const;
  // Promises `slot` room for `positions` positions (replacing its earlier
  // reservation). False, and nothing changed, when the pool cannot promise
  // that much; positions > max_seq_len is a caller bug (throws).
  bool reserve(int64_t slot, int64_t positions);

  // Makes positions [length(slot), end) of `slot` writable: allocates the
  // blocks they fall in (from the slot's reservation first, then from what
  // is unpromised) and copies a shared block about to be written. Throws
  // c10::Error when the pool has no block to give; nothing is changed then.
  void prepare_write(int64_t slot, int64_t end);
  // Row of the flat storage that holds `position` of `slot`; REQUIRES a
  // block there (written, or prepared for writing).
  int64_t storage_row(int64_t slot, int64_t position) const;
  // Writes the storage rows of positions [0, end) of `slot` to out[0, end);
  // REQUIRES blocks there.
  void storage_rows(int64_t slot, int64_t end, int64_t* out) const;
  // The zero block's first row: what padding positions read.
  static constexpr int64_t kZeroRow = 0;
  // The zero block's second row, when block_size >= 2: where padding rows
  // of a fixed-shape decode step (decode_graphs.h) write their keys and
  // values. Nothing reads it.
  static constexpr int64_t kScratchRow = 1;

  // Per-layer flat storage, [(num_blocks + 1) * block_size, kv_heads,
  // head_dim]; keys are stored after RoPE.
  at::Tensor& keys(int64_t layer) { return keys_[layer]; }
  at::Tensor& values(int64_t layer) { return values_[layer]; }

  int64_t bytes_per_position() const { return bytes_per_position_; }
  // Bytes of storage allocated (keys and values of every layer).
  int64_t bytes() const;
  int64_t blocks_in_use() const { return num_blocks_ - static_cast<int64_t>(free_.size()); }
  int64_t peak_blocks_in_use() const { return peak_in_use_; }

 private:
  void check_slot(int64_t slot) const;
  int64_t outstanding(int64_t slot) const;  // blocks still promised to `slot`
  int64_t take_block(int64_t slot);         // REQUIRES a free block
  void drop_block(int64_t block);
  void copy_rows(int64_t from_block, int64_t to_block, int64_t rows);

  int64_t max_seq_len_;
  int64_t block_size_;
  int64_t num_blocks_;
  int64_t bytes_per_position_ = 0;
  struct Entry {
    int64_t block = 0;
    bool owned = false;  // taken from the pool by this slot (else shared from another)
  };
  std::vector<int64_t> lengths_;
  std::vector<std::vector<Entry>> tables_;  // slot -> blocks, in position order
  std::vector<int64_t> allocated_;          // owned entries of each slot
  std::vector<int64_t> reserved_;           // blocks promised to each slot
  std::vector<int32_t> refs_;               // block -> slots holding it
  std::set<int64_t> free_;                  // lowest first: the pool's touched prefix stays small
  int64_t peak_in_use_ = 0;
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
};

}  // namespace relay::model
