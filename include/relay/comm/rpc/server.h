#pragma once

// The transport's server half: starting the trainer's gRPC server on an
// address, with TLS when certificates are given (loopback defaults stay
// plaintext) and message size limits. What it serves is the services'
// business (comm/service/trainer_service.h).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "relay/common/status.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

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
// RpcServer::start and GrpcTrainerClient::connect check their pair with it.
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

}  // namespace relay::comm
