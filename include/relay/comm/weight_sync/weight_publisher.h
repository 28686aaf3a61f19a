#pragma once

// The trainer's published weights: after each optimizer step the trainer
// publishes version v + 1 here; FetchWeights streams a snapshot to workers
// and WatchVersions wakes on a new one. Snapshots are host copies taken at
// publish time, so the trainer can go on updating its parameters while a
// slow worker still downloads the previous version.
//
// Thread-safe: one publisher, any number of readers.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "relay/common/status.h"
#include "relay/common/xxh3.h"
#include "relay/model/weight_manifest.h"

namespace relay::comm {

// A version's payload (its tensors' bytes in manifest order) is checksummed
// in blocks of this size when it is published, so senders hash nothing and a
// receiver checks each block as it lands (weight_sync.h).
inline constexpr uint64_t kChecksumBlockBytes = uint64_t{1} << 20;

struct WeightSnapshot {
  model::WeightManifest manifest;
  // uint8[total_bytes]: every tensor's bytes in manifest order, in one buffer,
  // so a broadcast bucket or a fetch chunk is a slice of it, never a copy.
  at::Tensor payload;
  std::vector<at::Tensor> tensors;  // in manifest order: payload_tensors(manifest, payload)
  uint64_t total_bytes = 0;
  uint64_t block_bytes = kChecksumBlockBytes;
  std::vector<uint64_t> block_checksums;  // XXH3-64 of each block; the last may be shorter
};

// ceil(total_bytes / block_bytes): buckets and checksum blocks alike; 0 for
// an empty payload.
inline uint64_t block_count(uint64_t total_bytes, uint64_t block_bytes) {
  return block_bytes == 0 ? 0 : (total_bytes + block_bytes - 1) / block_bytes;
}

// XXH3-64 of each `block_bytes` block of a byte stream that arrives in pieces
// of any size: update() calls done(block index, checksum) for each block it
// completes, finish() for the last, shorter one.
class BlockHasher {
 public:
  explicit BlockHasher(uint64_t block_bytes) : block_bytes_(block_bytes) {}

  template <typename Done>
  void update(const char* data, uint64_t size, Done&& done) {
    while (size > 0) {
      const uint64_t take = std::min(size, block_bytes_ - filled_);
      stream_.update(data, take);
      data += take;
      size -= take;
      filled_ += take;
      if (filled_ == block_bytes_) {
        done(index_++, stream_.digest());
        stream_.reset();
        filled_ = 0;
      }
    }
  }
  template <typename Done>
  void finish(Done&& done) {
    if (filled_ > 0) done(index_++, stream_.digest());
    stream_.reset();
    filled_ = 0;
  }

 private:
  const uint64_t block_bytes_;
  Xxh3Stream stream_;
  uint64_t filled_ = 0;  // bytes of block index_ hashed so far
  uint64_t index_ = 0;
};

class WeightPublisher {
 public:
  // Keeps the latest `keep` versions. A snapshot handed out stays alive
  // with its reader (a fetch or broadcast in progress) whatever `keep` is;
  // keep > 1 only lets a worker start fetching a version already superseded.
  // `block_bytes` (> 0): the size of the snapshots' checksum blocks.
  explicit WeightPublisher(int keep = 2, uint64_t block_bytes = kChecksumBlockBytes);

  // Copies `tensors` to the host, computes the manifest and the block
  // checksums in the same pass (each piece hashed while it is in cache), and
  // makes `version` the latest. InvalidArgument when version is not above
  // the latest.
  Status publish(int64_t version, const std::unordered_map<std::string, at::Tensor>& tensors);

  // -1 before the first publish.
  int64_t latest_version() const;
  // The snapshot of `version` (-1 = latest); NotFound when it is not (or no
  // longer) kept. While a publish reuses the only kept version's payload
  // (keep 1, nobody reading it), it waits for the new version.
  StatusOr<std::shared_ptr<const WeightSnapshot>> snapshot(int64_t version) const;
  // Blocks until a version above `after` is published, `timeout` passes or
  // `stop` (may be null) returns true; the latest version either way. `stop`
  // is asked on entry and on every wake-up under the publisher's lock: it
  // must be quick and must not call the publisher. Whoever sets what it
  // reads calls wake_waiters() afterwards.
  int64_t wait_for_version(int64_t after, std::chrono::milliseconds timeout,
                           const std::function<bool()>& stop = nullptr) const;
  // Makes every wait_for_version() in progress ask its `stop` again.
  void wake_waiters() const;

