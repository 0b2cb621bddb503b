// Shared memory against a real kilnd (kiln/v1/shm.proto, server/shm_regions.h):
// tensors in and out through registered memfd regions; every way a region
// can be misused gets a clear status and leaves nothing behind (kilnd's fd
// count, the tenant's kiln_shm_regions / kiln_shm_bytes back to 0); the C++
// client uses shared memory by itself; the Unix-socket listener maps peer
// uids to tenants.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cpp/client.h"
#include "clients/cpp/shm.h"
#include "server/config.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

constexpr char kAlice[] = "alice-shm-key";
constexpr char kBob[] = "bob-shm-key";
constexpr int64_t kMiB = int64_t{1} << 20;

std::string Config() {
  using server::Sha256Hex;
  return absl::StrCat(R"(
tenants {
  name: "alice"
  api_key_sha256: ")", Sha256Hex(kAlice), R"("
  quota { max_shm_regions: 3 max_shm_bytes: 8388608 }
}
tenants {
  name: "bob"
  api_key_sha256: ")", Sha256Hex(kBob), R"("
}
)");
}

// y = x * 2 and z = x + 1 for any x: f32[n].
constexpr char kTwoOutputs[] =
    "graph \"two\"\ninput x: f32[n]\nlet y = x * 2\nlet z = x + 1\nout y\nout z\n";
constexpr char kIntGraph[] = "graph \"ints\"\ninput i: i32[4]\nlet j = i + i\nout j\n";

int FdCount(pid_t pid) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    (void)e;
    ++n;
  }
  return n;
}

int64_t RssKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

v1::SharedMemoryRef Ref(const std::string& id, int64_t offset, int64_t bytes) {
  v1::SharedMemoryRef r;
  r.set_region_id(id);
  r.set_offset(offset);
  r.set_bytes(bytes);
  return r;
}

void AddShmInput(v1::RunRequest& req, const std::string& name, DType dtype, const Dims& dims,
                 const v1::SharedMemoryRef& ref) {
  v1::NamedTensor* t = req.add_inputs();
  t->set_name(name);
  t->mutable_tensor()->set_dtype(dtype);
  for (int64_t d : dims) t->mutable_tensor()->add_dims(d);
  *t->mutable_shm() = ref;
}

class ShmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_->path(), .config_text = Config()}, &error)
                 .release();
    ASSERT_NE(kilnd_, nullptr) << error;
  }
  static void TearDownTestSuite() {
    delete kilnd_;
    delete cache_;
  }

  static std::shared_ptr<ShmConnection> Connect(const std::string& key) {
    auto stub = kilnd_->Stub();
    auto ctx = Context(key);
    absl::StatusOr<std::shared_ptr<ShmConnection>> c = ShmConnection::Connect(*stub, *ctx);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

  static double Metric(const std::string& name, const std::string& tenant) {
    return testing::MetricValue(testing::HttpGet(kilnd_->metrics_port(), "/metrics"), name,
                                {{"tenant", tenant}});
  }

  // Waits until the tenant's mapped regions and bytes are 0 (kilnd drops a
  // closed connection's regions on its socket thread, within a poll).
  static void ExpectQuotaBackToZero(const std::string& tenant) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline && (Metric("kiln_shm_regions", tenant) != 0 ||
                                      Metric("kiln_shm_bytes", tenant) != 0)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(Metric("kiln_shm_regions", tenant), 0);
    EXPECT_EQ(Metric("kiln_shm_bytes", tenant), 0);
  }

  // kilnd's fds back to `before` (an HTTP scrape's connection may linger).
  static void ExpectFdsBackTo(int before) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline && FdCount(kilnd_->pid()) > before) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_LE(FdCount(kilnd_->pid()), before);
  }

  static grpc::Status Run(const v1::RunRequest& req, v1::RunResponse* resp,
                          const std::string& key = kAlice) {
    auto stub = kilnd_->Stub();
    auto ctx = Context(key);
    return stub->Run(ctx.get(), req, resp);
  }

  static TempDir* cache_;
  static KilndProcess* kilnd_;
};

TempDir* ShmTest::cache_ = nullptr;
KilndProcess* ShmTest::kilnd_ = nullptr;

