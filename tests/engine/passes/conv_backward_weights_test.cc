// kiln.conv2d_backward_weights (base/custom_ops.h, backends/cpu/
// kernels_conv_wgrad.cc): a 2-D conv's weight gradient as oneDNN's
// backward-weights on x and g as they lie, against an f64 reference in f32,
// f16 and bf16 (stride, dilation, asymmetric padding, a stride that skips
// x's last rows); legalize's decomposition (the transposes and conv autodiff
// writes otherwise) against the kernel; the autodiff pass emitting it for any
// input channel count; its own VJP and JVP rules (a graph that holds the op, and
// an HVP through a conv's weight gradient) against f64 references; and bad
// payloads and shapes refused with a status.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/custom_ops.h"
#include "base/status.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
// A namespace of its own: unity builds put this file beside autodiff_test.cc.
namespace conv_backward_weights_test {
namespace {

struct ConvCase {
  std::string name;
  Dims x, w;
  std::vector<int64_t> stride, dilation, lo, hi;
};

std::vector<ConvCase> Cases() {
  return {
      {"pad1", {3, 4, 10, 10}, {5, 4, 3, 3}, {}, {}, {1, 1}, {1, 1}},
      {"stride2_skips_last_row", {2, 6, 12, 10}, {3, 6, 3, 3}, {2, 2}, {}, {}, {}},
      {"dilation_asym", {2, 4, 9, 9}, {4, 4, 3, 2}, {}, {2, 3}, {1, 0}, {2, 1}},
      {"stride_pad_mixed", {1, 5, 7, 6}, {2, 5, 2, 3}, {1, 2}, {}, {0, 2}, {1, 0}},
      {"one_channel", {6, 1, 9, 8}, {4, 1, 3, 3}, {}, {}, {1, 1}, {1, 1}},  // a first layer
  };
}

struct Geo {
  int64_t s[2] = {1, 1}, d[2] = {1, 1}, lo[2] = {0, 0}, hi[2] = {0, 0}, p[2] = {0, 0};
};

Geo GeoOf(const ConvCase& c) {
  Geo g;
  for (int i = 0; i < 2; ++i) {
    if (!c.stride.empty()) g.s[i] = c.stride[i];
    if (!c.dilation.empty()) g.d[i] = c.dilation[i];
    if (!c.lo.empty()) g.lo[i] = c.lo[i];
    if (!c.hi.empty()) g.hi[i] = c.hi[i];
    const int64_t span = (c.w[2 + i] - 1) * g.d[i] + 1;
    g.p[i] = (c.x[2 + i] + g.lo[i] + g.hi[i] - span) / g.s[i] + 1;
  }
  return g;
}

Dims GDims(const ConvCase& c) {
  const Geo q = GeoOf(c);
  return {c.x[0], c.w[0], q.p[0], q.p[1]};
}

v1::ConvAttrs AttrsOf(const ConvCase& c) {
  const Geo q = GeoOf(c);
  v1::ConvAttrs a;
  for (int i = 0; i < 2; ++i) {
    a.add_stride(q.s[i]);
    a.add_dilation(q.d[i]);
    a.add_pad_low(q.lo[i]);
    a.add_pad_high(q.hi[i]);
  }
  return a;
}

// Over every term x[n, ch, h, w] * g[n, o, p, q] * C[o, ch, i, j] of the
// bilinear form <C, dw(x, g)>: dw, and its gradients in x and g for C.
struct Reference {
  std::vector<double> dw, dx, dg;
};

Reference Ref(const ConvCase& c, const std::vector<double>& x, const std::vector<double>& g,
              const std::vector<double>& ct) {
  const Geo q = GeoOf(c);
  const int64_t n = c.x[0], ch = c.x[1], h = c.x[2], w = c.x[3], o = c.w[0], kh = c.w[2],
                kw = c.w[3];
  Reference r;
  r.dw.assign(o * ch * kh * kw, 0);
  r.dx.assign(x.size(), 0);
  r.dg.assign(g.size(), 0);
  for (int64_t a = 0; a < n; ++a)
    for (int64_t oo = 0; oo < o; ++oo)
      for (int64_t cc = 0; cc < ch; ++cc)
        for (int64_t pi = 0; pi < q.p[0]; ++pi)
          for (int64_t pj = 0; pj < q.p[1]; ++pj)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t hh = pi * q.s[0] + i * q.d[0] - q.lo[0];
                const int64_t ww = pj * q.s[1] + j * q.d[1] - q.lo[1];
                if (hh < 0 || hh >= h || ww < 0 || ww >= w) continue;
                const int64_t xi = ((a * ch + cc) * h + hh) * w + ww;
                const int64_t gi = ((a * o + oo) * q.p[0] + pi) * q.p[1] + pj;
                const int64_t wi = ((oo * ch + cc) * kh + i) * kw + j;
                r.dw[wi] += x[xi] * g[gi];
                if (!ct.empty()) {
                  r.dx[xi] += ct[wi] * g[gi];
                  r.dg[gi] += ct[wi] * x[xi];
                }
              }
  return r;
}

int64_t Count(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

// Few distinct values, multiples of 1/8: the f32 sums are exact.
std::vector<double> Values(std::mt19937_64& rng, int64_t n) {
  std::vector<double> v(n);
  for (double& e : v) e = static_cast<double>(static_cast<int>(rng() % 17) - 8) / 8;
  return v;
}

HostTensor Tensor(DType dt, const Dims& dims, const std::vector<double>& v) {
  HostTensor t = std::move(HostTensor::Create(dt, dims)).value();
  for (size_t i = 0; i < v.size(); ++i) t.SetFromDouble(static_cast<int64_t>(i), v[i]);
  return t;
}

std::vector<double> AsDoubles(const HostTensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.num_elements(); ++i) v.push_back(t.GetAsDouble(i));
  return v;
}

auto Spec(const Dims& d) { return std::vector<GraphBuilder::DimSpec>(d.begin(), d.end()); }

// dw = kiln.conv2d_backward_weights(x, g, w) as a graph of its own; with
// `ct`, loss = reduce_sum(dw * ct) as well (the output "loss").
v1::Graph OpGraph(DType dt, const Dims& xd, const Dims& gd, const Dims& wd, const std::string& payload,
                  bool with_loss) {
  GraphBuilder b("conv_backward_weights");
  auto x = b.input("x", dt, Spec(xd));
  auto g = b.input("g", dt, Spec(gd));
  auto w = b.input("w", dt, Spec(wd));
  auto ct = with_loss ? b.input("ct", dt, Spec(wd)) : x;
  v1::Attrs attrs;
  attrs.mutable_custom()->set_name(kConvBackwardWeightsOp);
  attrs.mutable_custom()->set_payload(payload);
  auto dw = b.node(v1::OP_CUSTOM, {x, g, w}, attrs, "dw");
  if (with_loss) {
    b.output("loss", b.reduce(v1::REDUCE_SUM, b.mul(dw, ct), {0, 1, 2, 3}));
  } else {
    b.output("dw", dw);
  }
  v1::Graph graph = b.Build();
  v1::TensorType* t = graph.mutable_nodes(dw.node)->add_outputs();
  t->set_dtype(dt);
  for (int64_t d : wd) t->add_dims()->set_size(d);
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

std::string Implementations(const RunResult& r) {
  std::string s;
  for (const auto& st : r.report.steps()) absl::StrAppend(&s, st.implementation(), ";");
  return s;
}

const HostTensor* Output(const RunResult& r, const std::string& name) {
  for (const auto& [n, t] : r.outputs) {
    if (n == name) return &t;
  }
  return nullptr;
}

// |got - want| within the storage dtype's rounding of the result.
void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, DType dt,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double rel = dt == v1::DTYPE_BF16 ? 1.0 / 256 : dt == v1::DTYPE_F16 ? 1.0 / 2048 : 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * std::abs(want[i]) + 1e-9) << what << " at " << i;
  }
}

