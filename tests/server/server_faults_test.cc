// Device faults over a real kilnd: a Vulkan device whose waits are bounded far
// below what its work takes (device_wait_floor_seconds / device_wait_slack)
// faults on every real run. Its runs fail UNAVAILABLE naming it, ListDevices,
// /metrics and the per-device health service follow its state, the CPU keeps
// serving every tenant, and the device comes back after its restart probe.
// Without a Vulkan device (lavapipe) the suite has nothing to fault and says so.
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using testing::Context;
using testing::KilndProcess;
using testing::TempDir;

class ServerFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_ = new TempDir();
    std::string error;
    kilnd_ = KilndProcess::Start({.cache_dir = cache_->path(),
                                  .config_text = "device_wait_floor_seconds: 0.000001\n"
                                                 "device_wait_slack: 0.000001\n"},
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

  v1::DeviceInfo Device(const std::string& id) {
    v1::ListDevicesResponse resp;
    EXPECT_TRUE(stub_->ListDevices(Context().get(), {}, &resp).ok());
    for (const v1::DeviceInfo& d : resp.devices()) {
      if (d.id() == id) return d;
    }
    return {};
  }

  static TempDir* cache_;
  static KilndProcess* kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TempDir* ServerFaults::cache_ = nullptr;
KilndProcess* ServerFaults::kilnd_ = nullptr;

TEST_F(ServerFaults, AFaultedDeviceFailsOnlyItsRunsAndComesBack) {
  if (Device("vulkan:0").id().empty()) GTEST_SKIP() << "no Vulkan device to fault";
  v1::DeviceInfo before = Device("vulkan:0");
  EXPECT_TRUE(before.healthy());
  EXPECT_EQ(before.faults(), 0);
  EXPECT_GE(before.concurrent_runs(), 1);
  EXPECT_EQ(testing::HealthStatus(*kilnd_->channel(), "kiln.device/vulkan:0"), 1);  // SERVING
  EXPECT_EQ(testing::HealthStatus(*kilnd_->channel(), "kiln.device/cpu:0"), 1);

  // A run pinned to the device: its wait times out, a device fault.
  v1::RunRequest on_vk = testing::SlowRequest(256, 4);
  on_vk.mutable_options()->set_device("vulkan:0");
  v1::RunResponse resp;
  const grpc::Status s = stub_->Run(Context().get(), on_vk, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "vulkan:0: device fault")) << s.error_message();

  // The CPU keeps serving meanwhile.
  v1::RunResponse ok;
  EXPECT_TRUE(stub_->Run(Context().get(), testing::AffineRequest(), &ok).ok());

  // Counted, and restarted by the probe (a small copy on a fresh stream,
  // generously bounded): healthy again, in ListDevices, /metrics and health.
  v1::DeviceInfo after;
  for (int i = 0; i < 200; ++i) {
    after = Device("vulkan:0");
    if (after.healthy() && after.restarts() >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(after.faults(), 1);
  EXPECT_GE(after.restarts(), 1);
  EXPECT_TRUE(after.healthy());
  EXPECT_TRUE(absl::StrContains(after.fault(), "device fault")) << after.fault();
  const std::string m = testing::HttpGet(kilnd_->metrics_port(), "/metrics");
  EXPECT_EQ(testing::MetricValue(m, "kiln_device_faults_total", {{"device", "vulkan:0"}}), 1);
  EXPECT_GE(testing::MetricValue(m, "kiln_device_restarts_total", {{"device", "vulkan:0"}}), 1);
  EXPECT_EQ(testing::MetricValue(m, "kiln_device_faults_total", {{"device", "cpu:0"}}), 0);
  for (int i = 0; i < 50; ++i) {
    if (testing::HealthStatus(*kilnd_->channel(), "kiln.device/vulkan:0") == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(testing::HealthStatus(*kilnd_->channel(), "kiln.device/vulkan:0"), 1);
  EXPECT_NE(kilnd_->Log().find("marked unhealthy"), std::string::npos);
  EXPECT_EQ(testing::HealthStatus(*kilnd_->channel()), 1);  // kilnd itself never stopped
}

}  // namespace
}  // namespace kiln
