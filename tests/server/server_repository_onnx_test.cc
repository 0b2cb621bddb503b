// A value-specialised ONNX model in kilnd's model repository (server/models.h):
// a Loop whose trip count n is a graph input and whose scan output stacks
// every step, exported from PyTorch (tests/engine/io/export_torch_models.py
// --models loop_scan). Its shapes depend on n's value, so kilnd cannot import
// it once at load: the version keeps an io::OnnxSpecializer and a session on
// it imports and compiles once per distinct n. Checked through real kilnd and
// its gRPC client: outputs equal PyTorch's for two trip counts, on two
// tenants sharing the weights; the errors (wrong dtype or shape of n, a trip
// count over max_while_iterations, Compile on the model); the metrics; hot
// reload of a new version while a session on the old one keeps running.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/io/npy.h"
#include "server/config.h"
#include "tests/server/kilnd_process.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::Context;
using testing::FromProto;
using testing::KilndProcess;
using testing::MetricValue;
using testing::TempDir;
using testing::ToProto;

constexpr char kOnnxAdmin[] = "admin-secret";
constexpr char kOnnxUser[] = "user-secret";
constexpr int64_t kMaxIterations = 50;  // limits.max_while_iterations

class ServerRepositoryOnnx : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    exported_ = new TempDir();
    const char* src = std::getenv("KILN_SOURCE_DIR");
    const std::string cmd =
        absl::StrCat("/usr/bin/python3 ", src ? src : ".", "/tests/engine/io/export_torch_models.py --out ",
                     exported_->path(), " --models loop_scan > ", exported_->path(), "/export.log 2>&1");
    export_status_ = std::system(cmd.c_str());
  }
  static void TearDownTestSuite() {
    delete exported_;
    exported_ = nullptr;
  }

  void SetUp() override {
    ASSERT_EQ(export_status_, 0) << "export_torch_models.py --models loop_scan failed (needs /usr/bin/python3 "
                                    "with python3-torch and python3-onnx); see "
                                 << exported_->path() << "/export.log";
    repo_ = std::make_unique<TempDir>();
    cache_ = std::make_unique<TempDir>();
    WriteVersion(1);
    const std::string config = absl::StrCat(R"(
tenants { name: "ops" api_key_sha256: ")", server::Sha256Hex(kOnnxAdmin), R"(" admin: true }
tenants { name: "user" api_key_sha256: ")", server::Sha256Hex(kOnnxUser), R"("
          quota { max_param_bytes: 64 } }
limits { max_while_iterations: )", kMaxIterations, R"( }
model_repository { root: ")", repo_->path(), R"(" poll_seconds: 0.2 }
)");
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_->path(), .config_text = config}, &error);
    ASSERT_NE(kilnd_, nullptr) << error;
    stub_ = kilnd_->Stub();
  }
  void TearDown() override {
    if (HasFailure() && kilnd_) std::cerr << "kilnd log:\n" << kilnd_->Log();
  }

  // repo/loop/<version>/model.onnx, through a staging directory and a rename.
  void WriteVersion(int64_t version) {
    const fs::path stage = fs::path(repo_->path()) / absl::StrCat(".stage-", version);
    fs::create_directories(stage);
    fs::copy_file(fs::path(exported_->path()) / "loop_scan.onnx", stage / "model.onnx");
    fs::create_directories(fs::path(repo_->path()) / "loop");
    fs::rename(stage, fs::path(repo_->path()) / "loop" / std::to_string(version));
  }
  static HostTensor Load(const std::string& name) {
    absl::StatusOr<HostTensor> t = ReadNpy((fs::path(exported_->path()) / ("loop_scan." + name + ".npy")).string());
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : HostTensor();
  }

  v1::ListModelsResponse List() {
    v1::ListModelsResponse r;
    grpc::Status s = stub_->ListModels(Context(kOnnxUser).get(), {}, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r;
  }
  const v1::ModelVersionInfo* Find(const v1::ListModelsResponse& r, int64_t v) {
    for (const auto& m : r.models()) {
      if (m.name() == "loop" && m.version() == v) return &m;
    }
    return nullptr;
  }
  bool WaitState(int64_t v, v1::ModelState state) {
    for (int i = 0; i < 600; ++i) {
      v1::ListModelsResponse r = List();
      if (const auto* m = Find(r, v); m && m->state() == state) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::string Open(const std::string& key, int64_t version = 0) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->mutable_model()->set_name("loop");
    req.mutable_graph()->mutable_model()->set_version(version);
    v1::CreateSessionResponse resp;
    grpc::Status s = stub_->CreateSession(Context(key).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  }
  // One run with x and n; the outputs by name, or the status.
  grpc::Status Run(const std::string& key, const std::string& session, const HostTensor& x, const HostTensor* n,
                   std::map<std::string, HostTensor>* out) {
    v1::RunRequest req;
    req.set_session_id(session);
    auto* in = req.add_inputs();
    in->set_name("x");
    *in->mutable_tensor() = ToProto(x);
    if (n != nullptr) {
      in = req.add_inputs();
      in->set_name("n");
      *in->mutable_tensor() = ToProto(*n);
    }
    v1::RunResponse resp;
    grpc::Status s = stub_->Run(Context(key).get(), req, &resp);
    if (s.ok() && out != nullptr) {
      for (const auto& o : resp.outputs()) out->emplace(o.name(), FromProto(o.tensor()));
    }
    return s;
  }
  // Runs with n = `trips` and checks both outputs against PyTorch's.
  void ExpectPyTorch(const std::string& key, const std::string& session, int64_t trips) {
    const HostTensor x = Load("x");
    const HostTensor n = Load(absl::StrCat("n", trips));
    std::map<std::string, HostTensor> out;
    grpc::Status s = Run(key, session, x, &n, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
    for (const char* name : {"last", "ys"}) {
      SCOPED_TRACE(absl::StrCat(name, " n=", trips));
      ASSERT_TRUE(out.contains(name));
      const HostTensor want = Load(absl::StrCat(name, trips));
      const HostTensor& got = out.at(name);
      ASSERT_EQ(got.dims(), want.dims());
      for (int64_t i = 0; i < got.num_elements(); ++i) {
        const double w = want.GetAsDouble(i);
        ASSERT_NEAR(got.GetAsDouble(i), w, 1e-5 + 1e-5 * std::abs(w)) << i;
      }
    }
  }
  double Metric(const std::string& name, int64_t version) {
    return MetricValue(testing::HttpGet(kilnd_->metrics_port(), "/metrics"), name,
                       {{"model", "loop"}, {"version", std::to_string(version)}, {"value_inputs", "n"}});
  }

  static TempDir* exported_;
  static int export_status_;
  std::unique_ptr<TempDir> repo_, cache_;
  std::unique_ptr<KilndProcess> kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TempDir* ServerRepositoryOnnx::exported_ = nullptr;
int ServerRepositoryOnnx::export_status_ = -1;

TEST_F(ServerRepositoryOnnx, LoopWithTripCountInputCompilesPerValueAndMatchesPyTorch) {
  ASSERT_TRUE(WaitState(1, v1::MODEL_STATE_READY)) << List().DebugString();
  const v1::ListModelsResponse listed = List();
  const v1::ModelVersionInfo* m = Find(listed, 1);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->graph_file(), "model.onnx");
  EXPECT_EQ(m->param_bytes(), (8 * 8 + 8) * 4);  // lin.weight, lin.bias: shared like any model's
  ASSERT_EQ(m->signature().inputs_size(), 2);
  EXPECT_EQ(m->signature().inputs(0).name(), "x");
  EXPECT_EQ(m->signature().inputs(1).name(), "n");
  EXPECT_EQ(m->signature().inputs(1).type().dtype(), v1::DTYPE_I64);
  // ListModels says which input specialises the model, so a client knows n is read by value.
  ASSERT_EQ(m->value_inputs_size(), 1);
  EXPECT_EQ(m->value_inputs(0), "n");
  ASSERT_EQ(m->signature().outputs_size(), 2);
  EXPECT_EQ(m->signature().outputs(1).type().dims(0).symbol(), "steps");
  // No value seen yet: only the load's import.
  EXPECT_EQ(Metric("kiln_model_value_specializations", 1), 0);

  // Two tenants on one shared copy of the weights ("user" may hold 64 bytes
  // of params: the 288 bytes are the repository's), two trip counts each.
  const std::string a = Open(kOnnxAdmin);
  const std::string u = Open(kOnnxUser);
  ASSERT_FALSE(a.empty() || u.empty());
  ExpectPyTorch(kOnnxAdmin, a, 3);
  ExpectPyTorch(kOnnxAdmin, a, 5);
  ExpectPyTorch(kOnnxUser, u, 5);
  ExpectPyTorch(kOnnxUser, u, 3);
  ExpectPyTorch(kOnnxAdmin, a, 3);  // the session's executable for n = 3, again
  EXPECT_EQ(Find(List(), 1)->sessions(), 2);
  // One import per distinct value, shared by both sessions (and tenants).
  EXPECT_EQ(Metric("kiln_model_value_specializations", 1), 2);

  const HostTensor x = Load("x");
  // n of the wrong dtype or shape, or missing: INVALID_ARGUMENT naming n.
  const HostTensor n32 = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {}, {3});
  grpc::Status s = Run(kOnnxUser, u, x, &n32, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("\"n\""), std::string::npos) << s.error_message();
  const HostTensor n1 = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {1}, {3});
  s = Run(kOnnxUser, u, x, &n1, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = Run(kOnnxUser, u, x, nullptr, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // A trip count over limits.max_while_iterations: RESOURCE_EXHAUSTED naming the Loop.
  const HostTensor big = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {kMaxIterations + 1});
  s = Run(kOnnxUser, u, x, &big, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("recurrence"), std::string::npos) << s.error_message();
  // n = 0: no iteration, an empty scan output.
  const HostTensor zero = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {}, {0});
  std::map<std::string, HostTensor> out;
  s = Run(kOnnxUser, u, x, &zero, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(out.contains("ys"));
  EXPECT_EQ(out.at("ys").dims(), (Dims{0, 2, 8}));
  // The session still serves after the errors.
  ExpectPyTorch(kOnnxUser, u, 5);

  // Compile cannot take it: its graph depends on the values.
  v1::CompileRequest compile;
  compile.mutable_graph()->mutable_model()->set_name("loop");
  v1::CompileResponse cr;
  s = stub_->Compile(Context(kOnnxUser).get(), compile, &cr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("value-specialised"), std::string::npos) << s.error_message();
}

TEST_F(ServerRepositoryOnnx, HotReloadKeepsTheOldVersionsSessionRunning) {
  ASSERT_TRUE(WaitState(1, v1::MODEL_STATE_READY));
  const std::string old_session = Open(kOnnxUser);
  ASSERT_FALSE(old_session.empty());
  ExpectPyTorch(kOnnxUser, old_session, 3);

  WriteVersion(2);
  ASSERT_TRUE(WaitState(2, v1::MODEL_STATE_READY));
  ASSERT_TRUE(WaitState(1, v1::MODEL_STATE_UNLOADING));
  ExpectPyTorch(kOnnxUser, old_session, 5);  // a new value on the unloading version still imports
  const std::string new_session = Open(kOnnxUser);
  ASSERT_FALSE(new_session.empty());
  ExpectPyTorch(kOnnxUser, new_session, 5);
  EXPECT_EQ(Find(List(), 1)->sessions(), 1);
  EXPECT_EQ(Find(List(), 2)->sessions(), 1);
  EXPECT_EQ(Metric("kiln_model_value_specializations", 2), 1);

  v1::CloseSessionRequest close;
  v1::CloseSessionResponse closed;
  close.set_session_id(old_session);
  ASSERT_TRUE(stub_->CloseSession(Context(kOnnxUser).get(), close, &closed).ok());
  EXPECT_EQ(Find(List(), 1)->state(), v1::MODEL_STATE_AVAILABLE);
  ExpectPyTorch(kOnnxUser, new_session, 3);
}

}  // namespace
}  // namespace kiln
