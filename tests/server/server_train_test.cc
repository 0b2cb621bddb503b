// Training sessions in a real kilnd (server/rpc_train.cc): the optimizer
// state counts against the tenant's param quota (a step whose Adam state does
// not fit is refused, naming the bytes, and nothing is charged; closing the
// session gives it all back), and the per-tenant step metrics move (for a
// TrainSteps stream too, before each answer).
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "tests/server/kilnd_process.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::MetricValue;
using testing::TempDir;

constexpr char kKey[] = "trainer-key";
constexpr char kSmallKey[] = "small-trainer-key";

// w: f32[64, 64] (16384 bytes) + b: f32[64]; Adam's state doubles each.
constexpr char kGraph[] = R"(graph "quota_mlp"
input x: f32[4, 64]
input y: i64[4]
param w: f32[64, 64]
param b: f32[64]
let loss = softmax_cross_entropy(x @ w + b, y)
out loss
)";
constexpr int64_t kParamBytes = 64 * 64 * 4 + 64 * 4;

std::string TrainConfig() {
  using server::Sha256Hex;
  return absl::StrCat(R"(
tenants {
  name: "trainer"
  api_key_sha256: ")",
                      Sha256Hex(kKey), R"("
}
tenants {
  name: "small"
  api_key_sha256: ")",
                      Sha256Hex(kSmallKey), R"("
  quota { max_param_bytes: )",
                      2 * kParamBytes, R"( }
}
)");
}

class ServerTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    std::string error;
    kilnd_ =
        KilndProcess::Start({.cache_dir = cache_->path(), .config_text = TrainConfig()}, &error)
            .release();
    ASSERT_NE(kilnd_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete cache_;
  }

  static v1::CreateSessionRequest Request(v1::OptimizerKind kind) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(kGraph);
    req.mutable_options()->set_device("cpu:0");
    v1::TrainingSpec* t = req.mutable_options()->mutable_transforms()->mutable_training();
    t->set_loss("loss");
    t->mutable_optimizer()->set_kind(kind);
    t->mutable_optimizer()->set_lr(0.1);
    HostTensor w = HostTensor::Create(v1::DTYPE_F32, {64, 64}).value();
    HostTensor b = HostTensor::Create(v1::DTYPE_F32, {64}).value();
    v1::NamedTensor* nw = req.add_params();
    nw->set_name("w");
    *nw->mutable_tensor() = testing::ToProto(w);
    v1::NamedTensor* nb = req.add_params();
    nb->set_name("b");
    *nb->mutable_tensor() = testing::ToProto(b);
    return req;
  }

  static v1::TrainStepRequest Step(const std::string& session) {
    v1::TrainStepRequest req;
    req.set_session_id(session);
    v1::NamedTensor* x = req.add_inputs();
    x->set_name("x");
    *x->mutable_tensor() = testing::ToProto(HostTensor::Create(v1::DTYPE_F32, {4, 64}).value());
    v1::NamedTensor* y = req.add_inputs();
    y->set_name("y");
    *y->mutable_tensor() = testing::ToProto(HostTensor::Create(v1::DTYPE_I64, {4}).value());
    return req;
  }

  static double Metric(const std::string& name, const std::string& tenant) {
    return MetricValue(testing::HttpGet(kilnd_->metrics_port(), "/metrics"), name,
                       {{"tenant", tenant}});
  }

  static inline TempDir* cache_ = nullptr;
  static inline KilndProcess* kilnd_ = nullptr;
};