TEST_F(ShmTest, InputsAndOutputsThroughSharedMemory) {
  auto c = Connect(kAlice);
  ASSERT_NE(c, nullptr);
  auto region = c->CreateRegion("io", kMiB);
  ASSERT_TRUE(region.ok()) << region.status();
  float* x = reinterpret_cast<float*>((*region)->data());
  for (int i = 0; i < 1000; ++i) x[i] = static_cast<float>(i) - 7.5f;

  v1::RunRequest req;
  req.mutable_graph()->set_text(kTwoOutputs);
  AddShmInput(req, "x", v1::DTYPE_F32, {1000}, Ref("io", 0, 4000));
  *req.mutable_shm_output_area() = Ref("io", 4096, kMiB - 4096);
  v1::RunResponse resp;
  grpc::Status s = Run(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 2);
  for (int o = 0; o < 2; ++o) {
    const v1::NamedTensor& out = resp.outputs(o);
    ASSERT_TRUE(out.has_shm()) << out.name();
    EXPECT_TRUE(out.tensor().data().empty());
    EXPECT_EQ(out.tensor().dtype(), v1::DTYPE_F32);
    ASSERT_EQ(out.tensor().dims_size(), 1);
    EXPECT_EQ(out.tensor().dims(0), 1000);
    EXPECT_EQ(out.shm().region_id(), "io");
    EXPECT_EQ(out.shm().bytes(), 4000);
    EXPECT_EQ(out.shm().offset() % 64, 0);
    EXPECT_GE(out.shm().offset(), 4096);
    const float* v = reinterpret_cast<const float*>((*region)->data() + out.shm().offset());
    for (int i = 0; i < 1000; ++i) {
      const float want = out.name() == "y" ? 2 * x[i] : x[i] + 1;
      ASSERT_EQ(v[i], want) << out.name() << "[" << i << "]";
    }
  }
  EXPECT_NE(resp.outputs(0).shm().offset(), resp.outputs(1).shm().offset());

  // An explicit place for y; z, with no room in a small area, comes back as bytes.
  v1::RunRequest req2;
  req2.mutable_graph()->set_text(kTwoOutputs);
  AddShmInput(req2, "x", v1::DTYPE_F32, {1000}, Ref("io", 0, 4000));
  v1::NamedTensor* y = req2.add_shm_outputs();
  y->set_name("y");
  *y->mutable_shm() = Ref("io", 8192, 4000);
  *req2.mutable_shm_output_area() = Ref("io", 16384, 100);
  v1::RunResponse resp2;
  s = Run(req2, &resp2);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp2.outputs_size(), 2);
  EXPECT_EQ(resp2.outputs(0).shm().offset(), 8192);
  EXPECT_FALSE(resp2.outputs(1).has_shm());
  HostTensor z = testing::FromProto(resp2.outputs(1).tensor());
  EXPECT_EQ(z.data_as<float>()[10], x[10] + 1);
  EXPECT_EQ(reinterpret_cast<const float*>((*region)->data() + 8192)[999], 2 * x[999]);
}

