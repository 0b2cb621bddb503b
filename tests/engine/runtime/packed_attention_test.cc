// Fuse's packed attention layout end to end: an attention between the head
// transposes ([B, S, H*D] -> reshape -> [B, S, H, D] -> transpose -> [B, H,
// S, D] and back) compiles on the CPU to one attention kernel reading and
// writing [B, S, H*D], with no transpose left, and matches an f64 reference
// and the unfused program. GQA, masks (causal, custom, bias), odd sequence
// lengths, and a merged result used as [B, S, H, D] (not reshaped back).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"

namespace kiln {
namespace packed_attention_test {

struct Shape {
  int64_t b, hq, hkv, sq, sk, d, dv;
};

HostTensor Random(std::mt19937_64& rng, DType dtype, const Dims& dims) {
  HostTensor t = HostTensor::Create(dtype, dims).value();
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    t.SetFromDouble(i, dtype == v1::DTYPE_BOOL ? (rng() % 3 != 0) : u(rng));
  }
  return t;
}

// q [B, Sq, Hq*D], k [B, Sk, Hkv*D], v [B, Sk, Hkv*Dv] inputs, heads split
// with reshape + transpose, attention, heads merged. `reshape_back`: the
// merged [B, Sq, Hq, Dv] is reshaped to [B, Sq, Hq*Dv] (else it is the
// output as is).
v1::Graph PackedGraph(const Shape& s, const v1::AttentionAttrs& attrs, const Dims& extra,
                      bool reshape_back) {
  GraphBuilder g("packed_attention");
  auto split = [&](const std::string& name, int64_t seq, int64_t heads, int64_t d) {
    auto x = g.input(name, v1::DTYPE_F32, {s.b, seq, heads * d});  // [B, S, H*D]
    return g.transpose(g.reshape(x, {s.b, seq, heads, d}), {0, 2, 1, 3});
  };
  auto q = split("q", s.sq, s.hq, s.d);
  auto k = split("k", s.sk, s.hkv, s.d);
  auto v = split("v", s.sk, s.hkv, s.dv);
  std::optional<GraphBuilder::Value> mask;
  const std::vector<GraphBuilder::DimSpec> extra_dims(extra.begin(), extra.end());
  if (attrs.mask() == v1::MASK_CUSTOM) mask = g.input("m", v1::DTYPE_BOOL, extra_dims);
  if (attrs.mask() == v1::MASK_BIAS) mask = g.input("m", v1::DTYPE_F32, extra_dims);
  auto a = g.attention(q, k, v, attrs, mask);
  auto merged = g.transpose(a, {0, 2, 1, 3});
  g.output("y", reshape_back ? g.reshape(merged, {s.b, s.sq, s.hq * s.dv}) : merged);
  return g.Build();
}

bool Visible(const v1::AttentionAttrs& a, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  const int64_t pos = i + (sk - sq);
  switch (a.mask()) {
    case v1::MASK_CAUSAL: return j <= pos;
    case v1::MASK_SLIDING_WINDOW: return j <= pos && pos - j < a.window();
    default: return true;
  }
}

// f64 attention over the packed inputs; result [B, Sq, Hq*Dv] row-major.
std::vector<double> Reference(const Shape& s, const v1::AttentionAttrs& a,
                              const std::vector<HostTensor>& in) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> out(s.b * s.sq * s.hq * s.dv, 0.0), logits(s.sk);
  std::vector<bool> keep(s.sk);
  const int64_t group = s.hq / s.hkv;
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < s.sq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.sk; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < s.d; ++x) {
            dot += in[0].GetAsDouble(((b * s.sq + i) * s.hq + h) * s.d + x) *
                   in[1].GetAsDouble(((b * s.sk + j) * s.hkv + hk) * s.d + x);
          }
          double l = scale * dot;
          keep[j] = Visible(a, i, j, s.sq, s.sk);
          if (a.mask() == v1::MASK_CUSTOM) keep[j] = in[3].GetAsDouble(b * s.sk + j) != 0;
          if (a.mask() == v1::MASK_BIAS) l += in[3].GetAsDouble((h * s.sq + i) * s.sk + j);
          logits[j] = l;
          if (keep[j]) mx = std::max(mx, l);
        }
        if (mx == -INFINITY) continue;  // nothing visible: zeros
        double sum = 0;
        for (int64_t j = 0; j < s.sk; ++j) {
          logits[j] = keep[j] ? std::exp(logits[j] - mx) : 0.0;
          sum += logits[j];
        }
        for (int64_t x = 0; x < s.dv; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < s.sk; ++j) {
            acc += logits[j] * in[2].GetAsDouble(((b * s.sk + j) * s.hkv + hk) * s.dv + x);
          }
          out[((b * s.sq + i) * s.hq + h) * s.dv + x] = acc / sum;
        }
      }
    }
  }
  return out;
}

