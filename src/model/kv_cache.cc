#include "relay/model/kv_cache.h"

#include <algorithm>
#include <string>

#include <torch/types.h>
#include <torch/utils.h>

namespace relay::model {

KVCache::KVCache(const PolicyConfig& config, const KVCacheOptions& o)
    : max_seq_len_(o.max_seq_len),
      block_size_(o.block_size),
      lengths_(o.num_slots, 0),
      tables_(o.num_slots),
      allocated_(o.num_slots, 0),
      reserved_(o.num_slots, 0) {
  TORCH_CHECK(o.num_slots >= 1, "KVCache: num_slots must be >= 1, got ", o.num_slots);
  TORCH_CHECK(o.max_seq_len >= 1, "KVCache: max_seq_len must be >= 1, got ", o.max_seq_len);
  TORCH_CHECK(o.block_size >= 1, "KVCache: block_size must be >= 1, got ", o.block_size);
  TORCH_CHECK(o.num_blocks >= 0, "KVCache: num_blocks must be >= 0, got ", o.num_blocks);
  num_blocks_ = o.num_blocks > 0 ? o.num_blocks : o.num_slots * blocks_for(o.max_seq_len);
  refs_.assign(num_blocks_ + 1, 0);
  for (int64_t b = 1; b <= num_blocks_; ++b) free_.insert(free_.end(), b);

  const int64_t kv_heads = config.num_key_value_heads, head_dim = config.resolved_head_dim();
  auto options = torch::TensorOptions().dtype(o.dtype).device(o.device);
  const std::vector<int64_t> shape = {(num_blocks_ + 1) * block_size_, kv_heads, head_dim};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    // Uncommitted until written (on the CPU); only the zero block is touched.
    keys_.push_back(torch::empty(shape, options));
    values_.push_back(torch::empty(shape, options));
    keys_.back().narrow(0, 0, block_size_).zero_();
    values_.back().narrow(0, 0, block_size_).zero_();
  }
  bytes_per_position_ =
      2 * config.num_hidden_layers * kv_heads * head_dim * c10::elementSize(o.dtype);
}

KVCache::KVCache(const PolicyConfig& config, int64_t num_slots, int64_t max_seq_len,
                 c10::ScalarType dtype, c10::Device device)
    : KVCache(config, [&] {
        KVCacheOptions o;
        o.num_slots = num_slots;
        o.max_seq_len = max_seq_len;
        o.dtype = dtype;
        o.device = device;
        return o;
      }()) {}

void KVCache::check_slot(int64_t slot) const {
  TORCH_CHECK(slot >= 0 && slot < num_slots(), "KVCache: slot ", slot, " out of range [0, ",
              num_slots(), ")");
}

int64_t KVCache::length(int64_t slot) const {
  check_slot(slot);
  return lengths_[slot];
}

int64_t KVCache::blocks_for(int64_t positions) const {
  return (positions + block_size_ - 1) / block_size_;
}

int64_t KVCache::outstanding(int64_t slot) const {
  return std::max<int64_t>(0, reserved_[slot] - allocated_[slot]);
}

int64_t KVCache::available_blocks() const {
  int64_t promised = 0;
  for (int64_t s = 0; s < num_slots(); ++s) promised += outstanding(s);
  return static_cast<int64_t>(free_.size()) - promised;
}

bool KVCache::reserve(int64_t slot, int64_t positions) {
  check_slot(slot);
  TORCH_CHECK(positions >= 0 && positions <= max_seq_len_, "KVCache: cannot reserve ", positions,
              " positions; a slot holds at most ", max_seq_len_);
  const int64_t blocks = blocks_for(positions);
  const int64_t others = available_blocks() + outstanding(slot);  // what is free of other promises
  if (std::max<int64_t>(0, blocks - allocated_[slot]) > others) return false;
  reserved_[slot] = blocks;
  return true;
}

int64_t KVCache::take_block(int64_t slot) {
  TORCH_CHECK(!free_.empty(), "KVCache: no free block");
  const int64_t block = *free_.begin();
  free_.erase(free_.begin());
  refs_[block] = 1;
  ++allocated_[slot];
  peak_in_use_ = std::max(peak_in_use_, blocks_in_use());
  return block;
}

void KVCache::drop_block(int64_t block) {
  if (--refs_[block] == 0) free_.insert(block);
}

void KVCache::copy_rows(int64_t from_block, int64_t to_block, int64_t rows) {
  for (size_t l = 0; l < keys_.size(); ++l) {
    keys_[l]
        .narrow(0, to_block * block_size_, rows)
        .copy_(keys_[l].narrow(0, from_block * block_size_, rows));
    values_[l]
        .narrow(0, to_block * block_size_, rows)
        .copy_(values_[l].narrow(0, from_block * block_size_, rows));
  }
}

