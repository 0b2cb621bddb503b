// The cost model's host terms (runtime::HostProfile): the thread team's fork +
// join only for kernels that span it, its wake-up once per run, the cache's
// bandwidth below its size, transcendental elements at their measured rate,
// and no launch for elementwise nodes that fusion folds into their producer.
#include "engine/runtime/cost_model.h"

#include <gtest/gtest.h>

#include "clients/cpp/graph_builder.h"
#include "engine/ir/verifier.h"
#include "engine/passes/pass.h"
#include "engine/runtime/device_registry.h"

namespace kiln::runtime::cost_model_test {

backend::KernelSpec Unary(v1::UnaryKind kind, int64_t n) {
  backend::KernelSpec s;
  s.op = v1::OP_UNARY;
  s.attrs.mutable_unary()->set_kind(kind);
  s.inputs = {{v1::DTYPE_F32, {n}}};
  s.outputs = {{v1::DTYPE_F32, {n}}};
  return s;
}

backend::DeviceInfo HostDevice() {
  backend::DeviceInfo d;
  d.id = "cpu:0";
  d.host_memory = true;
  d.threads = 16;
  d.profile.peak_gflops_f32 = d.profile.peak_gflops_f16 = 1000;
  d.profile.bandwidth_gbps = 10;  // memory, past the cache
  d.profile.launch_overhead_us = 1;
  d.profile.sync_overhead_us = 2;
  d.profile.calibrated = true;
  return d;
}

TEST(CostModel, TeamLaunchOnlyForKernelsThatSpanTheTeam) {
  const backend::DeviceInfo cpu = HostDevice();
  CostModel model;
  const double tiny_before = model.KernelMicros(Unary(v1::UNARY_RELU, 16), cpu);
  const double big_before = model.KernelMicros(Unary(v1::UNARY_RELU, 1 << 20), cpu);
  HostProfile h;
  h.parallel_launch_us = 50;
  h.mixed_launch_us = 80;
  model.SetHostProfile("cpu:0", h);
  EXPECT_FALSE(SpansThreadTeam(EstimateWork(Unary(v1::UNARY_RELU, 16))));
  EXPECT_TRUE(SpansThreadTeam(EstimateWork(Unary(v1::UNARY_RELU, 1 << 20))));
  EXPECT_DOUBLE_EQ(model.KernelMicros(Unary(v1::UNARY_RELU, 16), cpu), tiny_before);
  EXPECT_DOUBLE_EQ(model.KernelMicros(Unary(v1::UNARY_RELU, 1 << 20), cpu), big_before + 50);
  // A run of one such kernel pays the stable figure (in KernelMicros); a run
  // of several pays the mixed one for each (the rest in RunMicros).
  EXPECT_DOUBLE_EQ(model.RunMicros(cpu, 0), 2);
  EXPECT_DOUBLE_EQ(model.RunMicros(cpu, 1), 2);
  EXPECT_DOUBLE_EQ(model.RunMicros(cpu, 3), 2 + 3 * 30);
  // Another device keeps none of it.
  backend::DeviceInfo gpu = HostDevice();
  gpu.id = "cuda:0";
  EXPECT_DOUBLE_EQ(model.RunMicros(gpu, 3), 2);
}

TEST(CostModel, CacheBandwidthBelowTheCacheSize) {
  const backend::DeviceInfo cpu = HostDevice();
  CostModel model;
  HostProfile h;
  h.cache_bandwidth_gbps = 100;
  h.cache_bytes = int64_t{1} << 20;
  model.SetHostProfile("cpu:0", h);
  // 2 x 64 KiB in cache at 100 GB/s; 2 x 4 MiB from memory at 10 GB/s.
  const double small = model.KernelMicros(Unary(v1::UNARY_RELU, 1 << 14), cpu) - 1;
  const double large = model.KernelMicros(Unary(v1::UNARY_RELU, 1 << 20), cpu) - 1;
  EXPECT_NEAR(small, 2.0 * (1 << 16) / 100e3, 1e-9);
  EXPECT_NEAR(large, 2.0 * (1 << 22) / 10e3, 1e-6);
}

TEST(CostModel, TranscendentalsCostTheirMeasuredRate) {
  const backend::DeviceInfo cpu = HostDevice();
  EXPECT_EQ(EstimateWork(Unary(v1::UNARY_TANH, 1000)).transcendentals, 1000);
  EXPECT_EQ(EstimateWork(Unary(v1::UNARY_RELU, 1000)).transcendentals, 0);
  // A fused region counts each transcendental instruction per element.
  backend::KernelSpec fused;
  fused.op = v1::OP_FUSED_ELEMENTWISE;
  for (v1::UnaryKind k : {v1::UNARY_TANH, v1::UNARY_EXP, v1::UNARY_RELU}) {
    v1::FusedInstr* in = fused.attrs.mutable_fused_elementwise()->add_instrs();
    in->set_op(v1::OP_UNARY);
    in->mutable_unary()->set_kind(k);
  }
  fused.inputs = {{v1::DTYPE_F32, {500}}};
  fused.outputs = {{v1::DTYPE_F32, {500}}};
  EXPECT_EQ(EstimateWork(fused).transcendentals, 1000);
  CostModel model;
  const double before = model.KernelMicros(Unary(v1::UNARY_TANH, 1 << 20), cpu);
  HostProfile h;
  h.transcendental_gelems = 1;  // 1e9 a second: 1M take 1049 us
  model.SetHostProfile("cpu:0", h);
  const double after = model.KernelMicros(Unary(v1::UNARY_TANH, 1 << 20), cpu);
  EXPECT_GT(after, before);
  EXPECT_NEAR(after, (1 << 20) / 1e3 + 1 + (1 << 20) / (1000 * 1e3), 1e-6);
}

// A chain of elementwise nodes becomes one fused kernel: legalize's estimate
// charges one launch for it, not one per node.
TEST(CostModel, FusedChainPaysOneLaunch) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device* cpu = (*registry)->cpu();
  auto estimate = [&](int depth) {
    GraphBuilder b("chain");
    auto x = b.input("x", v1::DTYPE_F32, {int64_t{16}});
    auto y = x;
    for (int i = 0; i < depth; ++i) y = b.relu(b.add(y, x));
    b.output("y", y);
    auto g = ir::ImportGraph(b.Build());
    EXPECT_TRUE(g.ok()) << g.status();
    CostModel model;
    backend::DeviceProfile p = cpu->info().profile;
    p.launch_overhead_us = 1000;  // dwarfs the work of 16 elements
    p.sync_overhead_us = 0;
    p.calibrated = true;
    model.SetProfile(cpu->info().id, p);
    passes::PassContext ctx;
    ctx.devices = {cpu};
    ctx.cost_model = &model;
    auto legalize = passes::CreatePass("legalize");
    EXPECT_TRUE((*legalize)->Run(**g, ctx).ok());
    return ctx.placement_report.estimates(0).estimate_micros();
  };
  // Copies on a host device cost nothing here: one launch per chain.
  EXPECT_LT(estimate(1), 1100);
  EXPECT_GE(estimate(1), 1000);
  EXPECT_LT(estimate(6), 1100);
}