TEST_F(ShmTest, IntegerInputsAndOutputs) {
  auto c = Connect(kAlice);
  ASSERT_NE(c, nullptr);
  auto region = c->CreateRegion("ints", 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  int32_t* i = reinterpret_cast<int32_t*>((*region)->data() + 4);  // unaligned on purpose
  for (int k = 0; k < 4; ++k) i[k] = 100 * k - 3;
  v1::RunRequest req;
  req.mutable_graph()->set_text(kIntGraph);
  AddShmInput(req, "i", v1::DTYPE_I32, {4}, Ref("ints", 4, 16));
  v1::NamedTensor* j = req.add_shm_outputs();
  j->set_name("j");
  *j->mutable_shm() = Ref("ints", 1000, 16);  // unaligned too: copied at the end
  v1::RunResponse resp;
  grpc::Status s = Run(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const int32_t* out = reinterpret_cast<const int32_t*>((*region)->data() + 1000);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(out[k], 2 * (100 * k - 3));
}

TEST_F(ShmTest, OutOfBoundsAndMismatchedSizes) {
  auto c = Connect(kAlice);
  ASSERT_NE(c, nullptr);
  auto region = c->CreateRegion("small", 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    v1::SharedMemoryRef ref;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Ref("small", 4096 - 3999, 4000), grpc::OUT_OF_RANGE, "not inside shared-memory region"},
      {Ref("small", -64, 4000), grpc::OUT_OF_RANGE, "not inside"},
      {Ref("small", kMax - 100, 4000), grpc::OUT_OF_RANGE, "not inside"},
      {Ref("small", 0, 3996), grpc::INVALID_ARGUMENT, "shm.bytes 4000"},
      {Ref("nope", 0, 4000), grpc::NOT_FOUND, "no shared-memory region \"nope\""},
  };
  for (const Case& k : cases) {
    v1::RunRequest req;
    req.mutable_graph()->set_text(kTwoOutputs);
    AddShmInput(req, "x", v1::DTYPE_F32, {1000}, k.ref);
    v1::RunResponse resp;
    grpc::Status s = Run(req, &resp);
    EXPECT_EQ(s.error_code(), k.code) << k.ref.ShortDebugString() << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(k.message), std::string::npos) << s.error_message();
  }
  // Outputs: an area past the end, an explicit place of the wrong size, one
  // that overlaps the input.
  {
    v1::RunRequest req;
    req.mutable_graph()->set_text(kTwoOutputs);
    AddShmInput(req, "x", v1::DTYPE_F32, {10}, Ref("small", 0, 40));
    *req.mutable_shm_output_area() = Ref("small", 64, kMax);
    v1::RunResponse resp;
    EXPECT_EQ(Run(req, &resp).error_code(), grpc::OUT_OF_RANGE);
  }
  {
    v1::RunRequest req;
    req.mutable_graph()->set_text(kTwoOutputs);
    AddShmInput(req, "x", v1::DTYPE_F32, {10}, Ref("small", 0, 40));
    v1::NamedTensor* y = req.add_shm_outputs();
    y->set_name("y");
    *y->mutable_shm() = Ref("small", 64, 36);
    v1::RunResponse resp;
    grpc::Status s = Run(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("40 bytes; shm.bytes is 36"), std::string::npos)
        << s.error_message();
  }
  {
    v1::RunRequest req;
    req.mutable_graph()->set_text(kTwoOutputs);
    AddShmInput(req, "x", v1::DTYPE_F32, {10}, Ref("small", 0, 40));
    v1::NamedTensor* y = req.add_shm_outputs();
    y->set_name("y");
    *y->mutable_shm() = Ref("small", 20, 40);
    v1::RunResponse resp;
    grpc::Status s = Run(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("overlaps input \"x\""), std::string::npos)
        << s.error_message();
  }
  // Shared memory is for Run's inputs only: a param naming it is refused.
  {
    v1::RunRequest req = testing::AffineRequest();
    v1::NamedTensor* w = req.mutable_params(0);
    w->mutable_tensor()->clear_data();
    *w->mutable_shm() = Ref("small", 0, 24);
    v1::RunResponse resp;
    grpc::Status s = Run(req, &resp);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("only Run's inputs"), std::string::npos) << s.error_message();
  }
}

TEST_F(ShmTest, AnotherTenantsRegionIsNotFound) {
  auto alice = Connect(kAlice);
  auto bob = Connect(kBob);
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);
  auto a = alice->CreateRegion("mine", 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::RunRequest req;
  req.mutable_graph()->set_text(kTwoOutputs);
  AddShmInput(req, "x", v1::DTYPE_F32, {10}, Ref("mine", 0, 40));
  v1::RunResponse resp;
  grpc::Status s = Run(req, &resp, kBob);
  EXPECT_EQ(s.error_code(), grpc::NOT_FOUND) << s.error_message();
  // Region ids are per tenant: bob may have a "mine" of his own.
  auto b = bob->CreateRegion("mine", 4096);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(Run(req, &resp, kBob).ok());
  EXPECT_TRUE(Run(req, &resp, kAlice).ok());
}

