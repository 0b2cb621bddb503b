// Runtime v2 through the Engine (DESIGN.md section 5): concurrent runs of one
// program on separate run contexts, fair shares of a device across tenants,
// one device's backlog not holding another's, runs stopped between kernels by
// cancellation and deadlines, and a hung device failing only its runs,
// marked unhealthy, and restarted. Vulkan cases run on lavapipe and skip
// where no Vulkan device exists.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "clients/cpp/graph_builder.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

std::unique_ptr<Engine> MakeV2Engine(EngineOptions o = {}) {
  o.calibration = EngineOptions::Calibration::kNever;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

bool V2HasVulkan(const Engine& e) {
  for (const auto* d : e.Devices()) {
    if (d->backend == "vulkan") return true;
  }
  return false;
}

using models::MatMulChain;

struct Chain {
  v1::Graph graph;
  HostTensor x, w;
  std::vector<TensorRef> inputs;
  Chain(int64_t n, int depth) : graph(MatMulChain(n, depth)) {
    std::mt19937_64 rng(7);
    x = models::RandomF32(rng, {n, n}, 0.1);
    w = models::RandomF32(rng, {n, n}, 0.1);
    inputs = {TensorRef::Of("x", x), TensorRef::Of("w", w)};
  }
};

std::shared_ptr<Executable> CompileOnV2(Engine& e, const v1::Graph& g, const std::string& device) {
  CompileOptions o;
  o.device = device;
  o.enable_fusion = false;  // keep one step per node: many points to stop between
  auto c = e.Compile(g, o, {});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->executable : nullptr;
}

DeviceStats StatsOf(const std::vector<DeviceStats>& all, const std::string& device) {
  for (const DeviceStats& s : all) {
    if (s.device == device) return s;
  }
  ADD_FAILURE() << "no device " << device;
  return {};
}

// N runs of one program at once on one device really run at once: each takes
// its own run context, and their report intervals overlap.
TEST(RuntimeV2, ConcurrentRunsOfOneProgramOverlap) {
  auto engine = MakeV2Engine();
  if (!V2HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  Chain c(192, 8);
  auto exe = CompileOnV2(*engine, c.graph, "vulkan:0");
  ASSERT_NE(exe, nullptr);
  auto reference = engine->Run(*exe, c.inputs, nullptr, {});
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_GE(StatsOf(engine->DeviceStatistics(), "vulkan:0").slots, 2);
  RunOptions ro;
  ro.report = true;
  bool overlapped = false;
  for (int attempt = 0; attempt < 4 && !overlapped; ++attempt) {
    constexpr int kRuns = 3;
    std::vector<absl::StatusOr<RunResult>> results(kRuns);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRuns; ++i) {
      threads.emplace_back([&, i] { results[i] = engine->Run(*exe, c.inputs, nullptr, ro); });
    }
    for (auto& t : threads) t.join();
    for (auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status();
      // Same program, separate contexts: the same answer.
      ASSERT_EQ(r->outputs[0].second.num_bytes(), reference->outputs[0].second.num_bytes());
      EXPECT_EQ(std::memcmp(r->outputs[0].second.data(), reference->outputs[0].second.data(),
                            reference->outputs[0].second.num_bytes()),
                0);
    }
    for (int i = 0; i < kRuns && !overlapped; ++i) {
      for (int j = i + 1; j < kRuns && !overlapped; ++j) {
        const double a0 = results[i]->report.start_unix_micros();
        const double a1 = a0 + results[i]->report.run_micros();
        const double b0 = results[j]->report.start_unix_micros();
        const double b1 = b0 + results[j]->report.run_micros();
        overlapped = a0 < b1 && b0 < a1;
      }
    }
  }
  EXPECT_TRUE(overlapped);
}

// Every step of a report starts inside the run (Vulkan timestamps are
// modular: a step measured from a later origin wrapped to ~1.8e19 us).
TEST(RuntimeV2, ReportStepTimesLieInsideTheRun) {
  auto engine = MakeV2Engine();
  if (!V2HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  Chain c(64, 3);
  auto exe = CompileOnV2(*engine, c.graph, "vulkan:0");
  ASSERT_NE(exe, nullptr);
  RunOptions ro;
  ro.report = true;
  auto r = engine->Run(*exe, c.inputs, nullptr, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GT(r->report.steps_size(), 0);
  for (const v1::DispatchStep& s : r->report.steps()) {
    EXPECT_GE(s.start_micros(), 0) << s.kernel();
    EXPECT_LE(s.start_micros(), r->report.run_micros() + 1) << s.kernel();
    EXPECT_GE(s.duration_micros(), 0) << s.kernel();
  }
}

// Two tenants with weights 1 and 3 keep a backlog on the CPU (one slot): the
// device time splits 1:3 within 10%.
TEST(RuntimeV2, TenantsShareADeviceByWeight) {
  auto engine = MakeV2Engine();
  Chain c(96, 2);
  auto exe = CompileOnV2(*engine, c.graph, "cpu:0");
  ASSERT_NE(exe, nullptr);
  std::atomic<bool> stop = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      RunOptions ro;
      ro.tenant = i % 2 == 0 ? "light" : "heavy";
      ro.tenant_weight = i % 2 == 0 ? 1 : 3;
      while (!stop.load()) ASSERT_TRUE(engine->Run(*exe, c.inputs, nullptr, ro).ok());
    });
  }
  absl::SleepFor(absl::Milliseconds(1500));
  stop = true;
  for (auto& t : threads) t.join();
  const DeviceStats s = StatsOf(engine->DeviceStatistics(), "cpu:0");
  const double light = s.tenant_device_micros.at("light");
  const double heavy = s.tenant_device_micros.at("heavy");
  EXPECT_NEAR(heavy / (light + heavy), 0.75, 0.075) << "light " << light << " heavy " << heavy;
}

