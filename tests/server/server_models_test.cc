// kilnd end to end: the MLP and a BERT encoder layer through sessions with
// chunked params, one-shot runs from `.kiln` text, Compile, reports, devices,
// health and reflection, and the disk cache across a restart.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <random>
#include <thread>

#include "tests/e2e/models.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::Context;
using testing::FromProto;
using testing::KilndProcess;
using testing::TempDir;
using testing::ToProto;

class ServerModels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_->path()}, &error).release();
    ASSERT_NE(kilnd_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete cache_;
  }
  void TearDown() override {
    if (HasFailure() && kilnd_) std::cerr << "kilnd log:\n" << kilnd_->Log();
  }

  static std::string CreateSession(v1::Kiln::Stub& stub, const v1::Graph& graph,
                                   v1::CreateSessionResponse* response = nullptr) {
    v1::CreateSessionRequest req;
    *req.mutable_graph()->mutable_graph() = graph;
    v1::CreateSessionResponse local;
    v1::CreateSessionResponse* resp = response ? response : &local;
    grpc::Status s = stub.CreateSession(Context().get(), req, resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp->session_id();
  }

  static TempDir* cache_;
  static KilndProcess* kilnd_;
};

TempDir* ServerModels::cache_ = nullptr;
KilndProcess* ServerModels::kilnd_ = nullptr;

