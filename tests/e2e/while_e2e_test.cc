// While with a data-dependent trip count, end to end in-process: the cond and
// body compile as programs of their own, the loop runs on the CPU (from any
// placement), the iteration limit fails RESOURCE_EXHAUSTED naming the node,
// and a run's deadline and cancellation stop it between iterations.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
namespace {

// The node is named after its first result, "i". (i, n, x) -> while i < n: (i + 1, n, x * 2 + 1); the trip count is the
// input n, known only at run time.
constexpr char kLoop[] = R"(graph "loop"
input i0: i32[]
input n: i32[]
input x: f32[3]
let (i, m, y) = while(i0, n, x, cond=graph "cond" {
  input i: i32[]
  input n: i32[]
  input a: f32[3]
  out more = i < n
}, body=graph "body" {
  input i: i32[]
  input n: i32[]
  input a: f32[3]
  out i1 = i + 1
  out n1 = n
  out a1 = a * 2.0 + 1.0
}, max_iterations=MAXIT)
out i
out y
)";

v1::Graph LoopGraph(int64_t max_iterations = 0) {
  std::string text = kLoop;
  text.replace(text.find("MAXIT"), 5, absl::StrCat(max_iterations));
  auto g = ir::ParseGraphProto(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : v1::Graph();
}

std::unique_ptr<Engine> MakeWhileEngine(int64_t max_while_iterations = 1000000) {
  EngineOptions o;
  o.max_while_iterations = max_while_iterations;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

absl::StatusOr<RunResult> RunLoop(Engine& engine, const v1::Graph& g, int32_t n,
                                  const CompileOptions& co = {}, const RunOptions& ro = {}) {
  const HostTensor i0 = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {}, {0});
  const HostTensor nt = HostTensor::FromVector<int32_t>(v1::DTYPE_I32, {}, {n});
  const HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {0.0f, 1.0f, -1.0f});
  const std::vector<TensorRef> in = {TensorRef::Of("i0", i0), TensorRef::Of("n", nt), TensorRef::Of("x", x)};
  return engine.RunGraph(g, in, nullptr, co, ro);
}

TEST(WhileE2E, DataDependentTripCountOnEveryPlacement) {
  auto engine = MakeWhileEngine();
  const v1::Graph g = LoopGraph();
  std::vector<std::string> devices = {"auto"};
  for (const backend::DeviceInfo* d : engine->Devices()) devices.push_back(d->id);
  for (const std::string& device : devices) {
    SCOPED_TRACE(device);
    CompileOptions co;
    co.device = device;
    for (int32_t n : {0, 1, 5, 20}) {
      SCOPED_TRACE(n);
      auto r = RunLoop(*engine, g, n, co, {});
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->outputs.size(), 2u);
      EXPECT_EQ(r->outputs[0].second.GetAsDouble(0), n);
      const double x0[3] = {0, 1, -1};
      for (int j = 0; j < 3; ++j) {
        double want = x0[j];
        for (int k = 0; k < n; ++k) want = want * 2 + 1;
        EXPECT_EQ(r->outputs[1].second.GetAsDouble(j), want) << "j=" << j;
      }
    }
  }
  // One executable serves every trip count: the loop is not unrolled.
  CompileOptions co;
  auto compiled = engine->Compile(g, co, {});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  int whiles = 0;
  for (const v1::LirStep& s : compiled->executable->lir().steps()) {
    if (s.kind() == v1::STEP_KERNEL && s.kernel().node().op() == v1::OP_WHILE) {
      ++whiles;
      EXPECT_EQ(s.kernel().subprograms_size(), 2);
      EXPECT_EQ(s.kernel().implementation(), "engine:while");
      EXPECT_EQ(s.device(), "cpu:0");
    }
  }
  EXPECT_EQ(whiles, 1);
}

TEST(WhileE2E, IterationLimitIsResourceExhaustedNamingTheNode) {
  auto engine = MakeWhileEngine(7);
  const v1::Graph g = LoopGraph();
  auto ok = RunLoop(*engine, g, 7);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->outputs[0].second.GetAsDouble(0), 7);
  auto over = RunLoop(*engine, g, 8);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  const std::string msg(over.status().message());
  EXPECT_NE(msg.find("\"i\" (while)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 7 iterations"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limits.max_while_iterations = 7"), std::string::npos) << msg;
  // The node's own max_iterations can only lower the server's limit.
  auto own = RunLoop(*engine, LoopGraph(3), 4);
  ASSERT_FALSE(own.ok());
  EXPECT_EQ(own.status().code(), absl::StatusCode::kResourceExhausted) << own.status();
  EXPECT_NE(std::string(own.status().message()).find("its max_iterations attribute = 3"), std::string::npos)
      << own.status();
  auto higher = RunLoop(*engine, LoopGraph(100), 8);
  ASSERT_FALSE(higher.ok());
  EXPECT_NE(std::string(higher.status().message()).find("limits.max_while_iterations = 7"), std::string::npos)
      << higher.status();
  // The engine serves on.
  ASSERT_TRUE(RunLoop(*engine, g, 2).ok());
}

TEST(WhileE2E, DeadlineAndCancellationStopBetweenIterations) {
  auto engine = MakeWhileEngine(int64_t{1} << 40);
  const v1::Graph g = LoopGraph();
  ASSERT_TRUE(RunLoop(*engine, g, 1).ok());  // compiled before the clock starts
  RunOptions ro;
  ro.deadline = absl::Now() + absl::Milliseconds(300);
  auto late = RunLoop(*engine, g, 2000000000, {}, ro);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  // Seen between iterations by the While kernel ("... (while) stopped after N
  // iterations") or inside an iteration by the body's own executor ("...
  // (while): body, iteration N: the run's deadline passed"): either names the
  // node. Which one depends on where the clock runs out (a loaded host saw both).
  EXPECT_NE(std::string(late.status().message()).find("\"i\" (while)"), std::string::npos)
      << late.status();

  std::atomic<bool> cancelled{false};
  RunOptions rc;
  rc.cancelled = &cancelled;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancelled = true;
  });
  auto gone = RunLoop(*engine, g, 2000000000, {}, rc);
  canceller.join();
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kCancelled) << gone.status();
}

TEST(WhileE2E, BodyThatChangesACarryShapeIsRefused) {
  auto engine = MakeWhileEngine();
  auto g = ir::ParseGraphProto(R"(graph "grow"
input x: f32[2]
let y = while(x, cond=graph "c" {
  input a: f32[2]
  out more = reduce_sum(a, axes=[0]) < 10.0
}, body=graph "b" {
  input a: f32[2]
  out a1 = reduce_sum(a, axes=[0], keepdims=true)
})
out y
)");
  ASSERT_TRUE(g.ok()) << g.status();
  auto r = engine->Compile(*g, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("\"y\" (while)"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace kiln