absl::StatusOr<RunResult> RunOp(const ConvCase& c, DType dt, bool prefer_common_ir,
                                std::vector<double>* want) {
  std::mt19937_64 rng(std::hash<std::string>()(c.name));
  const Dims gd = GDims(c);
  const std::vector<double> x = Values(rng, Count(c.x)), g = Values(rng, Count(gd));
  *want = Ref(c, x, g, {}).dw;
  const v1::Graph graph = OpGraph(dt, c.x, gd, c.w, AttrsOf(c).SerializeAsString(), false);
  HostTensor xt = Tensor(dt, c.x, x), gt = Tensor(dt, gd, g),
             wt = Tensor(dt, c.w, std::vector<double>(Count(c.w), 0));
  std::vector<TensorRef> in = {TensorRef::Of("x", xt), TensorRef::Of("g", gt), TensorRef::Of("w", wt)};
  CompileOptions co;
  co.device = "cpu:0";
  co.prefer_common_ir = prefer_common_ir;
  RunOptions ro;
  ro.report = true;
  return SharedEngine().RunGraph(graph, in, nullptr, co, ro);
}

TEST(ConvBackwardWeights, MatchesTheF64Reference) {
  for (const ConvCase& c : Cases()) {
    for (DType dt : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16}) {
      std::vector<double> want;
      auto r = RunOp(c, dt, false, &want);
      ASSERT_TRUE(r.ok()) << c.name << " " << DTypeName(dt) << ": " << r.status();
      EXPECT_NE(Implementations(*r).find("onednn:conv2d_bwd_weights"), std::string::npos)
          << Implementations(*r);
      ExpectClose(AsDoubles(r->outputs[0].second), want, dt, c.name + " " + DTypeName(dt));
    }
  }
}

