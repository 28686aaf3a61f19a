#include "relay/comm/rpc/grpc_trainer_client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "relay/common/file_io.h"

namespace relay::comm {
namespace {

// Two self-signed certificates with their keys (a/ and b/), an encrypted
// copy of a's key, made with the openssl command line (scripts/setup.sh
// installs it), once for the suite.
class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/relay_tls_files_" + std::to_string(::getpid()));
    std::filesystem::remove_all(*dir_);
    std::filesystem::create_directories(*dir_);
    const std::string cmd =
        "(cd " + *dir_ +
        " && for n in a b; do openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1"
        " -nodes -days 1 -subj /CN=127.0.0.1 -keyout $n.key -out $n.pem || exit 1; done"
        " && openssl pkey -in a.key -aes256 -passout pass:secret -out a.encrypted.key) > " +
        *dir_ + "/openssl.log 2>&1";
    ok_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(ok_) << "openssl failed; see " << *dir_ << "/openssl.log"; }

  static std::string file(const std::string& name) { return *dir_ + "/" + name; }
  static std::string message(const Status& s) { return std::string(s.message()); }

  static std::string* dir_;
  static bool ok_;
};
std::string* TlsFilesTest::dir_ = nullptr;
bool TlsFilesTest::ok_ = false;

TEST_F(TlsFilesTest, AMatchingPairPasses) {
  EXPECT_TRUE(check_tls_key_pair(file("a.pem"), file("a.key")).ok());
  EXPECT_TRUE(check_tls_key_pair(file("b.pem"), file("b.key")).ok());
}

TEST_F(TlsFilesTest, AKeyOfAnotherCertificateNamesBothFiles) {
  Status s = check_tls_key_pair(file("a.pem"), file("b.key"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message(s), "tls key_file " + file("b.key") +
                            " does not match the certificate in tls cert_file " + file("a.pem") +
                            ": the key is not that certificate's private key");
}

TEST_F(TlsFilesTest, FilesThatAreNotPemSaySo) {
  ASSERT_TRUE(write_file_atomic(file("junk.txt"), "not a certificate\n").ok());
  Status s = check_tls_key_pair(file("junk.txt"), file("a.key"));
  EXPECT_EQ(message(s), "tls cert_file " + file("junk.txt") +
                            ": no PEM certificate in it (a -----BEGIN CERTIFICATE----- block)");
  s = check_tls_key_pair(file("a.key"), file("a.pem"));
  EXPECT_NE(message(s).find("it holds a private key instead (cert_file and key_file swapped?)"),
            std::string::npos)
      << s;
  s = check_tls_key_pair(file("a.pem"), file("junk.txt"));
  EXPECT_EQ(message(s).rfind("tls key_file " + file("junk.txt") + ": no PEM private key", 0), 0u)
      << s;
  s = check_tls_key_pair(file("a.pem"), file("a.encrypted.key"));
  EXPECT_NE(message(s).find("the private key is encrypted"), std::string::npos) << s;
}

TEST_F(TlsFilesTest, AMissingFileIsNamedOnce) {
  Status s = check_tls_key_pair(file("nope.pem"), file("a.key"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(message(s), "tls cert_file " + file("nope.pem") + ": no such file");
  s = check_tls_key_pair(file("a.pem"), "");
  EXPECT_EQ(message(s), "tls key_file: no file given");
}

// The server checks before it listens: a mismatch is reported as one, not as
// "cannot listen on ...". So does a client presenting a certificate.
TEST_F(TlsFilesTest, ServerAndClientReportAMismatchNotAListenFailure) {
  ServerOptions o;
  o.tls.cert_file = file("a.pem");
  o.tls.key_file = file("b.key");
  auto server = RpcServer::start(o, {});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(message(server.status()), message(check_tls_key_pair(file("a.pem"), file("b.key"))));
  EXPECT_EQ(message(server.status()).find("cannot listen"), std::string::npos);

  o.tls.key_file = file("a.key");
  o.tls.client_ca_file = file("a.key");
  server = RpcServer::start(o, {});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(message(server.status()).rfind("tls client_ca_file " + file("a.key") + ": ", 0), 0u)
      << server.status();

  ClientOptions c;
  c.address = "127.0.0.1:1";
  c.tls.root_ca_file = file("a.pem");
  c.tls.cert_file = file("b.pem");
  c.tls.key_file = file("a.key");
  auto client = GrpcTrainerClient::connect(c);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(message(client.status()), message(check_tls_key_pair(file("b.pem"), file("a.key"))));
}

}  // namespace
}  // namespace relay::comm
