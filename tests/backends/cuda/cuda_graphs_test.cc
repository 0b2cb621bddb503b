// CUDA graphs in the runtime (engine/runtime/program.cc): which programs
// replay a captured graph, by CompileOptions.cuda_graphs (no GPU needed);
// and on cuda:0, in this process and in a device worker, that a program's
// second run captures, later runs replay with the unrolled run's results,
// and reports give per-step times from the events inside the graph (skips
// without a CUDA device).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "engine/runtime/program.h"
#include "tests/e2e/models.h"

namespace kiln::runtime {
namespace {

TEST(CudaGraphsDecision, OffNeverOnWhenCapturableAutoWhenTheGraphSavesEnough) {
  // OFF never; nothing that cannot be captured, whatever the mode.
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_OFF, true, 20, 100, 5));
  for (v1::CudaGraphs mode : {v1::CUDA_GRAPHS_AUTO, v1::CUDA_GRAPHS_ON}) {
    EXPECT_FALSE(UseCapturedGraphs(mode, false, 20, 100, 5));
    EXPECT_FALSE(UseCapturedGraphs(mode, true, 0, 0, 5));
  }
  // ON: every capturable program, however long its kernels run.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_ON, true, 2, 1e6, 5));
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_ON, true, 2, 1e6, 0));
}

TEST(CudaGraphsDecision, AutoWeighsTheLaunchesSavedAgainstTheEstimate) {
  // Saved: kernels x launch cost; captured when that is at least
  // kMinGraphSaving of the estimated run.
  // The BERT-base layer fp32 B8 S128: 13 kernels, estimated 621 us.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 13, 621, 4));
  // The bf16 layer at B32 S512: 13 kernels estimated at 2474 us (0.68 ms of
  // kernels on an H100) whose launches cost 120-200 us of a run: captured
  // with the nominal launch cost (4 us) and the calibrated one (6.6 us). The
  // rule before (at most 100 us of estimate per kernel) declined it.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 13, 2474, 4));
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 13, 2474, 6.6));
  // A 7B-style decoder layer (~10 kernels, estimated ~11 ms): 40 us saved is
  // 0.4% of the run, below the bar; one large GEMM saves one launch.
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 10, 11000, 4));
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 1, 2900, 6.6));
  // The bar itself: exactly kMinGraphSaving is enough, just under is not.
  const double run = 1000;
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 4, run, kMinGraphSaving * run / 4));
  EXPECT_FALSE(
      UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 4, run, 0.99 * kMinGraphSaving * run / 4));
  // The launch cost decides: the same program on a device whose launches
  // cost a tenth as much saves too little.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 10, 2000, 4));
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 10, 2000, 0.4));
  // An unknown estimate (0) counts as launch-bound; a launch cost that is
  // unknown (0) or nonsense (negative) saves nothing.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 3, 0, 4));
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 3, 500, 0));
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 3, 500, -4));
}

