// Calibration measures real numbers once and reuses them from the cache.
#include "engine/runtime/calibration.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

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

// An idle lane runs an inline-eligible job on the caller's thread; a busy one
// queues it behind the holder, in order, on the worker thread.
TEST(DeviceWorker, InlineOnlyWhenIdle) {
  DeviceWorker worker("cpu:0");
  const std::thread::id caller = std::this_thread::get_id();
  auto here = worker.Submit([] { return std::this_thread::get_id(); }, /*may_run_inline=*/true);
  ASSERT_EQ(here.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(here.get(), caller);

  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> holder_done = false;
  auto holder = worker.Submit([gate, &holder_done] {
    gate.wait();
    holder_done = true;
  });
  auto queued = worker.Submit(
      [&holder_done] { return std::make_pair(std::this_thread::get_id(), holder_done.load()); },
      /*may_run_inline=*/true);
  EXPECT_EQ(queued.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  release.set_value();
  holder.get();
  const auto [thread, after_holder] = queued.get();
  EXPECT_NE(thread, caller);
  EXPECT_TRUE(after_holder);
  const WorkerStats s = worker.stats();
  EXPECT_EQ(s.runs, 3);
  EXPECT_EQ(s.inline_runs, 1);
}

}  // namespace
}  // namespace kiln::runtime
