// Tenants against one kilnd with three configured tenants: keys (missing,
// malformed, unknown), isolation of sessions and reports, and each quota.
#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "tests/e2e/models.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::AddTensor;
using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

constexpr char kAlice[] = "alice-secret-key";
constexpr char kBob[] = "bob-secret-key";
constexpr char kCarol[] = "carol-secret-key";

std::string TenantsConfig() {
  using server::Sha256Hex;
  return absl::StrCat(R"(
tenants {
  name: "alice"
  api_key_sha256: ")", Sha256Hex(kAlice), R"("
  weight: 2
  quota { max_sessions: 3 max_param_bytes: 100000 max_in_flight: 3 max_queue: 1
          max_request_bytes: 200000 }
}
tenants {
  name: "bob"
  api_key_sha256: ")", Sha256Hex(kBob), R"("
  quota { max_sessions: 1 max_in_flight: 1 }
}
tenants {
  name: "carol"
  api_key_sha256: ")", Sha256Hex(kCarol), R"("
  quota { max_param_bytes: 10000000 max_device_memory_bytes: 1000000 }
}
)");
}

class ServerTenants : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_->path(),
                                  .config_text = TenantsConfig(),
                                  .extra_flags = {"--max_concurrent_runs=1"}},
                                 &error)
                 .release();
    ASSERT_NE(kilnd_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete cache_;
  }
  void SetUp() override { stub_ = kilnd_->Stub(); }
  void TearDown() override {
    if (HasFailure()) std::cerr << "kilnd log:\n" << kilnd_->Log();
  }

  std::string NewSession(const std::string& key, grpc::Status* status = nullptr) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(testing::kAffineText);
    v1::CreateSessionResponse resp;
    grpc::Status s = stub_->CreateSession(Context(key).get(), req, &resp);
    if (status) *status = s;
    return resp.session_id();
  }
  grpc::Status Close(const std::string& key, const std::string& id) {
    v1::CloseSessionRequest req;
    req.set_session_id(id);
    v1::CloseSessionResponse resp;
    return stub_->CloseSession(Context(key).get(), req, &resp);
  }
  grpc::Status RunSession(const std::string& key, const std::string& id) {
    v1::RunRequest req;
    req.set_session_id(id);
    AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {1, 3}, {1, 2, 3});
    v1::RunResponse resp;
    return stub_->Run(Context(key).get(), req, &resp);
  }
  static std::map<std::string, HostTensor> AffineParams() {
    std::map<std::string, HostTensor> p;
    p.emplace("w", HostTensor::FromVector(v1::DTYPE_F32, {3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6}));
    p.emplace("b", HostTensor::FromVector(v1::DTYPE_F32, {2}, std::vector<float>{1, 1}));
    return p;
  }

  static TempDir* cache_;
  static KilndProcess* kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TempDir* ServerTenants::cache_ = nullptr;
KilndProcess* ServerTenants::kilnd_ = nullptr;

