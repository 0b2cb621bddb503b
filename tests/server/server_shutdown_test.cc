// SIGTERM while a long run executes: the run finishes OK, health turns
// NOT_SERVING, new work gets UNAVAILABLE, and kilnd exits 0. Start-up
// refusals exit non-zero with a message.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

TEST(ServerShutdown, SigtermDrainsARunningRunAndExitsZero) {
  TempDir cache;
  std::string error;
  auto kilnd = KilndProcess::Start({.cache_dir = cache.path(), .extra_flags = {"--drain_timeout=60s"}},
                                   &error);
  ASSERT_NE(kilnd, nullptr) << error;
  auto stub = kilnd->Stub();
  // Warm the compile so the run itself is what takes the time.
  const v1::RunRequest slow = testing::SlowRequest(1024, 48);
  v1::CompileRequest compile;
  *compile.mutable_graph() = slow.graph();
  v1::CompileResponse compiled;
  ASSERT_TRUE(stub->Compile(Context().get(), compile, &compiled).ok());

  v1::RunResponse slow_resp;
  grpc::ClientContext slow_ctx;
  std::promise<grpc::Status> slow_done;
  const absl::Time t0 = absl::Now();
  stub->async()->Run(&slow_ctx, &slow, &slow_resp,
                     [&](grpc::Status s) { slow_done.set_value(std::move(s)); });
  for (int i = 0; i < 500; ++i) {
    const std::string m = testing::HttpGet(kilnd->metrics_port(), "/metrics");
    if (testing::MetricValue(m, "kiln_runs_in_flight", {{"tenant", "default"}}) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kilnd->Signal(SIGTERM);
  // Draining: health says NOT_SERVING, then new work is refused.
  int health = 1;
  for (int i = 0; i < 1000 && health != 2; ++i) {
    health = testing::HealthStatus(*kilnd->channel());
    if (health != 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(health, 2);
  v1::RunResponse refused_resp;
  const grpc::Status refused = stub->Run(Context().get(), testing::AffineRequest(), &refused_resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_NE(refused.error_message().find("shutting down"), std::string::npos)
      << refused.error_message();
  v1::ServerInfoResponse info;
  EXPECT_EQ(stub->ServerInfo(Context().get(), {}, &info).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  const grpc::Status s = slow_done.get_future().get();
  const absl::Duration took = absl::Now() - t0;
  EXPECT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(slow_resp.outputs_size(), 1);
  EXPECT_NEAR(testing::FromProto(slow_resp.outputs(0).tensor()).GetAsDouble(0), 1024, 1e-2);
  EXPECT_EQ(kilnd->WaitExit(absl::Seconds(60)), 0) << kilnd->Log();
  const std::string log = kilnd->Log();
  EXPECT_NE(log.find("received SIGTERM"), std::string::npos) << log;
  EXPECT_NE(log.find("exit 0"), std::string::npos) << log;
  std::cerr << "slow run took " << absl::FormatDuration(took) << "\n";
  if (::testing::Test::HasFailure()) std::cerr << "kilnd log:\n" << log;
}

TEST(ServerShutdown, SigintWhenIdleExitsZero) {
  TempDir cache;
  std::string error;
  auto kilnd = KilndProcess::Start({.cache_dir = cache.path()}, &error);
  ASSERT_NE(kilnd, nullptr) << error;
  kilnd->Signal(SIGINT);
  EXPECT_EQ(kilnd->WaitExit(absl::Seconds(30)), 0) << kilnd->Log();
}

TEST(ServerStartup, RefusesNonLoopbackWithoutAuth) {
  TempDir cache;
  std::string out;
  const int code = testing::RunKilndToExit(
      {"--listen=0.0.0.0:0", "--metrics_listen=off", absl::StrCat("--cache_dir=", cache.path())},
      &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("refusing to listen on 0.0.0.0:0 without authentication"), std::string::npos)
      << out;
}

TEST(ServerStartup, ModelRepositoryThatIsNotADirectoryIsRefused) {
  TempDir cache;
  std::string out;
  const int code = testing::RunKilndToExit({"--listen=127.0.0.1:0", "--metrics_listen=off",
                                            absl::StrCat("--cache_dir=", cache.path()),
                                            absl::StrCat("--model_repository=", cache.path(), "/absent")},
                                           &out);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("/absent\" is not a directory"), std::string::npos) << out;
}

// API keys must not cross the network in plaintext: tenants alone are not
// enough off loopback (ServerTls.NonLoopbackNeedsTlsAndTenants starts one with both).
TEST(ServerStartup, NonLoopbackWithTenantsButNoTlsIsRefused) {
  TempDir cache;
  std::string out;
  const std::string config = cache.path() + "/tenants.textproto";
  std::ofstream(config) << absl::StrCat("tenants { name: \"t\" api_key_sha256: \"",
                                        server::Sha256Hex("k"), "\" }");
  const int code = testing::RunKilndToExit(
      {"--listen=0.0.0.0:0", "--metrics_listen=off", "--config=" + config,
       absl::StrCat("--cache_dir=", cache.path())},
      &out);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("refusing to listen on 0.0.0.0:0 without TLS"), std::string::npos) << out;
}

TEST(ServerStartup, BadConfigNamesTheLine) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.textproto";
  std::ofstream(path) << "listen: \"127.0.0.1:0\"\nlimits { max_nodez: 3 }\n";
  std::string out;
  const int code = testing::RunKilndToExit(
      {absl::StrCat("--config=", path), "--metrics_listen=off",
       absl::StrCat("--cache_dir=", dir.path())},
      &out);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("bad.textproto:2:"), std::string::npos) << out;
  EXPECT_NE(out.find("max_nodez"), std::string::npos) << out;
}

TEST(ServerStartup, PortInUseFails) {
  TempDir cache;
  std::string error;
  auto first = KilndProcess::Start({.cache_dir = cache.path()}, &error);
  ASSERT_NE(first, nullptr) << error;
  std::string out;
  const int code = testing::RunKilndToExit(
      {absl::StrCat("--listen=127.0.0.1:", first->port()), "--metrics_listen=off",
       absl::StrCat("--cache_dir=", cache.path())},
      &out);
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("cannot listen on 127.0.0.1:"), std::string::npos) << out;
}

}  // namespace
}  // namespace kiln
