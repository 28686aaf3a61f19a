#pragma once

// What a rollout worker asks of the trainer (proto/relay/v1/worker.proto,
// and the operator's Admin Stats), as an interface: GrpcTrainerClient
// (comm/rpc/grpc_trainer_client.h) makes the calls over the network, and
// tests give RolloutWorker an in-memory fake (tests/testing/fake_trainer_client.h)
// so that the worker's loop is tested without a server.

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/trajectory.h"

namespace relay::v1 {
class RegisterWorkerResponse;
class HeartbeatRequest;
class HeartbeatResponse;
class LeasePromptsResponse;
class SubmitGroupAck;
class VersionAnnouncement;
class StatsResponse;
class WorkerCapabilities;
}  // namespace relay::v1

namespace relay::comm {

// Ends a fetch_weights call from another thread: the call returns
// Cancelled. It stays cancelled, so a call that had not begun when cancel()
// ran returns at once. One call at a time uses it.
class FetchCancel {
 public:
  // Runs the call's on_cancel under the lock: the call's clear() waits for
  // it, so it never reaches a context the call has already destroyed.
  void cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (on_cancel_) on_cancel_();
  }
  bool cancelled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  // For the call: how to end it (a gRPC context's TryCancel: quick, and it
  // must not call back into this). False when it is cancelled already
  // (nothing is registered then); clear() before what it refers to goes.
  bool arm(std::function<void()> on_cancel) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return false;
    on_cancel_ = std::move(on_cancel);
    return true;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    on_cancel_ = nullptr;
  }

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  std::function<void()> on_cancel_;
};

struct FetchedWeights {
  model::WeightManifest manifest;
  std::unordered_map<std::string, at::Tensor> tensors;  // verified against the digest
  // The trainer's version is the one the caller said it holds: no tensors
  // were transferred.
  bool already_held = false;
};

// The worker's side of the Worker service (and the operator's Admin calls).
// Errors keep the trainer's status code and say which call failed.
class TrainerClient {
 public:
  virtual ~TrainerClient() = default;

  virtual StatusOr<v1::RegisterWorkerResponse> register_worker(
      const std::string& name, const v1::WorkerCapabilities& caps) = 0;
  virtual StatusOr<v1::HeartbeatResponse> heartbeat(const v1::HeartbeatRequest& request) = 0;
  virtual StatusOr<v1::LeasePromptsResponse> lease_prompts(const std::string& worker_id,
                                                           int max_prompts) = 0;
  // How many of `lease_ids` were still this worker's open leases.
  virtual StatusOr<int32_t> release_leases(const std::string& worker_id,
                                           const std::vector<uint64_t>& lease_ids) = 0;
  // Every group submitted on its lease id; one ack per group, in order.
  virtual StatusOr<std::vector<v1::SubmitGroupAck>> submit_groups(
      const std::string& worker_id,
      const std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>>& groups) = 0;
  // Downloads `version` (-1 = latest), verified against its digest; DataLoss
  // on any mismatch. With `held` (the manifest of the weights the caller
  // has), a version with the same tensors and digest is not transferred: the
  // result has already_held set and no tensors. With `cancel`, another
  // thread may end the download (Cancelled).
  virtual StatusOr<FetchedWeights> fetch_weights(const std::string& worker_id, int64_t version,
                                                 uint64_t chunk_bytes = 0,
                                                 const model::WeightManifest* held = nullptr,
                                                 FetchCancel* cancel = nullptr) = 0;
  // The first version announced after `after_version`, or nullopt when none
  // arrives within `wait_ms`.
  virtual StatusOr<std::optional<v1::VersionAnnouncement>> next_version(
      const std::string& worker_id, int64_t after_version, int64_t wait_ms) = 0;
  virtual StatusOr<v1::StatsResponse> stats() = 0;
};

}  // namespace relay::comm