void KVCache::reset(int64_t slot) {
  check_slot(slot);
  for (const Entry& e : tables_[slot]) drop_block(e.block);
  tables_[slot].clear();
  allocated_[slot] = 0;
  lengths_[slot] = 0;
}

void KVCache::release(int64_t slot) {
  reset(slot);
  reserved_[slot] = 0;
}

void KVCache::prepare_write(int64_t slot, int64_t end) {
  check_slot(slot);
  TORCH_CHECK(end <= max_seq_len_, "KVCache: slot ", slot, " holds ", lengths_[slot],
              " positions; writing up to ", end, " exceeds max_seq_len ", max_seq_len_);
  std::vector<Entry>& table = tables_[slot];
  const int64_t start = lengths_[slot];
  if (end <= start) return;
  // A shared block that the first new position falls in is copied first.
  const int64_t first = start / block_size_;
  const bool copy_first = start % block_size_ != 0 && first < static_cast<int64_t>(table.size()) &&
                          refs_[table[first].block] > 1;
  const int64_t grow = std::max<int64_t>(0, blocks_for(end) - static_cast<int64_t>(table.size()));
  const int64_t needed = grow + (copy_first ? 1 : 0);
  const int64_t beyond = std::max<int64_t>(0, needed - outstanding(slot));
  TORCH_CHECK(beyond <= available_blocks(), "KVCache: out of blocks: slot ", slot, " needs ",
              needed, " more (", outstanding(slot), " reserved) and ", available_blocks(), " of ",
              num_blocks_, " are free of other reservations");
  if (copy_first) {
    const int64_t shared = table[first].block;
    if (table[first].owned) --allocated_[slot];
    const int64_t own = take_block(slot);
    copy_rows(shared, own, start % block_size_);
    drop_block(shared);
    table[first] = {own, true};
  }
  for (int64_t i = 0; i < grow; ++i) table.push_back({take_block(slot), true});
}

int64_t KVCache::storage_row(int64_t slot, int64_t position) const {
  const std::vector<Entry>& table = tables_[slot];
  const int64_t block = position / block_size_;
  TORCH_CHECK(position >= 0 && block < static_cast<int64_t>(table.size()), "KVCache: slot ", slot,
              " has no block for position ", position);
  return table[block].block * block_size_ + position % block_size_;
}

void KVCache::storage_rows(int64_t slot, int64_t end, int64_t* out) const {
  const std::vector<Entry>& table = tables_[slot];
  TORCH_CHECK(end >= 0 && blocks_for(end) <= static_cast<int64_t>(table.size()), "KVCache: slot ",
              slot, " has no blocks for ", end, " positions");
  for (int64_t p = 0; p < end; p += block_size_) {
    const int64_t base = table[p / block_size_].block * block_size_;
    const int64_t n = std::min(block_size_, end - p);
    for (int64_t i = 0; i < n; ++i) out[p + i] = base + i;
  }
}

void KVCache::copy_slot(int64_t src, int64_t dst) { copy_prefix(src, dst, length(src)); }

void KVCache::copy_prefix(int64_t src, int64_t dst, int64_t n) {
  check_slot(src);
  check_slot(dst);
  TORCH_CHECK(n >= 0 && n <= lengths_[src], "KVCache: cannot copy ", n, " positions of slot ", src,
              ", which holds ", lengths_[src]);
  if (src == dst) {
    // Truncate: blocks past the prefix go; a shared partial block is copied
    // on its next write.
    std::vector<Entry>& table = tables_[dst];
    while (static_cast<int64_t>(table.size()) > blocks_for(n)) {
      if (table.back().owned) --allocated_[dst];
      drop_block(table.back().block);
      table.pop_back();
    }
    lengths_[dst] = n;
    return;
  }
  const int64_t full = n / block_size_, rem = n % block_size_;
  reset(dst);
  TORCH_CHECK(rem == 0 || outstanding(dst) >= 1 || available_blocks() >= 1,
              "KVCache: out of blocks copying a prefix into slot ", dst, " (left empty)");
  std::vector<Entry>& table = tables_[dst];
  for (int64_t i = 0; i < full; ++i) {
    const int64_t block = tables_[src][i].block;
    ++refs_[block];
    table.push_back({block, false});
  }
  if (rem > 0) {
    const int64_t own = take_block(dst);
    copy_rows(tables_[src][full].block, own, rem);
    table.push_back({own, true});
  }
  lengths_[dst] = n;
}

void KVCache::advance(int64_t slot, int64_t count) {
  check_slot(slot);
  TORCH_CHECK(count >= 0 && lengths_[slot] + count <= max_seq_len_, "KVCache: slot ", slot,
              " holds ", lengths_[slot], " positions; appending ", count, " exceeds max_seq_len ",
              max_seq_len_);
  TORCH_CHECK(blocks_for(lengths_[slot] + count) <= static_cast<int64_t>(tables_[slot].size()),
              "KVCache: slot ", slot, " advanced past its blocks (prepare_write first)");
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