 private:
  int64_t latest_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The payload of the oldest kept version when publishing evicts it and no
  // reader holds it, else a new one (faulting in 400 MB of fresh pages costs
  // more than copying the weights into them).
  at::Tensor payload_for(uint64_t total_bytes);

  const int keep_;
  const uint64_t block_bytes_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Oldest first.
  std::deque<std::shared_ptr<WeightSnapshot>> snapshots_ ABSL_GUARDED_BY(mu_);
  // Set while publish() writes the next version into the payload of the
  // only kept one (keep 1): snapshot() waits for the new version instead of
  // finding nothing, and the replaced version still counts as the latest.
  bool rebuilding_ ABSL_GUARDED_BY(mu_) = false;
  int64_t replaced_version_ ABSL_GUARDED_BY(mu_) = -1;
};

// The bytes of a (received) manifest's payload, each tensor checked:
// InvalidArgument for a dtype safetensors cannot name, DataLoss for a negative
// dimension or a size that does not fit shape and dtype; naming the version
// and the tensor.
StatusOr<uint64_t> manifest_payload_bytes(const model::WeightManifest& manifest);

// A uint8 CPU buffer of `bytes` for a version's payload: `reuse` (an earlier
// payload) when it has that size and nothing else refers to it (no other
// Tensor, no view: its version's tensors were dropped), which saves faulting
// in fresh pages; else a new one. *reused (may be null) says which.
at::Tensor payload_buffer(at::Tensor reuse, uint64_t bytes, bool* reused = nullptr);

// The manifest's tensors over `payload` (uint8, their bytes in manifest
// order): views of it, except a tensor whose offset is not a multiple of its
// element size (mixed dtypes can cause that), which is copied.
std::vector<at::Tensor> payload_tensors(const model::WeightManifest& manifest,
                                        const at::Tensor& payload);

// Splits a snapshot's payload into chunks of at most `chunk_bytes`, calling
// `emit(offset, data, size)` in order (data points into the payload); stops
// early when emit returns false.
void for_each_chunk(const WeightSnapshot& snapshot, uint64_t chunk_bytes,
                    const std::function<bool(uint64_t, const char*, uint64_t)>& emit);

// Reassembles a version's tensors from its bytes as they arrive, chunk by
// chunk, straight into tensors allocated from the manifest: a receiver holds
// the version once (not a byte string and then the tensors), which for a
// 0.5B-parameter fp32 model is 2 GB less at the peak.
class WeightAssembler {
 public:
  // Allocates the version's payload (uint8, every tensor's bytes in manifest
  // order), or receives into `reuse`, the payload() of an earlier version,
  // when it has the right size and nothing else refers to it (its tensors
  // were dropped): no fresh pages to fault in. InvalidArgument for a dtype it
  // cannot name, DataLoss for a size that does not fit shape and dtype.
  static StatusOr<WeightAssembler> create(model::WeightManifest manifest, at::Tensor reuse = {});

  // Appends the bytes at `offset`, which must be where the previous chunk
  // ended; DataLoss for a gap, an overlap or bytes past the manifest's total.
  Status add(uint64_t offset, const char* data, uint64_t size);
  uint64_t received_bytes() const { return received_; }
  uint64_t total_bytes() const { return total_; }
  const model::WeightManifest& manifest() const { return manifest_; }

  // The tensors (views of the payload, payload_tensors), once every byte
  // arrived and their digest is the manifest's; DataLoss naming the version
  // and both digests otherwise (the caller fetches again).
  StatusOr<std::unordered_map<std::string, at::Tensor>> finish();
  const at::Tensor& payload() const { return payload_; }

 private:
  WeightAssembler() = default;
  model::WeightManifest manifest_;
  at::Tensor payload_;  // uint8[total_]
  uint64_t total_ = 0;
  uint64_t received_ = 0;
  // Of the bytes received so far, hashed as they are copied (a pointer: the
  // assembler is moved around in StatusOr/optional).
  std::unique_ptr<Xxh3Stream> digest_ = std::make_unique<Xxh3Stream>();
};

// The same in one call: `bytes` is the concatenation in manifest order.
StatusOr<std::unordered_map<std::string, at::Tensor>> tensors_from_bytes(
    const model::WeightManifest& manifest, const std::string& bytes);

}  // namespace relay::comm
