// TLS and mTLS against real kilnd processes, with certificates made by the
// openssl CLI in the test (tests/server/test_pki.h): plaintext to a TLS port,
// a client that trusts the wrong CA, client certificates from an unknown CA,
// revoked (CRL) or mapped to no tenant are refused; tenants by certificate
// SAN and subject, and by API key over TLS, are honoured.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"
#include "tests/server/test_pki.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::TempDir;
using testing::TestPki;

constexpr char kAliceKey[] = "alice-tls-key";

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A TLS channel to kilnd trusting `ca` (a file of `pki`), presenting the
// client certificate `client` (none when empty).
std::shared_ptr<grpc::Channel> TlsChannel(const KilndProcess& kilnd, const TestPki& pki,
                                          const std::string& ca, const std::string& client = "") {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Slurp(pki.path(ca));
  if (!client.empty()) {
    ssl.pem_cert_chain = Slurp(pki.path(client + ".pem"));
    ssl.pem_private_key = Slurp(pki.path(client + ".key"));
  }
  return grpc::CreateChannel(kilnd.address(), grpc::SslCredentials(ssl));
}

// ServerInfo through `channel`; the tenant it names, or the failure.
grpc::Status Info(grpc::Channel& channel, const std::string& api_key, std::string* tenant) {
  auto stub = v1::Kiln::NewStub(std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  v1::ServerInfoResponse info;
  grpc::Status s = stub->ServerInfo(Context(api_key, absl::Seconds(20)).get(), {}, &info);
  *tenant = info.tenant();
  return s;
}

class ServerTls : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = TestPki::Create(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::make_unique<TestPki>(std::move(pki).value());
  }

  std::string TlsBlock(const std::string& extra = "") const {
    return absl::StrCat("tls { cert_file: \"", pki_->path("kilnd.pem"), "\" key_file: \"",
                        pki_->path("kilnd.key"), "\" ", extra, " }\n");
  }
  std::string MtlsBlock(const std::string& extra = "") const {
    return TlsBlock(absl::StrCat("client_ca_file: \"", pki_->path("ca.pem"), "\" ", extra));
  }
  // alice by API key; carol by certificate SAN; dave by certificate subject.
  static std::string Tenants() {
    return absl::StrCat(
        "tenants { name: \"alice\" api_key_sha256: \"", server::Sha256Hex(kAliceKey), "\" }\n",
        "tenants { name: \"carol\" client_cert_san: \"carol.clients.kiln\" }\n",
        "tenants { name: \"dave\" client_cert_subject: \"CN=dave,O=Kiln\" }\n");
  }

  std::unique_ptr<KilndProcess> Start(const std::string& config,
                                      std::vector<std::string> flags = {}) {
    std::string error;
    auto kilnd = KilndProcess::Start(
        {.cache_dir = cache_.path(), .config_text = config, .extra_flags = std::move(flags)},
        &error);
    EXPECT_NE(kilnd, nullptr) << error;
    return kilnd;
  }

  TempDir dir_, cache_;
  std::unique_ptr<TestPki> pki_;
};

TEST_F(ServerTls, PlaintextToTlsPortIsRefused) {
  auto kilnd = Start(TlsBlock());
  ASSERT_NE(kilnd, nullptr);
  std::string tenant;
  // KilndProcess's own channel is plaintext.
  grpc::Status plain = Info(*kilnd->channel(), "", &tenant);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  grpc::Status tls = Info(*TlsChannel(*kilnd, *pki_, "ca.pem"), "", &tenant);
  ASSERT_TRUE(tls.ok()) << tls.error_message();
  EXPECT_EQ(tenant, server::kOpenTenant);  // no tenants configured: the open tenant, on loopback
  EXPECT_NE(kilnd->Log().find("TLS"), std::string::npos) << kilnd->Log();
}

TEST_F(ServerTls, ClientTrustingAnotherCaIsRefused) {
  auto kilnd = Start(TlsBlock());
  ASSERT_NE(kilnd, nullptr);
  std::string tenant;
  grpc::Status s = Info(*TlsChannel(*kilnd, *pki_, "other-ca.pem"), "", &tenant);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(ServerTls, ClientCertificatesMapToTenants) {
  ASSERT_TRUE(pki_->MakeClient("carol", "carol", "DNS:carol.clients.kiln").ok());
  ASSERT_TRUE(pki_->MakeClient("dave", "dave", "DNS:whatever.example").ok());
  ASSERT_TRUE(pki_->MakeClient("mallory", "mallory", "DNS:mallory.clients.kiln").ok());
  ASSERT_TRUE(pki_->MakeClient("eve", "carol", "DNS:carol.clients.kiln", /*by_other_ca=*/true).ok());
  auto kilnd = Start(MtlsBlock() + Tenants());
  ASSERT_NE(kilnd, nullptr);
  std::string tenant;

  // By SAN and by subject.
  grpc::Status s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "carol"), "", &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tenant, "carol");
  s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "dave"), "", &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << kilnd->Log();
  EXPECT_EQ(tenant, "dave");

  // Without a certificate, the API key still works over TLS; nothing at all does not.
  auto plain_tls = TlsChannel(*kilnd, *pki_, "ca.pem");
  s = Info(*plain_tls, kAliceKey, &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tenant, "alice");
  EXPECT_EQ(Info(*plain_tls, "", &tenant).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // A certificate of the right CA that no tenant lists is refused, and says why.
  s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "mallory"), "", &tenant);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("CN=mallory,O=Kiln"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("maps to no tenant"), std::string::npos) << s.error_message();

  // Carol's certificate with alice's key: two identities, refused.
  s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "carol"), kAliceKey, &tenant);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();

  // Carol's names, signed by a CA kilnd does not trust: the handshake fails.
  s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "eve"), "", &tenant);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();

  // Tenancy holds by certificate as by key: carol's session is not dave's.
  auto carol = v1::Kiln::NewStub(TlsChannel(*kilnd, *pki_, "ca.pem", "carol"));
  auto dave = v1::Kiln::NewStub(TlsChannel(*kilnd, *pki_, "ca.pem", "dave"));
  v1::CreateSessionRequest create;
  create.mutable_graph()->set_text(testing::kAffineText);
  v1::CreateSessionResponse session;
  s = carol->CreateSession(Context().get(), create, &session);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  v1::CloseSessionResponse closed;
  EXPECT_EQ(dave->CloseSession(Context().get(), close, &closed).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(carol->CloseSession(Context().get(), close, &closed).ok());
}

