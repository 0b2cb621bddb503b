// The model repository through real kilnd (--model_repository in the config):
// models listed with their state, sessions opened by name from two tenants on
// one shared copy of the weights (uncharged; a change copies them and charges
// the tenant), admin-only load and unload, hot reload of a new version while
// a session on the old one keeps running, and unload giving the weights'
// memory back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/io/safetensors.h"
#include "server/config.h"
#include "tests/e2e/models.h"
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

constexpr char kAdmin[] = "admin-secret";
constexpr char kUser[] = "user-secret";
const std::vector<int64_t> kWidths = {64, 256, 256, 8};

// Writes version `version` of the MLP into `root`/mlp/ through a staging
// directory and a rename, as docs/models.md tells operators to.
models::Model WriteMlp(const std::string& root, int64_t version, uint64_t seed) {
  models::Model m = models::Mlp(seed, kWidths);
  const fs::path stage = fs::path(root) / absl::StrCat(".stage-", version);
  fs::create_directories(stage);
  std::ofstream(stage / "model.pb", std::ios::binary) << m.graph.SerializeAsString();
  std::vector<io::SafetensorsItem> items;
  for (const auto& [name, t] : m.params) items.emplace_back(name, &t);
  EXPECT_TRUE(io::WriteSafetensors((stage / "weights.safetensors").string(), items, {}).ok());
  fs::create_directories(fs::path(root) / "mlp");
  fs::rename(stage, fs::path(root) / "mlp" / std::to_string(version));
  return m;
}

int64_t ParamBytes(const models::Model& m) {
  int64_t b = 0;
  for (const auto& [name, t] : m.params) b += t.num_bytes();
  return b;
}