TEST_F(ServerTrain, OptimizerStateCountsAgainstTheParamQuota) {
  auto stub = kilnd_->Stub();
  // SGD without momentum keeps no per-param state: it fits in 2 x the params.
  v1::CreateSessionResponse sgd;
  grpc::Status s = stub->CreateSession(Context(kSmallKey).get(), Request(v1::OPTIMIZER_SGD), &sgd);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::TrainStepResponse r;
  s = stub->TrainStep(Context(kSmallKey).get(), Step(sgd.session_id()), &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.step(), 1);
  v1::CloseSessionResponse closed;
  v1::CloseSessionRequest close;
  close.set_session_id(sgd.session_id());
  ASSERT_TRUE(stub->CloseSession(Context(kSmallKey).get(), close, &closed).ok());

  // Adam's m and v double the params: over the quota at the first step.
  v1::CreateSessionResponse adam;
  s = stub->CreateSession(Context(kSmallKey).get(), Request(v1::OPTIMIZER_ADAM), &adam);
  ASSERT_TRUE(s.ok()) << s.error_message();
  s = stub->TrainStep(Context(kSmallKey).get(), Step(adam.session_id()), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat(2 * kParamBytes + 8, " bytes of optimizer state")),
            std::string::npos)
      << s.error_message();
  // Nothing was charged: the refused step left room for another SGD session.
  close.set_session_id(adam.session_id());
  ASSERT_TRUE(stub->CloseSession(Context(kSmallKey).get(), close, &closed).ok());
  s = stub->CreateSession(Context(kSmallKey).get(), Request(v1::OPTIMIZER_SGD), &sgd);
  ASSERT_TRUE(s.ok()) << s.error_message();
  s = stub->TrainStep(Context(kSmallKey).get(), Step(sgd.session_id()), &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(ServerTrain, StepMetricsMovePerTenant) {
  auto stub = kilnd_->Stub();
  const double before = Metric("kiln_train_steps_total", "trainer");
  v1::CreateSessionResponse session;
  grpc::Status s = stub->CreateSession(Context(kKey).get(), Request(v1::OPTIMIZER_ADAMW), &session);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (int i = 1; i <= 3; ++i) {
    v1::TrainStepResponse r;
    s = stub->TrainStep(Context(kKey).get(), Step(session.session_id()), &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.step(), i);
    EXPECT_FLOAT_EQ(r.lr(), 0.1f);
  }
  EXPECT_EQ(Metric("kiln_train_steps_total", "trainer"), before + 3);
  EXPECT_EQ(Metric("kiln_train_step_seconds_count", "trainer"), before + 3);
  EXPECT_GE(Metric("kiln_requests_total", "trainer"), 4);
}

// A TrainSteps stream counts each step in the tenant's metrics and keeps its
// dispatch report before the step's answer is written (kilnd does both on
// gRPC's thread, off the device's, server/train_stream.h): every answer read
// finds its step already counted.
TEST_F(ServerTrain, StreamedStepsAreCountedAndReportedBeforeTheirAnswers) {
  auto stub = kilnd_->Stub();
  v1::CreateSessionResponse session;
  grpc::Status s = stub->CreateSession(Context(kKey).get(), Request(v1::OPTIMIZER_ADAMW), &session);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const double before = Metric("kiln_train_steps_total", "trainer");
  auto ctx = Context(kKey);
  auto stream = stub->TrainSteps(ctx.get());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(stream->Write(Step(i == 1 ? session.session_id() : "")));
    v1::TrainStepResponse r;
    ASSERT_TRUE(stream->Read(&r));
    EXPECT_EQ(r.step(), i);
    EXPECT_EQ(Metric("kiln_train_steps_total", "trainer"), before + i);
    EXPECT_EQ(Metric("kiln_train_step_seconds_count", "trainer"), before + i);
    v1::GetReportRequest last;
    last.set_last(1);
    v1::GetReportResponse reports;
    ASSERT_TRUE(stub->GetReport(Context(kKey).get(), last, &reports).ok());
    ASSERT_EQ(reports.reports_size(), 1);
    EXPECT_EQ(reports.reports(0).request_id(), r.request_id());
    EXPECT_GT(reports.reports(0).steps_size(), 0);  // the step's kernels
  }
  ASSERT_TRUE(stream->WritesDone());
  s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace kiln
