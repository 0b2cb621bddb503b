// Placement and scheduling across devices (DESIGN.md section 5) with the
// Vulkan backend on lavapipe: auto placement from profiles, pinning, CPU
// fallback with copies, concurrent runs on two devices, and caches reused by a
// restarted engine. Skipped where no Vulkan device exists.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "clients/cpp/graph_builder.h"
#include "engine/ir/verifier.h"
#include "engine/passes/pass.h"
#include "engine/runtime/cost_model.h"
#include "engine/runtime/device_registry.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

bool PlacementHasVulkan(const Engine& e) {
  for (const auto* d : e.Devices()) {
    if (d->backend == "vulkan") return true;
  }
  return false;
}

std::unique_ptr<Engine> MakePlacementEngine(const std::string& cache_dir = "",
                                   EngineOptions::Calibration cal = EngineOptions::Calibration::kNever) {
  EngineOptions o;
  o.cache_dir = cache_dir;
  o.calibration = cal;
  o.calibration_max_load_per_core = 1e9;  // tests run beside builds: cache whatever is measured
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

v1::Graph TinyGraph() {
  GraphBuilder g("tiny");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{1}});
  g.output("y", g.add(x, g.scalar(1.0)));
  return g.Build();
}

using models::MatMulChain;

// Placement from profiles alone: with a device profiled far faster than the
// CPU, a large matmul graph goes to it while a one-element graph stays on the
// CPU (the device's sync overhead dominates).
TEST(Placement, FollowsTheProfiles) {
  auto registry = runtime::DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok());
  backend::Device* vk = nullptr;
  for (backend::Device* d : (*registry)->devices()) {
    if (d->info().backend == "vulkan") vk = d;
  }
  if (vk == nullptr) GTEST_SKIP() << "no Vulkan device";
  runtime::CostModel model;
  backend::DeviceProfile fast;
  fast.peak_gflops_f32 = fast.peak_gflops_f16 = 50000;
  fast.bandwidth_gbps = 3000;
  fast.launch_overhead_us = 5;
  fast.sync_overhead_us = 40;
  fast.host_to_device_gbps = 25;
  fast.calibrated = true;
  model.SetProfile(vk->info().id, fast);
  backend::DeviceProfile cpu = (*registry)->cpu()->info().profile;
  cpu.peak_gflops_f32 = 200;
  cpu.bandwidth_gbps = 20;
  cpu.launch_overhead_us = 1;
  cpu.sync_overhead_us = 0;
  cpu.calibrated = true;
  model.SetProfile("cpu:0", cpu);
  auto place = [&](const v1::Graph& proto) {
    auto g = ir::ImportGraph(proto);
    EXPECT_TRUE(g.ok()) << g.status();
    passes::PassContext ctx;
    ctx.devices = (*registry)->devices();
    ctx.cost_model = &model;
    auto legalize = passes::CreatePass("legalize");
    EXPECT_TRUE((*legalize)->Run(**g, ctx).ok());
    return ctx.placement_report;
  };
  const v1::Placement tiny = place(TinyGraph());
  EXPECT_EQ(tiny.chosen(), "cpu:0") << tiny.DebugString();
  ASSERT_EQ(tiny.estimates_size(), static_cast<int>((*registry)->devices().size()));
  const v1::Placement big = place(MatMulChain(1024, 4));
  EXPECT_EQ(big.chosen(), vk->info().id) << big.DebugString();
  EXPECT_NE(big.why().find("lowest estimate"), std::string::npos);
}

// With measured profiles, `auto` picks the device its own estimates rank
// first, and the report lists every device's estimate.
TEST(Placement, AutoChoosesTheLowestEstimate) {
  auto engine = MakePlacementEngine("", EngineOptions::Calibration::kAlways);
  if (!PlacementHasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  for (const v1::Graph& g : {TinyGraph(), MatMulChain(256, 2)}) {
    auto c = engine->Compile(g, {}, {});
    ASSERT_TRUE(c.ok()) << c.status();
    const v1::Placement& p = c->executable->lir().placement();
    ASSERT_GE(p.estimates_size(), 2);
    std::string best;
    double best_us = 1e300;
    for (const auto& e : p.estimates()) {
      if (e.estimate_micros() < best_us) best_us = e.estimate_micros(), best = e.device();
    }
    EXPECT_EQ(p.chosen(), best) << p.DebugString();
  }
  auto tiny = engine->Compile(TinyGraph(), {}, {});
  EXPECT_EQ(tiny->executable->lir().placement().chosen(), "cpu:0");
}

// Pinned to Vulkan, an op it does not claim (cumsum) runs on the CPU with
// copies either side, the report says so, and the result equals the CPU's.
TEST(Placement, PinnedDeviceFallsBackToCpuWithCopies) {
  auto engine = MakePlacementEngine();
  if (!PlacementHasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  GraphBuilder g("fallback");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{8}, int64_t{64}});
  auto y = g.cumsum(g.exp(g.mul(x, g.scalar(0.1))), 1);
  g.named("scan");
  g.output("z", g.softmax(g.tanh(y)));
  const v1::Graph graph = g.Build();
  std::mt19937_64 rng(1);
  HostTensor xt = models::RandomF32(rng, {8, 64}, 1.0);
  std::vector<TensorRef> inputs = {TensorRef::Of("x", xt)};
  CompileOptions pinned;
  pinned.device = "vulkan:0";
  RunOptions ro;
  ro.report = true;
  auto on_vk = engine->RunGraph(graph, inputs, nullptr, pinned, ro);
  ASSERT_TRUE(on_vk.ok()) << on_vk.status();
  CompileOptions cpu_only;
  cpu_only.device = "cpu:0";
  auto on_cpu = engine->RunGraph(graph, inputs, nullptr, cpu_only, {});
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_LE(models::WorstError(on_vk->outputs[0].second, on_cpu->outputs[0].second, 1e-5, 1e-5), 1.0);
  const v1::DispatchReport& r = on_vk->report;
  EXPECT_EQ(r.placement().chosen(), "vulkan:0");
  int copies = 0, cpu_kernels = 0, vk_kernels = 0;
  for (const auto& s : r.steps()) {
    if (s.kind() == v1::STEP_COPY) ++copies;
    if (s.kind() == v1::STEP_KERNEL && s.device() == "cpu:0") {
      ++cpu_kernels;
      EXPECT_NE(std::find(s.node_names().begin(), s.node_names().end(), "scan"),
                s.node_names().end());
    }
    if (s.kind() == v1::STEP_KERNEL && s.device() == "vulkan:0") ++vk_kernels;
  }
  EXPECT_EQ(copies, 2) << r.DebugString();
  EXPECT_EQ(cpu_kernels, 1);
  EXPECT_GE(vk_kernels, 2);
  bool noted = false;
  for (const auto& n : r.compile().notes()) noted = noted || n.find("\"scan\" (cumsum) runs on cpu:0") != std::string::npos;
  EXPECT_TRUE(noted) << r.compile().DebugString();
}

