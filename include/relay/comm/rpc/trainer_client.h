#pragma once

// What a rollout worker asks of the trainer (proto/relay/v1/worker.proto,
// and the operator's Admin Stats), as an interface: GrpcTrainerClient
// (comm/rpc/grpc_trainer_client.h) makes the calls over the network, and
// tests give RolloutWorker an in-memory fake (tests/testing/fake_trainer_client.h)
// so that the worker's loop is tested without a server.

#include <cstdint>
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
  // result has already_held set and no tensors.
  virtual StatusOr<FetchedWeights> fetch_weights(const std::string& worker_id, int64_t version,
                                                 uint64_t chunk_bytes = 0,
                                                 const model::WeightManifest* held = nullptr) = 0;
  // The first version announced after `after_version`, or nullopt when none
  // arrives within `wait_ms`.
  virtual StatusOr<std::optional<v1::VersionAnnouncement>> next_version(
      const std::string& worker_id, int64_t after_version, int64_t wait_ms) = 0;
  virtual StatusOr<v1::StatsResponse> stats() = 0;
};

}  // namespace relay::comm
