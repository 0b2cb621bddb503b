// Operand packing through the Engine (backends/packing.h): a program's
// constants are packed once, when it is loaded; a ParamSet's params once, on
// the first run with that set, and again for a new set (new values), never
// per run; results match the f64 reference either way. On the CPU the
// packing kernels are the small-M matmuls (backends/cpu/small_matmul.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "engine/runtime/program.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

std::unique_ptr<Engine> MakePackingEngine() {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

std::shared_ptr<Executable> CompileOnCpu(Engine& e, const v1::Graph& g, const Dims& x_dims) {
  CompileOptions o;
  o.device = "cpu:0";
  auto c = e.Compile(g, o, {{"x", x_dims}});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->executable : nullptr;
}

int64_t Packs(const Executable& e) { return static_cast<const runtime::Program&>(e).packs_made(); }

// Runs with a report; returns the output and how many steps read a packed B.
std::pair<HostTensor, int> RunCounting(Engine& e, Executable& exe, const HostTensor& x,
                                       const ParamSet* params) {
  RunOptions ro;
  ro.report = true;
  std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
  auto r = e.Run(exe, inputs, params, ro);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {HostTensor(), 0};
  int packed = 0;
  for (const auto& step : r->report.steps()) {
    if (absl::StrContains(step.implementation(), "+packed_b")) ++packed;
  }
  return {std::move(r->outputs[0].second), packed};
}

class PackingTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(PackingTest, ParamsPackedOncePerParamSetAndAgainForANewSet) {
  const int64_t batch = GetParam();
  auto engine = MakePackingEngine();
  models::Model m1 = models::Mlp(1), m2 = models::Mlp(2);
  auto exe = CompileOnCpu(*engine, m1.graph, {batch, 784});
  ASSERT_NE(exe, nullptr);
  EXPECT_EQ(Packs(*exe), 0) << "params are packed on their first run, not at load";
  std::mt19937_64 rng(5);
  const HostTensor x = models::RandomF32(rng, {batch, 784}, 1.0);
  auto p1 = engine->CreateParams(models::ParamRefs(m1));
  auto p2 = engine->CreateParams(models::ParamRefs(m2));
  ASSERT_TRUE(p1.ok() && p2.ok());
  const HostTensor want1 = models::MlpReference(m1, x), want2 = models::MlpReference(m2, x);

  // fc1, fc2 and fc3 each read their weights packed, packed on the first run.
  for (int i = 0; i < 3; ++i) {
    auto [y, packed] = RunCounting(*engine, *exe, x, p1->get());
    EXPECT_EQ(packed, 3);
    EXPECT_LE(models::WorstError(y, want1, 1e-4, 1e-4), 1.0);
    EXPECT_EQ(Packs(*exe), 3) << "run " << i;
  }
  // Another set (other values): packed again, and its own results.
  for (int i = 0; i < 2; ++i) {
    auto [y, packed] = RunCounting(*engine, *exe, x, p2->get());
    EXPECT_EQ(packed, 3);
    EXPECT_LE(models::WorstError(y, want2, 1e-4, 1e-4), 1.0);
    EXPECT_EQ(Packs(*exe), 6) << "run " << i;
  }
  // The first set kept its packing.
  auto [y, packed] = RunCounting(*engine, *exe, x, p1->get());
  EXPECT_LE(models::WorstError(y, want1, 1e-4, 1e-4), 1.0);
  EXPECT_EQ(Packs(*exe), 6);
}

// M = 1 (the micro-kernel reads an unpacked B too) and M = 64 (an unpacked B
// would go to oneDNN: the packed one stays on the micro-kernel).
INSTANTIATE_TEST_SUITE_P(Batches, PackingTest, ::testing::Values(1, 64));

// Above the small-M kernel's 64 rows the oneDNN matmul packs a param B into
// the blocked layout its primitive prefers: once per ParamSet, with bias, GELU
// and residual still fused, and the results those of the f64 reference.
TEST(PackingOneDnn, LargeMParamsPackedOnceAndExact) {
  auto engine = MakePackingEngine();
  std::mt19937_64 rng(9);
  const int64_t m = 130, k = 96, n = 72;
  models::Model model;
  model.params["w"] = models::RandomF32(rng, {k, n}, 0.1);
  model.params["b"] = models::RandomF32(rng, {n}, 0.1);
  model.params["r"] = models::RandomF32(rng, {m, n}, 1.0);
  GraphBuilder g("packed_fc");
  auto x = g.input("x", v1::DTYPE_F32, {m, k});
  auto w = g.param("w", v1::DTYPE_F32, {k, n});
  auto b = g.param("b", v1::DTYPE_F32, {n});
  auto r = g.param("r", v1::DTYPE_F32, {m, n});
  g.output("y", g.add(g.gelu(g.add(g.matmul(x, w), b)), r));
  model.graph = g.Build();
  auto exe = CompileOnCpu(*engine, model.graph, {m, k});
  ASSERT_NE(exe, nullptr);
  auto params = engine->CreateParams(models::ParamRefs(model));
  ASSERT_TRUE(params.ok()) << params.status();
  const HostTensor xt = models::RandomF32(rng, {m, k}, 1.0);
  std::vector<double> want(m * n);
  const float* xv = xt.data_as<float>();
  const float* wv = model.params["w"].data_as<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = model.params["b"].data_as<float>()[j];
      for (int64_t kk = 0; kk < k; ++kk) s += double(xv[i * k + kk]) * wv[kk * n + j];
      want[i * n + j] = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0))) +
                        model.params["r"].data_as<float>()[i * n + j];
    }
  }
  for (int run = 0; run < 3; ++run) {
    auto [y, packed] = RunCounting(*engine, *exe, xt, params->get());
    EXPECT_EQ(packed, 1) << "run " << run;
    EXPECT_EQ(Packs(*exe), 1) << "run " << run;
    ASSERT_EQ(y.num_elements(), m * n);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(y.data_as<float>()[i], want[i], 1e-4 + 1e-4 * std::abs(want[i])) << i;
    }
  }
}