class ServerRepository : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_ = std::make_unique<TempDir>();
    cache_ = std::make_unique<TempDir>();
    v1_ = WriteMlp(repo_->path(), 1, 1);
    // A model whose weights lack a param, and entries that are not models.
    fs::create_directories(fs::path(repo_->path()) / "broken" / "3");
    models::Model b = models::Mlp(2, kWidths);
    std::ofstream(fs::path(repo_->path()) / "broken" / "3" / "model.pb", std::ios::binary)
        << b.graph.SerializeAsString();
    fs::create_directories(fs::path(repo_->path()) / ".hidden" / "1");
    fs::create_directories(fs::path(repo_->path()) / "mlp" / "latest");
    const std::string config = absl::StrCat(R"(
tenants { name: "ops" api_key_sha256: ")", server::Sha256Hex(kAdmin), R"(" admin: true }
tenants { name: "user" api_key_sha256: ")", server::Sha256Hex(kUser), R"("
          quota { max_param_bytes: 4096 } }
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

  v1::ListModelsResponse List() {
    v1::ListModelsResponse r;
    grpc::Status s = stub_->ListModels(Context(kUser).get(), {}, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r;
  }
  const v1::ModelVersionInfo* Find(const v1::ListModelsResponse& r, const std::string& name, int64_t v) {
    for (const auto& m : r.models()) {
      if (m.name() == name && m.version() == v) return &m;
    }
    return nullptr;
  }
  // Waits until `name`:`v` is in `state` (hot reload runs every 0.2 s; the
  // bound is generous for a loaded CI host).
  bool WaitState(const std::string& name, int64_t v, v1::ModelState state) {
    for (int i = 0; i < 600; ++i) {
      v1::ListModelsResponse r = List();
      if (const auto* m = Find(r, name, v); m && m->state() == state) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::string Open(const std::string& key, const std::string& model, int64_t version = 0,
                   grpc::Status* status = nullptr) {
    v1::CreateSessionRequest req;
    req.mutable_graph()->mutable_model()->set_name(model);
    req.mutable_graph()->mutable_model()->set_version(version);
    v1::CreateSessionResponse resp;
    grpc::Status s = stub_->CreateSession(Context(key).get(), req, &resp);
    if (status) *status = s;
    else EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_id();
  }
  HostTensor Run(const std::string& key, const std::string& session, const HostTensor& x) {
    v1::RunRequest req;
    req.set_session_id(session);
    auto* in = req.add_inputs();
    in->set_name("x");
    *in->mutable_tensor() = ToProto(x);
    v1::RunResponse resp;
    grpc::Status s = stub_->Run(Context(key).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok() || resp.outputs_size() == 0) return HostTensor();
    return FromProto(resp.outputs(0).tensor());
  }
  static void ExpectNear(const HostTensor& got, const HostTensor& want) {
    ASSERT_EQ(got.dims(), want.dims());
    for (int64_t i = 0; i < got.num_elements(); ++i) {
      ASSERT_NEAR(got.GetAsDouble(i), want.GetAsDouble(i), 1e-4 * (1 + std::abs(want.GetAsDouble(i)))) << i;
    }
  }

  std::unique_ptr<TempDir> repo_, cache_;
  std::unique_ptr<KilndProcess> kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
  models::Model v1_;
};

HostTensor Input(uint64_t seed) {
  HostTensor x = *HostTensor::Create(v1::DTYPE_F32, {3, kWidths[0]});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.SetFromDouble(i, std::sin(0.37 * i + seed));
  return x;
}

TEST_F(ServerRepository, ListsModelsAndServesTwoTenantsOnOneSharedCopy) {
  v1::ListModelsResponse r = List();
  EXPECT_EQ(r.repository(), repo_->path());
  const auto* mlp = Find(r, "mlp", 1);
  ASSERT_NE(mlp, nullptr);
  EXPECT_EQ(mlp->state(), v1::MODEL_STATE_READY);
  EXPECT_EQ(mlp->graph_file(), "model.pb");
  ASSERT_EQ(mlp->weight_files_size(), 1);
  EXPECT_EQ(mlp->param_bytes(), ParamBytes(v1_));
  EXPECT_EQ(mlp->signature().inputs(0).name(), "x");
  const auto* broken = Find(r, "broken", 3);
  ASSERT_NE(broken, nullptr);
  EXPECT_EQ(broken->state(), v1::MODEL_STATE_FAILED);
  EXPECT_NE(broken->error().find("have no tensor in the weight files"), std::string::npos) << broken->error();
  EXPECT_NE(broken->error().find("w1"), std::string::npos) << broken->error();
  for (const auto& m : r.models()) EXPECT_NE(m.name(), ".hidden");
  EXPECT_EQ(r.models_size(), 2);

  // Both tenants open the model by name; "user" may hold 4 KiB of params, far
  // less than the weights: shared weights are charged to no tenant.
  const std::string a = Open(kAdmin, "mlp");
  const std::string u = Open(kUser, "mlp");
  ASSERT_FALSE(a.empty() || u.empty());
  const HostTensor x = Input(1);
  const HostTensor want = models::MlpReference(v1_, x);
  ExpectNear(Run(kAdmin, a, x), want);
  ExpectNear(Run(kUser, u, x), want);
  EXPECT_EQ(Find(List(), "mlp", 1)->sessions(), 2);

  // A change copies the weights for that session only: charged to its tenant
  // ("user" cannot afford the copy), the other session unchanged.
  std::map<std::string, HostTensor> b3;
  b3.emplace("b3", HostTensor::FromVector<float>(v1::DTYPE_F32, {kWidths.back()}, std::vector<float>(8, 100.f)));
  grpc::Status denied = testing::UploadParams(*stub_, u, b3, 1 << 20, kUser);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << denied.error_message();
  grpc::Status ok = testing::UploadParams(*stub_, a, b3, 1 << 20, kAdmin);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  const HostTensor changed = Run(kAdmin, a, x);
  EXPECT_NEAR(changed.GetAsDouble(0), want.GetAsDouble(0) - v1_.params.at("b3").GetAsDouble(0) + 100, 1e-3);
  ExpectNear(Run(kUser, u, x), want);

  // Bad references name what is wrong.
  grpc::Status s;
  Open(kUser, "nope", 0, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("its models: broken, mlp"), std::string::npos) << s.error_message();
  Open(kUser, "mlp", 7, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  Open(kUser, "../etc", 0, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  Open(kUser, "broken", 0, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
}

TEST_F(ServerRepository, OnlyAdminsLoadAndUnload) {
  v1::LoadModelRequest load;
  load.set_name("mlp");
  v1::LoadModelResponse lr;
  EXPECT_EQ(stub_->LoadModel(Context(kUser).get(), load, &lr).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::UnloadModelRequest unload;
  unload.set_name("mlp");
  v1::UnloadModelResponse ur;
  EXPECT_EQ(stub_->UnloadModel(Context(kUser).get(), unload, &ur).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(stub_->LoadModel(Context(kAdmin).get(), load, &lr).ok());
  EXPECT_EQ(lr.model().state(), v1::MODEL_STATE_READY);
}

TEST_F(ServerRepository, HotReloadKeepsOldSessionsAndUnloadFreesTheWeights) {
  const HostTensor x = Input(2);
  const std::string old_session = Open(kUser, "mlp");
  ASSERT_FALSE(old_session.empty());

  const models::Model v2 = WriteMlp(repo_->path(), 2, 7);
  ASSERT_TRUE(WaitState("mlp", 2, v1::MODEL_STATE_READY));
  // Version 1 was loaded automatically: it unloads once 2 is ready, and the
  // session open on it keeps it until it closes.
  ASSERT_TRUE(WaitState("mlp", 1, v1::MODEL_STATE_UNLOADING));
  ExpectNear(Run(kUser, old_session, x), models::MlpReference(v1_, x));
  const std::string new_session = Open(kUser, "mlp");
  ExpectNear(Run(kUser, new_session, x), models::MlpReference(v2, x));
  EXPECT_EQ(Find(List(), "mlp", 1)->sessions(), 1);

  v1::CloseSessionRequest close;
  v1::CloseSessionResponse closed;
  close.set_session_id(old_session);
  ASSERT_TRUE(stub_->CloseSession(Context(kUser).get(), close, &closed).ok());
  close.set_session_id(new_session);
  ASSERT_TRUE(stub_->CloseSession(Context(kUser).get(), close, &closed).ok());
  EXPECT_EQ(Find(List(), "mlp", 1)->state(), v1::MODEL_STATE_AVAILABLE);

  // Unloading version 2 with no session on it frees its weights.
  const std::map<std::string, std::string> cpu = {{"device", "cpu:0"}};
  const double before = MetricValue(testing::HttpGet(kilnd_->metrics_port(), "/metrics"),
                                    "kiln_device_memory_in_use_bytes", cpu);
  v1::UnloadModelRequest unload;
  unload.set_name("mlp");
  v1::UnloadModelResponse ur;
  ASSERT_TRUE(stub_->UnloadModel(Context(kAdmin).get(), unload, &ur).ok());
  ASSERT_EQ(ur.unloaded_size(), 1);
  EXPECT_EQ(ur.unloaded(0).version(), 2);
  const double after = MetricValue(testing::HttpGet(kilnd_->metrics_port(), "/metrics"),
                                   "kiln_device_memory_in_use_bytes", cpu);
  EXPECT_LE(after, before - static_cast<double>(ParamBytes(v2))) << before << " -> " << after;
  // An unloaded version stays down (hot reload does not bring it back) and
  // says so; LoadModel brings it back.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  grpc::Status s;
  Open(kUser, "mlp", 2, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  v1::LoadModelRequest load;
  load.set_name("mlp");
  v1::LoadModelResponse lr;
  ASSERT_TRUE(stub_->LoadModel(Context(kAdmin).get(), load, &lr).ok());
  EXPECT_EQ(lr.model().version(), 2);
  ExpectNear(Run(kUser, Open(kUser, "mlp"), x), models::MlpReference(v2, x));

  const std::string metrics = testing::HttpGet(kilnd_->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(metrics, "kiln_model_versions", {{"model", "mlp"}, {"version", "2"}, {"state", "ready"}}), 1);
  EXPECT_GE(MetricValue(metrics, "kiln_model_loads_total", {{"model", "mlp"}, {"outcome", "ok"}}), 3);
  EXPECT_GE(MetricValue(metrics, "kiln_model_loads_total", {{"model", "broken"}, {"outcome", "failed"}}), 1);
}

}  // namespace
}  // namespace kiln
