// CUDA graphs in the runtime (engine/runtime/program.cc): which programs
// replay a captured graph, by CompileOptions.cuda_graphs (no GPU needed);
// and on cuda:0, in this process and in a device worker, that a program's
// second run captures, later runs replay with the unrolled run's results,
// and reports give per-step times from the events inside the graph (skips
// without a CUDA device).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/engine.h"
#include "engine/runtime/program.h"
#include "tests/e2e/models.h"

namespace kiln::runtime {
namespace {


TEST(CudaGraphsDecision, OffNeverOnWhenCapturableAutoWhenLaunchBound) {
  // OFF never; nothing that cannot be captured, whatever the mode.
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_OFF, true, 20, 100));
  for (v1::CudaGraphs mode : {v1::CUDA_GRAPHS_AUTO, v1::CUDA_GRAPHS_ON}) {
    EXPECT_FALSE(UseCapturedGraphs(mode, false, 20, 100));
    EXPECT_FALSE(UseCapturedGraphs(mode, true, 0, 0));
  }
  // ON: every capturable program, however long its kernels run.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_ON, true, 2, 1e6));
  // AUTO: launch-bound programs only (the estimate per kernel at most
  // kLaunchBoundMicros): the BERT-base layer at B8 S128 (~15 kernels,
  // ~0.8 ms) is; a 5 ms decoder layer of 12 kernels is not.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 15, 800));
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 1, kLaunchBoundMicros));
  EXPECT_FALSE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 12, 5000));
  // An unknown estimate (0) counts as launch-bound.
  EXPECT_TRUE(UseCapturedGraphs(v1::CUDA_GRAPHS_AUTO, true, 3, 0));
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

}  // namespace
}  // namespace kiln::runtime