// Two long runs pinned to two devices overlap in time.
TEST(Placement, RunsOnTwoDevicesOverlap) {
  auto engine = MakePlacementEngine();
  if (!PlacementHasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  const v1::Graph graph = MatMulChain(256, 12);
  std::mt19937_64 rng(2);
  HostTensor x = models::RandomF32(rng, {256, 256}, 0.1), w = models::RandomF32(rng, {256, 256}, 0.1);
  std::vector<TensorRef> inputs = {TensorRef::Of("x", x), TensorRef::Of("w", w)};
  CompileOptions on_cpu, on_vk;
  on_cpu.device = "cpu:0";
  on_vk.device = "vulkan:0";
  auto cc = engine->Compile(graph, on_cpu, {});
  auto cv = engine->Compile(graph, on_vk, {});
  ASSERT_TRUE(cc.ok() && cv.ok());
  // Warm both (pipelines, first-touch memory), then time one of each at once.
  ASSERT_TRUE(engine->Run(*cc->executable, inputs, nullptr, {}).ok());
  ASSERT_TRUE(engine->Run(*cv->executable, inputs, nullptr, {}).ok());
  RunOptions ro;
  ro.report = true;
  // Repeat: on a loaded 2-core machine one try may serialize by chance.
  bool overlapped = false;
  for (int attempt = 0; attempt < 3 && !overlapped; ++attempt) {
    absl::StatusOr<RunResult> a, b;
    std::thread t1([&] { a = engine->Run(*cc->executable, inputs, nullptr, ro); });
    std::thread t2([&] { b = engine->Run(*cv->executable, inputs, nullptr, ro); });
    t1.join();
    t2.join();
    ASSERT_TRUE(a.ok() && b.ok());
    const double a0 = a->report.start_unix_micros(), a1 = a0 + a->report.run_micros();
    const double b0 = b->report.start_unix_micros(), b1 = b0 + b->report.run_micros();
    overlapped = a0 < b1 && b0 < a1;
  }
  EXPECT_TRUE(overlapped);
  std::map<std::string, int64_t> runs;
  for (const DeviceStats& s : engine->DeviceStatistics()) runs[s.device] = s.runs;
  EXPECT_GE(runs["cpu:0"], 2);
  EXPECT_GE(runs["vulkan:0"], 2);
}

// A restarted engine on the same cache dir reuses the executable, the SPIR-V
// of generated kernels, the pipeline cache and the calibration.
TEST(Placement, RestartReusesEveryCache) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_placement_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  GraphBuilder g("fused");
  auto x = g.input("x", v1::DTYPE_F32, {int64_t{32}, int64_t{32}});
  g.output("y", g.sub(g.tanh(g.mul(x, g.scalar(0.5))), x));
  const v1::Graph graph = g.Build();
  CompileOptions pinned;
  pinned.device = "vulkan:0";
  {
    auto engine = MakePlacementEngine(dir.string(), EngineOptions::Calibration::kIfCacheDir);
    if (!PlacementHasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
    auto c = engine->Compile(graph, pinned, {});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->report.executable_cache(), v1::CACHE_MISS);
    EXPECT_GE(c->report.kernel_cache_misses(), 1);
    for (const DeviceStats& s : engine->DeviceStatistics()) EXPECT_FALSE(s.calibration_from_cache);
  }
  bool pipeline_cache = false;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    pipeline_cache = pipeline_cache || e.path().filename().string().find("pipeline") != std::string::npos;
  }
  EXPECT_TRUE(pipeline_cache) << "no pipeline cache file under " << dir;
  auto engine = MakePlacementEngine(dir.string(), EngineOptions::Calibration::kIfCacheDir);
  auto c = engine->Compile(graph, pinned, {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->report.executable_cache(), v1::CACHE_HIT_DISK);
  EXPECT_GE(c->report.kernel_cache_hits(), 1);
  EXPECT_EQ(c->report.kernel_cache_misses(), 0);
  for (const DeviceStats& s : engine->DeviceStatistics()) {
    EXPECT_TRUE(s.calibration_from_cache) << s.device;
  }
  EXPECT_GE(engine->cache_stats().kernel_hits, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
