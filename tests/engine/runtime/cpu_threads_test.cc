// EngineOptions::cpu_threads holds on every thread that runs: OpenMP's thread
// count is a per-thread setting, and kilnd runs from its work pool's threads,
// not the thread that made the engine (before the fix, a run from another
// thread used every core whatever cpu_threads said). Observed by a custom op
// whose CPU kernel reports OpenMP's count and the size of the team it gets.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "base/custom_ops.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"

namespace kiln {
namespace {

constexpr char kOp[] = "kiln_test.omp_threads";

// y = [omp_get_max_threads(), threads in a parallel region], i32[2].
int Shape(const void*, size_t, const KilnTensorType*, int32_t, KilnTensorType* outputs,
          int32_t* num_outputs, char*, size_t) {
  outputs[0] = KilnTensorType{};
  outputs[0].dtype = v1::DTYPE_I32;
  outputs[0].rank = 1;
  outputs[0].dims[0] = 2;
  *num_outputs = 1;
  return 0;
}

int Kernel(const void*, size_t, const KilnTensor*, int32_t, KilnTensor* outputs, int32_t, char*,
           size_t) {
  int team = 0;
#pragma omp parallel
  {
#pragma omp atomic
    ++team;
  }
  auto* y = static_cast<int32_t*>(outputs[0].data);
  y[0] = omp_get_max_threads();
  y[1] = team;
  return 0;
}

void RegisterProbe() {
  static const KilnCustomOp ops[] = {{kOp, &Shape, &Kernel, {}}};
  static const KilnPlugin plugin{
      KILN_PLUGIN_ABI_VERSION, sizeof(KilnPlugin), "omp_probe", "1", 1, ops};
  static const absl::Status registered = CustomOpRegistry::Global().Register(plugin, "", "");
  ASSERT_TRUE(registered.ok()) << registered;
}

v1::Graph ProbeGraph() {
  GraphBuilder b("omp_threads");
  auto x = b.input("x", v1::DTYPE_F32, {1});
  v1::Attrs attrs;
  attrs.mutable_custom()->set_name(kOp);
  auto probe = b.node(v1::OP_CUSTOM, {x}, attrs, "probe");
  v1::Graph g = b.Build();
  v1::TensorType* t = g.mutable_nodes(g.nodes_size() - 1)->add_outputs();
  t->set_dtype(v1::DTYPE_I32);
  t->add_dims()->set_size(2);
  v1::GraphOutput* out = g.add_outputs();
  out->set_name("y");
  out->mutable_value()->set_node(probe.node);
  return g;
}

TEST(CpuThreads, EveryThreadThatRunsUsesTheEnginesCount) {
  RegisterProbe();
  for (int threads : {1, 2}) {
    EngineOptions o;
    o.cpu_threads = threads;
    o.calibration = EngineOptions::Calibration::kNever;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    CompileOptions co;
    co.device = "cpu:0";
    auto compiled = (*engine)->Compile(ProbeGraph(), co, {});
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    const HostTensor xt = HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {1.0f});
    const std::vector<TensorRef> inputs = {TensorRef::Of("x", xt)};
    // From this thread and from threads the engine never saw.
    for (int caller = 0; caller < 3; ++caller) {
      int32_t got[2] = {-1, -1};
      auto run = [&] {
        auto r = (*engine)->Run(*compiled->executable, inputs, nullptr, {});
        ASSERT_TRUE(r.ok()) << r.status();
        std::memcpy(got, r->outputs[0].second.data(), sizeof(got));
      };
      if (caller == 0) {
        run();
      } else {
        std::thread(run).join();
      }
      EXPECT_EQ(got[0], threads) << "cpu_threads " << threads << ", caller " << caller;
      EXPECT_EQ(got[1], threads) << "cpu_threads " << threads << ", caller " << caller;
    }
  }
}

// The threads that ran kiln_test.thread_probe's kernel since the last Clear.
std::mutex probe_threads_mu;
std::set<std::thread::id> probe_threads;

int ThreadKernel(const void* attrs, size_t attrs_size, const KilnTensor* inputs,
                 int32_t num_inputs, KilnTensor* outputs, int32_t num_outputs, char* error,
                 size_t error_size) {
  {
    std::lock_guard<std::mutex> lock(probe_threads_mu);
    probe_threads.insert(std::this_thread::get_id());
  }
  return Kernel(attrs, attrs_size, inputs, num_inputs, outputs, num_outputs, error, error_size);
}

constexpr char kThreadOp[] = "kiln_test.thread_probe";

// A run too long to run inline executes on its device's thread whoever asks
// for it (kilnd asks from gRPC's and the work pool's threads): libgomp keeps
// one OpenMP team per thread that opens a parallel region, so the device's
// kernels find the same warm team on every run instead of one team per
// caller (docs/benchmarks.md, "mlp9").
TEST(CpuThreads, RunsOfADeviceExecuteOnItsOwnThread) {
  static const KilnCustomOp ops[] = {{kThreadOp, &Shape, &ThreadKernel, {}}};
  static const KilnPlugin plugin{
      KILN_PLUGIN_ABI_VERSION, sizeof(KilnPlugin), "thread_probe", "1", 1, ops};
  static const absl::Status registered = CustomOpRegistry::Global().Register(plugin, "", "");
  ASSERT_TRUE(registered.ok()) << registered;
  EngineOptions o;
  o.cpu_threads = 2;
  o.calibration = EngineOptions::Calibration::kNever;
  o.inline_run_micros = 0;  // no run is short enough to run on its caller's thread
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  v1::Graph g = ProbeGraph();
  for (v1::Node& n : *g.mutable_nodes()) {
    if (n.op() == v1::OP_CUSTOM) n.mutable_attrs()->mutable_custom()->set_name(kThreadOp);
  }
  CompileOptions co;
  co.device = "cpu:0";
  auto compiled = (*engine)->Compile(g, co, {});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const HostTensor xt = HostTensor::FromVector<float>(v1::DTYPE_F32, {1}, {1.0f});
  const std::vector<TensorRef> inputs = {TensorRef::Of("x", xt)};
  {
    std::lock_guard<std::mutex> lock(probe_threads_mu);
    probe_threads.clear();
  }
  std::set<std::thread::id> callers = {std::this_thread::get_id()};
  auto run = [&] {
    auto r = (*engine)->Run(*compiled->executable, inputs, nullptr, {});
    ASSERT_TRUE(r.ok()) << r.status();
  };
  run();
  std::vector<std::thread> threads;
  std::mutex callers_mu;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      {
        std::lock_guard<std::mutex> lock(callers_mu);
        callers.insert(std::this_thread::get_id());
      }
      for (int k = 0; k < 3; ++k) run();
    });
  }
  for (std::thread& t : threads) t.join();
  std::lock_guard<std::mutex> lock(probe_threads_mu);
  ASSERT_EQ(probe_threads.size(), 1u) << "13 runs from 5 threads ran on " << probe_threads.size()
                                      << " threads";
  EXPECT_FALSE(callers.contains(*probe_threads.begin())) << "a run ran on its caller's thread";
  for (const DeviceStats& d : (*engine)->DeviceStatistics()) {
    if (d.device == "cpu:0") {
      EXPECT_EQ(d.inline_runs, 0) << "runs on cpu:0: " << d.runs;
    }
  }
}

}  // namespace
}  // namespace kiln
