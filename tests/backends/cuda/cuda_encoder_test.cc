// The BERT-base encoder layer (fp32) through the engine on cuda:0, in this
// process and in a device worker (skips without a CUDA device): its attention
// runs the tiled f32 kernel and the output matches an f64 reference of the
// layer, run after run. In a worker, the input and output go through the
// registered (pinned) staging region by DMA, the same blocks each run.
#include <gtest/gtest.h>

#include <random>
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

}  // namespace
}  // namespace kiln