struct Case {
  std::string name;
  Shape s;
  v1::MaskKind mask;
  bool reshape_back = true;
};

class PackedAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(PackedAttentionTest, OneKernelNoTransposesMatchesReference) {
  const Case& c = GetParam();
  const Shape& s = c.s;
  v1::AttentionAttrs attrs;
  attrs.set_mask(c.mask);
  Dims extra;
  if (c.mask == v1::MASK_CUSTOM) extra = {s.b, s.sk};
  if (c.mask == v1::MASK_BIAS) extra = {s.hq, s.sq, s.sk};
  const v1::Graph graph = PackedGraph(s, attrs, extra, c.reshape_back);
  std::mt19937_64 rng(42);
  std::vector<HostTensor> in;
  in.push_back(Random(rng, v1::DTYPE_F32, {s.b, s.sq, s.hq * s.d}));
  in.push_back(Random(rng, v1::DTYPE_F32, {s.b, s.sk, s.hkv * s.d}));
  in.push_back(Random(rng, v1::DTYPE_F32, {s.b, s.sk, s.hkv * s.dv}));
  if (!extra.empty()) {
    in.push_back(Random(rng, c.mask == v1::MASK_CUSTOM ? v1::DTYPE_BOOL : v1::DTYPE_F32, extra));
  }
  std::vector<TensorRef> refs = {TensorRef::Of("q", in[0]), TensorRef::Of("k", in[1]),
                                 TensorRef::Of("v", in[2])};
  if (in.size() > 3) refs.push_back(TensorRef::Of("m", in[3]));
  const std::vector<double> want = Reference(s, attrs, in);

  EngineOptions eo;
  auto engine = Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (bool fusion : {true, false}) {
    SCOPED_TRACE(absl::StrCat("fusion ", fusion));
    CompileOptions co;
    co.device = "cpu:0";
    co.enable_fusion = fusion;
    RunOptions ro;
    ro.report = true;
    auto r = (*engine)->RunGraph(graph, refs, nullptr, co, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& y = r->outputs[0].second;
    ASSERT_EQ(y.num_elements(), static_cast<int64_t>(want.size()));
    double worst = 0;
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      worst = std::max(worst, std::abs(y.GetAsDouble(i) - want[i]));
    }
    EXPECT_LT(worst, 2e-5);
    int transposes = 0, attentions = 0;
    for (const v1::DispatchStep& step : r->report.steps()) {
      transposes += step.implementation().find("transpose") != std::string::npos;
      attentions += step.implementation().find("attention") != std::string::npos;
    }
    EXPECT_EQ(attentions, 1);
    // Fused: no head transposes. Unfused: the three splits and the merge.
    EXPECT_EQ(transposes, fusion ? 0 : 4);
  }
}

