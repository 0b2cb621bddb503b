// kiln_train_bench: the training step in process (Engine::Run of a training
// executable over a training param set, no gRPC), AdamW (lr 1e-3, weight decay
// 0.01), f32. Prints one JSON object with the median step time.
//   --model mlp: MLP 784-512-512-10, relu, softmax cross-entropy, batch 128;
//   --model cnn: examples/fashion_cnn.kiln's model (conv3x3 1->16, relu, max
//     pool, conv3x3 16->32, relu, max pool, linear 1568->10), batch 128;
//   --model gpt: examples/char_gpt/char_gpt.kiln (--graph), batch --batch.
// bench/train_mlp_vs_torch.py runs it between its kilnd and PyTorch rounds
// (--inproc); bench/gpu/train_gpt.sh runs the gpt model on cuda:0 with
// --export DIR, which writes the initial params, the batch and Kiln's losses
// (DIR/manifest.json, DIR/<name>.npy) for bench/gpu/torch_train_gpt.py.
// --report prints each kernel's median time over the steps (the dispatch
// report) to stderr, slowest first. --cuda_graphs auto|on|off is
// CompileOptions.cuda_graphs (auto: kilnd's default); the JSON's
// graph_replays counts the steps that replayed one captured CUDA graph.
//   kiln_train_bench [--model mlp] [--steps 40] [--threads 2] [--device cpu:0]
//                    [--graph FILE] [--batch N] [--export DIR] [--report]
//                    [--cuda_graphs auto]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/openmp_policy.h"
#include "engine/engine.h"
#include "engine/io/npy.h"
#include "engine/ir/text.h"
#include "engine/runtime/program.h"

namespace kiln {
namespace {

constexpr char kMlp[] = R"(graph "bench_mlp"
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

// examples/fashion_cnn.kiln without the standardization and the evaluation
// outputs (the step benchmark feeds standardized images).
constexpr char kCnn[] = R"(graph "bench_cnn"
input x: f32[128, 784]
input y: i64[128]
param c1_w: f32[16, 1, 3, 3]
param c1_b: f32[16]
param c2_w: f32[32, 16, 3, 3]
param c2_b: f32[32]
param fc_w: f32[1568, 10]
param fc_b: f32[10]
let img = reshape(x, shape=[-1, 1, 28, 28])
let h1 = max_pool(relu(conv(img, c1_w, c1_b, pad_low=[1, 1], pad_high=[1, 1])), window=[2, 2])
let h2 = max_pool(relu(conv(h1, c2_w, c2_b, pad_low=[1, 1], pad_high=[1, 1])), window=[2, 2])
let logits = reshape(h2, shape=[-1, 1568]) @ fc_w + fc_b
let loss = softmax_cross_entropy(logits, y)
out loss
)";

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kiln_train_bench: %s\n", s.ToString().c_str());
  return 1;
}

Dims DimsOf(const v1::TensorType& t) {
  Dims d;
  for (const auto& dim : t.dims()) d.push_back(dim.size());
  return d;
}

// The model's initial value of a param: the GPT's as char_gpt.py's
// init_params (layer-norm gains 1, vectors 0, matrices N(0, 0.02)); the MLP's
// and CNN's uniform in +-0.04.
HostTensor InitParam(const std::string& model, const std::string& name, const Dims& dims,
                     std::mt19937& rng) {
  HostTensor t = HostTensor::Create(v1::DTYPE_F32, dims).value();
  float* v = t.data_as<float>();
  if (model != "gpt") {
    std::uniform_real_distribution<float> u(-0.04f, 0.04f);
    for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = u(rng);
    return t;
  }
  if (absl::EndsWith(name, "_g")) {
    std::fill(v, v + t.num_elements(), 1.0f);
  } else if (dims.size() >= 2) {
    std::normal_distribution<float> n(0.0f, 0.02f);
    for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = n(rng);
  }
  return t;
}