// A backlog on the CPU does not hold the Vulkan device: a Vulkan run finishes
// while CPU runs still wait.
TEST(RuntimeV2, BacklogOnOneDeviceDoesNotHoldAnother) {
  auto engine = MakeV2Engine();
  if (!V2HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  Chain big(256, 12), small(32, 1);
  auto on_cpu = CompileOnV2(*engine, big.graph, "cpu:0");
  auto on_vk = CompileOnV2(*engine, small.graph, "vulkan:0");
  ASSERT_TRUE(on_cpu && on_vk);
  ASSERT_TRUE(engine->Run(*on_vk, small.inputs, nullptr, {}).ok());
  std::vector<std::thread> backlog;
  for (int i = 0; i < 6; ++i) {
    backlog.emplace_back([&] { ASSERT_TRUE(engine->Run(*on_cpu, big.inputs, nullptr, {}).ok()); });
  }
  while (StatsOf(engine->DeviceStatistics(), "cpu:0").queued < 3) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(engine->Run(*on_vk, small.inputs, nullptr, {}).ok());
  EXPECT_GE(StatsOf(engine->DeviceStatistics(), "cpu:0").queued, 1)
      << "the Vulkan run waited for the CPU backlog";
  for (auto& t : backlog) t.join();
}

// A run stops between kernels once its cancel flag is set (the client went
// away), and the program serves the next run.
// The chain takes ~100 ms or more here (1000 matmuls of 256^3); the stop comes
// after 10 ms.
TEST(RuntimeV2, CancellationStopsBetweenKernels) {
  auto engine = MakeV2Engine();
  Chain c(256, 1000);
  auto exe = CompileOnV2(*engine, c.graph, "cpu:0");
  ASSERT_NE(exe, nullptr);
  const int steps = exe->lir().steps_size();
  std::atomic<bool> cancelled = false;
  RunOptions ro;
  ro.cancelled = &cancelled;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(10));
    cancelled = true;
  });
  auto r = engine->Run(*exe, c.inputs, nullptr, ro);
  canceller.join();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat(" of ", steps, " steps")))
      << r.status();
  EXPECT_FALSE(absl::StrContains(r.status().message(), absl::StrCat(steps, " of ", steps)));
  // Cancelled before it starts: not started at all.
  const absl::Status before = engine->Run(*exe, c.inputs, nullptr, ro).status();
  EXPECT_EQ(before.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(absl::StrContains(before.message(), "before the run started")) << before;
  EXPECT_TRUE(engine->Run(*exe, c.inputs, nullptr, {}).ok());
}

