// Faults contained, over a real kilnd and real clients (DESIGN.md section 5):
// kilnd runs vulkan:0 in a device worker process that has the test-only fault
// kernel (KILN_DEVICE_WORKER = kiln_fault_worker). Two tenants load kilnd at
// once: "steady" runs a CPU graph and a Vulkan graph from several threads
// while "faulty" sends graphs whose kernel crashes, then hangs, the worker.
// Every steady CPU run succeeds with the right answer; a steady Vulkan run
// either succeeds with the right answer or, in flight when the worker died,
// fails UNAVAILABLE naming vulkan:0; kilnd never stops; the device comes back
// after each fault with a new worker, and steady's Vulkan runs succeed again.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "tests/engine/runtime/worker/fault_graph.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

constexpr char kSteady[] = "steady-secret-key";
constexpr char kFaulty[] = "faulty-secret-key";

std::string IsolationConfig() {
  using server::Sha256Hex;
  return absl::StrCat("device_wait_floor_seconds: 2\n", R"(
tenants { name: "steady" api_key_sha256: ")", Sha256Hex(kSteady), R"(" }
tenants { name: "faulty" api_key_sha256: ")", Sha256Hex(kFaulty), R"(" }
)");
}

v1::DeviceInfo Device(v1::Kiln::Stub& stub, const std::string& id) {
  v1::ListDevicesResponse resp;
  EXPECT_TRUE(stub.ListDevices(Context(kSteady).get(), {}, &resp).ok());
  for (const v1::DeviceInfo& d : resp.devices()) {
    if (d.id() == id) return d;
  }
  return {};
}

v1::RunRequest FaultRequest(const std::string& mode) {
  v1::RunRequest req;
  *req.mutable_graph()->mutable_graph() = testing::FaultGraph(mode);
  req.mutable_options()->set_device("vulkan:0");
  std::vector<double> x(64);
  for (int i = 0; i < 64; ++i) x[i] = i * 0.25 - 3;
  testing::AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {64}, x);
  return req;
}

// y = 2x exactly (the pass kernel copies x * 2).
bool PassAnswerIsRight(const v1::RunResponse& resp) {
  if (resp.outputs_size() != 1) return false;
  const HostTensor y = testing::FromProto(resp.outputs(0).tensor());
  if (y.num_bytes() != 64 * 4) return false;
  const float* p = static_cast<const float*>(y.data());
  for (int i = 0; i < 64; ++i) {
    if (p[i] != static_cast<float>(2 * (i * 0.25 - 3))) return false;
  }
  return true;
}

TEST(ServerIsolation, TwoTenantsUnderLoadWhileAWorkerCrashesAndHangs) {
  TempDir cache;
  ::setenv("KILN_DEVICE_WORKER", KILN_FAULT_WORKER_PATH, 1);
  std::string error;
  auto kilnd = KilndProcess::Start({.cache_dir = cache.path(), .config_text = IsolationConfig()}, &error);
  ::unsetenv("KILN_DEVICE_WORKER");
  ASSERT_NE(kilnd, nullptr) << error;
  auto stub = kilnd->Stub();
  const v1::DeviceInfo first = Device(*stub, "vulkan:0");
  if (first.id().empty()) GTEST_SKIP() << "no Vulkan device";

  std::atomic<bool> stop = false;
  std::atomic<int> cpu_ok = 0, cpu_bad = 0, vk_ok = 0, vk_unavailable = 0, vk_bad = 0;
  std::vector<std::string> bad_messages;
  std::mutex bad_mu;
  auto note_bad = [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(bad_mu);
    if (bad_messages.size() < 5) bad_messages.push_back(m);
  };
  std::vector<std::thread> steady;
  for (int t = 0; t < 3; ++t) {
    steady.emplace_back([&, t] {
      auto s = kilnd->Stub();
      while (!stop.load()) {
        if (t != 2) {
          v1::RunResponse resp;
          v1::RunRequest req = testing::AffineRequest();
          req.mutable_options()->set_device("cpu:0");
          const grpc::Status st = s->Run(Context(kSteady).get(), req, &resp);
          const bool right = st.ok() && resp.outputs_size() == 1;
          (right ? cpu_ok : cpu_bad)++;
          if (!right) note_bad(absl::StrCat("cpu: ", st.error_message()));
          continue;
        }
        v1::RunResponse resp;
        const grpc::Status st = s->Run(Context(kSteady).get(), FaultRequest("pass"), &resp);
        if (st.ok() && PassAnswerIsRight(resp)) {
          ++vk_ok;
        } else if (st.error_code() == grpc::StatusCode::UNAVAILABLE &&
                   absl::StrContains(st.error_message(), "vulkan:0")) {
          ++vk_unavailable;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } else {
          ++vk_bad;
          note_bad(absl::StrCat("vulkan: ", st.error_code(), " ", st.error_message()));
        }
      }
    });
  }

  int64_t restarts = 0;
  for (const std::string mode : {"crash", "hang"}) {
    v1::RunResponse resp;
    const grpc::Status st = stub->Run(Context(kFaulty).get(), FaultRequest(mode), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << mode << ": " << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), "vulkan:0")) << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(),
                                  mode == "crash" ? "killed by signal 11" : "did not answer"))
        << st.error_message();
    ++restarts;
    v1::DeviceInfo d;
    for (int i = 0; i < 600; ++i) {
      d = Device(*stub, "vulkan:0");
      if (d.healthy() && d.restarts() >= restarts) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(d.healthy()) << mode << ": " << d.fault();
    EXPECT_GE(d.restarts(), restarts) << mode;
  }
  // Steady's Vulkan runs succeed again on the last worker.
  const int vk_before = vk_ok.load();
  for (int i = 0; i < 600 && vk_ok.load() < vk_before + 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  for (auto& t : steady) t.join();

  EXPECT_GT(cpu_ok.load(), 0);
  EXPECT_EQ(cpu_bad.load(), 0);
  EXPECT_GE(vk_ok.load(), vk_before + 3);
  EXPECT_EQ(vk_bad.load(), 0);
  for (const auto& m : bad_messages) ADD_FAILURE() << m;
  const v1::DeviceInfo last = Device(*stub, "vulkan:0");
  EXPECT_EQ(last.faults(), 2);
  EXPECT_EQ(testing::HealthStatus(*kilnd->channel()), 1);  // kilnd itself never stopped
  EXPECT_EQ(testing::HealthStatus(*kilnd->channel(), "kiln.device/cpu:0"), 1);
  const std::string m = testing::HttpGet(kilnd->metrics_port(), "/metrics");
  EXPECT_EQ(testing::MetricValue(m, "kiln_device_faults_total", {{"device", "vulkan:0"}}), 2);
  EXPECT_EQ(testing::MetricValue(m, "kiln_device_faults_total", {{"device", "cpu:0"}}), 0);
  std::printf("steady: %d cpu runs ok, %d vulkan runs ok, %d vulkan runs UNAVAILABLE (in flight "
              "at a fault)\n",
              cpu_ok.load(), vk_ok.load(), vk_unavailable.load());
  if (HasFailure()) std::cerr << "kilnd log:\n" << kilnd->Log();
}

}  // namespace
}  // namespace kiln
