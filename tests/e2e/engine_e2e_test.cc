// End to end in-process: graphs compiled through the whole pipeline and run on
// the CPU equal their f64 references.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/ir/text.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

std::unique_ptr<Engine> MakeEngine(const std::string& cache_dir = "") {
  EngineOptions o;
  o.cache_dir = cache_dir;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

TEST(EngineE2E, MlpMatchesReference) {
  auto engine = MakeEngine();
  models::Model m = models::Mlp();
  auto params = engine->CreateParams(models::ParamRefs(m));
  ASSERT_TRUE(params.ok()) << params.status();
  std::mt19937_64 rng(7);
  for (int64_t batch : {1, 3, 32}) {
    HostTensor x = models::RandomF32(rng, {batch, 784}, 1.0);
    std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
    RunOptions ro;
    ro.report = true;
    auto r = engine->RunGraph(m.graph, inputs, params->get(), {}, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 1u);
    EXPECT_EQ(r->outputs[0].first, "logits");
    const HostTensor want = models::MlpReference(m, x);
    EXPECT_LE(models::WorstError(r->outputs[0].second, want, 1e-4, 1e-4), 1.0) << "batch " << batch;
    // Matmul + bias (+ relu) epilogues are fused: three kernels in all.
    int matmuls = 0;
    for (const auto& s : r->report.steps()) {
      if (s.implementation().find("matmul") != std::string::npos) ++matmuls;
    }
    EXPECT_EQ(matmuls, 3);
    EXPECT_EQ(r->report.steps_size(), 3) << r->report.DebugString();
  }
}

TEST(EngineE2E, EncoderLayerMatchesReference) {
  auto engine = MakeEngine();
  models::EncoderConfig c;
  models::Model m = models::EncoderLayer(c);
  auto params = engine->CreateParams(models::ParamRefs(m));
  ASSERT_TRUE(params.ok()) << params.status();
  std::mt19937_64 rng(11);
  HostTensor x = models::RandomF32(rng, {1, c.seq, c.hidden}, 1.0);
  std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
  RunOptions ro;
  ro.report = true;
  auto r = engine->RunGraph(m.graph, inputs, params->get(), {}, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  const HostTensor want = models::EncoderLayerReference(m, c, x);
  EXPECT_LE(models::WorstError(r->outputs[0].second, want, 2e-4, 2e-4), 1.0);
  const auto& report = r->report;
  EXPECT_EQ(report.compile().executable_cache(), v1::CACHE_DISABLED);
  ASSERT_FALSE(report.compile().memory().empty());
  const auto& mem = report.compile().memory(0);
  EXPECT_GT(mem.arena_bytes(), 0);
  EXPECT_GE(mem.arena_bytes(), mem.lower_bound_bytes());
  EXPECT_LE(mem.arena_bytes(), mem.naive_bytes());
  for (const auto& s : report.steps()) {
    EXPECT_EQ(s.device(), "cpu:0");
    EXPECT_FALSE(s.implementation().empty()) << s.kernel();
    EXPECT_GE(s.duration_micros(), 0);
  }
}

TEST(EngineE2E, CommonIrDecompositionsMatchNative) {
  // prefer_common_ir decomposes attention, layer norm, softmax and gelu into
  // primitives; the result must equal the native kernels' result.
  auto engine = MakeEngine();
  models::EncoderConfig c;
  c.seq = 16;
  c.hidden = 64;
  c.heads = 4;
  c.ffn = 128;
  models::Model m = models::EncoderLayer(c);
  auto params = engine->CreateParams(models::ParamRefs(m));
  ASSERT_TRUE(params.ok());
  std::mt19937_64 rng(3);
  HostTensor x = models::RandomF32(rng, {2, c.seq, c.hidden}, 1.0);
  std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
  CompileOptions common;
  common.prefer_common_ir = true;
  RunOptions ro;
  ro.report = true;
  auto r = engine->RunGraph(m.graph, inputs, params->get(), common, ro);
  ASSERT_TRUE(r.ok()) << r.status();
  const HostTensor want = models::EncoderLayerReference(m, c, x);
  EXPECT_LE(models::WorstError(r->outputs[0].second, want, 1e-4, 1e-4), 1.0);
  bool saw_common = false;
  for (const auto& s : r->report.steps()) {
    saw_common = saw_common || s.path() == v1::PATH_COMMON_IR;
    EXPECT_NE(s.implementation().find("attention"), 0u);
  }
  EXPECT_TRUE(saw_common);
}

// GroupNorm runs as one native kernel on every device (cpu:group_norm_f32,
// spirv:group_norm_f32, nvrtc:group_norm_f32), and with prefer_common_ir as
// its decomposition (COMMON_IR: reshapes, reductions and elementwise ops, what
// autodiff differentiates). Both checked on every device against an f64
// loop, with and without the affine operands.
TEST(EngineE2E, GroupNormNativeAndDecomposedOnEveryDevice) {
  auto engine = MakeEngine();
  struct Shape {
    Dims dims;
    int64_t groups;
    int affine;  // 0 none, 1 scale, 2 scale and bias
  };
  const std::vector<Shape> shapes = {{{2, 8, 5, 3}, 4, 2}, {{3, 6}, 3, 0}, {{1, 4, 7}, 1, 1}, {{2, 6, 2, 2, 2}, 6, 2}};
  for (const backend::DeviceInfo* dev : engine->Devices()) {
    for (const bool decomposed : {false, true}) {
      for (const Shape& sh : shapes) {
        SCOPED_TRACE(absl::StrCat(dev->id, " ", DimsToString(sh.dims), " groups=", sh.groups,
                                  decomposed ? " decomposed" : " native"));
        const int64_t ch = sh.dims[1];
        std::string text = absl::StrCat("graph \"gn\"\ninput x: f32", DimsToString(sh.dims), "\n");
        if (sh.affine >= 1) absl::StrAppend(&text, "input g: f32[", ch, "]\n");
        if (sh.affine >= 2) absl::StrAppend(&text, "input b: f32[", ch, "]\n");
        absl::StrAppend(&text, "let y = group_norm(x", sh.affine >= 1 ? ", g" : "", sh.affine >= 2 ? ", b" : "",
                        ", groups=", sh.groups, ", epsilon=0.001)\nout y\n");
        auto graph = ir::ParseGraphProto(text);
        ASSERT_TRUE(graph.ok()) << graph.status() << "\n" << text;
        std::mt19937_64 rng(static_cast<uint64_t>(sh.dims.size() * 7 + sh.groups));
        HostTensor x = models::RandomF32(rng, sh.dims, 2.0);
        HostTensor g = models::RandomF32(rng, {ch}, 1.0), b = models::RandomF32(rng, {ch}, 1.0);
        std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
        if (sh.affine >= 1) inputs.push_back(TensorRef::Of("g", g));
        if (sh.affine >= 2) inputs.push_back(TensorRef::Of("b", b));
        CompileOptions co;
        co.device = dev->id;
        co.prefer_common_ir = decomposed;
        RunOptions ro;
        ro.report = true;
        auto r = engine->RunGraph(*graph, inputs, nullptr, co, ro);
        ASSERT_TRUE(r.ok()) << r.status();
        bool common = false, native = false;
        for (const auto& step : r->report.steps()) {
          common = common || step.path() == v1::PATH_COMMON_IR;
          native = native || (step.path() == v1::PATH_NATIVE &&
                              step.implementation().find("group_norm") != std::string::npos);
        }
        EXPECT_EQ(common, decomposed);
        EXPECT_EQ(native, !decomposed);
        const HostTensor& y = r->outputs[0].second;
        const int64_t n = sh.dims[0], per = x.num_elements() / n / sh.groups, spatial = per / (ch / sh.groups);
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t gr = 0; gr < sh.groups; ++gr) {
            const int64_t base = (i * sh.groups + gr) * per;
            long double mean = 0, var = 0;
            for (int64_t k = 0; k < per; ++k) mean += x.GetAsDouble(base + k);
            mean /= per;
            for (int64_t k = 0; k < per; ++k) var += (x.GetAsDouble(base + k) - mean) * (x.GetAsDouble(base + k) - mean);
            var /= per;
            for (int64_t k = 0; k < per; ++k) {
              const int64_t c = gr * (ch / sh.groups) + k / spatial;
              long double want = (x.GetAsDouble(base + k) - mean) / std::sqrt(var + 0.001L);
              if (sh.affine >= 1) want *= g.GetAsDouble(c);
              if (sh.affine >= 2) want += b.GetAsDouble(c);
              ASSERT_NEAR(y.GetAsDouble(base + k), static_cast<double>(want), 1e-4 * (1 + std::abs(static_cast<double>(want))))
                  << "element " << base + k;
            }
          }
        }
      }
    }
  }
}