TEST_F(ServerTls, RevokedClientCertificateIsRefused) {
  ASSERT_TRUE(pki_->MakeClient("carol", "carol", "DNS:carol.clients.kiln").ok());
  ASSERT_TRUE(pki_->MakeClient("dave", "dave", "DNS:dave.clients.kiln").ok());
  ASSERT_TRUE(pki_->Revoke("carol").ok());
  auto kilnd =
      Start(MtlsBlock(absl::StrCat("crl_dir: \"", pki_->crl_dir(), "\"")) + Tenants());
  ASSERT_NE(kilnd, nullptr);
  std::string tenant;
  grpc::Status s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "carol"), "", &tenant);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // The CRL is enforced, not every certificate refused: dave (not revoked) gets in.
  s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "dave"), "", &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << kilnd->Log();
  EXPECT_EQ(tenant, "dave");
}

TEST_F(ServerTls, RequiredClientCertificate) {
  ASSERT_TRUE(pki_->MakeClient("dave", "dave", "DNS:dave.clients.kiln").ok());
  auto kilnd = Start(MtlsBlock("require_client_cert: true") + Tenants());
  ASSERT_NE(kilnd, nullptr);
  std::string tenant;
  EXPECT_EQ(Info(*TlsChannel(*kilnd, *pki_, "ca.pem"), kAliceKey, &tenant).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  grpc::Status s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem", "dave"), "", &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tenant, "dave");
}

TEST_F(ServerTls, NonLoopbackNeedsTlsAndTenants) {
  std::string out;
  // Tenants but no TLS: refused, naming what is missing.
  const std::string tenants = Tenants();
  std::ofstream(dir_.path() + "/no-tls.textproto")
      << absl::StrCat("tenants { name: \"alice\" api_key_sha256: \"",
                      server::Sha256Hex(kAliceKey), "\" }\n");
  int code = testing::RunKilndToExit(
      {"--listen=0.0.0.0:0", "--metrics_listen=off", "--config=" + dir_.path() + "/no-tls.textproto",
       "--cache_dir=" + cache_.path()},
      &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("refusing to listen on 0.0.0.0:0 without TLS"), std::string::npos) << out;
  // TLS but no tenants: refused.
  code = testing::RunKilndToExit({"--listen=0.0.0.0:0", "--metrics_listen=off",
                                  "--tls_cert=" + pki_->path("kilnd.pem"),
                                  "--tls_key=" + pki_->path("kilnd.key"),
                                  "--cache_dir=" + cache_.path()},
                                 &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("without authentication"), std::string::npos) << out;
  // Both: serves (the flags turn TLS on as the config's tls block would).
  auto kilnd = Start(tenants, {"--listen=0.0.0.0:0", "--tls_cert=" + pki_->path("kilnd.pem"),
                               "--tls_key=" + pki_->path("kilnd.key"),
                               "--tls_client_ca=" + pki_->path("ca.pem")});
  ASSERT_NE(kilnd, nullptr);
  std::string tenant;
  grpc::Status s = Info(*TlsChannel(*kilnd, *pki_, "ca.pem"), kAliceKey, &tenant);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tenant, "alice");
}

TEST_F(ServerTls, BadTlsFilesFailAtStartNamingTheFile) {
  std::string out;
  // A key that is not the certificate's.
  int code = testing::RunKilndToExit(
      {"--listen=127.0.0.1:0", "--metrics_listen=off", "--tls_cert=" + pki_->path("kilnd.pem"),
       "--tls_key=" + pki_->path("ca.key"), "--cache_dir=" + cache_.path()},
      &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("is not the key of the certificate"), std::string::npos) << out;
  // A missing file.
  code = testing::RunKilndToExit(
      {"--listen=127.0.0.1:0", "--metrics_listen=off", "--tls_cert=" + pki_->path("nope.pem"),
       "--tls_key=" + pki_->path("kilnd.key"), "--cache_dir=" + cache_.path()},
      &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("tls.cert_file: cannot read"), std::string::npos) << out;
  EXPECT_NE(out.find("nope.pem"), std::string::npos) << out;
  // A key without its certificate.
  code = testing::RunKilndToExit({"--listen=127.0.0.1:0", "--metrics_listen=off",
                                  "--tls_key=" + pki_->path("kilnd.key"),
                                  "--cache_dir=" + cache_.path()},
                                 &out);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("tls.cert_file and tls.key_file go together"), std::string::npos) << out;
}

}  // namespace
}  // namespace kiln
