#pragma once

// The pure half of the c10d weight broadcast (comm/weight_sync/weight_sync.h): the wire
// header, the manifest encoding, cutting a snapshot into byte buckets and
// putting a version back together from them. No sockets and no threads, so
// every check here is tested directly (tests/unit/comm/weight_buckets_test.cc).
//
// A version's payload is the concatenation of its tensors' bytes in manifest
// order (the same bytes FetchWeights streams and the manifest digest covers),
// cut into pieces of `bucket_bytes`; the last piece is shorter. Its integrity
// rests on the snapshot's block checksums (WeightSnapshot, computed at
// publish): they travel before the buckets, so the sender hashes nothing and
// the receiver checks each block as it lands, whatever the bucket size.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/common/status.h"
#include "relay/model/weight_manifest.h"

namespace relay::comm {

// The first collective of every broadcast: int64 words, so one Gloo/NCCL
// broadcast of a fixed-size tensor carries it.
struct SyncHeader {
  int64_t generation = 0;  // the group it travels in (a member checks it is its own)
  int64_t seq = 0;         // 0-based index of this broadcast in the generation
  int64_t version = 0;     // the policy version
  uint64_t digest = 0;     // the manifest's XXH3-64 over the whole payload
  uint64_t total_bytes = 0;
  uint64_t bucket_bytes = 0;
  uint64_t bucket_count = 0;        // ceil(total_bytes / bucket_bytes)
  uint64_t manifest_bytes = 0;      // size of the encoded manifest that follows
  uint64_t manifest_checksum = 0;   // XXH3-64 of those bytes
  uint64_t block_bytes = 0;         // the checksum blocks' size (> 0)
  uint64_t checksums_checksum = 0;  // XXH3-64 of the block checksums after the manifest

  uint64_t block_count() const { return comm::block_count(total_bytes, block_bytes); }
};

inline constexpr int kSyncHeaderWords = 14;  // 11 fields + magic/format, + 1 checksum

// The header announcing `snapshot`, whose manifest's encoding
// (encode_manifest) is `manifest_bytes`, cut into buckets of `bucket_bytes`.
SyncHeader make_header(const WeightSnapshot& snapshot, const std::string& manifest_bytes,
                       uint64_t bucket_bytes, int64_t generation, int64_t seq);

// Writes kSyncHeaderWords words: magic, format, the fields, and an XXH3-64
// over the words before it.
void encode_header(const SyncHeader& header, int64_t* words);
// DataLoss when the magic, format or checksum is wrong or the sizes disagree
// (bucket_count != ceil(total / bucket), no block size).
StatusOr<SyncHeader> decode_header(const int64_t* words);
// DataLoss unless `checksums` are header.block_count() values whose XXH3-64
// is header.checksums_checksum.
Status check_block_checksums(const SyncHeader& header, const std::vector<uint64_t>& checksums);

// The manifest as relay.v1.WeightManifest bytes (the receiver learns names,
// shapes and dtypes from the broadcast itself, without asking gRPC).
std::string encode_manifest(const model::WeightManifest& manifest);
// Checks the bytes against `checksum`, parses them and checks them against
// the header (version, digest, total bytes, each tensor's size from its shape
// and dtype). DataLoss naming what disagrees.
StatusOr<model::WeightManifest> decode_manifest(const std::string& bytes, const SyncHeader& header);

// ceil(total_bytes / bucket_bytes); 0 for an empty payload.
inline uint64_t bucket_count(uint64_t total_bytes, uint64_t bucket_bytes) {
  return block_count(total_bytes, bucket_bytes);
}

// Reads a snapshot bucket by bucket. The snapshot must outlive the reader.
class BucketReader {
 public:
  // REQUIRES: bucket_bytes > 0.
  BucketReader(const WeightSnapshot& snapshot, uint64_t bucket_bytes);

  uint64_t bucket_count() const { return count_; }
  uint64_t bucket_size(uint64_t index) const;
  // Copies bucket `index` into dst (bucket_size(index) bytes).
  void read(uint64_t index, char* dst) const;
  // Bucket `index` as a uint8 slice of the snapshot's payload (sent as it is).
  at::Tensor view(uint64_t index) const;

 private:
  const WeightSnapshot& snapshot_;
  const uint64_t bucket_bytes_;
  uint64_t count_ = 0;
};

// Puts one version back together, bucket by bucket in order, in one payload
// buffer: the transport writes bucket k straight into bucket(k) (no copy),
// add_bucket checks the blocks it completes there against the publisher's
// checksums, and finish() returns the tensors as views of the payload (a
// tensor whose offset is not a multiple of its element size, which mixed
// dtypes can cause, is copied instead).
//
// The blocks stand for the manifest digest: the publisher computed both in
// one pass over the same bytes, and the list arrives checked against the
// header (check_block_checksums), so bytes whose every block matches are the
// published version. Hashing once instead of twice is 8 ms of a 400 MB
// version's receive on a CPU that the transport already keeps busy.
class VersionAssembler {
 public:
  // `block_checksums`: the snapshot's, of `block_bytes` blocks.
  // `reuse`: the payload() of an earlier version; it is received into when it
  // has the right size and nothing else refers to it (the caller dropped
  // every tensor of that version), which saves faulting in fresh pages.
  // InvalidArgument for a dtype or shape the manifest cannot describe, or
  // checksums that do not cover its bytes.
  static StatusOr<std::unique_ptr<VersionAssembler>> create(model::WeightManifest manifest,
                                                            uint64_t bucket_bytes,
                                                            uint64_t block_bytes,
                                                            std::vector<uint64_t> block_checksums,
                                                            at::Tensor reuse = {});

  uint64_t bucket_count() const { return count_; }
  // uint8 view of the payload where bucket `index` goes.
  at::Tensor bucket(uint64_t index) const;
  // Hashes bucket `index`, already written into bucket(index). DataLoss when
  // it is not the next one, or naming the first block it completes (its byte
  // range, and the bucket) whose bytes are not the published ones.
  Status add_bucket(uint64_t index);
  // DataLoss unless every bucket was added and every block matched.
  StatusOr<std::unordered_map<std::string, at::Tensor>> finish();

  const model::WeightManifest& manifest() const { return manifest_; }
  const at::Tensor& payload() const { return payload_; }
  // Whether create() received into the `reuse` buffer.
  bool reused() const { return reused_; }

 private:
  VersionAssembler(model::WeightManifest manifest, uint64_t bucket_bytes, uint64_t total_bytes,
                   uint64_t block_bytes, std::vector<uint64_t> block_checksums);

  const model::WeightManifest manifest_;
  const uint64_t bucket_bytes_;
  const uint64_t total_bytes_;
  const uint64_t count_;
  uint64_t next_ = 0;   // next bucket expected
  at::Tensor payload_;  // uint8 [total_bytes]
  bool reused_ = false;
  const uint64_t block_bytes_;
  const std::vector<uint64_t> block_checksums_;  // the publisher's
  BlockHasher blocks_;                           // hashes the block being received
  Status bad_;                                   // the first block that did not match
};

}  // namespace relay::comm
