// kilnd's configuration in-process: defaults, textproto parsing, flag
// overrides, validation, and the shipped configs/*.textproto.
#include "server/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "server/tenants.h"

namespace kiln::server {
namespace {

TEST(ServerConfig, EmptyConfigHasWorkingDefaults) {
  auto c = LoadConfig("", {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen(), "127.0.0.1:7450");
  EXPECT_EQ(c->metrics_listen(), "127.0.0.1:9450");
  EXPECT_FALSE(c->cache_dir().empty());
  EXPECT_EQ(c->drain_timeout_seconds(), 30);
  EXPECT_EQ(c->max_concurrent_runs(), 2);
  EXPECT_EQ(c->reports_per_tenant(), 64);
  EXPECT_GT(c->limits().max_message_bytes(), 4 << 20);
  EXPECT_EQ(c->default_quota().max_request_bytes(), c->limits().max_message_bytes());
  EXPECT_GT(c->default_quota().max_sessions(), 0);
  EXPECT_GT(c->default_quota().max_queue(), 0);
  EXPECT_EQ(c->limits().max_while_iterations(), 1000000);
  EXPECT_TRUE(c->plugin_dir().empty());
}

TEST(ServerConfig, FlagsOverrideTheFile) {
  auto parsed = ParseConfigText("listen: \"127.0.0.1:1\"\ndrain_timeout_seconds: 5\n", "x");
  ASSERT_TRUE(parsed.ok());
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/kilnd_flags.textproto";
  std::ofstream(path) << "listen: \"127.0.0.1:1\"\ndrain_timeout_seconds: 5\ncpu_threads: 3\n";
  FlagOverrides flags;
  flags.listen = "127.0.0.1:2";
  auto c = LoadConfig(path, flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen(), "127.0.0.1:2");
  EXPECT_EQ(c->drain_timeout_seconds(), 5);
  EXPECT_EQ(c->cpu_threads(), 3);
}

TEST(ServerConfig, TenantQuotasInheritTheDefaultQuota) {
  auto c = ParseConfigText(R"(
default_quota { max_sessions: 7 }
tenants { name: "a" api_key_sha256: "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
          quota { max_queue: 3 } }
)", "t");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyDefaults(*c);
  ASSERT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(c->tenants(0).quota().max_sessions(), 7);
  EXPECT_EQ(c->tenants(0).quota().max_queue(), 3);
  EXPECT_EQ(c->tenants(0).weight(), 1);
  EXPECT_EQ(c->tenants(0).api_key_sha256(0),
            "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789");
}

TEST(ServerConfig, RejectsWhatCannotWork) {
  auto check = [](const std::string& text, const std::string& needle) {
    auto c = ParseConfigText(text, "t");
    ASSERT_TRUE(c.ok()) << c.status();
    ApplyDefaults(*c);
    absl::Status s = ValidateConfig(*c);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  check("listen: \"0.0.0.0:7450\"",
        "refusing to listen on 0.0.0.0:7450 without authentication and TLS");
  check("tenants { name: \"a\" }", "has no api_key_sha256 and no client_cert_san");
  check("tenants { name: \"a\" client_cert_san: \"a.example\" }", "needs mTLS");
  check("tls { cert_file: \"c.pem\" }", "tls.cert_file and tls.key_file go together");
  check("tls { client_ca_file: \"ca.pem\" }", "need TLS");
  check("model_repository { root: \"/srv\" max_model_bytes: -1 }", "max_model_bytes must be >= 0");
  check("limits { max_while_iterations: -5 }", "limits.max_while_iterations is -5; must be > 0");
  check("model_repository { root: \"/srv\" poll_seconds: nan }", "poll_seconds must be a number");
  check("tls { cert_file: \"c.pem\" key_file: \"k.pem\" crl_dir: \"crl\" }",
        "set tls.client_ca_file");
  check(R"(tls { cert_file: "c" key_file: "k" client_ca_file: "ca" }
           tenants { name: "a" client_cert_san: "x" }
           tenants { name: "b" client_cert_san: "x" })",
        "client_cert_san \"x\" is listed twice");
  check(R"(listen: "0.0.0.0:1"
           tenants { name: "a" api_key_sha256: "0000000000000000000000000000000000000000000000000000000000000000" })",
        "refusing to listen on 0.0.0.0:1 without TLS");
  check(R"(listen: "0.0.0.0:1" tls { cert_file: "c" key_file: "k" })",
        "refusing to listen on 0.0.0.0:1 without authentication:");
  check("tenants { name: \"a\" api_key_sha256: \"secret\" }", "not 64 hex digits");
  check(R"(tenants { name: "a" api_key_sha256: "0000000000000000000000000000000000000000000000000000000000000000" }
           tenants { name: "a" api_key_sha256: "1111111111111111111111111111111111111111111111111111111111111111" })",
        "two tenants are named \"a\"");
  check(R"(tenants { name: "a" api_key_sha256: "0000000000000000000000000000000000000000000000000000000000000000" }
           tenants { name: "b" api_key_sha256: "0000000000000000000000000000000000000000000000000000000000000000" })",
        "listed for two tenants");
  check("model_repository { root: \"/srv\" models { name: \"m\" batching { max_batch: 1025 } } }",
        "model_repository.models[0].batching.max_batch is 1025; it must be 0 or 1 (off) or 2..1024");
  check("model_repository { root: \"/srv\" models { name: \"m\" batching { max_batch: 4 "
        "max_queue_delay_micros: 9223372036854775807 } } }",
        "model_repository.models[0].batching.max_queue_delay_micros is 9223372036854775807");
  check("model_repository { root: \"/srv\" models { name: \"../m\" } }",
        "model_repository.models[0].name");
  check("model_repository { root: \"/srv\" models { name: \"m\" } models { name: \"m\" } }",
        "model_repository.models[1].name \"m\" is also model_repository.models[0].name");
  check("limits { max_nodes: -1 }", "limits.max_nodes");
  check("default_quota { max_queue: -2 }", "default_quota.max_queue");
  check("max_concurrent_runs: -1", "max_concurrent_runs");