// An input node of a hand-built proto graph.
v1::Node* ProtoInput(v1::Graph& g, int id, const std::string& name, DType dt, Dims dims) {
  v1::Node* n = g.add_nodes();
  n->set_id(id);
  n->set_name(name);
  n->set_op(v1::OP_INPUT);
  v1::TensorType* t = n->add_outputs();
  t->set_dtype(dt);
  for (int64_t d : dims) t->add_dims()->set_size(d);
  return n;
}

v1::Graph Body(const std::string& text) {
  auto g = ir::ParseGraphProto(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *g : v1::Graph();
}

// If and Scan lower by inlining (If: both branches and a Where; Scan with a
// known length: unrolled), so they compile and run on every device.
TEST(EngineE2E, IfAndScanLowerOnEveryDevice) {
  auto engine = MakeEngine();
  // If: y = p ? x * 2 : x + 1, and a second result from the branches.
  v1::Graph ifg;
  ifg.set_name("if");
  ProtoInput(ifg, 0, "p", v1::DTYPE_BOOL, {});
  ProtoInput(ifg, 1, "x", v1::DTYPE_F32, {4});
  v1::Node* n = ifg.add_nodes();
  n->set_id(2);
  n->set_name("branch");
  n->set_op(v1::OP_IF);
  for (int i : {0, 1}) n->add_operands()->set_node(i);
  *n->mutable_attrs()->mutable_if_()->mutable_then_branch() =
      Body("graph \"t\"\ninput x: f32[4]\nlet y = x * 2\nlet z = reduce_sum(x, axes=[0])\nout y\nout z\n");
  *n->mutable_attrs()->mutable_if_()->mutable_else_branch() =
      Body("graph \"e\"\ninput x: f32[4]\nlet y = x + 1\nlet z = reduce_max(x, axes=[0])\nout y\nout z\n");
  for (int k : {0, 1}) {
    v1::GraphOutput* o = ifg.add_outputs();
    o->set_name(k == 0 ? "y" : "z");
    o->mutable_value()->set_node(2);
    o->mutable_value()->set_output(k);
  }
  // Scan: running sum over xs [5, 3] with the carry, ys the partial sums
  // (reversed: from the last row).
  v1::Graph sg;
  sg.set_name("scan");
  ProtoInput(sg, 0, "c", v1::DTYPE_F32, {3});
  ProtoInput(sg, 1, "xs", v1::DTYPE_F32, {5, 3});
  v1::Node* s = sg.add_nodes();
  s->set_id(2);
  s->set_name("loop");
  s->set_op(v1::OP_SCAN);
  for (int i : {0, 1}) s->add_operands()->set_node(i);
  auto* sa = s->mutable_attrs()->mutable_scan();
  sa->set_num_carries(1);
  sa->set_length(5);
  sa->set_reverse(true);
  *sa->mutable_body() = Body("graph \"b\"\ninput c: f32[3]\ninput x: f32[3]\nlet n = c + x\nlet m = n * 1\nout n\nout m\n");
  for (int k : {0, 1}) {
    v1::GraphOutput* o = sg.add_outputs();
    o->set_name(k == 0 ? "total" : "partial");
    o->mutable_value()->set_node(2);
    o->mutable_value()->set_output(k);
  }
  for (const backend::DeviceInfo* dev : engine->Devices()) {
    SCOPED_TRACE(dev->id);
    CompileOptions co;
    co.device = dev->id;
    HostTensor x = HostTensor::FromVector<float>(v1::DTYPE_F32, {4}, {1, -2, 3, 0.5f});
    for (bool pred : {true, false}) {
      HostTensor p = HostTensor::FromVector<uint8_t>(v1::DTYPE_BOOL, {}, {static_cast<uint8_t>(pred)});
      std::vector<TensorRef> in = {TensorRef::Of("p", p), TensorRef::Of("x", x)};
      auto r = engine->RunGraph(ifg, in, nullptr, co, {});
      ASSERT_TRUE(r.ok()) << r.status();
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(r->outputs[0].second.GetAsDouble(i), pred ? 2 * x.GetAsDouble(i) : x.GetAsDouble(i) + 1);
      }
      EXPECT_EQ(r->outputs[1].second.GetAsDouble(0), pred ? 2.5 : 3.0);
    }
    HostTensor c = HostTensor::FromVector<float>(v1::DTYPE_F32, {3}, {10, 20, 30});
    HostTensor xs = *HostTensor::Create(v1::DTYPE_F32, {5, 3});
    for (int64_t i = 0; i < 15; ++i) xs.SetFromDouble(i, i);
    std::vector<TensorRef> in = {TensorRef::Of("c", c), TensorRef::Of("xs", xs)};
    auto r = engine->RunGraph(sg, in, nullptr, co, {});
    ASSERT_TRUE(r.ok()) << r.status();
    // Reverse: step t = 4, 3, ..., 0; partial[t] = c + sum of rows t..4.
    for (int j = 0; j < 3; ++j) {
      double acc = c.GetAsDouble(j);
      for (int t = 4; t >= 0; --t) {
        acc += xs.GetAsDouble(t * 3 + j);
        EXPECT_EQ(r->outputs[1].second.GetAsDouble(t * 3 + j), acc) << "t=" << t << " j=" << j;
      }
      EXPECT_EQ(r->outputs[0].second.GetAsDouble(j), acc);
    }
  }
  // A scan too long to unroll is refused with the limit, not unrolled.
  sa->set_length(100000);
  sg.mutable_nodes(1)->mutable_outputs(0)->mutable_dims(0)->set_size(100000);
  auto huge = engine->Compile(sg, {}, {});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(std::string(huge.status().message()).find("would inline more than 65536 nodes"), std::string::npos)
      << huge.status();
  // Nested scans each within the per-lowering bound still cannot multiply the
  // graph past the total bound.
  v1::Graph inner = sg;  // c [3], xs [2000, 3]
  inner.mutable_nodes(2)->mutable_attrs()->mutable_scan()->set_length(2000);
  inner.mutable_nodes(1)->mutable_outputs(0)->mutable_dims(0)->set_size(2000);
  inner.mutable_nodes(2)->mutable_attrs()->mutable_scan()->set_reverse(false);
  v1::Graph outer = sg;  // its body runs the inner scan on (c, a constant-free xs input)
  v1::Graph& body = *outer.mutable_nodes(2)->mutable_attrs()->mutable_scan()->mutable_body();
  body = inner;
  body.mutable_nodes(1)->mutable_outputs(0)->clear_dims();
  for (int64_t d : {2000, 3}) body.mutable_nodes(1)->mutable_outputs(0)->add_dims()->set_size(d);
  outer.mutable_nodes(2)->mutable_attrs()->mutable_scan()->set_length(200);
  outer.mutable_nodes(1)->mutable_outputs(0)->clear_dims();
  for (int64_t d : {200, 2000, 3}) outer.mutable_nodes(1)->mutable_outputs(0)->add_dims()->set_size(d);
  auto nested = engine->Compile(outer, {}, {});
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.status().code(), absl::StatusCode::kResourceExhausted) << nested.status();
  EXPECT_NE(std::string(nested.status().message()).find("past 262144 nodes"), std::string::npos) << nested.status();
}