// A TrainStep's batch through shared memory (x f32 read in place, y i64
// copied first): the same losses as the same steps with the batch as bytes;
// a batch outside the region, of the wrong size, or in another tenant's
// region is refused with the status Run gives, and the step does not run.
TEST_F(ShmTest, TrainStepBatchThroughSharedMemory) {
  constexpr char kTrain[] = R"(graph "shm_train"
input x: f32[4, 8]
input y: i64[4]
param w: f32[8, 3]
let loss = softmax_cross_entropy(x @ w, y)
out loss
)";
  auto stub = kilnd_->Stub();
  auto create = [&](const std::string& key) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->set_text(kTrain);
    req.mutable_options()->set_device("cpu:0");
    v1::TrainingSpec* t = req.mutable_options()->mutable_transforms()->mutable_training();
    t->set_loss("loss");
    t->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
    t->mutable_optimizer()->set_lr(0.1);
    HostTensor w = HostTensor::Create(v1::DTYPE_F32, {8, 3}).value();
    for (int i = 0; i < 24; ++i) w.data_as<float>()[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
    v1::NamedTensor* nw = req.add_params();
    nw->set_name("w");
    *nw->mutable_tensor() = testing::ToProto(w);
    v1::CreateSessionResponse resp;
    grpc::Status s = stub->CreateSession(Context(key).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  };
  HostTensor x = HostTensor::Create(v1::DTYPE_F32, {4, 8}).value();
  HostTensor y = HostTensor::Create(v1::DTYPE_I64, {4}).value();
  for (int i = 0; i < 32; ++i) x.data_as<float>()[i] = std::sin(0.7f * static_cast<float>(i));
  for (int i = 0; i < 4; ++i) y.data_as<int64_t>()[i] = i % 3;

  auto c = Connect(kAlice);
  ASSERT_NE(c, nullptr);
  auto region = c->CreateRegion("batch", 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memcpy((*region)->data(), x.data(), 128);
  std::memcpy((*region)->data() + 128, y.data(), 32);
  auto shm_step = [&](const std::string& session, const v1::SharedMemoryRef& xr,
                      const v1::SharedMemoryRef& yr) {
    v1::TrainStepRequest req;
    req.set_session_id(session);
    for (const auto& [name, dtype, dims, ref] :
         {std::tuple{"x", v1::DTYPE_F32, Dims{4, 8}, xr}, std::tuple{"y", v1::DTYPE_I64, Dims{4}, yr}}) {
      v1::NamedTensor* t = req.add_inputs();
      t->set_name(name);
      t->mutable_tensor()->set_dtype(dtype);
      for (int64_t d : dims) t->mutable_tensor()->add_dims(d);
      *t->mutable_shm() = ref;
    }
    return req;
  };
  const std::string by_shm = create(kAlice), by_bytes = create(kAlice);
  for (int step = 1; step <= 3; ++step) {
    v1::TrainStepResponse a, b;
    grpc::Status s = stub->TrainStep(Context(kAlice).get(),
                                     shm_step(by_shm, Ref("batch", 0, 128), Ref("batch", 128, 32)), &a);
    ASSERT_TRUE(s.ok()) << s.error_message();
    v1::TrainStepRequest bytes_req;
    bytes_req.set_session_id(by_bytes);
    v1::NamedTensor* nx = bytes_req.add_inputs();
    nx->set_name("x");
    *nx->mutable_tensor() = testing::ToProto(x);
    v1::NamedTensor* ny = bytes_req.add_inputs();
    ny->set_name("y");
    *ny->mutable_tensor() = testing::ToProto(y);
    s = stub->TrainStep(Context(kAlice).get(), bytes_req, &b);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(a.step(), step);
    EXPECT_EQ(a.loss(), b.loss()) << "step " << step;
  }
  struct Case {
    v1::SharedMemoryRef x;
    std::string key;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Ref("batch", 4000, 128), kAlice, grpc::OUT_OF_RANGE, "not inside shared-memory region"},
      {Ref("batch", -64, 128), kAlice, grpc::OUT_OF_RANGE, "not inside"},
      {Ref("batch", 0, 124), kAlice, grpc::INVALID_ARGUMENT, "shm.bytes 128"},
      {Ref("nope", 0, 128), kAlice, grpc::NOT_FOUND, "no shared-memory region \"nope\""},
      // Bob's own session, Alice's region: not his to name.
      {Ref("batch", 0, 128), kBob, grpc::NOT_FOUND, "no shared-memory region \"batch\""},
  };
  const std::string bobs = create(kBob);
  for (const Case& k : cases) {
    v1::TrainStepResponse resp;
    grpc::Status s = stub->TrainStep(Context(k.key).get(),
                                     shm_step(k.key == kBob ? bobs : by_shm, k.x, Ref("batch", 128, 32)),
                                     &resp);
    EXPECT_EQ(s.error_code(), k.code) << k.x.ShortDebugString() << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(k.message), std::string::npos) << s.error_message();
  }
  // None of the refused steps ran.
  v1::TrainStepResponse last;
  ASSERT_TRUE(stub->TrainStep(Context(kAlice).get(),
                              shm_step(by_shm, Ref("batch", 0, 128), Ref("batch", 128, 32)), &last)
                  .ok());
  EXPECT_EQ(last.step(), 4);
}