// A graph that states the packed layout itself (rank-3 q, k, v, heads named):
// the CPU's kernel natively, and legalize's decomposition (prefer_common_ir:
// split heads, rank-4 decomposition, merge) give the reference's result.
TEST_P(PackedAttentionTest, RankThreeAttentionNativeAndDecomposed) {
  const Case& c = GetParam();
  const Shape& s = c.s;
  v1::AttentionAttrs attrs;
  attrs.set_mask(c.mask);
  attrs.set_heads(s.hq);
  attrs.set_kv_heads(s.hkv);
  Dims extra;
  if (c.mask == v1::MASK_CUSTOM) extra = {s.b, s.sk};
  if (c.mask == v1::MASK_BIAS) extra = {s.hq, s.sq, s.sk};
  GraphBuilder g("rank3_attention");
  auto q = g.input("q", v1::DTYPE_F32, {s.b, s.sq, s.hq * s.d});
  auto k = g.input("k", v1::DTYPE_F32, {s.b, s.sk, s.hkv * s.d});
  auto v = g.input("v", v1::DTYPE_F32, {s.b, s.sk, s.hkv * s.dv});
  std::optional<GraphBuilder::Value> mask;
  const std::vector<GraphBuilder::DimSpec> extra_dims(extra.begin(), extra.end());
  if (c.mask == v1::MASK_CUSTOM) mask = g.input("m", v1::DTYPE_BOOL, extra_dims);
  if (c.mask == v1::MASK_BIAS) mask = g.input("m", v1::DTYPE_F32, extra_dims);
  g.output("y", g.attention(q, k, v, attrs, mask));
  const v1::Graph graph = g.Build();
  std::mt19937_64 rng(7);
  std::vector<HostTensor> in;
  in.push_back(Random(rng, v1::DTYPE_F32, {s.b, s.sq, s.hq * s.d}));
  in.push_back(Random(rng, v1::DTYPE_F32, {s.b, s.sk, s.hkv * s.d}));
  in.push_back(Random(rng, v1::DTYPE_F32, {s.b, s.sk, s.hkv * s.dv}));
  if (!extra.empty()) {
    in.push_back(Random(rng, c.mask == v1::MASK_CUSTOM ? v1::DTYPE_BOOL : v1::DTYPE_F32, extra));
  }
  std::vector<TensorRef> refs = {TensorRef::Of("q", in[0]), TensorRef::Of("k", in[1]),
                                 TensorRef::Of("v", in[2])};
  if (in.size() > 3) refs.push_back(TensorRef::Of("m", in[3]));
  const std::vector<double> want = Reference(s, attrs, in);
  EngineOptions eo;
  auto engine = Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (bool common_ir : {false, true}) {
    SCOPED_TRACE(absl::StrCat("prefer_common_ir ", common_ir));
    CompileOptions co;
    co.device = "cpu:0";
    co.prefer_common_ir = common_ir;
    auto r = (*engine)->RunGraph(graph, refs, nullptr, co, RunOptions{});
    ASSERT_TRUE(r.ok()) << r.status();
    const HostTensor& y = r->outputs[0].second;
    ASSERT_EQ(y.dims(), (Dims{s.b, s.sq, s.hq * s.dv}));
    double worst = 0;
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      worst = std::max(worst, std::abs(y.GetAsDouble(i) - want[i]));
    }
    EXPECT_LT(worst, 2e-5);
  }
}

// The packed layout's shape rules: the heads are required and must divide
// the last dims; q, k, v share a rank.
TEST(PackedAttentionShapes, RejectsWhatTheLayoutCannotMean) {
  EngineOptions eo;
  auto engine = Engine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  struct Bad {
    int64_t heads, kv_heads;
    int64_t q_last, k_rank;
    std::string want;
  };
  for (const Bad& bad : {Bad{0, 0, 16, 3, "need attribute heads > 0"},
                         Bad{3, 0, 16, 3, "must divide by its 3 heads"},
                         Bad{4, 3, 16, 3, "must divide by its 3 heads"},
                         Bad{4, 0, 16, 4, "like q"}}) {
    SCOPED_TRACE(bad.want);
    GraphBuilder g("bad_packed");
    auto q = g.input("q", v1::DTYPE_F32, {1, 5, bad.q_last});
    auto k = bad.k_rank == 3 ? g.input("k", v1::DTYPE_F32, {1, 5, 16})
                             : g.input("k", v1::DTYPE_F32, {1, 4, 5, 4});
    v1::AttentionAttrs attrs;
    attrs.set_heads(bad.heads);
    attrs.set_kv_heads(bad.kv_heads);
    g.output("y", g.attention(q, k, k, attrs));
    HostTensor qt = HostTensor::Create(v1::DTYPE_F32, {1, 5, bad.q_last}).value();
    HostTensor kt = HostTensor::Create(v1::DTYPE_F32, bad.k_rank == 3 ? Dims{1, 5, 16}
                                                                      : Dims{1, 4, 5, 4})
                        .value();
    std::vector<TensorRef> refs = {TensorRef::Of("q", qt), TensorRef::Of("k", kt)};
    auto r = (*engine)->RunGraph(g.Build(), refs, nullptr, CompileOptions{}, RunOptions{});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(bad.want), std::string::npos) << r.status();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PackedAttentionTest,
    ::testing::Values(Case{"bert_b2", {2, 12, 12, 128, 128, 64, 64}, v1::MASK_BIDIRECTIONAL},
                      Case{"gqa_causal_odd", {1, 6, 2, 17, 17, 16, 16}, v1::MASK_CAUSAL},
                      Case{"gqa_dv_custom", {2, 4, 2, 5, 33, 8, 12}, v1::MASK_CUSTOM},
                      Case{"mqa_bias", {1, 4, 1, 7, 9, 8, 8}, v1::MASK_BIAS},
                      Case{"merged_kept_4d", {1, 3, 3, 9, 9, 8, 8}, v1::MASK_CAUSAL, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace packed_attention_test
}  // namespace kiln
