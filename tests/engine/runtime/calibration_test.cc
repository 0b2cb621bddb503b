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

#include "base/host_arena.h"
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

// The one cache file under `dir` (there is one device per test).
fs::path CalibrationCacheFile(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "calibration")) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? fs::path() : files[0];
}

std::string ReadCalibrationFile(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every figure survives the round trip through the cache file, the CPU's
// team and cache figures (HostProfile) included, and `refresh` measures again
// even though the file is good.
TEST(Calibration, PersistedProfileRoundTrips) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device& cpu = *(*registry)->cpu();
  const fs::path dir = fs::temp_directory_path() / ("kiln_calib_rt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto first = CalibrateCached(cpu, dir.string(), 1e9);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->from_cache);
  // Every CPU measures its tanh rate (the cost of transcendental elements).
  EXPECT_GT(first->host.transcendental_gelems, 0.0);
  auto second = CalibrateCached(cpu, dir.string(), 1e9);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->from_cache);
  const backend::DeviceProfile& a = first->profile;
  const backend::DeviceProfile& b = second->profile;
  EXPECT_DOUBLE_EQ(b.peak_gflops_f32, a.peak_gflops_f32);
  EXPECT_DOUBLE_EQ(b.peak_gflops_f16, a.peak_gflops_f16);
  EXPECT_DOUBLE_EQ(b.bandwidth_gbps, a.bandwidth_gbps);
  EXPECT_DOUBLE_EQ(b.launch_overhead_us, a.launch_overhead_us);
  EXPECT_DOUBLE_EQ(b.sync_overhead_us, a.sync_overhead_us);
  EXPECT_TRUE(b.calibrated);
  EXPECT_DOUBLE_EQ(second->host.parallel_launch_us, first->host.parallel_launch_us);
  EXPECT_DOUBLE_EQ(second->host.mixed_launch_us, first->host.mixed_launch_us);
  EXPECT_DOUBLE_EQ(second->host.cache_bandwidth_gbps, first->host.cache_bandwidth_gbps);
  EXPECT_EQ(second->host.cache_bytes, first->host.cache_bytes);
  EXPECT_DOUBLE_EQ(second->host.transcendental_gelems, first->host.transcendental_gelems);
  auto refreshed = CalibrateCached(cpu, dir.string(), 1e9, /*refresh=*/true);
  ASSERT_TRUE(refreshed.ok()) << refreshed.status();
  EXPECT_FALSE(refreshed->from_cache);
  fs::remove_all(dir);
}

// A file cut short, one with a figure of the wrong type (which the JSON
// library would throw on if read unchecked) and one written for another
// machine (fingerprint) are all measured over and rewritten, never trusted.
TEST(Calibration, DamagedOrForeignFilesAreMeasuredOver) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device& cpu = *(*registry)->cpu();
  const fs::path dir = fs::temp_directory_path() / ("kiln_calib_bad_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ASSERT_TRUE(CalibrateCached(cpu, dir.string(), 1e9).ok());
  const fs::path file = CalibrationCacheFile(dir);
  const std::string good = ReadCalibrationFile(file);
  const std::string fingerprint = CalibrationFingerprint(cpu.info());
  ASSERT_NE(good.find(fingerprint), std::string::npos) << good;
  std::string wrong_type = good;
  const size_t at = wrong_type.find("\"bandwidth_gbps\":");
  ASSERT_NE(at, std::string::npos);
  wrong_type.insert(at + std::string("\"bandwidth_gbps\":").size(), " \"fast\", \"was\":");
  std::string foreign = good;
  const size_t cores = foreign.find("|cores=");
  ASSERT_NE(cores, std::string::npos);
  foreign.insert(cores + 7, "9");  // the same file, for a machine with other cores
  for (const std::string& bad : {good.substr(0, good.size() / 2), wrong_type, foreign}) {
    std::ofstream(file, std::ios::trunc) << bad;
    auto r = CalibrateCached(cpu, dir.string(), 1e9);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->from_cache) << bad;
    EXPECT_GT(r->profile.bandwidth_gbps, 0.0);
    // Rewritten: the next start reads it again.
    auto again = CalibrateCached(cpu, dir.string(), 1e9);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->from_cache) << ReadCalibrationFile(file);
  }
  fs::remove_all(dir);
}