// Legalize's decomposition (what a device without the kernel runs) gives
// the same dw.
TEST(ConvBackwardWeights, DecompositionMatchesTheKernel) {
  for (const ConvCase& c : Cases()) {
    std::vector<double> want;
    auto r = RunOp(c, v1::DTYPE_F32, true, &want);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status();
    EXPECT_EQ(Implementations(*r).find("onednn:conv2d_bwd_weights"), std::string::npos)
        << Implementations(*r);
    ExpectClose(AsDoubles(r->outputs[0].second), want, v1::DTYPE_F32, c.name);
  }
}

// Every channel count takes the op, a first layer's single channel included
// (conv1 of the Fashion CNN ran transposes and a forward conv below 4 until
// gpt9b).
TEST(ConvBackwardWeights, AutodiffEmitsItForAnyInputChannels) {
  for (int64_t channels : {1, 2, 4}) {
    const ConvCase c{"emit", {2, channels, 6, 6}, {3, channels, 3, 3}, {}, {}, {1, 1}, {1, 1}};
    auto g = ir::ParseGraphProto(absl::StrCat(
        "graph \"t\"\ninput x: f32[2, ", channels, ", 6, 6]\ninput w: f32[3, ", channels,
        ", 3, 3]\ninput c: f32[2, 3, 6, 6]\n"
        "let loss = reduce_sum(conv(x, w, pad_low=[1, 1], pad_high=[1, 1]) * c)\nout loss\n"));
    ASSERT_TRUE(g.ok()) << g.status();
    std::mt19937_64 rng(channels);
    const std::vector<double> x = Values(rng, Count(c.x)), w = Values(rng, Count(c.w)),
                              ct = Values(rng, 2 * 3 * 36);
    CompileOptions co;
    co.device = "cpu:0";
    co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_GRAD);
    co.transforms.mutable_autodiff()->set_output("loss");
    co.transforms.mutable_autodiff()->add_wrt("w");
    HostTensor xt = Tensor(v1::DTYPE_F32, c.x, x), wt = Tensor(v1::DTYPE_F32, c.w, w),
               cdt = Tensor(v1::DTYPE_F32, {2, 3, 6, 6}, ct);
    std::vector<TensorRef> in = {TensorRef::Of("x", xt), TensorRef::Of("w", wt), TensorRef::Of("c", cdt)};
    RunOptions ro;
    ro.report = true;
    auto r = SharedEngine().RunGraph(*g, in, nullptr, co, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    const bool native = Implementations(*r).find("onednn:conv2d_bwd_weights") != std::string::npos;
    EXPECT_TRUE(native) << channels << " channels: " << Implementations(*r);
    const HostTensor* dw = Output(*r, "grad/w");
    ASSERT_NE(dw, nullptr);
    ExpectClose(AsDoubles(*dw), Ref(c, x, ct, {}).dw, v1::DTYPE_F32, absl::StrCat(channels, " channels"));
  }
}

