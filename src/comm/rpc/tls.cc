// The TLS files the server and the client are given, checked before gRPC
// sees them: gRPC reports a certificate it cannot use only as a server that
// does not start ("cannot listen") or a client whose handshakes fail;
// OpenSSL (which gRPC itself links) says what is wrong first.

#include "comm/rpc/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "relay/comm/rpc/server.h"
#include "relay/common/file_io.h"

namespace relay::comm {
namespace {

struct OpenSslFree {
  void operator()(BIO* b) const { BIO_free(b); }
  void operator()(X509* x) const { X509_free(x); }
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
template <typename T>
using SslPtr = std::unique_ptr<T, OpenSslFree>;

// OpenSSL's passphrase callback: none is given, so an encrypted key fails to
// load instead of OpenSSL prompting on the terminal (gRPC cannot use an
// encrypted key either).
int no_passphrase(char*, int, int, void*) { return -1; }

// The first certificate in `pem`, or null. Leaves OpenSSL's error queue
// (thread-local, shared with gRPC) empty.
SslPtr<X509> first_certificate(const std::string& pem) {
  SslPtr<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  SslPtr<X509> cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, no_passphrase, nullptr) : nullptr);
  ERR_clear_error();
  return cert;
}

SslPtr<EVP_PKEY> private_key(const std::string& pem) {
  SslPtr<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  SslPtr<EVP_PKEY> key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr)
                           : nullptr);
  ERR_clear_error();
  return key;
}

Status no_certificate(const std::string& path, const std::string& pem, const char* what) {
  std::string hint;
  if (absl::StrContains(pem, "PRIVATE KEY-----")) {
    hint = "; it holds a private key instead";
    if (std::string_view(what) == "tls cert_file") hint += " (cert_file and key_file swapped?)";
  }
  return InvalidArgumentError(absl::StrCat(
      what, " ", path, ": no PEM certificate in it (a -----BEGIN CERTIFICATE----- block)", hint));
}

}  // namespace

StatusOr<std::string> read_pem(const std::string& path, const char* what) {
  if (path.empty()) return InvalidArgumentError(absl::StrCat(what, ": no file given"));
  StatusOr<std::string> text = read_file(path);
  if (!text.ok()) {
    // read_file's message starts with the path; it is said once.
    absl::string_view why = text.status().message();
    if (absl::StartsWith(why, path + ": ")) why.remove_prefix(path.size() + 2);
    return Status(text.status().code(), absl::StrCat(what, " ", path, ": ", why));
  }
  return text;
}

// `pem` (read from `path`) holds at least one PEM certificate.
Status check_certificates(const std::string& path, const std::string& pem, const char* what) {
  if (!first_certificate(pem)) return no_certificate(path, pem, what);
  return OkStatus();
}

// The certificate chain and private key of one side of a TLS connection:
// both PEM, the key unencrypted and the private half of the chain's first
// (leaf) certificate.
Status check_key_pair(const std::string& cert_file, const std::string& cert_pem,
                      const std::string& key_file, const std::string& key_pem) {
  SslPtr<X509> cert = first_certificate(cert_pem);
  if (!cert) return no_certificate(cert_file, cert_pem, "tls cert_file");
  SslPtr<EVP_PKEY> key = private_key(key_pem);
  if (!key) {
    if (absl::StrContains(key_pem, "ENCRYPTED")) {
      return InvalidArgumentError(
          absl::StrCat("tls key_file ", key_file,
                       ": the private key is encrypted; gRPC needs it unencrypted "
                       "(openssl pkey -in KEY -out PLAIN_KEY)"));
    }
    return InvalidArgumentError(
        absl::StrCat("tls key_file ", key_file,
                     ": no PEM private key in it (a -----BEGIN PRIVATE KEY----- block, or "
                     "RSA/EC PRIVATE KEY)"));
  }
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return InvalidArgumentError(
        absl::StrCat("tls key_file ", key_file, " does not match the certificate in tls cert_file ",
                     cert_file, ": the key is not that certificate's private key"));
  }
  return OkStatus();
}

Status check_tls_key_pair(const std::string& cert_file, const std::string& key_file) {
  RELAY_ASSIGN_OR_RETURN(std::string cert, read_pem(cert_file, "tls cert_file"));
  RELAY_ASSIGN_OR_RETURN(std::string key, read_pem(key_file, "tls key_file"));
  return check_key_pair(cert_file, cert, key_file, key);
}

}  // namespace relay::comm
