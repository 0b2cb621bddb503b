// Devices in worker processes (DESIGN.md section 5, "Faults contained";
// runtime/worker_client.h), through the Engine: an isolated device computes
// what the in-process one does, and a worker that crashes, exits, hangs or
// reports its device lost fails only the runs on that device, with
// UNAVAILABLE naming it and what happened, while the CPU keeps serving; the
// worker is restarted and programs loaded before the fault (their constants,
// run contexts and parameter mirrors) run again on the fresh one. The faults
// come from the test-only fault kernel (worker/fault_worker.cc). Vulkan cases
// run on lavapipe and skip where no Vulkan device exists.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/host_arena.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "engine/runtime/worker_client.h"
#include "tests/e2e/models.h"
#include "tests/engine/runtime/worker/fault_graph.h"

namespace kiln {
namespace {

// The fault worker: this build's, or $KILN_FAULT_WORKER where the tests run
// from a bundle (the GPU machine).
std::string FaultWorker() {
  const char* env = std::getenv("KILN_FAULT_WORKER");
  return env != nullptr && *env != '\0' ? env : KILN_FAULT_WORKER_PATH;
}

std::unique_ptr<Engine> MakeIsolatedEngine(EngineOptions o) {
  o.calibration = EngineOptions::Calibration::kNever;
  o.device_isolation = EngineOptions::DeviceIsolation::kProcess;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(e).value() : nullptr;
}

bool HasVulkan(const Engine& e) {
  for (const auto* d : e.Devices()) {
    if (d->backend == "vulkan") return true;
  }
  return false;
}

DeviceStats StatsOf(const Engine& e, const std::string& device) {
  for (const DeviceStats& s : e.DeviceStatistics()) {
    if (s.device == device) return s;
  }
  ADD_FAILURE() << "no device " << device;
  return {};
}

std::shared_ptr<Executable> CompileOn(Engine& e, const v1::Graph& g, const std::string& device) {
  CompileOptions o;
  o.device = device;
  auto c = e.Compile(g, o, {});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->executable : nullptr;
}

using testing::FaultGraph;

struct Vector {
  HostTensor x;
  std::vector<TensorRef> inputs;
  Vector() {
    std::mt19937_64 rng(3);
    x = models::RandomF32(rng, {64}, 1.0);
    inputs = {TensorRef::Of("x", x)};
  }
};

// Waits (bounded) until `device` is healthy again after `restarts` restarts.
DeviceStats AwaitRestart(const Engine& e, const std::string& device, int64_t restarts) {
  const absl::Time until = absl::Now() + absl::Seconds(60);
  DeviceStats s = StatsOf(e, device);
  while (absl::Now() < until && !(s.healthy && s.restarts >= restarts)) {
    absl::SleepFor(absl::Milliseconds(20));
    s = StatsOf(e, device);
  }
  return s;
}

TEST(DeviceIsolation, IsolatedDeviceComputesWhatTheCpuDoes) {
  auto engine = MakeIsolatedEngine({});
  ASSERT_NE(engine, nullptr);
  if (!HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  const DeviceStats vk = StatsOf(*engine, "vulkan:0");
  EXPECT_TRUE(vk.isolated);
  EXPECT_NE(vk.worker_pid, 0);
  EXPECT_NE(vk.worker_pid, ::getpid());
  EXPECT_FALSE(StatsOf(*engine, "cpu:0").isolated);

  const v1::Graph g = models::MatMulChain(64, 4);
  std::mt19937_64 rng(5);
  HostTensor x = models::RandomF32(rng, {64, 64}, 0.1), w = models::RandomF32(rng, {64, 64}, 0.1);
  const std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("w", w)};
  auto on_vk = CompileOn(*engine, g, "vulkan:0");
  auto on_cpu = CompileOn(*engine, g, "cpu:0");
  ASSERT_NE(on_vk, nullptr);
  ASSERT_NE(on_cpu, nullptr);
  RunOptions ro;
  ro.report = true;
  for (int i = 0; i < 3; ++i) {  // a reused run context too
    auto a = engine->Run(*on_vk, in, nullptr, ro);
    auto b = engine->Run(*on_cpu, in, nullptr, {});
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->outputs.size(), 1u);
    const HostTensor& ya = a->outputs[0].second;
    const HostTensor& yb = b->outputs[0].second;
    ASSERT_EQ(ya.num_bytes(), yb.num_bytes());
    const float* pa = static_cast<const float*>(ya.data());
    const float* pb = static_cast<const float*>(yb.data());
    for (int64_t k = 0; k < ya.num_bytes() / 4; ++k) ASSERT_NEAR(pa[k], pb[k], 1e-4) << k;
    // The report's kernel times come from the worker's events.
    ASSERT_GT(a->report.steps_size(), 0);
    for (const auto& step : a->report.steps()) {
      EXPECT_EQ(step.device(), "vulkan:0");
      EXPECT_GE(step.duration_micros(), 0);
      EXPECT_LT(step.start_micros(), a->report.run_micros() + 1);
    }
  }
}

// One case per way a worker can fail: the run on it fails UNAVAILABLE naming
// the device and what happened, a CPU run right after succeeds, the device
// comes back with a fresh worker, and a program loaded before the fault
// (its constants and run context made on the old worker) runs right again.
struct FaultCase {
  std::string mode;
  std::string says;  // in the failure's message
};

class WorkerFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(WorkerFaults, FailOnlyTheirDeviceAndTheWorkerRestarts) {
  EngineOptions o;
  o.device_worker = FaultWorker();
  o.device_wait_floor = absl::Seconds(1);  // the hang is caught after 1 s + grace
  o.device_worker_grace = absl::Seconds(1);
  auto engine = MakeIsolatedEngine(o);
  ASSERT_NE(engine, nullptr);
  if (!HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  const int64_t first_pid = StatsOf(*engine, "vulkan:0").worker_pid;
  Vector v;
  auto pass = CompileOn(*engine, FaultGraph("pass"), "vulkan:0");
  auto fault = CompileOn(*engine, FaultGraph(GetParam().mode), "vulkan:0");
  auto cpu = CompileOn(*engine, models::MatMulChain(32, 2), "cpu:0");
  ASSERT_NE(pass, nullptr);
  ASSERT_NE(fault, nullptr);
  ASSERT_NE(cpu, nullptr);
  auto good = engine->Run(*pass, v.inputs, nullptr, {});
  ASSERT_TRUE(good.ok()) << good.status();
  const HostTensor expected = std::move(good->outputs[0].second);

  auto r = engine->Run(*fault, v.inputs, nullptr, {});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(backend::FaultedDevice(r.status()), "vulkan:0");
  EXPECT_TRUE(absl::StrContains(r.status().message(), "vulkan:0")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), GetParam().says)) << r.status();

