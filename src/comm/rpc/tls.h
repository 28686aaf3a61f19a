#pragma once

// Private to the transport (comm/rpc/): reading and checking the PEM files
// that RpcServer::start and GrpcTrainerClient::connect hand to gRPC.

#include <string>

#include "relay/common/status.h"

namespace relay::comm {

// The file's text; `what` ("tls cert_file") names it in errors.
StatusOr<std::string> read_pem(const std::string& path, const char* what);
// `pem` (read from `path`) holds at least one PEM certificate.
Status check_certificates(const std::string& path, const std::string& pem, const char* what);
// The certificate chain and private key of one side of a TLS connection:
// both PEM, the key unencrypted and the private half of the chain's first
// (leaf) certificate.
Status check_key_pair(const std::string& cert_file, const std::string& cert_pem,
                      const std::string& key_file, const std::string& key_pem);

}  // namespace relay::comm
