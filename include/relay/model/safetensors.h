#pragma once

// Reader and writer for the safetensors format (Hugging Face's checkpoint
// format) and for HF model directories that hold one or several shards.
//
// File layout: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//    ..., "__metadata__": {"<key>": "<value>"}}   (metadata optional)
// then the data section. Offsets are relative to the start of the data
// section; data is raw little-endian and row-major.
//
// Error codes: a missing file is NotFound; a safetensors file that is cut
// short or whose header is inconsistent is DataLoss; a dtype that safetensors
// defines but relay does not read (U32, F8_E4M3, ...) is Unimplemented; a
// malformed index JSON is InvalidArgument. Every message starts with the file
// path and names the tensor when there is one.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "relay/common/status.h"

namespace relay::model {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// Safetensors spelling: "F64", "F32", "F16", "BF16", "I64", ..., "U8", "BOOL".
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; InvalidArgument "unknown dtype 'X'" otherwise.
StatusOr<DType> parse_dtype(std::string_view name);
// Bytes per element.
size_t dtype_size(DType dtype);
c10::ScalarType to_scalar_type(DType dtype);
// InvalidArgument for scalar types safetensors (or relay) cannot store.
StatusOr<DType> from_scalar_type(c10::ScalarType type);

// One tensor's header entry. [begin, end) is relative to the data section.
struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty = 0-dim scalar
  uint64_t begin = 0, end = 0;

  int64_t numel() const;
};

// An open, validated safetensors file. The file is memory-mapped read-only for
// the reader's lifetime; tensor() copies out of the mapping. Files written by
// write_safetensors are replaced by rename, so an open reader keeps seeing the
// old contents; truncating a mapped file in place would fault (SIGBUS).
// Thread-safe: all methods are const after open().
class SafetensorsReader {
 public:
  // Maps `path` and validates the whole header: dtypes, shapes, offsets
  // within the data section, byte sizes that match the shape, no overlaps.
  static StatusOr<std::unique_ptr<SafetensorsReader>> open(const std::string& path);

  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // In data-section order (ascending offset; empty tensors sharing an offset
  // by name), which for a file written by write_safetensors is the order the
  // tensors were given in.
  const std::vector<TensorEntry>& entries() const { return entries_; }
  // nullptr when there is no tensor `name`.
  const TensorEntry* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // An owned, contiguous CPU copy (never aliases the mapping, whose offsets
  // may be unaligned). NotFound when there is no tensor `name`.
  StatusOr<at::Tensor> tensor(std::string_view name) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsReader() = default;

  std::string path_;
  void* map_ = nullptr;  // whole file, PROT_READ
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section, inside map_
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t, std::less<>> by_name_;  // name -> index in entries_
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` in the given order (each moved to CPU and made contiguous)
// with `metadata` as "__metadata__". The header is padded with spaces so the
// data section starts 8-byte aligned, as HF does. Writes `path` + ".tmp",
// fsyncs and renames it over `path`, so a crash never leaves a half-written
// `path`. Rejects empty, duplicate or "__metadata__" names, undefined tensors
// and dtypes outside DType (InvalidArgument).
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// HF's model.safetensors.index.json.
struct ShardIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  // Non-string values are kept as their JSON text: total_size 988 -> "988".
  std::map<std::string, std::string> metadata;
};

// Rejects a missing or non-object weight_map and shard names that are empty or
// contain '/' or "..", so an index cannot point outside its directory.
StatusOr<ShardIndex> read_shard_index(const std::string& index_path);

// Every tensor of an HF model directory, whichever layout it uses:
// model.safetensors.index.json plus shards (preferred when present) or a single
// model.safetensors. Tensors in a shard but missing from the weight_map are
// ignored, as transformers does. Thread-safe after open(). Movable.
class CheckpointTensors {
 public:
  static StatusOr<CheckpointTensors> open(const std::string& dir);

  CheckpointTensors(CheckpointTensors&&) = default;
  CheckpointTensors& operator=(CheckpointTensors&&) = default;

  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  // nullptr when there is no tensor `name`.
  const TensorEntry* entry(std::string_view name) const;
  // An owned, contiguous CPU copy. NotFound when there is no tensor `name`.
  StatusOr<at::Tensor> tensor(std::string_view name) const;
  const std::string& dir() const { return dir_; }

 private:
  CheckpointTensors() = default;

  struct Location {
    const SafetensorsReader* reader;
    const TensorEntry* entry;
  };
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;  // one per shard file
  std::map<std::string, Location, std::less<>> tensors_;
};

// Writes `tensors` (in order) into `dir` (created if missing) in HF layout:
// a single model.safetensors when their data fits in `max_shard_bytes`, else
// model-00001-of-0000N.safetensors shards of at most `max_shard_bytes` of data
// each (a larger tensor goes alone in its shard), each carrying `metadata`,
// plus model.safetensors.index.json (metadata.total_size and weight_map),
// written last. Files of a previous layout in `dir` are NOT removed, and
// CheckpointTensors::open prefers an index: write into an empty directory.
Status write_checkpoint_tensors(const std::string& dir,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                uint64_t max_shard_bytes = 5ull << 30,
                                const std::map<std::string, std::string>& metadata = {
                                    {"format", "pt"}});

}  // namespace relay::model
