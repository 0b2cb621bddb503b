// End to end in-process: graphs compiled through the whole pipeline and run on
// the CPU equal their f64 references.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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
