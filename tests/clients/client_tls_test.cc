// kiln::Client and kilnctl over TLS and mTLS against a real kilnd, with
// certificates made by the openssl CLI in the test (tests/server/test_pki.h):
// options and KILN_* environment variables, tenants by API key and by client
// certificate, and the errors a user sees for a wrong CA, a plaintext client
// or a certificate without its key.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "clients/cpp/client.h"
#include "tests/clients/kilnd_child.h"
#include "tests/server/test_pki.h"

namespace kiln {
namespace {

using testing::KilndChild;
using testing::RunProcess;
using testing::ScratchDir;
using testing::TestPki;

constexpr char kAliceKey[] = "alice-client-tls-key";

class ClientTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    cache_ = new ScratchDir();
    auto pki = TestPki::Create(dir_->path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new TestPki(std::move(pki).value());
    ASSERT_TRUE(pki_->MakeClient("carol", "carol", "DNS:carol.clients.kiln").ok());
    ASSERT_TRUE(pki_->MakeClient("mallory", "mallory", "DNS:mallory.clients.kiln").ok());
    const std::string config = dir_->path() + "/tenants.textproto";
    std::ofstream(config) << absl::StrCat(
        "tenants { name: \"alice\" api_key_sha256: \"", Sha256Hex(kAliceKey), "\" }\n",
        "tenants { name: \"carol\" client_cert_san: \"carol.clients.kiln\" }\n");
    auto k = KilndChild::Start(cache_->path(), "",
                               {"--config=" + config, "--tls_cert=" + pki_->path("kilnd.pem"),
                                "--tls_key=" + pki_->path("kilnd.key"),
                                "--tls_client_ca=" + pki_->path("ca.pem")});
    ASSERT_TRUE(k.ok()) << k.status();
    kilnd_ = k->release();
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete pki_;
    delete cache_;
    delete dir_;
  }

  static std::string Tenant(const ClientOptions& options, absl::StatusCode* code = nullptr) {
    auto client = Client::Create(kilnd_->addr(), options);
    if (!client.ok()) {
      if (code) *code = client.status().code();
      return "";
    }
    auto info = (*client)->ServerInfo();
    if (code) *code = info.status().code();
    return info.ok() ? info->tenant() : std::string(info.status().message());
  }

  static ScratchDir* dir_;
  static ScratchDir* cache_;
  static TestPki* pki_;
  static KilndChild* kilnd_;
};
ScratchDir* ClientTlsTest::dir_ = nullptr;
ScratchDir* ClientTlsTest::cache_ = nullptr;
TestPki* ClientTlsTest::pki_ = nullptr;
KilndChild* ClientTlsTest::kilnd_ = nullptr;

TEST_F(ClientTlsTest, ApiKeyAndClientCertificate) {
  ClientOptions by_key;
  by_key.tls = true;
  by_key.ca_file = pki_->path("ca.pem");
  by_key.api_key = kAliceKey;
  EXPECT_EQ(Tenant(by_key), "alice");

  ClientOptions by_cert;
  by_cert.ca_file = pki_->path("ca.pem");  // implies TLS
  by_cert.cert_file = pki_->path("carol.pem");
  by_cert.key_file = pki_->path("carol.key");
  EXPECT_EQ(Tenant(by_cert), "carol");

  absl::StatusCode code;
  by_cert.cert_file = pki_->path("mallory.pem");
  by_cert.key_file = pki_->path("mallory.key");
  Tenant(by_cert, &code);
  EXPECT_EQ(code, absl::StatusCode::kUnauthenticated);
}

TEST_F(ClientTlsTest, RefusedConnectionsSayUnavailable) {
  absl::StatusCode code;
  ClientOptions plain;
  plain.api_key = kAliceKey;
  Tenant(plain, &code);
  EXPECT_EQ(code, absl::StatusCode::kUnavailable);

  ClientOptions wrong_ca;
  wrong_ca.ca_file = pki_->path("other-ca.pem");
  wrong_ca.api_key = kAliceKey;
  Tenant(wrong_ca, &code);
  EXPECT_EQ(code, absl::StatusCode::kUnavailable);

  ClientOptions half;
  half.cert_file = pki_->path("carol.pem");
  Tenant(half, &code);
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);

  ClientOptions missing;
  missing.ca_file = pki_->path("nope.pem");
  auto c = Client::Create(kilnd_->addr(), missing);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nope.pem"), std::string::npos) << c.status();
}

TEST_F(ClientTlsTest, OptionsFromEnvironment) {
  setenv("KILN_CA", pki_->path("ca.pem").c_str(), 1);
  setenv("KILN_CERT", pki_->path("carol.pem").c_str(), 1);
  setenv("KILN_KEY", pki_->path("carol.key").c_str(), 1);
  setenv("KILN_TLS", "1", 1);
  const ClientOptions o = ClientOptions::FromEnvironment();
  unsetenv("KILN_CA");
  unsetenv("KILN_CERT");
  unsetenv("KILN_KEY");
  unsetenv("KILN_TLS");
  EXPECT_TRUE(o.tls);
  EXPECT_EQ(o.cert_file, pki_->path("carol.pem"));
  EXPECT_EQ(Tenant(o), "carol");
}

TEST_F(ClientTlsTest, KilnctlFlagsAndEnvironment) {
  const std::string addr = "--addr=" + kilnd_->addr();
  auto r = RunProcess({KILNCTL_PATH, addr, "--tls", "--ca", pki_->path("ca.pem"), "--cert",
                       pki_->path("carol.pem"), "--key", pki_->path("carol.key"), "cache",
                       "stats"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("tenant carol"), std::string::npos) << r.out;
  // A tenant that is not an admin sees its own cache counters, not the server's.
  EXPECT_EQ(r.out.find("cache dir"), std::string::npos) << r.out;

  r = RunProcess({KILNCTL_PATH, addr, "cache", "stats"},
                 {"KILN_TLS=1", "KILN_CA=" + pki_->path("ca.pem"),
                  absl::StrCat("KILN_API_KEY=", kAliceKey)});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("tenant alice"), std::string::npos) << r.out;

  r = RunProcess({KILNCTL_PATH, addr, "--api-key", kAliceKey, "devices"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("UNAVAILABLE"), std::string::npos) << r.err;

  r = RunProcess({KILNCTL_PATH, addr, "--cert", pki_->path("carol.pem"), "devices"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("needs its key"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kiln
