// kiln.max_pool_backward (base/custom_ops.h, backends/cpu/
// kernels_max_pool_backward.cc): the CPU's one-pass max pool derivative
// against an f64 reference of the rule (the first maximum of each window in
// row-major order takes g, padding holds the lowest value, overlaps add up)
// in every float dtype, with ties on purpose; legalize's decomposition (the
// composition autodiff used before) against the kernel; the autodiff pass
// emitting it; and bad payloads and shapes refused with a status.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/custom_ops.h"
#include "base/status.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
// A namespace of its own: unity builds put this file beside autodiff_test.cc.
namespace max_pool_backward_test {
namespace {

struct PoolCase {
  std::string name;
  Dims x;
  std::vector<int64_t> window, stride, lo, hi;
};

std::vector<PoolCase> Cases() {
  return {
      {"tile2x2", {2, 3, 8, 6}, {2, 2}, {}, {}, {}},
      {"tile2x2_crop", {2, 3, 7, 9}, {2, 2}, {}, {}, {}},
      {"tile2x2_wide", {2, 3, 6, 38}, {2, 2}, {}, {}, {}},  // eight windows at a time, and a tail
      {"tile2x2_seven", {2, 2, 4, 14}, {2, 2}, {}, {}, {}},  // masked: rows of 7 and 5 windows
      {"tile2x2_five", {1, 2, 6, 10}, {2, 2}, {}, {}, {}},
      {"tile3x3", {1, 2, 6, 9}, {3, 3}, {}, {}, {}},
      {"overlap3s2p1", {2, 2, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
      {"asym", {1, 2, 9, 8}, {3, 2}, {2, 1}, {1, 0}, {1, 1}},
      {"1d", {2, 3, 11}, {3}, {2}, {}, {}},
      {"1d_pad", {2, 1, 7}, {3}, {2}, {1}, {1}},
  };
}

v1::PoolAttrs AttrsOf(const PoolCase& c) {
  v1::PoolAttrs a;
  a.set_kind(v1::POOL_MAX);
  for (int64_t v : c.window) a.add_window(v);
  for (int64_t v : c.stride) a.add_stride(v);
  for (int64_t v : c.lo) a.add_pad_low(v);
  for (int64_t v : c.hi) a.add_pad_high(v);
  return a;
}

// Geometry widened to 2-D (a 1-D pool is H = 1).
struct Geo2 {
  int64_t planes, ih, iw, oh, ow, k[2], s[2], lo[2];
};

Geo2 GeoOf(const PoolCase& c) {
  const int sp = static_cast<int>(c.x.size()) - 2, off = 2 - sp;
  Geo2 g{c.x[0] * c.x[1], 1, c.x.back(), 1, 1, {1, 1}, {1, 1}, {0, 0}};
  if (sp == 2) g.ih = c.x[2];
  int64_t out[2] = {1, 1};
  for (int i = 0; i < sp; ++i) {
    const int64_t in = c.x[2 + i], k = c.window[i];
    const int64_t s = c.stride.empty() ? k : c.stride[i];
    const int64_t lo = c.lo.empty() ? 0 : c.lo[i], hi = c.hi.empty() ? 0 : c.hi[i];
    g.k[off + i] = k, g.s[off + i] = s, g.lo[off + i] = lo;
    out[off + i] = (in + lo + hi - k) / s + 1;
  }
  g.oh = out[0], g.ow = out[1];
  return g;
}

Dims YDims(const PoolCase& c) {
  const Geo2 g = GeoOf(c);
  Dims y = {c.x[0], c.x[1]};
  if (c.x.size() == 4) y.push_back(g.oh);
  y.push_back(g.ow);
  return y;
}

// The pool and its derivative in f64, from x and g as the dtype holds them.
void Reference(const PoolCase& c, double pad, const std::vector<double>& x,
               const std::vector<double>& g, std::vector<double>* y, std::vector<double>* dx) {
  const Geo2 q = GeoOf(c);
  y->assign(q.planes * q.oh * q.ow, 0);
  dx->assign(q.planes * q.ih * q.iw, 0);
  for (int64_t p = 0; p < q.planes; ++p) {
    for (int64_t oy = 0; oy < q.oh; ++oy) {
      for (int64_t ox = 0; ox < q.ow; ++ox) {
        auto at = [&](int64_t ky, int64_t kx, int64_t* index) {
          const int64_t iy = oy * q.s[0] - q.lo[0] + ky, ix = ox * q.s[1] - q.lo[1] + kx;
          const bool in = iy >= 0 && iy < q.ih && ix >= 0 && ix < q.iw;
          *index = in ? (p * q.ih + iy) * q.iw + ix : -1;
          return in ? x[*index] : pad;
        };
        double m = -std::numeric_limits<double>::infinity();
        int64_t index;
        for (int64_t ky = 0; ky < q.k[0]; ++ky) {
          for (int64_t kx = 0; kx < q.k[1]; ++kx) m = std::max(m, at(ky, kx, &index));
        }
        const int64_t o = (p * q.oh + oy) * q.ow + ox;
        (*y)[o] = m;
        bool found = false;
        for (int64_t ky = 0; ky < q.k[0] && !found; ++ky) {
          for (int64_t kx = 0; kx < q.k[1] && !found; ++kx) {
            if (at(ky, kx, &index) == m) {
              found = true;
              if (index >= 0) (*dx)[index] += g[o];
            }
          }
        }
      }
    }
  }
}

HostTensor Tensor(DType dt, const Dims& dims, const std::vector<double>& v) {
  HostTensor t = std::move(HostTensor::Create(dt, dims)).value();
  for (size_t i = 0; i < v.size(); ++i) t.SetFromDouble(static_cast<int64_t>(i), v[i]);
  return t;
}

// dx = kiln.max_pool_backward(x, y, g) as a graph of its own.
v1::Graph BackwardGraph(DType dt, const Dims& xd, const Dims& yd, const std::string& payload) {
  auto spec = [](const Dims& d) { return std::vector<GraphBuilder::DimSpec>(d.begin(), d.end()); };
  GraphBuilder b("max_pool_backward");
  auto x = b.input("x", dt, spec(xd));
  auto y = b.input("y", dt, spec(yd));
  auto g = b.input("g", dt, spec(yd));
  v1::Attrs attrs;
  attrs.mutable_custom()->set_name(kMaxPoolBackwardOp);
  attrs.mutable_custom()->set_payload(payload);
  auto dx = b.node(v1::OP_CUSTOM, {x, y, g}, attrs, "dx");
  v1::Graph graph = b.Build();
  v1::TensorType* t = graph.mutable_nodes(graph.nodes_size() - 1)->add_outputs();
  t->set_dtype(dt);
  for (int64_t d : xd) t->add_dims()->set_size(d);
  v1::GraphOutput* out = graph.add_outputs();
  out->set_name("dx");
  out->mutable_value()->set_node(dx.node);
  return graph;
}

Engine& SharedEngine() {
  static std::unique_ptr<Engine> engine = [] {
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    return std::move(Engine::Create(o)).value();
  }();
  return *engine;
}

double LowestAs(DType dt) {
  if (dt == v1::DTYPE_F64) return -std::numeric_limits<double>::max();
  // What Pad stores of -FLT_MAX: f16 and bf16 round it to -inf.
  HostTensor t = Tensor(dt, {1}, {-std::numeric_limits<float>::max()});
  return t.GetAsDouble(0);
}

struct Outcome {
  std::vector<double> got, want;
  std::string implementation;
};

absl::StatusOr<Outcome> RunCase(const PoolCase& c, DType dt, bool prefer_common_ir) {
  std::mt19937_64 rng(std::hash<std::string>()(c.name));
  const Geo2 q = GeoOf(c);
  // Few distinct values, exact in every dtype: ties in most windows.
  std::vector<double> x(q.planes * q.ih * q.iw), g(q.planes * q.oh * q.ow);
  for (double& v : x) v = static_cast<double>(static_cast<int>(rng() % 5) - 2) * 0.5;
  for (double& v : g) v = static_cast<double>(static_cast<int>(rng() % 33) - 16) / 8;
  Outcome out;
  std::vector<double> y;
  Reference(c, LowestAs(dt), x, g, &y, &out.want);
  const Dims yd = YDims(c);
  const v1::Graph graph = BackwardGraph(dt, c.x, yd, AttrsOf(c).SerializeAsString());
  HostTensor xt = Tensor(dt, c.x, x), yt = Tensor(dt, yd, y), gt = Tensor(dt, yd, g);
  std::vector<TensorRef> in = {TensorRef::Of("x", xt), TensorRef::Of("y", yt), TensorRef::Of("g", gt)};
  CompileOptions co;
  co.device = "cpu:0";
  co.prefer_common_ir = prefer_common_ir;
  RunOptions ro;
  ro.report = true;
  KILN_ASSIGN_OR_RETURN(RunResult r, SharedEngine().RunGraph(graph, in, nullptr, co, ro));
  const HostTensor& dx = r.outputs[0].second;
  for (int64_t i = 0; i < dx.num_elements(); ++i) out.got.push_back(dx.GetAsDouble(i));
  for (const auto& s : r.report.steps()) absl::StrAppend(&out.implementation, s.implementation(), ";");
  return out;
}

TEST(MaxPoolBackward, MatchesTheF64ReferenceInEveryFloatDtype) {
  for (const PoolCase& c : Cases()) {
    for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64}) {
      auto r = RunCase(c, dt, false);
      ASSERT_TRUE(r.ok()) << c.name << " " << DTypeName(dt) << ": " << r.status();
      EXPECT_NE(r->implementation.find(kMaxPoolBackwardOp), std::string::npos) << r->implementation;
      ASSERT_EQ(r->got.size(), r->want.size());
      // Multiples of 1/8 summed over a few windows: exact in every dtype.
      for (size_t i = 0; i < r->got.size(); ++i) {
        ASSERT_EQ(r->got[i], r->want[i]) << c.name << " " << DTypeName(dt) << " at " << i;
      }
    }
  }
}

// Legalize's decomposition (what a device without the kernel runs, and what
// autodiff wrote before) gives the same derivative, ties included.
TEST(MaxPoolBackward, DecompositionMatchesTheKernel) {
  for (const PoolCase& c : Cases()) {
    auto r = RunCase(c, v1::DTYPE_F32, true);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status();
    EXPECT_EQ(r->implementation.find(kMaxPoolBackwardOp), std::string::npos) << r->implementation;
    ASSERT_EQ(r->got.size(), r->want.size());
    for (size_t i = 0; i < r->got.size(); ++i) ASSERT_EQ(r->got[i], r->want[i]) << c.name << " at " << i;
  }
}

TEST(MaxPoolBackward, AutodiffEmitsItOnTheCpu) {
  auto g = ir::ParseGraphProto(
      "graph \"t\"\ninput x: f32[2, 3, 8, 8]\ninput c: f32[2, 3, 4, 4]\n"
      "let loss = reduce_sum(max_pool(x, window=[2, 2]) * c)\nout loss\n");
  ASSERT_TRUE(g.ok()) << g.status();
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_GRAD);
  co.transforms.mutable_autodiff()->set_output("loss");
  co.transforms.mutable_autodiff()->add_wrt("x");
  HostTensor x = Tensor(v1::DTYPE_F32, {2, 3, 8, 8}, std::vector<double>(384, 1.0));
  HostTensor c = Tensor(v1::DTYPE_F32, {2, 3, 4, 4}, std::vector<double>(96, 2.0));
  std::vector<TensorRef> in = {TensorRef::Of("x", x), TensorRef::Of("c", c)};
  RunOptions ro;
  ro.report = true;
  auto r = SharedEngine().RunGraph(*g, in, nullptr, co, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  bool native = false;
  for (const auto& s : r->report.steps()) native |= s.implementation().find(kMaxPoolBackwardOp) != std::string::npos;
  EXPECT_TRUE(native);
  // All ties: each window's first element (even row, even column) takes 2.
  const HostTensor* dx = nullptr;
  for (const auto& [name, t] : r->outputs) {
    if (name == "grad/x") dx = &t;
  }
  ASSERT_NE(dx, nullptr);
  ASSERT_EQ(dx->num_elements(), 384);
  for (int64_t i = 0; i < dx->num_elements(); ++i) {
    const int64_t row = (i / 8) % 8, col = i % 8;
    ASSERT_EQ(dx->GetAsDouble(i), row % 2 == 0 && col % 2 == 0 ? 2.0 : 0.0) << i;
  }
}

TEST(MaxPoolBackward, BadPayloadsAndShapesAreRefused) {
  const PoolCase c = Cases()[0];
  const Dims yd = YDims(c);
  v1::PoolAttrs avg = AttrsOf(c);
  avg.set_kind(v1::POOL_AVG);
  v1::PoolAttrs pad_too_big = AttrsOf(c);
  pad_too_big.add_pad_low(2);
  pad_too_big.add_pad_low(0);
  const struct {
    std::string payload;
    Dims y;
    std::string why;
  } bad[] = {
      {"\xff\xff not a proto", yd, "PoolAttrs"},
      {avg.SerializeAsString(), yd, "POOL_MAX"},
      {pad_too_big.SerializeAsString(), yd, "padding"},
      {AttrsOf(c).SerializeAsString(), {2, 3, 4, 4}, "y and g must have max_pool(x)"},
  };
  for (const auto& b : bad) {
    const v1::Graph graph = BackwardGraph(v1::DTYPE_F32, c.x, b.y, b.payload);
    CompileOptions co;
    co.device = "cpu:0";
    auto r = SharedEngine().Compile(graph, co, {});
    ASSERT_FALSE(r.ok()) << b.why;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(b.why), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace max_pool_backward_test
}  // namespace kiln