// The op's VJP rule: the gradient of <ct, dw(x, g)> in x and in g.
TEST(ConvBackwardWeights, VjpRuleMatchesTheF64Reference) {
  for (const ConvCase& c : Cases()) {
    std::mt19937_64 rng(std::hash<std::string>()(c.name) + 1);
    const Dims gd = GDims(c);
    const std::vector<double> x = Values(rng, Count(c.x)), g = Values(rng, Count(gd)),
                              ct = Values(rng, Count(c.w));
    const Reference want = Ref(c, x, g, ct);
    const v1::Graph graph = OpGraph(v1::DTYPE_F32, c.x, gd, c.w, AttrsOf(c).SerializeAsString(), true);
    HostTensor xt = Tensor(v1::DTYPE_F32, c.x, x), gt = Tensor(v1::DTYPE_F32, gd, g),
               wt = Tensor(v1::DTYPE_F32, c.w, std::vector<double>(Count(c.w), 0)),
               ctt = Tensor(v1::DTYPE_F32, c.w, ct);
    std::vector<TensorRef> in = {TensorRef::Of("x", xt), TensorRef::Of("g", gt), TensorRef::Of("w", wt),
                                 TensorRef::Of("ct", ctt)};
    CompileOptions co;
    co.device = "cpu:0";
    co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_GRAD);
    co.transforms.mutable_autodiff()->set_output("loss");
    co.transforms.mutable_autodiff()->add_wrt("x");
    co.transforms.mutable_autodiff()->add_wrt("g");
    auto r = SharedEngine().RunGraph(graph, in, nullptr, co, {});
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status();
    const HostTensor *dx = Output(*r, "grad/x"), *dg = Output(*r, "grad/g");
    ASSERT_TRUE(dx != nullptr && dg != nullptr);
    ExpectClose(AsDoubles(*dx), want.dx, v1::DTYPE_F32, c.name + " d/dx");
    ExpectClose(AsDoubles(*dg), want.dg, v1::DTYPE_F32, c.name + " d/dg");
  }
}

