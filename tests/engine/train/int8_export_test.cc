// The int8 inference form (engine/quant/int8_export.h): the integer matmul
// (i8 or u8 @ i8 -> i32 through oneDNN) against an exact reference, extremes
// included; and exported graphs against the fake-quantized f32 graph they
// came from (per tensor and per channel, symmetric and asymmetric
// activations, LSQ scales, weights only).
#include "engine/quant/int8_export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
namespace {

Engine& SharedInt8Engine() {
  static std::unique_ptr<Engine> engine = [] {
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    return std::move(Engine::Create(o)).value();
  }();
  return *engine;
}

absl::StatusOr<RunResult> CompileRun(const v1::Graph& graph, const CompileOptions& co,
                                     const std::map<std::string, const HostTensor*>& inputs,
                                     const std::map<std::string, HostTensor>& params) {
  auto exe = SharedInt8Engine().Compile(graph, co, {});
  if (!exe.ok()) return exe.status();
  std::vector<TensorRef> in, ps;
  for (const auto& [n, t] : inputs) in.push_back(TensorRef::Of(n, *t));
  for (const auto& [n, t] : params) ps.push_back(TensorRef::Of(n, t));
  std::shared_ptr<ParamSet> set;
  if (!ps.empty()) {
    auto s = SharedInt8Engine().CreateParams(ps);
    if (!s.ok()) return s.status();
    set = *s;
  }
  return SharedInt8Engine().Run(*exe->executable, in, set.get(), {});
}

HostTensor Ints(DType dt, const Dims& dims, int lo, int hi, std::mt19937& rng) {
  HostTensor t = HostTensor::Create(dt, dims).value();
  std::uniform_int_distribution<int> u(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
  return t;
}

struct MatMulCase {
  std::string name;
  DType a_dtype;
  Dims a, b;
  bool tb;
  int lo, hi;  // the values' range (both operands; a u8 operand from 0)
};

TEST(Int8MatMul, MatchesExactReference) {
  const std::vector<MatMulCase> cases = {
      {"s8", v1::DTYPE_I8, {5, 37}, {37, 11}, false, -128, 127},
      {"s8_extremes", v1::DTYPE_I8, {4, 64}, {64, 8}, false, -128, -127},
      {"s8_max", v1::DTYPE_I8, {4, 64}, {64, 8}, false, 126, 127},
      {"u8", v1::DTYPE_U8, {7, 33}, {33, 9}, false, -128, 127},
      {"u8_extremes", v1::DTYPE_U8, {3, 256}, {256, 5}, false, 127, 127},
      {"transposed_b", v1::DTYPE_I8, {6, 40}, {13, 40}, true, -128, 127},
      {"batched", v1::DTYPE_I8, {2, 3, 16}, {16, 4}, false, -128, 127},
  };
  std::mt19937 rng(7);
  for (const MatMulCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string text = absl::StrCat(
        "graph \"mm\"\ninput a: ", DTypeName(c.a_dtype), DimsToString(c.a), "\ninput b: i8",
        DimsToString(c.b), "\nlet c = matmul(a, b", c.tb ? ", transpose_b=true" : "", ")\nout c\n");
    auto g = ir::ParseGraphProto(text);
    ASSERT_TRUE(g.ok()) << g.status() << "\n" << text;
    const bool u8 = c.a_dtype == v1::DTYPE_U8;
    HostTensor a =
        Ints(c.a_dtype, c.a, u8 ? std::max(0, c.lo + 128) : c.lo, u8 ? c.hi + 128 : c.hi, rng);
    HostTensor b = Ints(v1::DTYPE_I8, c.b, c.lo, c.hi, rng);
    CompileOptions co;
    co.device = "cpu:0";
    auto r = CompileRun(*g, co, {{"a", &a}, {"b", &b}}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& out = r->outputs[0].second;
    ASSERT_EQ(out.dtype(), v1::DTYPE_I32);
    const int64_t k = c.a.back(), n = c.tb ? c.b[0] : c.b[1];
    const int64_t rows = a.num_elements() / k;
    ASSERT_EQ(out.num_elements(), rows * n);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        int64_t want = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const int64_t bv = static_cast<int64_t>(b.GetAsDouble(c.tb ? j * k + kk : kk * n + j));
          want += static_cast<int64_t>(a.GetAsDouble(i * k + kk)) * bv;
        }
        ASSERT_EQ(static_cast<int64_t>(out.GetAsDouble(i * n + j)), want)
            << "c[" << i << ", " << j << "]";
      }
    }
  }
}