TEST(EngineE2E, ExamplesCompileAndRun) {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::filesystem::path dir = std::filesystem::path(src) / "examples";
  auto engine = MakeEngine();
  int ran = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".kiln") continue;
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    auto graph = ir::ParseGraphProto(text.str());
    ASSERT_TRUE(graph.ok()) << graph.status();
    auto sig = engine->Inspect(*graph);
    ASSERT_TRUE(sig.ok()) << sig.status();
    std::mt19937_64 rng(5);
    std::vector<HostTensor> owned;
    std::vector<TensorRef> inputs, param_refs;
    auto make = [&](const GraphSignature::Entry& e) {
      Dims dims;
      for (const auto& d : e.type.dims()) dims.push_back(d.has_size() ? d.size() : 2);
      HostTensor t = std::move(HostTensor::Create(e.type.dtype(), dims)).value();
      std::uniform_real_distribution<double> u(-1, 1);
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        t.SetFromDouble(i, IsFloat(t.dtype()) ? u(rng) : 0.0);
      }
      owned.push_back(std::move(t));
      return TensorRef::Of(e.name, owned.back());
    };
    owned.reserve(sig->inputs.size() + sig->params.size());
    for (const auto& e : sig->inputs) inputs.push_back(make(e));
    for (const auto& e : sig->params) param_refs.push_back(make(e));
    auto params = engine->CreateParams(param_refs);
    ASSERT_TRUE(params.ok()) << params.status();
    auto r = engine->RunGraph(*graph, inputs, params->get(), {}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outputs.size(), sig->outputs.size());
    ++ran;
  }
  EXPECT_GE(ran, 2);
}

}  // namespace
}  // namespace kiln