// The C++ client's TrainStep puts the batch in shared memory by itself (as
// its Run does): the same losses, step for step, and the same trained params
// as a client sending the batch as bytes; regions go back to the pool (the
// tenant's shared memory is released when the client goes).
TEST_F(ShmTest, ClientTrainStepUsesSharedMemory) {
  constexpr char kTrain[] = R"(graph "client_shm_train"
input x: f32[16, 12]
input y: i64[16]
param w: f32[12, 4]
param b: f32[4]
let loss = softmax_cross_entropy(x @ w + b, y)
out loss
)";
  ClientOptions options;
  options.api_key = kAlice;
  auto shm_client = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(shm_client.ok()) << shm_client.status();
  options.shared_memory = false;
  auto bytes_client = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(bytes_client.ok()) << bytes_client.status();
  v1::CompileOptions training;
  training.set_device("cpu:0");
  v1::TrainingSpec* spec = training.mutable_transforms()->mutable_training();
  spec->set_loss("loss");
  spec->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAMW);
  spec->mutable_optimizer()->set_lr(0.05);
  auto init = [] {
    TensorMap p;
    HostTensor w = HostTensor::Create(v1::DTYPE_F32, {12, 4}).value();
    for (int i = 0; i < 48; ++i) w.data_as<float>()[i] = 0.03f * static_cast<float>(i % 11) - 0.15f;
    p.emplace("w", std::move(w));
    p.emplace("b", HostTensor::FromVector<float>(v1::DTYPE_F32, {4}, {0.1f, -0.2f, 0.f, 0.3f}));
    return p;
  };
  auto by_shm = (*shm_client)->CreateSession(GraphFromText(kTrain), training, init());
  auto by_bytes = (*bytes_client)->CreateSession(GraphFromText(kTrain), training, init());
  ASSERT_TRUE(by_shm.ok()) << by_shm.status();
  ASSERT_TRUE(by_bytes.ok()) << by_bytes.status();
  for (int step = 1; step <= 5; ++step) {
    TensorMap batch;
    HostTensor x = HostTensor::Create(v1::DTYPE_F32, {16, 12}).value();
    for (int i = 0; i < 192; ++i) x.data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i * step));
    HostTensor y = HostTensor::Create(v1::DTYPE_I64, {16}).value();
    for (int i = 0; i < 16; ++i) y.data_as<int64_t>()[i] = (i + step) % 4;
    batch.emplace("x", std::move(x));
    batch.emplace("y", std::move(y));
    bool shm_used = false, bytes_used_shm = true;
    auto a = (*shm_client)->TrainStep(by_shm->session_id(), batch, &shm_used);
    auto b = (*bytes_client)->TrainStep(by_bytes->session_id(), batch, &bytes_used_shm);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(shm_used) << "step " << step;
    EXPECT_FALSE(bytes_used_shm) << "step " << step;
    EXPECT_EQ(a->step(), step);
    EXPECT_EQ(a->loss(), b->loss()) << "step " << step;
    EXPECT_EQ(a->lr(), b->lr()) << "step " << step;
  }
  // A batch that does not fit the graph is refused as it is as bytes, and
  // does not run.
  TensorMap bad;
  bad.emplace("x", HostTensor::Create(v1::DTYPE_F32, {16, 11}).value());
  bad.emplace("y", HostTensor::Create(v1::DTYPE_I64, {16}).value());
  bool bad_shm = true;
  auto refused = (*shm_client)->TrainStep(by_shm->session_id(), bad, &bad_shm);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_FALSE(bad_shm);
  auto a = (*shm_client)->GetParams(by_shm->session_id());
  auto b = (*bytes_client)->GetParams(by_bytes->session_id());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->at("opt/step").GetAsDouble(0), 5.0);
  for (const char* name : {"w", "b", "opt/w/m", "opt/w/v"}) {
    EXPECT_EQ(a->at(name).bytes(), b->at(name).bytes()) << name;
  }
  shm_client->reset();
  bytes_client->reset();
  ExpectQuotaBackToZero("alice");
}

