// A training step on cuda:0 as one CUDA graph (engine/runtime/program.cc):
// an embedding gather and a softmax cross-entropy loss used to keep every
// training step off graphs (their per-launch error slot and temporaries);
// now the step's second run captures and later runs replay, with the same
// losses as the step run kernel by kernel, in this process and in a device
// worker. A bad token id in a replayed step fails that step with the
// gather's OUT_OF_RANGE, and the next good step runs. Skips without a CUDA
// device.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
namespace {

// A small causal LM: token embedding, layer norm, one attention block with
// biases, a head, the mean next-token cross-entropy.
constexpr char kTinyLm[] = R"(graph "tiny_lm"
input x: i64[4, 8]
input y: i64[4, 8]
param wte: f32[16, 8]
param ln_g: f32[8]
param ln_b: f32[8]
param wq: f32[8, 8]
param bq: f32[8]
param wk: f32[8, 8]
param wv: f32[8, 8]
param w_head: f32[8, 16]
let h = gather(wte, x, axis=0)
let a = layer_norm(h, ln_g, ln_b, epsilon=1e-05)
let q = transpose(reshape(a @ wq + bq, shape=[4, 8, 2, 4]), perm=[0, 2, 1, 3])
let k = transpose(reshape(a @ wk, shape=[4, 8, 2, 4]), perm=[0, 2, 1, 3])
let v = transpose(reshape(a @ wv, shape=[4, 8, 2, 4]), perm=[0, 2, 1, 3])
let ctx = attention(q, k, v, heads=2, kv_heads=2, mask=causal)
let z = h + reshape(transpose(ctx, perm=[0, 2, 1, 3]), shape=[4, 8, 8])
let logits = z @ w_head
let loss = softmax_cross_entropy(reshape(logits, shape=[-1, 16]), reshape(y, shape=[-1]))
out loss
)";

HostTensor Tokens(std::mt19937_64& rng) {
  std::vector<int64_t> v(32);
  for (int64_t& t : v) t = static_cast<int64_t>(rng() % 16);
  return HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {4, 8}, v);
}

TEST(CudaTrainStepGraphs, StepsReplayOneGraphWithTheUnrolledLosses) {
  for (auto iso : {EngineOptions::DeviceIsolation::kThread, EngineOptions::DeviceIsolation::kProcess}) {
    SCOPED_TRACE(iso == EngineOptions::DeviceIsolation::kThread ? "thread isolation"
                                                                : "process isolation");
    EngineOptions o;
    o.calibration = EngineOptions::Calibration::kNever;
    o.device_isolation = iso;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    bool cuda = false;
    for (const auto* d : (*engine)->Devices()) cuda |= d->id == "cuda:0";
    if (!cuda) GTEST_SKIP() << "no CUDA device";
    auto g = ir::ParseGraphProto(kTinyLm);
    ASSERT_TRUE(g.ok()) << g.status();
    CompileOptions off, on;
    off.device = on.device = "cuda:0";
    for (CompileOptions* co : {&off, &on}) {
      co->transforms.mutable_training()->set_loss("loss");
      co->transforms.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAMW);
      co->transforms.mutable_training()->mutable_optimizer()->set_lr(1e-2);
    }
    off.cuda_graphs = v1::CUDA_GRAPHS_OFF;
    on.cuda_graphs = v1::CUDA_GRAPHS_AUTO;  // what kiln_train_bench and kilnd use
    auto unrolled = (*engine)->Compile(*g, off, {});
    auto graphed = (*engine)->Compile(*g, on, {});
    ASSERT_TRUE(unrolled.ok()) << unrolled.status();
    ASSERT_TRUE(graphed.ok()) << graphed.status();

    // The same initial params for both.
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    std::vector<std::pair<std::string, HostTensor>> values;
    for (const auto& p : unrolled->executable->signature().params) {
      if (p.name.rfind("opt/", 0) == 0) continue;
      Dims dims;
      for (const auto& d : p.type.dims()) dims.push_back(d.size());
      HostTensor t = HostTensor::Create(v1::DTYPE_F32, dims).value();
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        t.data_as<float>()[i] = p.name == "ln_g" ? 1.0f : normal(rng);
      }
      values.emplace_back(p.name, std::move(t));
    }
    std::vector<TensorRef> refs;
    for (const auto& [name, t] : values) refs.push_back(TensorRef::Of(name, t));
    auto off_params = (*engine)->CreateTrainingParams(*unrolled->executable, refs);
    auto on_params = (*engine)->CreateTrainingParams(*graphed->executable, refs);
    ASSERT_TRUE(off_params.ok()) << off_params.status();
    ASSERT_TRUE(on_params.ok()) << on_params.status();

    std::mt19937_64 data(5);
    const char* states[] = {"", "captured", "replayed", "replayed", "replayed", "replayed"};
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(step);
      HostTensor x = Tokens(data), y = Tokens(data);
      const std::vector<TensorRef> inputs = {TensorRef::Of("x", x), TensorRef::Of("y", y)};
      RunOptions ro;
      ro.report = true;
      auto want = (*engine)->Run(*unrolled->executable, inputs, off_params->get(), ro);
      auto got = (*engine)->Run(*graphed->executable, inputs, on_params->get(), ro);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(want->report.cuda_graph(), "");
      EXPECT_EQ(got->report.cuda_graph(), states[step]);
      const double a = got->outputs[0].second.GetAsDouble(0);
      const double b = want->outputs[0].second.GetAsDouble(0);
      EXPECT_NEAR(a, b, 1e-5 * std::fabs(b)) << "loss";
    }

    // A token id out of range in a replayed step: the gather's error slot,
    // decoded after the replay, fails the step; the next good step replays.
    HostTensor bad = Tokens(data), y = Tokens(data);
    bad.data_as<int64_t>()[13] = 99;
    const std::vector<TensorRef> bad_in = {TensorRef::Of("x", bad), TensorRef::Of("y", y)};
    auto failed = (*engine)->Run(*graphed->executable, bad_in, on_params->get(), {});
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kOutOfRange) << failed.status();
    EXPECT_TRUE(absl::StrContains(failed.status().message(), "gather index 99")) << failed.status();
    HostTensor good = Tokens(data);
    RunOptions ro;
    ro.report = true;
    const std::vector<TensorRef> good_in = {TensorRef::Of("x", good), TensorRef::Of("y", y)};
    auto next = (*engine)->Run(*graphed->executable, good_in, on_params->get(), ro);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->report.cuda_graph(), "replayed");
    EXPECT_TRUE(std::isfinite(next->outputs[0].second.GetAsDouble(0)));
  }
}

}  // namespace
}  // namespace kiln