TEST_F(ServerModels, MlpThroughSessionWithChunkedParams) {
  auto stub = kilnd_->Stub();
  models::Model m = models::Mlp();
  v1::CreateSessionResponse created;
  const std::string session = CreateSession(*stub, m.graph, &created);
  ASSERT_FALSE(session.empty());
  ASSERT_EQ(created.signature().inputs_size(), 1);
  EXPECT_EQ(created.signature().inputs(0).name(), "x");
  EXPECT_EQ(created.signature().params_size(), 6);

  v1::SetParamsResponse uploaded;
  grpc::Status s = testing::UploadParams(*stub, session, m.params, 64 << 10, "", &uploaded);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(uploaded.params(), 6);
  int64_t total = 0;
  for (const auto& [name, t] : m.params) total += t.num_bytes();
  EXPECT_EQ(uploaded.bytes(), total);

  std::mt19937_64 rng(7);
  for (int64_t batch : {1, 3}) {
    HostTensor x = models::RandomF32(rng, {batch, 784}, 1.0);
    v1::RunRequest req;
    req.set_session_id(session);
    req.set_report(true);
    v1::NamedTensor* in = req.add_inputs();
    in->set_name("x");
    *in->mutable_tensor() = ToProto(x);
    for (int repeat = 0; repeat < 2; ++repeat) {
      v1::RunResponse resp;
      s = stub->Run(Context().get(), req, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_EQ(resp.outputs_size(), 1);
      EXPECT_EQ(resp.outputs(0).name(), "logits");
      const HostTensor got = FromProto(resp.outputs(0).tensor());
      EXPECT_LE(models::WorstError(got, models::MlpReference(m, x), 1e-4, 1e-4), 1.0);
      EXPECT_FALSE(resp.request_id().empty());
      EXPECT_EQ(resp.report().request_id(), resp.request_id());
      EXPECT_EQ(resp.report().tenant(), "default");
      EXPECT_GT(resp.report().steps_size(), 0);
      if (repeat == 1) {
        EXPECT_EQ(resp.report().compile().executable_cache(), v1::CACHE_HIT_MEMORY);
      }
    }
  }

  // GetParams streams the params back in chunks of the asked size.
  v1::GetParamsRequest get;
  get.set_session_id(session);
  get.add_names("w1");
  get.set_chunk_bytes(100000);
  auto ctx = Context();
  auto reader = stub->GetParams(ctx.get(), get);
  std::string w1;
  v1::ParamChunk chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.name(), "w1");
    EXPECT_EQ(chunk.offset(), static_cast<int64_t>(w1.size()));
    w1 += chunk.data();
    ++chunks;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(chunks, (784 * 512 * 4 + 99999) / 100000);
  EXPECT_EQ(w1, std::string(m.params.at("w1").bytes()));

  v1::CloseSessionRequest close;
  close.set_session_id(session);
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(stub->CloseSession(Context().get(), close, &closed).ok());
  v1::RunRequest after;
  after.set_session_id(session);
  v1::RunResponse resp;
  EXPECT_EQ(stub->Run(Context().get(), after, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerModels, EncoderLayerThroughSession) {
  auto stub = kilnd_->Stub();
  models::EncoderConfig c;
  models::Model m = models::EncoderLayer(c);
  const std::string session = CreateSession(*stub, m.graph);
  ASSERT_FALSE(session.empty());
  grpc::Status s = testing::UploadParams(*stub, session, m.params, 1 << 20);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::mt19937_64 rng(11);
  HostTensor x = models::RandomF32(rng, {1, c.seq, c.hidden}, 1.0);
  v1::RunRequest req;
  req.set_session_id(session);
  v1::NamedTensor* in = req.add_inputs();
  in->set_name("x");
  *in->mutable_tensor() = ToProto(x);
  v1::RunResponse resp;
  s = stub->Run(Context().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_FALSE(resp.has_report());  // not asked for
  const HostTensor want = models::EncoderLayerReference(m, c, x);
  EXPECT_LE(models::WorstError(FromProto(resp.outputs(0).tensor()), want, 2e-4, 2e-4), 1.0);

  // The report was kept anyway: GetReport by request id.
  v1::GetReportRequest get;
  get.set_request_id(resp.request_id());
  v1::GetReportResponse reports;
  ASSERT_TRUE(stub->GetReport(Context().get(), get, &reports).ok());
  ASSERT_EQ(reports.reports_size(), 1);
  EXPECT_EQ(reports.reports(0).request_id(), resp.request_id());
  EXPECT_GT(reports.reports(0).steps_size(), 3);
}

using testing::kAffineText;

TEST_F(ServerModels, OneShotRunFromKilnText) {
  auto stub = kilnd_->Stub();
  const std::vector<float> x = {1, 2, 3, -1, -2, -3};
  const std::vector<float> w = {1, -1, 0.5, 2, -0.25, 1};
  const std::vector<float> b = {0.5, -0.5};
  v1::RunRequest req;
  req.mutable_graph()->set_text(kAffineText);
  req.set_report(true);
  auto add = [](google::protobuf::RepeatedPtrField<v1::NamedTensor>* to, const std::string& name,
                const std::vector<float>& v, Dims dims) {
    v1::NamedTensor* t = to->Add();
    t->set_name(name);
    *t->mutable_tensor() = ToProto(HostTensor::FromVector(v1::DTYPE_F32, std::move(dims), v));
  };
  add(req.mutable_inputs(), "x", x, {2, 3});
  add(req.mutable_params(), "w", w, {3, 2});
  add(req.mutable_params(), "b", b, {2});
  v1::RunResponse resp;
  grpc::Status s = stub->Run(Context().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const HostTensor y = FromProto(resp.outputs(0).tensor());
  ASSERT_EQ(y.dims(), (Dims{2, 2}));
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      double acc = b[j];
      for (int k = 0; k < 3; ++k) acc += x[i * 3 + k] * w[k * 2 + j];
      EXPECT_NEAR(y.GetAsDouble(i * 2 + j), std::max(acc, 0.0), 1e-5);
    }
  }
  // The same text again: the executable comes from the in-memory cache.
  v1::RunResponse again;
  ASSERT_TRUE(stub->Run(Context().get(), req, &again).ok());
  EXPECT_EQ(again.report().compile().executable_cache(), v1::CACHE_HIT_MEMORY);
}

TEST_F(ServerModels, CompileDevicesInfoHealthReflection) {
  auto stub = kilnd_->Stub();
  v1::CompileRequest compile;
  compile.mutable_graph()->set_text(kAffineText);
  v1::CompileResponse verified;
  ASSERT_TRUE(stub->Compile(Context().get(), compile, &verified).ok());
  EXPECT_TRUE(verified.executable_key().empty());  // symbolic batch, no shapes: verified only
  EXPECT_EQ(verified.signature().params_size(), 2);
  v1::InputShape* shape = compile.add_input_shapes();
  shape->set_name("x");
  shape->add_dims(5);
  shape->add_dims(3);
  v1::CompileResponse compiled;
  grpc::Status s = stub->Compile(Context().get(), compile, &compiled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(compiled.executable_key().size(), 64u);
  EXPECT_EQ(compiled.report().executable_key(), compiled.executable_key());
  EXPECT_EQ(compiled.signature().inputs(0).type().dims(0).size(), 5);

  v1::ListDevicesResponse devices;
  ASSERT_TRUE(stub->ListDevices(Context().get(), {}, &devices).ok());
  ASSERT_GE(devices.devices_size(), 1);
  EXPECT_EQ(devices.devices(0).id(), "cpu:0");
  EXPECT_GT(devices.devices(0).profile().peak_gflops_f32(), 0);

  v1::ServerInfoResponse info;
  ASSERT_TRUE(stub->ServerInfo(Context().get(), {}, &info).ok());
  EXPECT_EQ(info.tenant(), "default");
  EXPECT_EQ(info.cache().dir(), cache_->path());
  EXPECT_FALSE(info.compiler_version().empty());
  EXPECT_EQ(info.backends(0), "cpu");

  EXPECT_EQ(testing::HealthStatus(*kilnd_->channel()), 1);
  EXPECT_EQ(testing::HealthStatus(*kilnd_->channel(), "kiln.v1.Kiln"), 1);
  const std::vector<std::string> services = testing::ReflectionServices(*kilnd_->channel());
  EXPECT_NE(std::find(services.begin(), services.end(), "kiln.v1.Kiln"), services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());

  // The last reports of this tenant, oldest first.
  v1::GetReportRequest last;
  last.set_last(2);
  v1::GetReportResponse reports;
  ASSERT_TRUE(stub->GetReport(Context().get(), last, &reports).ok());
  EXPECT_LE(reports.reports_size(), 2);
}

// Many clients at once, each with its own session and shapes, while others
// run one-shot graphs: every answer is its own request's.
TEST_F(ServerModels, ConcurrentClientsGetTheirOwnAnswers) {
  constexpr int kClients = 8;
  std::vector<std::thread> threads;
  std::atomic<int> failures = 0;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto stub = kilnd_->Stub();
      std::string session;
      if (c % 2 == 0) {
        v1::CreateSessionRequest create;
        create.mutable_graph()->set_text(kAffineText);
        v1::CreateSessionResponse created;
        if (!stub->CreateSession(Context().get(), create, &created).ok()) {
          ++failures;
          return;
        }
        session = created.session_id();
        std::map<std::string, HostTensor> params;
        // w = c * identity-ish, b = 0: y = relu(x @ w)
        params.emplace("w", HostTensor::FromVector(v1::DTYPE_F32, {3, 2},
                                                   std::vector<float>{1.0f * c, 0, 0, 1.0f * c, 0, 0}));
        params.emplace("b", HostTensor::FromVector(v1::DTYPE_F32, {2}, std::vector<float>{0, 0}));
        if (!testing::UploadParams(*stub, session, params, 4).ok()) {
          ++failures;
          return;
        }
      }
      for (int i = 0; i < 25; ++i) {
        const int64_t batch = 1 + (i + c) % 4;
        v1::RunRequest req;
        if (session.empty()) {
          req = testing::AffineRequest();
          req.clear_inputs();
          req.mutable_params(0)->mutable_tensor()->set_data(
              std::string(ToProto(HostTensor::FromVector(
                                      v1::DTYPE_F32, {3, 2},
                                      std::vector<float>{1.0f * c, 0, 0, 1.0f * c, 0, 0}))
                              .data()));
          req.mutable_params(1)->mutable_tensor()->set_data(std::string(8, '\0'));
        } else {
          req.set_session_id(session);
        }
        std::vector<double> x(batch * 3);
        for (int64_t k = 0; k < batch * 3; ++k) x[k] = static_cast<double>(k + i);
        testing::AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {batch, 3}, x);
        v1::RunResponse resp;
        grpc::Status s = stub->Run(Context().get(), req, &resp);
        if (!s.ok() || resp.outputs_size() != 1) {
          ++failures;
          continue;
        }
        const HostTensor y = FromProto(resp.outputs(0).tensor());
        for (int64_t r = 0; r < batch; ++r) {
          for (int j = 0; j < 2; ++j) {
            const double want = std::max(0.0, c * x[r * 3 + j]);
            if (y.dims() != Dims{batch, 2} || std::abs(y.GetAsDouble(r * 2 + j) - want) > 1e-3) {
              ++failures;
            }
          }
        }
      }
      if (!session.empty()) {
        v1::CloseSessionRequest close;
        close.set_session_id(session);
        v1::CloseSessionResponse closed;
        if (!stub->CloseSession(Context().get(), close, &closed).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ServerRestart, SameRequestHitsTheDiskCacheAfterRestart) {
  TempDir cache;
  models::Model m = models::Mlp(3, {16, 8, 4});
  v1::RunRequest req;
  *req.mutable_graph()->mutable_graph() = m.graph;
  req.set_report(true);
  std::mt19937_64 rng(1);
  v1::NamedTensor* in = req.add_inputs();
  in->set_name("x");
  *in->mutable_tensor() = ToProto(models::RandomF32(rng, {2, 16}, 1.0));
  for (const auto& [name, t] : m.params) {
    v1::NamedTensor* p = req.add_params();
    p->set_name(name);
    *p->mutable_tensor() = ToProto(t);
  }
  std::vector<v1::CacheOutcome> outcomes;
  for (int start = 0; start < 2; ++start) {
    std::string error;
    auto kilnd = KilndProcess::Start({.cache_dir = cache.path()}, &error);
    ASSERT_NE(kilnd, nullptr) << error;
    v1::RunResponse resp;
    grpc::Status s = kilnd->Stub()->Run(Context().get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message() << kilnd->Log();
    outcomes.push_back(resp.report().compile().executable_cache());
    kilnd->Signal(SIGTERM);
    EXPECT_EQ(kilnd->WaitExit(absl::Seconds(30)), 0) << kilnd->Log();
  }
  EXPECT_EQ(outcomes[0], v1::CACHE_MISS);
  EXPECT_EQ(outcomes[1], v1::CACHE_HIT_DISK);
}

}  // namespace
}  // namespace kiln