TEST(CudaGraphsEngine, SecondRunCapturesLaterRunsReplayWithTheSameResults) {
  for (auto iso : {EngineOptions::DeviceIsolation::kThread, EngineOptions::DeviceIsolation::kProcess}) {
    const bool thread = iso == EngineOptions::DeviceIsolation::kThread;
    SCOPED_TRACE(thread ? "thread isolation" : "process isolation");
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    o.device_isolation = iso;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    bool cuda = false;
    for (const auto* d : (*engine)->Devices()) cuda |= d->id == "cuda:0";
    if (!cuda) GTEST_SKIP() << "no CUDA device";
    const int64_t n = 96;
    const v1::Graph g = models::MatMulChain(n, 6);
    std::mt19937_64 rng(3);
    HostTensor x = models::RandomF32(rng, {n, n}, 0.1), w = models::RandomF32(rng, {n, n}, 0.1);
    const std::vector<TensorRef> inputs = {TensorRef::Of("x", x), TensorRef::Of("w", w)};
    CompileOptions off, on;
    off.device = on.device = "cuda:0";
    off.cuda_graphs = v1::CUDA_GRAPHS_OFF;
    on.cuda_graphs = v1::CUDA_GRAPHS_ON;
    auto unrolled = (*engine)->Compile(g, off, {});
    auto graphed = (*engine)->Compile(g, on, {});
    ASSERT_TRUE(unrolled.ok() && graphed.ok());
    EXPECT_NE(unrolled->executable->key(), graphed->executable->key());
    auto* program = dynamic_cast<Program*>(graphed->executable.get());
    ASSERT_NE(program, nullptr);
    EXPECT_TRUE(program->uses_graphs());
    EXPECT_FALSE(dynamic_cast<Program*>(unrolled->executable.get())->uses_graphs());
    auto want = (*engine)->Run(*unrolled->executable, inputs, nullptr, {});
    ASSERT_TRUE(want.ok()) << want.status();
    const HostTensor& ref = want->outputs[0].second;
    const char* states[] = {"", "captured", "replayed", "replayed", "replayed"};
    for (int run = 0; run < 5; ++run) {
      SCOPED_TRACE(run);
      RunOptions ro;
      ro.report = run != 3;  // a replay without a report uses the same graph
      auto got = (*engine)->Run(*graphed->executable, inputs, nullptr, ro);
      ASSERT_TRUE(got.ok()) << got.status();
      const HostTensor& y = got->outputs[0].second;
      ASSERT_EQ(y.num_bytes(), ref.num_bytes());
      const float* a = static_cast<const float*>(y.data());
      const float* b = static_cast<const float*>(ref.data());
      for (int64_t i = 0; i < n * n; ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-5 * (1 + std::fabs(b[i]))) << "element " << i;
      }
      if (!ro.report) continue;
      EXPECT_EQ(got->report.cuda_graph(), states[run]);
      ASSERT_EQ(got->report.steps_size(), program->lir().steps_size());
      double busy = 0;
      for (const auto& step : got->report.steps()) {
        EXPECT_GT(step.duration_micros(), 0) << step.kernel();
        EXPECT_GE(step.start_micros(), 0) << step.kernel();
        busy += step.duration_micros();
      }
      EXPECT_LE(busy, got->report.run_micros());
    }
    const Program::ContextStats stats = program->context_stats();
    EXPECT_EQ(stats.graph_captures, 1);
    EXPECT_EQ(stats.graph_replays, 4);
    EXPECT_EQ(stats.graph_failures, 0);
  }
}

// AUTO through the engine on cuda:0 (nominal profile: no calibration): a chain
// of small kernels captures, one large GEMM (a launch saved of a ~3 ms run)
// does not, and ON captures it anyway.
TEST(CudaGraphsEngine, AutoCapturesWhatTheGraphSavesEnoughOn) {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  o.device_isolation = EngineOptions::DeviceIsolation::kThread;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const backend::DeviceInfo* cuda = nullptr;
  for (const auto* d : (*engine)->Devices()) {
    if (d->id == "cuda:0") cuda = d;
  }
  if (cuda == nullptr) GTEST_SKIP() << "no CUDA device";
  GraphBuilder big("one_gemm");
  const int64_t n = 4096;
  big.output("y", big.matmul(big.input("x", v1::DTYPE_F32, {n, n}),
                             big.input("w", v1::DTYPE_F32, {n, n})));
  struct Case {
    const char* name;
    v1::Graph graph;
    v1::CudaGraphs mode;
    bool graphs;
  };
  const Case cases[] = {{"chain auto", models::MatMulChain(96, 6), v1::CUDA_GRAPHS_AUTO, true},
                        {"gemm auto", big.Build(), v1::CUDA_GRAPHS_AUTO, false},
                        {"gemm on", big.Build(), v1::CUDA_GRAPHS_ON, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CompileOptions co;
    co.device = "cuda:0";
    co.cuda_graphs = c.mode;
    auto compiled = (*engine)->Compile(c.graph, co, {});
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    auto* program = dynamic_cast<Program*>(compiled->executable.get());
    ASSERT_NE(program, nullptr);
    const int kernels = program->lir().steps_size();
    EXPECT_EQ(program->uses_graphs(), c.graphs)
        << kernels << " kernels, estimate " << program->estimated_run_micros() << " us, launch "
        << cuda->profile.launch_overhead_us << " us";
    EXPECT_EQ(program->uses_graphs(),
              UseCapturedGraphs(c.mode, true, kernels, program->estimated_run_micros(),
                                cuda->profile.launch_overhead_us));
  }
}

}  // namespace
}  // namespace kiln::runtime
