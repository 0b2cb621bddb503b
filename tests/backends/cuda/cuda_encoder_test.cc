// The BERT-base encoder layer (fp32) through the engine on cuda:0, in this
// process and in a device worker (skips without a CUDA device): its attention
// runs the tiled f32 kernel and the output matches an f64 reference of the
// layer, run after run. In a worker, the input and output go through the
// registered (pinned) staging region by DMA, the same blocks each run.
// With CompileOptions.allow_tf32 every f32 GEMM runs on cuBLASLt's TF32
// compute type, the report names it, and the layer stays within TF32's bound.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

TEST(CudaEncoder, LayerMatchesAReferenceInBothIsolations) {
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
    models::EncoderConfig c;
    c.seq = 40;  // ragged query tiles (32) and key tiles (64)
    models::Model m = models::EncoderLayer(c);
    auto params = (*engine)->CreateParams(models::ParamRefs(m));
    ASSERT_TRUE(params.ok()) << params.status();
    std::mt19937_64 rng(21);
    const HostTensor x = models::RandomF32(rng, {3, c.seq, c.hidden}, 1.0);
    const HostTensor want = models::EncoderLayerReference(m, c, x);
    CompileOptions co;
    co.device = "cuda:0";
    RunOptions ro;
    ro.report = true;
    for (int run = 0; run < 3; ++run) {  // the same staging blocks are reused
      const std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
      auto r = (*engine)->RunGraph(m.graph, inputs, params->get(), co, ro);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_LE(models::WorstError(r->outputs[0].second, want, 2e-4, 2e-4), 1.0);
      int attention = 0;
      for (const auto& s : r->report.steps()) {
        if (s.implementation().find("flash_attn_simt_f32") != std::string::npos) ++attention;
      }
      EXPECT_EQ(attention, 1);
    }
  }
}

// CompileOptions.allow_tf32, end to end: off (the default) every GEMM of the
// fp32 layer is cuBLASLt's f32 compute type ("cublasLt:gemm_f32...") and the
// layer matches the f64 reference at f32's tolerance; on, the same graph is
// another executable whose GEMMs are all "cublasLt:gemm_tf32..." (the compute
// type the report names) and the layer matches the reference within what TF32
// operands (10-bit mantissas) allow: 5e-3 absolute + relative on a layer whose
// outputs are layer-normed to ~1, where f32 needs 2e-4 (an H100 measured 3.8e-4
// and 9.5e-7 at most).
TEST(CudaEncoder, Tf32OnlyWhenTheCompileOptionsAllowIt) {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  o.device_isolation = EngineOptions::DeviceIsolation::kThread;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  bool cuda = false;
  for (const auto* d : (*engine)->Devices()) cuda |= d->id == "cuda:0";
  if (!cuda) GTEST_SKIP() << "no CUDA device";
  models::EncoderConfig c;
  c.seq = 64;
  models::Model m = models::EncoderLayer(c);
  auto params = (*engine)->CreateParams(models::ParamRefs(m));
  ASSERT_TRUE(params.ok()) << params.status();
  std::mt19937_64 rng(22);
  const HostTensor x = models::RandomF32(rng, {2, c.seq, c.hidden}, 1.0);
  const HostTensor want = models::EncoderLayerReference(m, c, x);
  double worst[2] = {0, 0};
  for (bool tf32 : {false, true}) {
    SCOPED_TRACE(tf32 ? "allow_tf32" : "f32");
    CompileOptions co;
    co.device = "cuda:0";
    co.allow_tf32 = tf32;
    RunOptions ro;
    ro.report = true;
    const std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
    auto r = (*engine)->RunGraph(m.graph, inputs, params->get(), co, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string want_prefix = tf32 ? "cublasLt:gemm_tf32" : "cublasLt:gemm_f32";
    int gemms = 0;
    for (const auto& s : r->report.steps()) {
      if (s.implementation().rfind("cublasLt:", 0) != 0) continue;
      ++gemms;
      EXPECT_EQ(s.implementation().rfind(want_prefix, 0), 0u) << s.implementation();
    }
    EXPECT_GE(gemms, 4);  // Q, K, V (or one QKV), the output projection, the FFN's two
    const double tol = tf32 ? 5e-3 : 2e-4;
    EXPECT_LE(models::WorstError(r->outputs[0].second, want, tol, tol), 1.0);
    worst[tf32] = models::WorstError(r->outputs[0].second, want, 1, 0);
  }
  std::printf("encoder fp32 on cuda:0, max abs error vs f64: f32 %.3g, tf32 %.3g\n", worst[0],
              worst[1]);
}

}  // namespace
}  // namespace kiln
