#pragma once

// The transport's client half: TrainerClient over gRPC, with TLS when a root
// CA is given, the bearer token and a deadline on every call, a stall
// watchdog instead of a deadline on weight downloads, and message size
// limits.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "relay/comm/rpc/server.h"
#include "relay/comm/rpc/trainer_client.h"
#include "relay/common/status.h"

namespace relay::comm {

struct ClientOptions {
  std::string address;     // host:port
  std::string auth_token;  // sent as "authorization: Bearer <token>"; empty = none
  TlsOptions tls;          // root_ca_file set = TLS
  // Deadline of every unary call and of a whole stream, except FetchWeights:
  // a weight transfer fails after this long without a byte, however long it
  // runs while bytes keep coming.
  int64_t timeout_ms = 10000;
  int64_t max_message_bytes = int64_t{64} << 20;
};

class GrpcTrainerClient final : public TrainerClient {
 public:
  // Checks the TLS files (check_tls_key_pair); the channel connects lazily,
  // so an unreachable trainer shows on the first call.
  static StatusOr<std::unique_ptr<TrainerClient>> connect(const ClientOptions& options);
  ~GrpcTrainerClient() override;

  StatusOr<v1::RegisterWorkerResponse> register_worker(const std::string& name,
                                                       const v1::WorkerCapabilities& caps) override;
  StatusOr<v1::HeartbeatResponse> heartbeat(const v1::HeartbeatRequest& request) override;
  StatusOr<v1::LeasePromptsResponse> lease_prompts(const std::string& worker_id,
                                                   int max_prompts) override;
  StatusOr<int32_t> release_leases(const std::string& worker_id,
                                   const std::vector<uint64_t>& lease_ids) override;
  // One stream: every group sent, one ack read back per group, in order.
  StatusOr<std::vector<v1::SubmitGroupAck>> submit_groups(
      const std::string& worker_id,
      const std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>>& groups) override;
  // Chunks, each checked against its digest and offset, land in place
  // (WeightAssembler), then the whole version's digest is checked.
  // DeadlineExceeded when nothing arrives for ClientOptions::timeout_ms.
  StatusOr<FetchedWeights> fetch_weights(const std::string& worker_id, int64_t version,
                                         uint64_t chunk_bytes = 0,
                                         const model::WeightManifest* held = nullptr,
                                         FetchCancel* cancel = nullptr) override;
  StatusOr<std::optional<v1::VersionAnnouncement>> next_version(const std::string& worker_id,
                                                                int64_t after_version,
                                                                int64_t wait_ms) override;
  StatusOr<v1::StatsResponse> stats() override;

 private:
  class Impl;
  explicit GrpcTrainerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace relay::comm
