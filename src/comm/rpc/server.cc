#include "relay/comm/rpc/server.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "comm/rpc/tls.h"

namespace relay::comm {

RpcServer::RpcServer(std::unique_ptr<grpc::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

RpcServer::~RpcServer() { shutdown(0); }

StatusOr<std::unique_ptr<RpcServer>> RpcServer::start(const ServerOptions& options,
                                                      const std::vector<grpc::Service*>& services) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls.cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    RELAY_ASSIGN_OR_RETURN(pair.cert_chain, read_pem(options.tls.cert_file, "tls cert_file"));
    RELAY_ASSIGN_OR_RETURN(pair.private_key, read_pem(options.tls.key_file, "tls key_file"));
    RELAY_RETURN_IF_ERROR(check_key_pair(options.tls.cert_file, pair.cert_chain,
                                         options.tls.key_file, pair.private_key));
    ssl.pem_key_cert_pairs.push_back(pair);
    if (!options.tls.client_ca_file.empty()) {
      RELAY_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                             read_pem(options.tls.client_ca_file, "tls client_ca_file"));
      RELAY_RETURN_IF_ERROR(
          check_certificates(options.tls.client_ca_file, ssl.pem_root_certs, "tls client_ca_file"));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return UnavailableError(absl::StrCat("rpc server: cannot listen on ", options.address));
  }
  return std::unique_ptr<RpcServer>(new RpcServer(std::move(server), port));
}

void RpcServer::shutdown(int64_t grace_ms) {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server_->Wait();
  server_.reset();
}

}  // namespace relay::comm