  std::mt19937_64 rng(9);
  HostTensor a = models::RandomF32(rng, {32, 32}, 0.1), w = models::RandomF32(rng, {32, 32}, 0.1);
  const std::vector<TensorRef> cpu_in = {TensorRef::Of("x", a), TensorRef::Of("w", w)};
  EXPECT_TRUE(engine->Run(*cpu, cpu_in, nullptr, {}).ok());

  const DeviceStats back = AwaitRestart(*engine, "vulkan:0", 1);
  ASSERT_TRUE(back.healthy) << back.fault;
  EXPECT_EQ(back.faults, 1);
  EXPECT_NE(back.worker_pid, first_pid);
  EXPECT_TRUE(absl::StrContains(back.fault, GetParam().says)) << back.fault;
  // Loaded before the fault, right after it.
  auto again = engine->Run(*pass, v.inputs, nullptr, {});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->outputs[0].second.num_bytes(), expected.num_bytes());
  EXPECT_EQ(std::memcmp(again->outputs[0].second.data(), expected.data(), expected.num_bytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, WorkerFaults,
    ::testing::Values(FaultCase{"crash", "killed by signal 11"}, FaultCase{"exit", "exited with status 3"},
                      FaultCase{"hang", "did not answer"}, FaultCase{"lost", "device was lost"}),
    [](const auto& info) { return info.param.mode; });

// An ordinary kernel error is not a fault: the run fails with it, the
// device stays healthy and keeps its worker.
TEST(DeviceIsolation, KernelErrorIsNotAFault) {
  EngineOptions o;
  o.device_worker = FaultWorker();
  auto engine = MakeIsolatedEngine(o);
  ASSERT_NE(engine, nullptr);
  if (!HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  const int64_t pid = StatsOf(*engine, "vulkan:0").worker_pid;
  Vector v;
  auto bad = CompileOn(*engine, FaultGraph("error"), "vulkan:0");
  auto pass = CompileOn(*engine, FaultGraph("pass"), "vulkan:0");
  ASSERT_NE(bad, nullptr);
  ASSERT_NE(pass, nullptr);
  auto r = engine->Run(*bad, v.inputs, nullptr, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "failed on purpose")) << r.status();
  EXPECT_FALSE(backend::FaultedDevice(r.status()));
  EXPECT_TRUE(engine->Run(*pass, v.inputs, nullptr, {}).ok());
  const DeviceStats s = StatsOf(*engine, "vulkan:0");
  EXPECT_TRUE(s.healthy);
  EXPECT_EQ(s.faults, 0);
  EXPECT_EQ(s.worker_pid, pid);
}

// The host arena (base/host_arena.h, res8) through Engine::Run: with HostTensor
// allocating from the arena every worker maps (active on its own only where a
// CUDA worker registers it; here for the test), a run's input and its fresh
// output, and an output destination that is an arena HostTensor, cross by
// reference; a destination elsewhere takes the staging path. Bytes exact.
TEST(DeviceIsolation, HostArenaCarriesRunInputsAndOutputsByReference) {
  auto engine = MakeIsolatedEngine({});
  ASSERT_NE(engine, nullptr);
  if (!HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  HostArena* arena = HostArena::Made();  // the workers' (StartIsolatedBackend)
  if (arena == nullptr) GTEST_SKIP() << "no host arena (KILN_HOST_ARENA_BYTES=0)";
  arena->Activate();
  struct Deactivate {
    ~Deactivate() { HostArena::Deactivate(); }
  } deactivate;
  constexpr int64_t kRows = 512, kCols = 1024;  // 2 MiB of f32
  GraphBuilder b("twice");
  auto x = b.input("x", v1::DTYPE_F32, {kRows, kCols});
  b.output("y", b.mul(x, b.scalar(2.0)));
  auto exe = CompileOn(*engine, b.Build(), "vulkan:0");
  ASSERT_NE(exe, nullptr);
  std::mt19937_64 rng(5);
  HostTensor xt = models::RandomF32(rng, {kRows, kCols}, 1.0);
  ASSERT_TRUE(arena->Contains(xt.data()));
  const std::vector<TensorRef> inputs = {TensorRef::Of("x", xt)};
  auto check = [&](const float* y) {
    for (int64_t i = 0; i < kRows * kCols; ++i) {
      if (y[i] != 2.0f * xt.data_as<float>()[i]) return ::testing::AssertionFailure() << "element " << i;
    }
    return ::testing::AssertionSuccess();
  };
  for (int round = 0; round < 2; ++round) {  // the second reuses the first's blocks
    const HostArena::Stats before = arena->stats();
    auto r = engine->Run(*exe, inputs, nullptr, {});
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& y = r->outputs[0].second;
    EXPECT_TRUE(arena->Contains(y.data()));
    EXPECT_TRUE(check(y.data_as<float>()));
    EXPECT_EQ(arena->stats().direct_copies - before.direct_copies, 2) << "x in and y out";
  }
  // Destinations: an arena HostTensor is written by the worker; a vector is
  // copied into from staging.
  auto in_arena = HostTensor::CreateUninitialized(v1::DTYPE_F32, {kRows, kCols});
  ASSERT_TRUE(in_arena.ok());
  std::vector<float> elsewhere(static_cast<size_t>(kRows * kCols));
  for (float* dst : {in_arena->data_as<float>(), elsewhere.data()}) {
    const HostArena::Stats before = arena->stats();
    RunOptions ro;
    ro.output_destinations = {{"y", dst, in_arena->num_bytes()}};
    auto r = engine->Run(*exe, inputs, nullptr, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->in_destination, std::vector<bool>{true});
    EXPECT_TRUE(check(dst));
    EXPECT_EQ(arena->stats().direct_copies - before.direct_copies,
              dst == elsewhere.data() ? 1 : 2);
  }
  // A full arena: large HostTensors come from the heap (a miss), and a run's
  // fresh output too, through staging; the bytes are the same.
  std::vector<void*> filler;
  for (int64_t chunk : {int64_t{64} << 20, int64_t{1} << 20}) {
    while (void* p = arena->Allocate(chunk)) filler.push_back(p);
  }
  const HostArena::Stats now = arena->stats();
  auto heap = HostTensor::CreateUninitialized(v1::DTYPE_F32, {kRows, kCols});
  ASSERT_TRUE(heap.ok());
  EXPECT_FALSE(arena->Contains(heap->data()));
  EXPECT_GT(arena->stats().misses, now.misses);
  auto r = engine->Run(*exe, inputs, nullptr, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(arena->Contains(r->outputs[0].second.data()));
  EXPECT_TRUE(check(r->outputs[0].second.data_as<float>()));
  for (void* p : filler) EXPECT_TRUE(arena->Release(p));
}

// Issue 8 (bert8): a run on a device worker makes one round trip to it (its
// synchronize; the command list and the copies travel with it), with or
// without a report, and Engine::Run, whose caller waits anyway, runs it on the
// caller's thread when the device is idle, however long the cost model says it
// is; RunAsync's and the CPU's runs of that size go through the device's thread.
TEST(DeviceIsolation, ARunIsOneRoundTripOnTheCallersThread) {
  EngineOptions o;
  o.inline_run_micros = 1e-3;  // no program is this short: only a waiting caller runs inline
  auto engine = MakeIsolatedEngine(o);
  ASSERT_NE(engine, nullptr);
  if (!HasVulkan(*engine)) GTEST_SKIP() << "no Vulkan device";
  const v1::Graph g = models::MatMulChain(64, 4);
  std::mt19937_64 rng(5);
  HostTensor x = models::RandomF32(rng, {64, 64}, 0.1), w = models::RandomF32(rng, {64, 64}, 0.1);
  const std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("w", w)};
  auto on_vk = CompileOn(*engine, g, "vulkan:0");
  auto on_cpu = CompileOn(*engine, g, "cpu:0");
  ASSERT_NE(on_vk, nullptr);
  ASSERT_NE(on_cpu, nullptr);
  ASSERT_TRUE(engine->Run(*on_vk, in, nullptr, {}).ok());  // its run context is made
  for (const bool report : {false, true}) {
    RunOptions ro;
    ro.report = report;
    const DeviceStats before = StatsOf(*engine, "vulkan:0");
    auto r = engine->Run(*on_vk, in, nullptr, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    const DeviceStats after = StatsOf(*engine, "vulkan:0");
    EXPECT_EQ(after.worker_round_trips - before.worker_round_trips, 1) << "report " << report;
    EXPECT_EQ(after.runs - before.runs, 1);
    EXPECT_EQ(after.inline_runs - before.inline_runs, 1) << "report " << report;
    // Its hops (one clock in both processes), in order.
    const std::optional<runtime::worker::RoundTripTimes> t = runtime::worker::LastRoundTrip();
    ASSERT_TRUE(t.has_value());
    const int64_t hops[] = {t->sent, t->received, t->started, t->launched,
                            t->done, t->replied,  t->read,    t->woken};
    for (size_t k = 1; k < std::size(hops); ++k) EXPECT_LE(hops[k - 1], hops[k]) << "hop " << k;
    EXPECT_GT(t->sent, 0);
  }
  // Through RunAsync: the device's thread.
  const DeviceStats before = StatsOf(*engine, "vulkan:0");
  absl::Notification done;
  absl::Status async_status;
  auto ticket = engine->RunAsync(on_vk, in, nullptr, {}, [&](absl::StatusOr<RunResult> r) {
    async_status = r.status();
    done.Notify();
  });
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  done.WaitForNotification();
  EXPECT_TRUE(async_status.ok()) << async_status;
  const DeviceStats after = StatsOf(*engine, "vulkan:0");
  EXPECT_EQ(after.runs - before.runs, 1);
  EXPECT_EQ(after.inline_runs, before.inline_runs);
  // The CPU's runs stay on its thread (its OpenMP team).
  ASSERT_TRUE(engine->Run(*on_cpu, in, nullptr, {}).ok());
  EXPECT_EQ(StatsOf(*engine, "cpu:0").inline_runs, 0);
  EXPECT_EQ(StatsOf(*engine, "cpu:0").worker_round_trips, 0);
}

}  // namespace
}  // namespace kiln
