// Calibration measures real numbers once and reuses them from the cache.
#include "engine/runtime/calibration.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/runtime/device_registry.h"
#include "engine/runtime/device_worker.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

TEST(Calibration, MeasuresThenReusesTheCache) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device& cpu = *(*registry)->cpu();
  const fs::path dir = fs::temp_directory_path() / ("kiln_calib_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto first = CalibrateCached(cpu, dir.string());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_cache);
  const backend::DeviceProfile& p = first->profile;
  EXPECT_TRUE(p.calibrated);
  EXPECT_GT(p.peak_gflops_f32, 1.0);
  EXPECT_GT(p.bandwidth_gbps, 0.1);
  EXPECT_GT(p.launch_overhead_us, 0.0);
  EXPECT_EQ(p.host_to_device_gbps, 0.0);  // host memory: no copies

  auto second = CalibrateCached(cpu, dir.string());
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->from_cache);
  EXPECT_DOUBLE_EQ(second->profile.peak_gflops_f32, p.peak_gflops_f32);
  EXPECT_DOUBLE_EQ(second->profile.sync_overhead_us, p.sync_overhead_us);

  // A damaged cache file is measured over, never trusted.
  for (const auto& e : fs::directory_iterator(dir / "calibration")) {
    std::ofstream(e.path()) << "{not json";
  }
  auto third = CalibrateCached(cpu, dir.string());
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->from_cache);
  fs::remove_all(dir);
}

TEST(DeviceWorker, RunsInOrderAndCounts) {
  DeviceWorker worker("cpu:0");
  std::vector<int> order;
  std::vector<std::future<int>> results;
  for (int i = 0; i < 20; ++i) {
    results.push_back(worker.Submit([i, &order] {
      order.push_back(i);  // only the worker thread touches `order`
      return i * i;
    }));
  }
  for (int i = 0; i < 20; ++i) EXPECT_EQ(results[i].get(), i * i);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
  const WorkerStats s = worker.stats();
  EXPECT_EQ(s.runs, 20);
  EXPECT_EQ(s.queued, 0);
  EXPECT_GE(s.busy_micros, 0.0);
}

}  // namespace
}  // namespace kiln::runtime
