// EngineOptions::cpu_threads holds on every thread that runs: OpenMP's thread
// count is a per-thread setting, and kilnd runs from its work pool's threads,
// not the thread that made the engine (before the fix, a run from another
// thread used every core whatever cpu_threads said). Observed by a custom op
// whose CPU kernel reports OpenMP's count and the size of the team it gets.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
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

}  // namespace
}  // namespace kiln