int Main(int argc, char** argv) {
  int steps = 40, threads = 2;
  int64_t batch = 32;
  bool report = false;
  v1::CudaGraphs cuda_graphs = v1::CUDA_GRAPHS_AUTO;
  std::string model = "mlp", device = "cpu:0", graph_path = "examples/char_gpt/char_gpt.kiln",
              export_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--report") {
      report = true;
      continue;
    }
    if (i + 1 >= argc) break;
    const std::string value = argv[++i];
    if (flag == "--steps") steps = std::max(1, std::atoi(value.c_str()));
    if (flag == "--threads") threads = std::max(1, std::atoi(value.c_str()));
    if (flag == "--batch") batch = std::max(1, std::atoi(value.c_str()));
    if (flag == "--model") model = value;
    if (flag == "--device") device = value;
    if (flag == "--graph") graph_path = value;
    if (flag == "--export") export_dir = value;
    if (flag == "--cuda_graphs") {
      if (value != "auto" && value != "on" && value != "off") {
        return Fail(absl::InvalidArgumentError("--cuda_graphs is auto, on or off"));
      }
      cuda_graphs = value == "on"    ? v1::CUDA_GRAPHS_ON
                    : value == "off" ? v1::CUDA_GRAPHS_OFF
                                     : v1::CUDA_GRAPHS_AUTO;
    }
  }
  std::string text;
  if (model == "mlp") {
    text = kMlp;
  } else if (model == "cnn") {
    text = kCnn;
  } else if (model == "gpt") {
    std::ifstream in(graph_path);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read --graph ", graph_path)));
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  } else {
    return Fail(absl::InvalidArgumentError("--model is mlp, cnn or gpt"));
  }
  EngineOptions eo;
  eo.cpu_threads = threads;
  eo.calibration = EngineOptions::Calibration::kNever;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) return Fail(engine.status());
  auto graph = ir::ParseGraphProto(text);
  if (!graph.ok()) return Fail(graph.status());
  CompileOptions co;
  co.device = device;
  co.cuda_graphs = cuda_graphs;
  co.transforms.mutable_training()->set_loss("loss");
  co.transforms.mutable_training()->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAMW);
  co.transforms.mutable_training()->mutable_optimizer()->set_lr(1e-3);
  std::vector<std::pair<std::string, Dims>> shapes;
  if (model == "gpt") shapes = {{"x", {batch, 64}}, {"y", {batch, 64}}};
  auto exe = (*engine)->Compile(*graph, co, shapes);
  if (!exe.ok()) return Fail(exe.status());
  const GraphSignature& sig = exe->executable->signature();

  std::mt19937 rng(0);
  std::vector<std::pair<std::string, HostTensor>> values;
  for (const auto& p : sig.params) {
    if (absl::StartsWith(p.name, "opt/")) continue;
    values.emplace_back(p.name, InitParam(model, p.name, DimsOf(p.type), rng));
  }
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : values) refs.push_back(TensorRef::Of(name, t));
  auto set = (*engine)->CreateTrainingParams(*exe->executable, refs);
  if (!set.ok()) return Fail(set.status());

  std::vector<std::pair<std::string, HostTensor>> batch_values;
  for (const auto& in : sig.inputs) {
    const Dims dims = DimsOf(in.type);
    HostTensor t = HostTensor::Create(in.type.dtype(), dims).value();
    if (in.type.dtype() == v1::DTYPE_F32) {
      std::normal_distribution<float> normal;
      for (int64_t i = 0; i < t.num_elements(); ++i) t.data_as<float>()[i] = normal(rng);
    } else {
      const uint32_t classes = model == "gpt" ? 96 : 10;
      for (int64_t i = 0; i < t.num_elements(); ++i) t.data_as<int64_t>()[i] = rng() % classes;
    }
    batch_values.emplace_back(in.name, std::move(t));
  }
  std::vector<TensorRef> inputs;
  for (const auto& [name, t] : batch_values) inputs.push_back(TensorRef::Of(name, t));
  if (!export_dir.empty()) {
    std::filesystem::create_directories(export_dir);
    for (const auto* group : {&values, &batch_values}) {
      for (const auto& [name, t] : *group) {
        if (auto s = WriteNpy(export_dir + "/" + name + ".npy", t); !s.ok()) return Fail(s);
      }
    }
  }

  RunOptions ro;
  ro.report = report;
  std::vector<double> ms, losses;
  std::map<std::string, std::vector<double>> kernel_micros;
  for (int i = 0; i < steps + 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*engine)->Run(*exe->executable, inputs, set->get(), ro);
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) return Fail(r.status());
    for (const auto& [name, t] : r->outputs) {
      if (name == "loss") losses.push_back(t.GetAsDouble(0));
    }
    if (i < 3) continue;
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    for (const auto& s : r->report.steps()) {
      kernel_micros[absl::StrCat(s.kernel(), " ", s.implementation())].push_back(
          s.duration_micros());
    }
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (report) {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& [name, v] : kernel_micros) {
      std::sort(v.begin(), v.end());
      rows.emplace_back(v[v.size() / 2] * static_cast<double>(v.size()) / steps, name);
      total += rows.back().first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "kernels (median us per step; sum %.0f us, step %.0f us):\n", total,
                 median * 1e3);
    for (const auto& [us, name] : rows) std::fprintf(stderr, "%9.1f  %s\n", us, name.c_str());
  }
  std::string loss_list;
  for (size_t i = 0; i < losses.size(); ++i) {
    absl::StrAppend(&loss_list, i ? ", " : "", absl::StrFormat("%.9g", losses[i]));
  }
  // CUDA graphs: how many steps replayed one captured graph (-1: not a Program).
  int64_t graph_replays = -1;
  if (const auto* program = dynamic_cast<const runtime::Program*>(exe->executable.get())) {
    graph_replays = program->context_stats().graph_replays;
  }
  const std::string json = absl::StrFormat(
      "{\"bench\": \"train_step_inproc\", \"model\": \"%s\", \"device\": \"%s\", \"threads\": "
      "%d, \"batch\": %d, \"steps\": %d, \"median_ms\": %.4f, \"graph_replays\": %d, "
      "\"losses\": [%s]}",
      model, device, threads,
      static_cast<int>(sig.inputs.empty() ? 0 : DimsOf(sig.inputs[0].type)[0]), steps, median,
      static_cast<int>(graph_replays), loss_list);
  std::printf("%s\n", json.c_str());
  if (!export_dir.empty()) std::ofstream(export_dir + "/kiln.json") << json << "\n";
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  kiln::UseBoundedOpenMpSpin(argv);  // as kilnd does (base/openmp_policy.h)
  return kiln::Main(argc, argv);
}