TEST_F(ServerTenants, KeysMapToTenants) {
  v1::ServerInfoResponse info;
  ASSERT_TRUE(stub_->ServerInfo(Context(kAlice).get(), {}, &info).ok());
  EXPECT_EQ(info.tenant(), "alice");
  ASSERT_TRUE(stub_->ServerInfo(Context(kBob).get(), {}, &info).ok());
  EXPECT_EQ(info.tenant(), "bob");

  grpc::Status s = stub_->ServerInfo(Context().get(), {}, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("missing API key"), std::string::npos) << s.error_message();

  s = stub_->ServerInfo(Context("not-a-key").get(), {}, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("unknown API key"), std::string::npos) << s.error_message();

  grpc::ClientContext basic;
  basic.AddMetadata("authorization", "Basic YWxpY2U6cHc=");
  s = stub_->ServerInfo(&basic, {}, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("Bearer"), std::string::npos) << s.error_message();

  // Every RPC checks the key, streams included.
  v1::RunResponse resp;
  EXPECT_EQ(stub_->Run(Context("nope").get(), testing::AffineRequest(), &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(testing::UploadParams(*stub_, "s-x", AffineParams(), 8, "nope").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ServerTenants, AnotherTenantsSessionIsNotFound) {
  const std::string a = NewSession(kAlice);
  ASSERT_FALSE(a.empty());
  ASSERT_TRUE(testing::UploadParams(*stub_, a, AffineParams(), 16, kAlice).ok());
  ASSERT_TRUE(RunSession(kAlice, a).ok());

  const grpc::Status unknown = RunSession(kBob, "s-does-not-exist");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  // Bob can neither run, read, write nor close Alice's session, and the
  // answer is the one for an id that does not exist.
  grpc::Status s = RunSession(kBob, a);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(),
            absl::StrCat("session \"", a, "\"", unknown.error_message().substr(
                                                  unknown.error_message().find("\" not") + 1)));
  EXPECT_EQ(testing::UploadParams(*stub_, a, AffineParams(), 16, kBob).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::GetParamsRequest get;
  get.set_session_id(a);
  auto ctx = Context(kBob);
  auto reader = stub_->GetParams(ctx.get(), get);
  v1::ParamChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Close(kBob, a).error_code(), grpc::StatusCode::NOT_FOUND);

  // Nor see Alice's reports.
  v1::RunRequest req;
  req.set_session_id(a);
  AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {1, 3}, {1, 2, 3});
  v1::RunResponse run;
  ASSERT_TRUE(stub_->Run(Context(kAlice).get(), req, &run).ok());
  v1::GetReportRequest by_id;
  by_id.set_request_id(run.request_id());
  v1::GetReportResponse reports;
  EXPECT_EQ(stub_->GetReport(Context(kBob).get(), by_id, &reports).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(stub_->GetReport(Context(kAlice).get(), by_id, &reports).ok());
  EXPECT_EQ(reports.reports(0).tenant(), "alice");

  // Alice's session is intact.
  EXPECT_TRUE(RunSession(kAlice, a).ok());
  EXPECT_TRUE(Close(kAlice, a).ok());
}

TEST_F(ServerTenants, SessionQuota) {
  grpc::Status s;
  const std::string first = NewSession(kBob, &s);
  ASSERT_TRUE(s.ok()) << s.error_message();
  NewSession(kBob, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max_sessions = 1"), std::string::npos) << s.error_message();
  ASSERT_TRUE(Close(kBob, first).ok());
  const std::string again = NewSession(kBob, &s);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(Close(kBob, again).ok());
}

TEST_F(ServerTenants, ParamBytesQuotaIsCheckedBeforeUpload) {
  // Alice may hold 100000 param bytes; the MLP's first layer alone is more.
  models::Model m = models::Mlp(1, {64, 512, 10});
  v1::CreateSessionRequest req;
  *req.mutable_graph()->mutable_graph() = m.graph;
  v1::CreateSessionResponse created;
  ASSERT_TRUE(stub_->CreateSession(Context(kAlice).get(), req, &created).ok());
  grpc::Status s = testing::UploadParams(*stub_, created.session_id(), m.params, 1 << 16, kAlice);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max_param_bytes = 100000"), std::string::npos)
      << s.error_message();
  // Nothing was bound, and the charge was given back: a small upload fits.
  const std::string small = NewSession(kAlice);
  EXPECT_TRUE(testing::UploadParams(*stub_, small, AffineParams(), 16, kAlice).ok());
  EXPECT_TRUE(Close(kAlice, small).ok());
  EXPECT_TRUE(Close(kAlice, created.session_id()).ok());
}

TEST_F(ServerTenants, DeviceMemoryQuota) {
  // Carol may hold 10 MB of params but only 1 MB of device memory.
  models::Model m = models::Mlp(1, {256, 1024, 10});  // 1 MiB + 40 KiB of weights
  v1::CreateSessionRequest req;
  *req.mutable_graph()->mutable_graph() = m.graph;
  v1::CreateSessionResponse created;
  ASSERT_TRUE(stub_->CreateSession(Context(kCarol).get(), req, &created).ok());
  grpc::Status s = testing::UploadParams(*stub_, created.session_id(), m.params, 1 << 16, kCarol);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max_device_memory_bytes = 1000000"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(Close(kCarol, created.session_id()).ok());
}

TEST_F(ServerTenants, RequestBytesQuota) {
  v1::RunRequest req = testing::AffineRequest();
  req.clear_inputs();
  std::vector<double> big(3 * 20000, 0.5);
  AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {20000, 3}, big);  // 240 KB
  v1::RunResponse resp;
  grpc::Status s = stub_->Run(Context(kAlice).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max_request_bytes = 200000"), std::string::npos)
      << s.error_message();
  // Bob's quota is the default (the message limit): the same request runs.
  s = stub_->Run(Context(kBob).get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// One worker (--max_concurrent_runs=1): Bob's slow run holds it while the
// in-flight and queue quotas are probed.
TEST_F(ServerTenants, InFlightAndQueueQuotas) {
  const v1::RunRequest slow = testing::SlowRequest(1024, 48);
  v1::RunResponse slow_resp;
  grpc::ClientContext slow_ctx;
  slow_ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kBob));
  std::promise<grpc::Status> slow_done;
  stub_->async()->Run(&slow_ctx, &slow, &slow_resp,
                      [&](grpc::Status s) { slow_done.set_value(std::move(s)); });
  // Wait until it runs on the device (compiled, out of the queue).
  for (int i = 0; i < 500; ++i) {
    const std::string m = testing::HttpGet(kilnd_->metrics_port(), "/metrics");
    if (testing::MetricValue(m, "kiln_runs_running", {{"tenant", "bob"}}) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Bob has one run in flight, his quota.
  v1::RunResponse resp;
  grpc::Status s = stub_->Run(Context(kBob).get(), testing::AffineRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max_in_flight = 1"), std::string::npos) << s.error_message();

  // Alice's first run waits in her queue on the CPU (max_queue 1) behind Bob's;
  // the second finds it full.
  v1::RunRequest alice_req = testing::AffineRequest();
  v1::RunResponse queued_resp;
  grpc::ClientContext queued_ctx;
  queued_ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kAlice));
  std::promise<grpc::Status> queued_done;
  stub_->async()->Run(&queued_ctx, &alice_req, &queued_resp,
                      [&](grpc::Status st) { queued_done.set_value(std::move(st)); });
  for (int i = 0; i < 500; ++i) {
    const std::string m = testing::HttpGet(kilnd_->metrics_port(), "/metrics");
    if (testing::MetricValue(m, "kiln_runs_queued", {{"tenant", "alice"}}) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  s = stub_->Run(Context(kAlice).get(), testing::AffineRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("max_queue = 1"), std::string::npos) << s.error_message();

  const grpc::Status slow_status = slow_done.get_future().get();
  EXPECT_TRUE(slow_status.ok()) << slow_status.error_message();
  ASSERT_EQ(slow_resp.outputs_size(), 1);
  // Every entry stays 1/1024: the sum is 1024.
  EXPECT_NEAR(testing::FromProto(slow_resp.outputs(0).tensor()).GetAsDouble(0), 1024, 1e-2);
  const grpc::Status queued_status = queued_done.get_future().get();
  EXPECT_TRUE(queued_status.ok()) << queued_status.error_message();
}

// A long elementwise chain: `nodes` nodes, distinct per `salt` (no cache hit).
std::string LongChainText(int nodes, int salt) {
  std::string text = absl::StrCat("graph \"chain_", salt, "\"\ninput x: f32[8]\nlet a0 = x + ",
                                  salt, ".0\n");
  for (int i = 1; i < nodes; ++i) {
    absl::StrAppend(&text, "let a", i, " = ", i % 2 ? "tanh(a" : "a", i - 1,
                    i % 2 ? ")\n" : " * 0.5\n");
  }
  absl::StrAppend(&text, "out y = a", nodes - 1, "\n");
  return text;
}

// The work pool is fair across tenants: while one tenant's two large compiles
// are in it (its quota max_concurrent_compiles = 1 lets one run at a time),
// another tenant's 3-node compile runs at once on another thread instead of
// waiting behind them.
TEST_F(ServerTenants, LargeCompilesOfOneTenantDoNotDelayAnothersSmallOne) {
  struct Pending {
    v1::CompileRequest req;
    v1::CompileResponse resp;
    grpc::ClientContext ctx;
    std::promise<grpc::Status> done;
  };
  std::vector<std::unique_ptr<Pending>> large;
  for (int i = 0; i < 2; ++i) {
    auto p = std::make_unique<Pending>();
    p->req.mutable_graph()->set_text(LongChainText(12000, 1000 + i + static_cast<int>(::getpid())));
    p->ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kCarol));
    Pending* raw = p.get();
    stub_->async()->Compile(&raw->ctx, &raw->req, &raw->resp,
                            [raw](grpc::Status st) { raw->done.set_value(std::move(st)); });
    large.push_back(std::move(p));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  v1::CompileRequest small;
  small.mutable_graph()->set_text(testing::kAffineText);
  small.add_input_shapes()->set_name("x");
  small.mutable_input_shapes(0)->add_dims(2);
  small.mutable_input_shapes(0)->add_dims(3);
  v1::CompileResponse small_resp;
  const grpc::Status small_status = stub_->Compile(Context(kBob).get(), small, &small_resp);
  ASSERT_TRUE(small_status.ok()) << small_status.error_message();
  // Neither of Carol's compiles has finished (each takes seconds here): the
  // small one did not wait for a thread they held. Both are looked at before
  // either is waited for: they may finish in either order, and waiting for
  // one first would let the other finish in the meantime.
  std::vector<std::future<grpc::Status>> futures;
  for (auto& p : large) futures.push_back(p->done.get_future());
  for (auto& f : futures) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
        << "the small compile waited for a large one";
  }
  for (auto& f : futures) {
    const grpc::Status st = f.get();
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
}

}  // namespace
}  // namespace kiln