// A deadline that passes mid-run stops it between kernels; one already past
// is not started.
TEST(RuntimeV2, DeadlinesStopRunsBetweenKernels) {
  auto engine = MakeV2Engine();
  Chain c(256, 1000);
  auto exe = CompileOnV2(*engine, c.graph, "cpu:0");
  ASSERT_NE(exe, nullptr);
  RunOptions ro;
  // The chain runs for about a second; 100 ms leaves a loaded host's wake-up
  // (15 ms seen under CI-like load with a 10 ms deadline) inside the deadline,
  // so it passes mid-run.
  ro.deadline = absl::Now() + absl::Milliseconds(100);
  auto r = engine->Run(*exe, c.inputs, nullptr, ro);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "between kernels")) << r.status();
  ro.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_EQ(engine->Run(*exe, c.inputs, nullptr, ro).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(engine->Run(*exe, c.inputs, nullptr, {}).ok());
}

// While a run executes, its context's memory (here the CPU arena) is charged
// to the run's tenant; once it ends, to nobody.
TEST(RuntimeV2, RunContextMemoryIsChargedToTheRunsTenant) {
  auto engine = MakeV2Engine();
  Chain c(384, 24);
  auto p = CompileOnV2(*engine, c.graph, "cpu:0");
  ASSERT_NE(p, nullptr);
  RunOptions ro;
  ro.report = true;
  auto first = engine->Run(*p, c.inputs, nullptr, ro);  // its arena size, from the report
  ASSERT_TRUE(first.ok()) << first.status();
  int64_t arena = 0;
  for (const auto& t : first->report.totals()) {
    if (t.device() == "cpu:0") arena = t.peak_bytes();
  }
  ASSERT_GT(arena, 0);
  std::atomic<bool> stop = false;
  std::thread runner([&] {
    RunOptions a;
    a.tenant = "alice";
    while (!stop.load()) EXPECT_TRUE(engine->Run(*p, c.inputs, nullptr, a).ok());
  });
  int64_t seen = 0;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (seen == 0 && absl::Now() < until) {
    const DeviceStats s = StatsOf(engine->DeviceStatistics(), "cpu:0");
    if (auto it = s.tenant_run_memory_bytes.find("alice"); it != s.tenant_run_memory_bytes.end()) {
      seen = it->second;
    }
  }
  stop = true;
  runner.join();
  EXPECT_EQ(seen, arena);
  EXPECT_TRUE(StatsOf(engine->DeviceStatistics(), "cpu:0").tenant_run_memory_bytes.empty());
}

// A device whose waits time out (here: a wait bound far below what the work
// takes) fails its runs UNAVAILABLE naming it, is marked unhealthy, fails
// fast while unhealthy, keeps the other devices serving, and comes back once
// its probe succeeds.
TEST(RuntimeV2, HungDeviceFailsItsRunsAndIsRestarted) {
  EngineOptions o;
  o.device_wait_floor = absl::Microseconds(1);
  o.device_wait_slack = 1e-6;
  auto engine = MakeV2Engine(o);
  if (!V2HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  Chain c(256, 8);
  auto on_vk = CompileOnV2(*engine, c.graph, "vulkan:0");
  auto on_cpu = CompileOnV2(*engine, c.graph, "cpu:0");
  if (on_vk == nullptr) GTEST_SKIP() << "compile on vulkan:0 failed with a 1 us wait bound";
  ASSERT_NE(on_cpu, nullptr);
  auto r = engine->Run(*on_vk, c.inputs, nullptr, {});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(backend::FaultedDevice(r.status()), "vulkan:0");
  EXPECT_TRUE(absl::StrContains(r.status().message(), "vulkan:0")) << r.status();
  const DeviceStats after = StatsOf(engine->DeviceStatistics(), "vulkan:0");
  EXPECT_EQ(after.faults, 1);
  // The other device keeps serving.
  EXPECT_TRUE(engine->Run(*on_cpu, c.inputs, nullptr, {}).ok());
  // The restart probe (a small copy on a fresh stream, generously bounded)
  // brings the device back.
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (absl::Now() < until && !StatsOf(engine->DeviceStatistics(), "vulkan:0").healthy) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const DeviceStats back = StatsOf(engine->DeviceStatistics(), "vulkan:0");
  EXPECT_TRUE(back.healthy) << back.fault;
  EXPECT_EQ(back.restarts, 1);
  EXPECT_TRUE(absl::StrContains(back.fault, "device fault")) << back.fault;
}

}  // namespace
}  // namespace kiln