TEST_F(ShmTest, RegisteredTwiceAndBadFds) {
  auto c = Connect(kAlice);
  ASSERT_NE(c, nullptr);
  auto r = c->CreateRegion("twice", 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  auto again = c->CreateRegion("twice", 4096);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  // The same file under another id.
  absl::Status same = c->RegisterFd("twice-2", (*r)->fd());
  EXPECT_EQ(same.code(), absl::StatusCode::kAlreadyExists) << same;
  EXPECT_NE(same.message().find("already registered as region \"twice\""), std::string::npos);

  // Not sealed against shrinking.
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  absl::Status s = c->RegisterFd("unsealed", unsealed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("F_SEAL_SHRINK"), std::string::npos) << s;
  // Empty (sealed at size 0).
  const int empty = memfd_create("empty", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(fcntl(empty, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  s = c->RegisterFd("empty", empty);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Not a regular file.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  s = c->RegisterFd("pipe", pipe_fds[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s;
  // hugetlbfs, where the host has huge pages to make one from.
  const int huge = memfd_create("huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (huge >= 0 && ftruncate(huge, 2 * kMiB) == 0 && fcntl(huge, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
    s = c->RegisterFd("huge", huge);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  for (int fd : {unsealed, empty, pipe_fds[0], pipe_fds[1], huge}) {
    if (fd >= 0) close(fd);
  }
  // Bad region ids.
  for (const std::string& id : {std::string(""), std::string(65, 'a'), std::string("a/b")}) {
    auto bad = c->CreateRegion(id.empty() ? "x\n" : id, 4096);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  }
  // Still serving.
  auto fine = c->CreateRegion("fine", 4096);
  EXPECT_TRUE(fine.ok()) << fine.status();
}

TEST_F(ShmTest, QuotaOfRegionsAndBytesAndNothingLeaks) {
  ExpectQuotaBackToZero("alice");
  ExpectQuotaBackToZero("bob");
  const int fds_before = FdCount(kilnd_->pid());
  const int64_t rss_before = RssKiB(kilnd_->pid());
  {
    auto c = Connect(kAlice);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->max_regions(), 3);
    EXPECT_EQ(c->max_bytes(), 8 * kMiB);
    auto big = c->CreateRegion("big", 7 * kMiB);
    ASSERT_TRUE(big.ok()) << big.status();
    std::memset((*big)->data(), 1, 7 * kMiB);  // touched: RSS of the memfd, not of kilnd's heap
    auto over = c->CreateRegion("over", 2 * kMiB);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
    EXPECT_NE(over.status().message().find("max_shm_bytes"), std::string::npos) << over.status();
    auto r2 = c->CreateRegion("r2", 4096);
    auto r3 = c->CreateRegion("r3", 4096);
    ASSERT_TRUE(r2.ok() && r3.ok());
    auto r4 = c->CreateRegion("r4", 4096);
    EXPECT_EQ(r4.status().code(), absl::StatusCode::kResourceExhausted) << r4.status();
    EXPECT_NE(r4.status().message().find("max_shm_regions"), std::string::npos) << r4.status();
    EXPECT_EQ(Metric("kiln_shm_regions", "alice"), 3);
    EXPECT_EQ(Metric("kiln_shm_bytes", "alice"), 7 * kMiB + 8192);
    // Unregistering gives the quota back at once.
    r3->reset();
    auto r5 = c->CreateRegion("r5", 4096);
    EXPECT_TRUE(r5.ok()) << r5.status();
    // Regions go with their connection: release the client's handles
    // without unregistering, then close the socket.
  }
  ExpectQuotaBackToZero("alice");
  ExpectFdsBackTo(fds_before);
  EXPECT_LT(RssKiB(kilnd_->pid()), rss_before + 4 * 1024);
}

TEST_F(ShmTest, ClientGoesAwayMidRun) {
  ExpectQuotaBackToZero("alice");
  const int fds_before = FdCount(kilnd_->pid());
  auto c = Connect(kAlice);
  ASSERT_NE(c, nullptr);
  // A region the client made itself and never unregisters.
  const int fd = memfd_create("gone", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ASSERT_TRUE(c->RegisterFd("gone", fd).ok());
  const float s = 1.0f / 256;
  std::memcpy(mem, &s, sizeof(s));
  v1::RunRequest req;
  req.mutable_graph()->set_text(testing::SlowText(256, 40));
  AddShmInput(req, "s", v1::DTYPE_F32, {1, 1}, Ref("gone", 0, 4));
  *req.mutable_shm_output_area() = Ref("gone", 64, 64);
  auto run = std::async(std::launch::async, [&] {
    v1::RunResponse resp;
    return std::make_pair(Run(req, &resp), resp);
  });
  absl::SleepFor(absl::Milliseconds(50));
  // The client unmaps, closes its memfd and its connection while the run
  // may still be going: kilnd's own mapping keeps the run safe.
  munmap(mem, 4096);
  close(fd);
  c.reset();
  auto [status, resp] = run.get();
  EXPECT_TRUE(status.ok() || status.error_code() == grpc::NOT_FOUND) << status.error_message();
  if (status.ok()) {
    ASSERT_EQ(resp.outputs_size(), 1);
    EXPECT_TRUE(resp.outputs(0).has_shm());
  }
  ExpectQuotaBackToZero("alice");
  ExpectFdsBackTo(fds_before);
  // kilnd serves on.
  v1::RunRequest plain = testing::AffineRequest();
  v1::RunResponse plain_resp;
  EXPECT_TRUE(Run(plain, &plain_resp).ok());
}

TEST_F(ShmTest, TicketsAreChecked) {
  auto stub = kilnd_->Stub();
  auto ctx = Context("not-a-key");
  v1::ConnectSharedMemoryResponse resp;
  EXPECT_EQ(stub->ConnectSharedMemory(ctx.get(), {}, &resp).error_code(), grpc::UNAUTHENTICATED);
  // A ticket is good once.
  auto ok_ctx = Context(kAlice);
  ASSERT_TRUE(stub->ConnectSharedMemory(ok_ctx.get(), {}, &resp).ok());
  EXPECT_EQ(resp.ticket().size(), 32u);
  EXPECT_EQ(resp.socket().rfind("@kilnd-", 0), 0u) << resp.socket();
  auto first = Connect(kAlice);
  ASSERT_NE(first, nullptr);
}

TEST_F(ShmTest, ClientUsesSharedMemoryByItself) {
  ClientOptions options;
  options.api_key = kAlice;
  auto client = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->CreateSession(GraphFromText(kTwoOutputs));
  ASSERT_TRUE(session.ok()) << session.status();
  TensorMap in;
  std::vector<float> xs(300000);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 1000) * 0.25f;
  in.emplace("x", HostTensor::FromVector(v1::DTYPE_F32, {300000}, xs));
  for (int round = 0; round < 3; ++round) {
    auto r = (*client)->Run(session->session_id(), in);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->shared_memory);
    ASSERT_EQ(r->outputs.size(), 2u);
    const float* y = r->output("y")->data_as<float>();
    const float* z = r->output("z")->data_as<float>();
    for (size_t i = 0; i < xs.size(); i += 997) {
      ASSERT_EQ(y[i], 2 * xs[i]);
      ASSERT_EQ(z[i], xs[i] + 1);
    }
  }
  // Off by option, and by KILN_SHM=0: the same answers as bytes.
  options.shared_memory = false;
  auto plain = Client::Create(kilnd_->address(), options);
  ASSERT_TRUE(plain.ok());
  auto r = (*plain)->Run(session->session_id(), in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->shared_memory);
  EXPECT_EQ(r->output("y")->data_as<float>()[5], 2 * xs[5]);
  options.shared_memory = true;
  setenv("KILN_SHM", "0", 1);
  auto env_off = Client::Create(kilnd_->address(), options);
  unsetenv("KILN_SHM");
  ASSERT_TRUE(env_off.ok());
  r = (*env_off)->Run(session->session_id(), in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->shared_memory);
  client->reset();
  ExpectQuotaBackToZero("alice");
}

// kilnd without shared memory: ConnectSharedMemory is UNAVAILABLE and the
// client falls back to bytes.
TEST(ShmOff, ClientFallsBackToBytes) {
  TempDir cache;
  std::string error;
  auto kilnd = KilndProcess::Start({.cache_dir = cache.path(), .extra_flags = {"--shm_socket=off"}},
                                   &error);
  ASSERT_NE(kilnd, nullptr) << error;
  auto stub = kilnd->Stub();
  auto ctx = Context();
  v1::ConnectSharedMemoryResponse resp;
  EXPECT_EQ(stub->ConnectSharedMemory(ctx.get(), {}, &resp).error_code(), grpc::UNAVAILABLE);
  auto client = Client::Create(kilnd->address());
  ASSERT_TRUE(client.ok());
  TensorMap in;
  in.emplace("x", HostTensor::FromVector(v1::DTYPE_F32, {3}, std::vector<float>{1, 2, 3}));
  auto r = (*client)->Run(GraphFromText(kTwoOutputs), in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->shared_memory);
  EXPECT_EQ(r->output("y")->data_as<float>()[2], 6);
}

// The Unix-socket listener: calls without a key are the tenant of the
// peer's uid (unix_peer_tenants); with a key, the key's.
TEST(UnixListener, PeerUidPicksTheTenant) {
  TempDir cache;
  const std::string sock = cache.path() + "/kilnd.sock";
  const std::string config =
      absl::StrCat(Config(), "unix_peer_tenants { uid: ", getuid(), " tenant: \"bob\" }\n");
  std::string error;
  auto kilnd = KilndProcess::Start(
      {.cache_dir = cache.path(),
       .config_text = config,
       .extra_flags = {absl::StrCat("--listen=127.0.0.1:0,unix:", sock)}},
      &error);
  ASSERT_NE(kilnd, nullptr) << error;
  auto channel = grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials());
  auto stub = v1::Kiln::NewStub(channel);
  {
    auto ctx = Context();
    v1::ServerInfoResponse info;
    grpc::Status s = stub->ServerInfo(ctx.get(), {}, &info);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << kilnd->Log();
    EXPECT_EQ(info.tenant(), "bob");
  }
  {
    auto ctx = Context(kAlice);
    v1::ServerInfoResponse info;
    ASSERT_TRUE(stub->ServerInfo(ctx.get(), {}, &info).ok());
    EXPECT_EQ(info.tenant(), "alice");
  }
  // Over TCP the uid counts for nothing.
  {
    auto ctx = Context();
    v1::ServerInfoResponse info;
    EXPECT_EQ(kilnd->Stub()->ServerInfo(ctx.get(), {}, &info).error_code(), grpc::UNAUTHENTICATED);
  }
  // The C++ client on the Unix socket uses shared memory.
  auto client = Client::Create("unix:" + sock);
  ASSERT_TRUE(client.ok());
  TensorMap in;
  in.emplace("x", HostTensor::FromVector(v1::DTYPE_F32, {3}, std::vector<float>{1, 2, 3}));
  auto r = (*client)->Run(GraphFromText(kTwoOutputs), in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->shared_memory);
  EXPECT_EQ(r->output("z")->data_as<float>()[2], 4);
}

TEST(UnixListener, UnmappedUidIsRefused) {
  TempDir cache;
  const std::string sock = cache.path() + "/kilnd.sock";
  std::string error;
  auto kilnd = KilndProcess::Start(
      {.cache_dir = cache.path(),
       .config_text = Config(),
       .extra_flags = {absl::StrCat("--listen=127.0.0.1:0,unix:", sock)}},
      &error);
  ASSERT_NE(kilnd, nullptr) << error;
  auto stub = v1::Kiln::NewStub(grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials()));
  auto ctx = Context();
  v1::ServerInfoResponse info;
  grpc::Status s = stub->ServerInfo(ctx.get(), {}, &info);
  EXPECT_EQ(s.error_code(), grpc::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("maps to no tenant"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace kiln