  auto bad = ParseConfigText("listen: 7450\n", "f.textproto");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.textproto:1:"), std::string::npos) << bad.status();
}

TEST(ServerConfig, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:7450", "127.1.2.3:0", "localhost:1", "[::1]:7450",
                        "unix:/tmp/kilnd.sock", "ipv4:127.0.0.1:5"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:7450", "[::]:7450", "10.0.0.1:7450", "example.com:1",
                        "127.0.0.1.evil.com:1", "1270.0.0.1:3"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(ServerConfig, Sha256OfKnownVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ServerConfig, ShippedConfigsLoad) {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  for (const char* name : {"kilnd.textproto", "multi-tenant.textproto"}) {
    SCOPED_TRACE(name);
    auto c = LoadConfig(std::string(src) + "/configs/" + name, {});
    ASSERT_TRUE(c.ok()) << c.status();
    auto tenants = TenantRegistry::Create(*c);
    ASSERT_TRUE(tenants.ok());
    if (std::string(name) == "multi-tenant.textproto") {
      EXPECT_FALSE((*tenants)->open());
      EXPECT_EQ((*tenants)->tenants().size(), 3u);
      EXPECT_FALSE(c->tls().cert_file().empty());
      EXPECT_FALSE(c->tls().client_ca_file().empty());
      // The keys the example documents map to their tenants.
      auto alice = (*tenants)->Authenticate("Bearer alice-example-key");
      ASSERT_TRUE(alice.ok()) << alice.status();
      EXPECT_EQ((*alice)->name(), "alice");
      auto bob = (*tenants)->Authenticate("bearer bob-example-key");
      ASSERT_TRUE(bob.ok()) << bob.status();
      EXPECT_EQ((*bob)->name(), "bob");
      // carol is identified by her client certificate's subject or SAN.
      server::PeerIdentity carol{.has_certificate = true, .subject = "CN=carol,O=Kiln"};
      auto by_subject = (*tenants)->Authenticate(std::nullopt, carol);
      ASSERT_TRUE(by_subject.ok()) << by_subject.status();
      EXPECT_EQ((*by_subject)->name(), "carol");
      carol = {.has_certificate = true, .subject = "CN=x", .sans = {"carol.clients.kiln"}};
      auto by_san = (*tenants)->Authenticate(std::nullopt, carol);
      ASSERT_TRUE(by_san.ok()) << by_san.status();
      EXPECT_EQ((*by_san)->name(), "carol");
      EXPECT_TRUE((*tenants)->IsAdmin(**alice));
      EXPECT_FALSE((*tenants)->IsAdmin(**bob));
      EXPECT_EQ((*tenants)->Authenticate(std::nullopt).status().code(),
                absl::StatusCode::kUnauthenticated);
    } else {
      EXPECT_TRUE((*tenants)->open());
    }
  }
}

}  // namespace
}  // namespace kiln::server