TEST(PackingConstants, PackedOnceAtLoad) {
  auto engine = MakePackingEngine();
  std::mt19937_64 rng(3);
  const HostTensor w = models::RandomF32(rng, {96, 40}, 0.1);
  const HostTensor x = models::RandomF32(rng, {3, 96}, 1.0);
  GraphBuilder g("const_matmul");
  auto in = g.input("x", v1::DTYPE_F32, {3, 96});
  g.output("y", g.relu(g.matmul(in, g.constant(w, "w"))));
  auto exe = CompileOnCpu(*engine, g.Build(), {3, 96});
  ASSERT_NE(exe, nullptr);
  EXPECT_EQ(Packs(*exe), 1);
  bool named = false;
  for (const auto& step : exe->lir().steps()) {
    const std::string& impl = step.kernel().implementation();
    named = named ||
            (absl::StrContains(impl, "matmul_small_m") && absl::StrContains(impl, "+packed_b"));
  }
  EXPECT_TRUE(named) << exe->lir().DebugString();
  for (int i = 0; i < 3; ++i) {
    auto [y, packed] = RunCounting(*engine, *exe, x, nullptr);
    EXPECT_EQ(packed, 1);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < 40; ++c) {
        double s = 0;
        for (int64_t k = 0; k < 96; ++k) {
          s += double(x.data_as<float>()[r * 96 + k]) * w.data_as<float>()[k * 40 + c];
        }
        ASSERT_NEAR(y.data_as<float>()[r * 40 + c], std::max(s, 0.0), 1e-5);
      }
    }
  }
  EXPECT_EQ(Packs(*exe), 1);
}

}  // namespace
}  // namespace kiln