// A run copies each input to the device and each output back on its own
// (program.cc): legalize charges every one its fixed cost, not one for all
// the inputs together.
TEST(CostModel, EachInputAndOutputPaysItsOwnCopy) {
  auto registry = DeviceRegistry::Create({});
  ASSERT_TRUE(registry.ok()) << registry.status();
  backend::Device* cpu = (*registry)->cpu();
  backend::Device* other = nullptr;
  for (backend::Device* d : (*registry)->devices()) {
    if (!d->info().host_memory) other = d;
  }
  if (other == nullptr) GTEST_SKIP() << "no device with its own memory (lavapipe)";
  CostModel model;
  backend::DeviceProfile p = other->info().profile;
  p.peak_gflops_f32 = p.peak_gflops_f16 = 1e6;
  p.bandwidth_gbps = 1e6;
  p.host_to_device_gbps = p.device_to_host_gbps = 1e6;  // the bytes cost ~nothing
  p.launch_overhead_us = 1000;  // each kernel and each copy
  p.sync_overhead_us = 0;
  p.calibrated = true;
  model.SetProfile(other->info().id, p);
  auto estimate = [&](int inputs) {
    GraphBuilder b("sum");
    auto y = b.input("x0", v1::DTYPE_F32, {int64_t{16}});
    for (int i = 1; i < inputs; ++i) y = b.add(y, b.input("x" + std::to_string(i), v1::DTYPE_F32, {int64_t{16}}));
    b.output("y", y);
    auto g = ir::ImportGraph(b.Build());
    EXPECT_TRUE(g.ok()) << g.status();
    passes::PassContext ctx;
    ctx.devices = {cpu, other};
    ctx.cost_model = &model;
    auto legalize = passes::CreatePass("legalize");
    EXPECT_TRUE((*legalize)->Run(**g, ctx).ok());
    for (const v1::DeviceEstimate& e : ctx.placement_report.estimates()) {
      if (e.device() == other->info().id) return e.estimate_micros();
    }
    ADD_FAILURE() << "no estimate for " << other->info().id;
    return 0.0;
  };
  // Two inputs, one add, one output: 2 + 1 + 1 launches' worth.
  EXPECT_NEAR(estimate(2), 4000, 1);
  // Three inputs, two fused adds (one kernel), one output.
  EXPECT_NEAR(estimate(3), 5000, 1);
}

}  // namespace kiln::runtime::cost_model_test
