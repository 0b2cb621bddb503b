// Training sessions in a real kilnd (server/rpc_train.cc): the optimizer
// state counts against the tenant's param quota (a step whose Adam state does
// not fit is refused, naming the bytes, and nothing is charged; closing the
// session gives it all back; a training set's second buffers stay charged
// while the set lives, whatever executables the session forgets), and the
// per-tenant step metrics move (for a TrainSteps stream too, before each
// answer).
#include <gtest/gtest.h>

#include <vector>

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
constexpr char kEvictKey[] = "evicting-trainer-key";

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

// The same model over any batch size: an executable per batch size.
constexpr char kSymbolicGraph[] = R"(graph "quota_mlp_any_batch"
input x: f32[n, 64]
input y: i64[n]
param w: f32[64, 64]
param b: f32[64]
let loss = softmax_cross_entropy(x @ w + b, y)
out loss
)";

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
tenants {
  name: "evicting"
  api_key_sha256: ")",
                      Sha256Hex(kEvictKey), R"("
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

  // A batch of `n` rows for kSymbolicGraph (a training step, or with
  // `report` a Run of the forward graph).
  static void AddBatch(google::protobuf::RepeatedPtrField<v1::NamedTensor>* inputs, int64_t n) {
    v1::NamedTensor* x = inputs->Add();
    x->set_name("x");
    *x->mutable_tensor() = testing::ToProto(HostTensor::Create(v1::DTYPE_F32, {n, 64}).value());
    v1::NamedTensor* y = inputs->Add();
    y->set_name("y");
    *y->mutable_tensor() = testing::ToProto(HostTensor::Create(v1::DTYPE_I64, {n}).value());
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

// A training set keeps a second buffer of each param and optimizer-state
// value for the in-place updates (docs/training.md "How a step stays on the
// device"). Those buffers live as long as the set, not as long as the
// training executable the session remembers: when the executable leaves the
// session's LRU (16 executables; here 16 forward runs of other batch sizes),
// the tenant's device charge drops by the executable's arena only, and the
// next step (the executable compiled again) charges no second copy. Closing
// the session gives everything back.
TEST_F(ServerTrain, SecondBuffersStayChargedWhenTheStepLeavesTheSessionsExecutables) {
  auto stub = kilnd_->Stub();
  auto device_bytes = [] { return Metric("kiln_tenant_device_bytes", "evicting"); };
  auto arena = [](const v1::DispatchReport& r) {
    int64_t bytes = 0;
    for (const v1::MemoryPlanSummary& m : r.compile().memory()) bytes += m.arena_bytes();
    return bytes;
  };
  const double before = device_bytes();
  v1::CreateSessionRequest create = Request(v1::OPTIMIZER_ADAM);
  create.mutable_graph()->set_text(kSymbolicGraph);
  v1::CreateSessionResponse session;
  grpc::Status s = stub->CreateSession(Context(kEvictKey).get(), create, &session);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(device_bytes(), before + kParamBytes);  // symbolic: nothing compiled yet

  // Params w, b; Adam's m and v of each and opt/step; a second buffer of
  // every one of them (all are updated by the step).
  const int64_t state = 2 * kParamBytes + 8;
  const int64_t second = kParamBytes + state;
  v1::TrainStepRequest step;
  step.set_session_id(session.session_id());
  step.set_report(true);
  AddBatch(step.mutable_inputs(), 4);
  v1::TrainStepResponse r;
  s = stub->TrainStep(Context(kEvictKey).get(), step, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(r.step(), 1);
  const int64_t step_arena = arena(r.report());
  EXPECT_EQ(device_bytes(), before + kParamBytes + state + second + step_arena);

  // 16 forward runs of other batch sizes: 16 executables, the step's the
  // least recently used one, forgotten by the 16th.
  std::vector<int64_t> forward_arena;
  int64_t forward_arenas = 0;
  for (int n = 1; n <= 16; ++n) {
    v1::RunRequest run;
    run.set_session_id(session.session_id());
    run.set_report(true);
    AddBatch(run.mutable_inputs(), n);
    v1::RunResponse out;
    s = stub->Run(Context(kEvictKey).get(), run, &out);
    ASSERT_TRUE(s.ok()) << "batch " << n << ": " << s.error_message();
    forward_arena.push_back(arena(out.report()));
    forward_arenas += forward_arena.back();
  }
  // The step's executable is gone; its set's second buffers are not.
  EXPECT_EQ(device_bytes(), before + kParamBytes + state + second + forward_arenas);

  // The next step compiles the step again (charging its arena; the batch
  // of 1's executable, now the least recently used, is forgotten) and goes
  // on from step 1's params and state, with no second copy charged.
  s = stub->TrainStep(Context(kEvictKey).get(), step, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.step(), 2);
  EXPECT_EQ(arena(r.report()), step_arena);
  EXPECT_EQ(device_bytes(), before + kParamBytes + state + second + step_arena + forward_arenas -
                                forward_arena[0]);

  v1::CloseSessionRequest close;
  close.set_session_id(session.session_id());
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(stub->CloseSession(Context(kEvictKey).get(), close, &closed).ok());
  EXPECT_EQ(device_bytes(), before);
}

}  // namespace
}  // namespace kiln
