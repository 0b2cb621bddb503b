// kiln_train_bench: the training step in process (Engine::Run of a training
// executable over a training param set, no gRPC): MLP 784-512-512-10, relu,
// softmax cross-entropy, batch 128, AdamW, f32 on the CPU. Prints one JSON
// object with the median step time. bench/train_mlp_vs_torch.py runs it
// between its kilnd and PyTorch rounds (--inproc).
//   kiln_train_bench [--steps 40] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "engine/engine.h"
#include "engine/ir/text.h"

namespace kiln {
namespace {

constexpr char kGraph[] = R"(graph "bench_mlp"
input x: f32[128, 784]
input y: i64[128]
param w1: f32[784, 512]
param b1: f32[512]
param w2: f32[512, 512]
param b2: f32[512]
param w3: f32[512, 10]
param b3: f32[10]
let h1 = relu(x @ w1 + b1)
let h2 = relu(h1 @ w2 + b2)
let logits = h2 @ w3 + b3
let loss = softmax_cross_entropy(logits, y)
out loss
)";

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kiln_train_bench: %s\n", s.ToString().c_str());
  return 1;
}

int Main(int argc, char** argv) {
  int steps = 40, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--threads") threads = std::max(1, std::atoi(argv[i + 1]));
  }
  EngineOptions eo;
  eo.cpu_threads = threads;
  eo.calibration = EngineOptions::Calibration::kNever;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) return Fail(engine.status());
  auto graph = ir::ParseGraphProto(kGraph);
  if (!graph.ok()) return Fail(graph.status());
  CompileOptions co;
  co.device = "cpu:0";
  co.transforms.mutable_training()->set_loss("loss");
  co.transforms.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAMW);
  co.transforms.mutable_training()->mutable_optimizer()->set_lr(1e-3);
  auto exe = (*engine)->Compile(*graph, co, {});
  if (!exe.ok()) return Fail(exe.status());
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-0.04f, 0.04f);
  std::normal_distribution<float> normal;
  const std::vector<std::pair<std::string, Dims>> shapes = {{"w1", {784, 512}}, {"b1", {512}},
                                                            {"w2", {512, 512}}, {"b2", {512}},
                                                            {"w3", {512, 10}},  {"b3", {10}}};
  std::vector<HostTensor> values;
  std::vector<TensorRef> refs;
  for (const auto& [name, dims] : shapes) {
    HostTensor t = HostTensor::Create(v1::DTYPE_F32, dims).value();
    for (int64_t i = 0; i < t.num_elements(); ++i) t.data_as<float>()[i] = u(rng);
    values.push_back(std::move(t));
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    refs.push_back(TensorRef::Of(shapes[i].first, values[i]));
  auto set = (*engine)->CreateTrainingParams(*exe->executable, refs);
  if (!set.ok()) return Fail(set.status());
  HostTensor x = HostTensor::Create(v1::DTYPE_F32, {128, 784}).value();
  HostTensor y = HostTensor::Create(v1::DTYPE_I64, {128}).value();
  for (int64_t i = 0; i < x.num_elements(); ++i) x.data_as<float>()[i] = normal(rng);
  for (int64_t i = 0; i < 128; ++i) y.data_as<int64_t>()[i] = static_cast<int64_t>(rng() % 10);
  const std::vector<TensorRef> inputs = {TensorRef::Of("x", x), TensorRef::Of("y", y)};
  std::vector<double> ms;
  for (int i = 0; i < steps + 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*engine)->Run(*exe->executable, inputs, set->get(), {});
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) return Fail(r.status());
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "{\"bench\": \"train_step_inproc\", \"threads\": %d, \"steps\": %d, \"median_ms\": %.4f}\n",
      threads, steps, ms[ms.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
