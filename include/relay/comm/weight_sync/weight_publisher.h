#pragma once

// The trainer's published weights: after each optimizer step the trainer
// publishes version v + 1 here; FetchWeights streams a snapshot to workers
// and WatchVersions wakes on a new one. Snapshots are host copies taken at
// publish time, so the trainer can go on updating its parameters while a
// slow worker still downloads the previous version.
//
// Thread-safe: one publisher, any number of readers.

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
#include "relay/model/weight_manifest.h"

namespace relay::comm {

struct WeightSnapshot {
  model::WeightManifest manifest;
  std::vector<at::Tensor> tensors;  // contiguous CPU copies, in manifest order
  uint64_t total_bytes = 0;
};

class WeightPublisher {
 public:
  // Keeps the latest `keep` versions. A snapshot handed out stays alive
  // with its reader (a fetch or broadcast in progress) whatever `keep` is;
  // keep > 1 only lets a worker start fetching a version already superseded.
  explicit WeightPublisher(int keep = 2);

  // Copies `tensors` to the host, computes the manifest and makes `version`
  // the latest. InvalidArgument when version is not above the latest.
  Status publish(int64_t version, const std::unordered_map<std::string, at::Tensor>& tensors);

  // -1 before the first publish.
  int64_t latest_version() const;
  // The snapshot of `version` (-1 = latest); NotFound when it is not (or no
  // longer) kept.
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

  const int keep_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Oldest first.
  std::deque<std::shared_ptr<const WeightSnapshot>> snapshots_ ABSL_GUARDED_BY(mu_);
};

// Splits a snapshot into chunks of at most `chunk_bytes` of the
// concatenation of its tensors' bytes, calling `emit(offset, data, size)` in
// order; stops early when emit returns false.
void for_each_chunk(const WeightSnapshot& snapshot, uint64_t chunk_bytes,
                    const std::function<bool(uint64_t, const char*, uint64_t)>& emit);

// Reassembles a version's tensors from its bytes as they arrive, chunk by
// chunk, straight into tensors allocated from the manifest: a receiver holds
// the version once (not a byte string and then the tensors), which for a
// 0.5B-parameter fp32 model is 2 GB less at the peak.
class WeightAssembler {
 public:
  // Allocates every tensor the manifest names; InvalidArgument for a dtype
  // it cannot name, DataLoss for a size that does not fit shape and dtype.
  static StatusOr<WeightAssembler> create(model::WeightManifest manifest);

  // Appends the bytes at `offset`, which must be where the previous chunk
  // ended; DataLoss for a gap, an overlap or bytes past the manifest's total.
  Status add(uint64_t offset, const char* data, uint64_t size);
  uint64_t received_bytes() const { return received_; }
  uint64_t total_bytes() const { return total_; }
  const model::WeightManifest& manifest() const { return manifest_; }

  // The tensors, once every byte arrived and their digest is the manifest's;
  // DataLoss naming the version and both digests otherwise (the caller
  // fetches again). Leaves the assembler empty.
  StatusOr<std::unordered_map<std::string, at::Tensor>> finish();

 private:
  WeightAssembler() = default;
  model::WeightManifest manifest_;
  std::vector<at::Tensor> tensors_;  // manifest order
  uint64_t total_ = 0;
  uint64_t received_ = 0;
  size_t tensor_ = 0;         // the tensor the next byte belongs to
  uint64_t tensor_done_ = 0;  // bytes of it already written
};

// The same in one call: `bytes` is the concatenation in manifest order.
StatusOr<std::unordered_map<std::string, at::Tensor>> tensors_from_bytes(
    const model::WeightManifest& manifest, const std::string& bytes);

}  // namespace relay::comm