TEST(Int8MatMul, BadOperandsAreNamed) {
  auto g =
      ir::ParseGraphProto("graph \"mm\"\ninput a: i8[2, 3]\ninput b: u8[3, 4]\nout c = a @ b\n");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("an integer matmul is i8 or u8 @ i8"), std::string::npos)
      << g.status();
}

constexpr char kInt8Mlp[] = R"(graph "mlp"
input x: f32[16, 12]
param w1: f32[12, 24]
param b1: f32[24]
param w2: f32[10, 24]
param b2: f32[10]
let h = relu(x @ w1 + b1)
let logits = matmul(h, w2, transpose_b=true) + b2
out logits
)";

HostTensor Uniform(const Dims& dims, double lo, double hi, std::mt19937& rng) {
  HostTensor t = HostTensor::Create(v1::DTYPE_F32, dims).value();
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
  return t;
}

// The exported int8 graph computes what the QAT graph's fake quantization
// simulated: equal up to f32 rounding (and, rarely, an activation rounding
// the other way at a tie the two computations reach differently).
TEST(Int8Export, MatchesTheFakeQuantizedGraph) {
  struct Case {
    std::string name;
    std::function<void(v1::QatSpec&)> edit;
  };
  const std::vector<Case> cases = {
      {"tensor_sym", [](auto&) {}},
      {"channel_sym", [](auto& q) { q.set_weight_per_channel(true); }},
      {"channel_asym_act",
       [](auto& q) { q.set_weight_per_channel(true), q.set_activation_asymmetric(true); }},
      {"weights_only", [](auto& q) { q.set_weights_only(true); }},
      {"lsq", [](auto& q) { q.set_lsq(true), q.set_weight_per_channel(true); }},
  };
  auto graph = ir::ParseGraphProto(kInt8Mlp);
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(23);
    std::map<std::string, HostTensor> params;
    params.emplace("w1", Uniform({12, 24}, -0.4, 0.4, rng));
    params.emplace("b1", Uniform({24}, -0.1, 0.1, rng));
    params.emplace("w2", Uniform({10, 24}, -0.4, 0.4, rng));
    params.emplace("b2", Uniform({10}, -0.1, 0.1, rng));
    HostTensor x = Uniform({16, 12}, -1, 2, rng);
    v1::QatSpec qat;
    c.edit(qat);
    if (qat.lsq()) {  // learned scales: some set, some still at 0 (the init)
      HostTensor s1 = Uniform({24}, 0.002, 0.004, rng);
      s1.SetFromDouble(3, 0);
      params.emplace("w1/lsq_scale", std::move(s1));
      params.emplace("w2/lsq_scale", Uniform({10}, 0.002, 0.004, rng));
    }
    CompileOptions fq;
    fq.device = "cpu:0";
    *fq.transforms.mutable_qat() = qat;
    auto want = CompileRun(*graph, fq, {{"x", &x}}, params);
    ASSERT_TRUE(want.ok()) << want.status();
    auto model = quant::ExportInt8(*graph, qat, params);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->params.at("w1").dtype(), v1::DTYPE_I8);
    EXPECT_EQ(model->params.at("w2").dtype(), v1::DTYPE_I8);
    EXPECT_FALSE(model->params.contains("w1/lsq_scale"));
    CompileOptions plain;
    plain.device = "cpu:0";
    auto got = CompileRun(model->graph, plain, {{"x", &x}}, model->params);
    ASSERT_TRUE(got.ok()) << got.status();
    const HostTensor& a = want->outputs[0].second;
    const HostTensor& b = got->outputs[0].second;
    ASSERT_EQ(a.num_elements(), b.num_elements());
    double amax = 0;
    for (int64_t i = 0; i < a.num_elements(); ++i)
      amax = std::max(amax, std::abs(a.GetAsDouble(i)));
    int off = 0;
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      off += std::abs(a.GetAsDouble(i) - b.GetAsDouble(i)) > 1e-4 * amax;
    }
    EXPECT_LE(off, a.num_elements() / 50) << "of " << a.num_elements();
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      EXPECT_NEAR(a.GetAsDouble(i), b.GetAsDouble(i), 2e-2 * amax) << "logits[" << i << "]";
    }
  }
}

TEST(Int8Export, UnsupportedSpecsAreNamed) {
  auto graph = ir::ParseGraphProto(kInt8Mlp);
  ASSERT_TRUE(graph.ok());
  v1::QatSpec q;
  q.set_weight_asymmetric(true);
  auto m = quant::ExportInt8(*graph, q, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented) << m.status();
  q.Clear();
  q.set_bits(4);
  m = quant::ExportInt8(*graph, q, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented) << m.status();
  q.Clear();
  m = quant::ExportInt8(*graph, q, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find("\"w1\""), std::string::npos) << m.status();
}

}  // namespace
}  // namespace kiln
