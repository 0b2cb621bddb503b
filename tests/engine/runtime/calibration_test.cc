// Calibration measures real numbers once and reuses them from the cache.
#include "engine/runtime/calibration.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "engine/runtime/device_registry.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

TEST(Calibration, MeasuresThenReusesTheCache) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device& cpu = *(*registry)->cpu();
  const fs::path dir = fs::temp_directory_path() / ("kiln_calib_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // The tests run beside other builds and tests: any load is accepted here.
  constexpr double kAnyLoad = 1e9;
  auto first = CalibrateCached(cpu, dir.string(), kAnyLoad);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_cache);
  const backend::DeviceProfile& p = first->profile;
  EXPECT_TRUE(p.calibrated);
  EXPECT_GT(p.peak_gflops_f32, 1.0);
  EXPECT_GT(p.bandwidth_gbps, 0.1);
  EXPECT_GT(p.launch_overhead_us, 0.0);
  EXPECT_EQ(p.host_to_device_gbps, 0.0);  // host memory: no copies

  auto second = CalibrateCached(cpu, dir.string(), kAnyLoad);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->from_cache);
  EXPECT_DOUBLE_EQ(second->profile.peak_gflops_f32, p.peak_gflops_f32);
  EXPECT_DOUBLE_EQ(second->profile.sync_overhead_us, p.sync_overhead_us);

  // A damaged cache file is measured over, never trusted.
  for (const auto& e : fs::directory_iterator(dir / "calibration")) {
    std::ofstream(e.path()) << "{not json";
  }
  auto third = CalibrateCached(cpu, dir.string(), kAnyLoad);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->from_cache);
  // A FIFO (or any non-regular file) in its place is not opened: reading one
  // would block kilnd's start for good.
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir / "calibration")) entries.push_back(e.path());
  ASSERT_FALSE(entries.empty());
  for (const auto& path : entries) {
    fs::remove(path);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  }
  auto fourth = CalibrateCached(cpu, dir.string(), kAnyLoad);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_FALSE(fourth->from_cache);
  fs::remove_all(dir);
}

// A measurement taken on a busy host is used but never stored: with a load
// limit of -1 every host is busy, and the next call measures again.
TEST(Calibration, BusyHostIsNotCached) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device& cpu = *(*registry)->cpu();
  const fs::path dir = fs::temp_directory_path() / ("kiln_calib_busy_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (int i = 0; i < 2; ++i) {
    auto r = CalibrateCached(cpu, dir.string(), -1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->from_cache);
    EXPECT_TRUE(r->contended);
    EXPECT_GT(r->profile.peak_gflops_f32, 0);
  }
  EXPECT_FALSE(fs::exists(dir / "calibration") && !fs::is_empty(dir / "calibration"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::runtime