// The fingerprint names the device and the machine around it: another
// identity or driver is another calibration.
TEST(Calibration, FingerprintNamesDeviceAndMachine) {
  backend::DeviceInfo a;
  a.identity = "cpu|model|x86-64-v3|threads=16";
  a.driver_version = "1";
  backend::DeviceInfo b = a;
  EXPECT_EQ(CalibrationFingerprint(a), CalibrationFingerprint(b));
  b.identity = "cpu|model|x86-64-v3|threads=8";
  EXPECT_NE(CalibrationFingerprint(a), CalibrationFingerprint(b));
  b = a;
  b.driver_version = "2";
  EXPECT_NE(CalibrationFingerprint(a), CalibrationFingerprint(b));
  const std::string f = CalibrationFingerprint(a);
  EXPECT_NE(f.find("|cores="), std::string::npos) << f;
  EXPECT_NE(f.find("|memory_gib="), std::string::npos) << f;
}

// The copy probe moves its bytes the way a run moves its inputs and outputs:
// from and into HostTensor memory. Where a device worker takes those by
// reference from the host arena (a CUDA worker's DMA, res8), so does the
// probe; where HostTensors live on the heap it takes the staging path. A probe
// from a std::vector timed staging on a GPU whose runs took the direct path
// (17.6 GB/s against ~52: softmax 4096 x 4096 placed on the slower CPU).
TEST(Calibration, CopyProbeTakesTheRunsPath) {
  RegistryOptions ro;
  ro.isolation = DeviceIsolation::kProcess;
  auto registry = DeviceRegistry::Create(ro);
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device* device = nullptr;  // lavapipe, in its worker
  for (backend::Device* d : (*registry)->devices()) {
    if (!d->info().host_memory && (*registry)->isolated(d->info().id)) device = d;
  }
  if (device == nullptr) GTEST_SKIP() << "no isolated device with its own memory";
  HostArena* arena = HostArena::Made();  // the workers' (StartIsolatedBackend)
  if (arena == nullptr) GTEST_SKIP() << "no host arena (KILN_HOST_ARENA_BYTES=0)";
  constexpr int64_t kProbeBytes = int64_t{16} << 20;  // lavapipe's one size
  // HostTensors on the heap (the arena not active): every copy stages.
  HostArena::Deactivate();
  HostArena::Stats before = arena->stats();
  backend::DeviceProfile staged;
  ASSERT_TRUE(MeasureCopyRates(*device, &staged).ok());
  EXPECT_EQ(arena->stats().direct_copies, before.direct_copies);
  EXPECT_GT(staged.host_to_device_gbps, 0.0);
  EXPECT_GT(staged.device_to_host_gbps, 0.0);
  // HostTensors in the arena: 3 copies each way, every byte by reference.
  arena->Activate();
  struct Deactivate {
    ~Deactivate() { HostArena::Deactivate(); }
  } deactivate;
  before = arena->stats();
  backend::DeviceProfile direct;
  ASSERT_TRUE(MeasureCopyRates(*device, &direct).ok());
  EXPECT_EQ(arena->stats().direct_copies - before.direct_copies, 6);
  EXPECT_EQ(arena->stats().direct_bytes - before.direct_bytes, 6 * kProbeBytes);
  EXPECT_GT(direct.host_to_device_gbps, 0.0);
  EXPECT_GT(direct.device_to_host_gbps, 0.0);
  // A host-memory device has no copies to time.
  backend::DeviceProfile cpu;
  ASSERT_TRUE(MeasureCopyRates(*(*registry)->cpu(), &cpu).ok());
  EXPECT_EQ(cpu.host_to_device_gbps, 0.0);
}

}  // namespace
}  // namespace kiln::runtime