// The op's JVP rule, through an HVP of reduce_sum(conv(x, w)^2) / 2 in w:
// the gradient is dw(x, conv(x, w)), its derivative along v is
// dw(x, conv(x, v)) (w only shapes the op).
TEST(ConvBackwardWeights, HvpThroughTheWeightGradient) {
  const ConvCase c{"hvp", {2, 4, 5, 5}, {3, 4, 3, 3}, {}, {}, {1, 1}, {1, 1}};
  auto g = ir::ParseGraphProto(
      "graph \"h\"\ninput x: f32[2, 4, 5, 5]\ninput w: f32[3, 4, 3, 3]\n"
      "let y = conv(x, w, pad_low=[1, 1], pad_high=[1, 1])\n"
      "let loss = reduce_sum(y * y) * 0.5\nout loss\n");
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937_64 rng(7);
  const std::vector<double> x = Values(rng, Count(c.x)), w = Values(rng, Count(c.w)),
                            v = Values(rng, Count(c.w));
  // conv(x, v) in f64, then dw(x, conv(x, v)).
  const Geo q = GeoOf(c);
  const Dims gd = GDims(c);
  std::vector<double> yv(Count(gd), 0);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t o = 0; o < 3; ++o)
      for (int64_t pi = 0; pi < q.p[0]; ++pi)
        for (int64_t pj = 0; pj < q.p[1]; ++pj)
          for (int64_t ch = 0; ch < 4; ++ch)
            for (int64_t i = 0; i < 3; ++i)
              for (int64_t j = 0; j < 3; ++j) {
                const int64_t hh = pi + i - 1, ww = pj + j - 1;
                if (hh < 0 || hh >= 5 || ww < 0 || ww >= 5) continue;
                yv[((a * 3 + o) * q.p[0] + pi) * q.p[1] + pj] +=
                    x[((a * 4 + ch) * 5 + hh) * 5 + ww] * v[((o * 4 + ch) * 3 + i) * 3 + j];
              }
  const std::vector<double> want = Ref(c, x, yv, {}).dw;
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms.mutable_autodiff()->set_mode(v1::AUTODIFF_HVP);
  co.transforms.mutable_autodiff()->set_output("loss");
  co.transforms.mutable_autodiff()->add_wrt("w");
  HostTensor xt = Tensor(v1::DTYPE_F32, c.x, x), wt = Tensor(v1::DTYPE_F32, c.w, w),
             vt = Tensor(v1::DTYPE_F32, c.w, v);
  std::vector<TensorRef> in = {TensorRef::Of("x", xt), TensorRef::Of("w", wt), TensorRef::Of("tangent/w", vt)};
  RunOptions ro;
  ro.report = true;
  auto r = SharedEngine().RunGraph(*g, in, nullptr, co, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(Implementations(*r).find("onednn:conv2d_bwd_weights"), std::string::npos)
      << Implementations(*r);
  const HostTensor* hvp = Output(*r, "hvp/w");
  ASSERT_NE(hvp, nullptr);
  ExpectClose(AsDoubles(*hvp), want, v1::DTYPE_F32, "hvp");
}

TEST(ConvBackwardWeights, BadPayloadsAndShapesAreRefused) {
  const ConvCase c = Cases()[0];
  const Dims gd = GDims(c);
  v1::ConvAttrs groups = AttrsOf(c);
  groups.set_groups(2);
  v1::ConvAttrs three = AttrsOf(c);
  three.add_stride(1);
  const struct {
    std::string payload;
    Dims g;
    std::string why;
  } bad[] = {
      {"\xff\xff not a proto", gd, "ConvAttrs"},
      {groups.SerializeAsString(), gd, "groups"},
      {three.SerializeAsString(), gd, "two entries"},
      {AttrsOf(c).SerializeAsString(), {3, 5, 9, 10}, "conv(x, w)"},
      {AttrsOf(c).SerializeAsString(), {3, 4, 10, 10}, "disagree"},
  };
  for (const auto& b : bad) {
    const v1::Graph graph = OpGraph(v1::DTYPE_F32, c.x, b.g, c.w, b.payload, false);
    CompileOptions co;
    co.device = "cpu:0";
    auto r = SharedEngine().Compile(graph, co, {});
    ASSERT_FALSE(r.ok()) << b.why;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(b.why), std::string::npos) << r.status();
  }
  // f64 has no kernel: the shape function says so.
  const v1::Graph graph = OpGraph(v1::DTYPE_F64, c.x, gd, c.w, AttrsOf(c).SerializeAsString(), false);
  CompileOptions co;
  co.device = "cpu:0";
  auto r = SharedEngine().Compile(graph, co, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("f32, f16, bf16"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace conv_backward_weights_test
}  // namespace kiln
