// kiln_onnx_bench: an ONNX model imported (engine/io/onnx), compiled once and
// run in-process on the CPU; prints per-run latency as JSON. The ONNX Runtime
// side of the comparison is bench/ort/ort_run.js on the same file
// (bench/onnx_cnn_vs_ort.py runs both, alternating).
//   kiln_onnx_bench model.onnx input.pb [--iters N] [--warmup W] [--threads T] [--out y.bin]
//                   [--report] [--no-patterns]
// --no-patterns: import without onnx_patterns.cc (every ONNX node alone).
// input.pb: an onnx.TensorProto for the model's one input.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "base/openmp_policy.h"
#include "engine/engine.h"
#include "engine/io/onnx/onnx_import.h"
#include "nlohmann/json.hpp"

namespace {

std::string ReadFile(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kiln_onnx_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::UseBoundedOpenMpSpin(argv);  // as kilnd does (base/openmp_policy.h)
  if (argc < 3) {
    std::fprintf(stderr, "usage: kiln_onnx_bench model.onnx input.pb [--iters N] [--warmup W] "
                         "[--threads T] [--out y.bin]\n");
    return 2;
  }
  int iters = 50, warmup = 10, threads = 2;
  std::string out;
  bool report = false;
  bool patterns = true;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--report")) report = true;
    if (!std::strcmp(argv[i], "--no-patterns")) patterns = false;
  }
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--warmup")) warmup = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--out")) out = argv[i + 1];
  }
  std::string input_name;
  auto x = kiln::io::ParseOnnxTensor(ReadFile(argv[2]), &input_name);
  if (!x.ok()) return Fail(x.status());
  kiln::io::OnnxImportOptions io;
  io.input_shapes.emplace_back(input_name, x->dims());
  io.patterns = patterns;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = kiln::io::ImportOnnxModel(ReadFile(argv[1]), io);
  if (!model.ok()) return Fail(model.status());
  const double import_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  kiln::EngineOptions o;
  o.cpu_threads = threads;
  o.calibration = kiln::EngineOptions::Calibration::kNever;
  o.disabled_backends = {"vulkan", "cuda"};
  auto engine = kiln::Engine::Create(o);
  if (!engine.ok()) return Fail(engine.status());
  auto compiled = (*engine)->Compile(model->graph, {}, {});
  if (!compiled.ok()) return Fail(compiled.status());
  std::vector<kiln::TensorRef> inputs = {kiln::TensorRef::Of(input_name, *x)};
  std::vector<double> ms;
  absl::StatusOr<kiln::RunResult> last;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto s = std::chrono::steady_clock::now();
    last = (*engine)->Run(*compiled->executable, inputs, nullptr, {});
    const auto e = std::chrono::steady_clock::now();
    if (!last.ok()) return Fail(last.status());
    if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(e - s).count());
  }
  if (report) {
    // One more run with the dispatch report: where the time goes, per kernel.
    kiln::RunOptions ro;
    ro.report = true;
    auto r = (*engine)->Run(*compiled->executable, inputs, nullptr, ro);
    if (!r.ok()) return Fail(r.status());
    for (const auto& st : r->report.steps()) {
      std::fprintf(stderr, "%9.1f us  %-28s %s\n", st.duration_micros(), st.kernel().c_str(),
                   st.implementation().c_str());
    }
  }
  if (!out.empty()) {
    const auto& y = last->outputs[0].second;
    std::ofstream(out, std::ios::binary).write(static_cast<const char*>(y.data()), y.num_bytes());
  }
  std::sort(ms.begin(), ms.end());
  const auto pct = [&](double p) { return ms[std::min(ms.size() - 1, size_t(p * (ms.size() - 1) + 0.5))]; };
  std::printf("%s\n", nlohmann::json{{"impl", "kiln"}, {"threads", threads}, {"iters", iters},
                                     {"import_ms", import_ms}, {"p50_ms", pct(0.5)},
                                     {"p90_ms", pct(0.9)}, {"min_ms", ms.front()}}
                          .dump()
                          .c_str());
  return 0;
}
