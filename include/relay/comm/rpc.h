#pragma once

// Starting the trainer's gRPC server and connecting to it: TLS when
// certificates are given (loopback defaults stay plaintext), the bearer
// token on every client call, deadlines on every call, and message size
// limits on both ends.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/trajectory.h"

namespace grpc {
class Server;
class Service;
class Channel;
}  // namespace grpc

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

struct TlsOptions {
  std::string cert_file;       // server: its certificate chain (PEM); empty = plaintext
  std::string key_file;        // server: its private key
  std::string client_ca_file;  // server: require client certificates signed by this CA
  std::string root_ca_file;    // client: the CA that signed the server's certificate
};

struct ServerOptions {
  std::string address = "127.0.0.1:0";  // port 0 = any free port (see RpcServer::port)
  TlsOptions tls;
  int64_t max_message_bytes = int64_t{64} << 20;
};

// What gRPC would report only as a server that "cannot listen" or a client
// whose handshakes fail, said up front: `cert_file` exists and holds a PEM
// certificate (chain), `key_file` an unencrypted PEM private key, and the key
// is the private half of the chain's first certificate. InvalidArgument
// naming the file, or both files for a mismatch; NotFound for a missing one.
// RpcServer::start and TrainerClient::connect check their pair with it.
Status check_tls_key_pair(const std::string& cert_file, const std::string& key_file);

class RpcServer {
 public:
  // Errors name the address or the certificate file that failed (a
  // certificate and key that do not match: check_tls_key_pair).
  static StatusOr<std::unique_ptr<RpcServer>> start(const ServerOptions& options,
                                                    const std::vector<grpc::Service*>& services);
  ~RpcServer();
  int port() const { return port_; }
  // Stops accepting calls and waits up to `grace_ms` for running ones.
  void shutdown(int64_t grace_ms = 1000);

 private:
  RpcServer(std::unique_ptr<grpc::Server> server, int port);
  std::unique_ptr<grpc::Server> server_;
  int port_;
};

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

struct FetchedWeights {
  model::WeightManifest manifest;
  std::unordered_map<std::string, at::Tensor> tensors;  // verified against the digest
  // The trainer's version is the one the caller said it holds: no tensors
  // were transferred.
  bool already_held = false;
};

// The worker's side of the Worker service (and the operator's Admin calls).
// Errors keep the server's code and say which call failed.
class TrainerClient {
 public:
  static StatusOr<std::unique_ptr<TrainerClient>> connect(const ClientOptions& options);
  ~TrainerClient();

  StatusOr<v1::RegisterWorkerResponse> register_worker(const std::string& name,
                                                       const v1::WorkerCapabilities& caps);
  StatusOr<v1::HeartbeatResponse> heartbeat(const v1::HeartbeatRequest& request);
  StatusOr<v1::LeasePromptsResponse> lease_prompts(const std::string& worker_id, int max_prompts);
  // How many of `lease_ids` were still this worker's open leases.
  StatusOr<int32_t> release_leases(const std::string& worker_id,
                                   const std::vector<uint64_t>& lease_ids);
  // One stream: every group sent, one ack read back per group, in order.
  StatusOr<std::vector<v1::SubmitGroupAck>> submit_groups(
      const std::string& worker_id,
      const std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>>& groups);
  // Downloads `version` (-1 = latest) in chunks, checks each chunk's digest,
  // its offset, and the whole version's digest; DataLoss on any mismatch.
  // Chunks land in place (WeightAssembler). With `held` (the manifest of the
  // weights the caller has), a version with the same tensors and digest is
  // not transferred: the result has already_held set and no tensors.
  // DeadlineExceeded when nothing arrives for ClientOptions::timeout_ms.
  StatusOr<FetchedWeights> fetch_weights(const std::string& worker_id, int64_t version,
                                         uint64_t chunk_bytes = 0,
                                         const model::WeightManifest* held = nullptr);
  // The first version announced after `after_version`, or nullopt when none
  // arrives within `wait_ms`.
  StatusOr<std::optional<v1::VersionAnnouncement>> next_version(const std::string& worker_id,
                                                                int64_t after_version,
                                                                int64_t wait_ms);
  StatusOr<v1::StatsResponse> stats();

 private:
  class Impl;
  explicit TrainerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace relay::comm
