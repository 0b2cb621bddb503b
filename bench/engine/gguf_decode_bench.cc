// kiln_gguf_decode_bench: greedy decode of the GGUF llama decoder in process
// (Engine::Run, no gRPC): the model directory that examples/gguf_decoder
// writes (model.pb, model.gguf read by engine/io's GGUF reader, the cache
// zero), compiled with the same state binding kilnd's session uses
// (cache_out -> cache), a prefill run over the prompt, then decode runs of one
// token. Prints one JSON object: the tokens, the prefill time and the median
// decode step. bench/gguf_decode.py runs it between its kilnd and PyTorch rounds.
// --int8-activations 1 compiles with CompileOptions.allow_int8_activations
// (DequantMatMul rounds its activations to int8 per 32 values).
//   kiln_gguf_decode_bench --model DIR [--prompt 1,5,9] [--tokens 64] [--threads 2]
//                          [--int8-activations 0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/openmp_policy.h"
#include "engine/engine.h"
#include "engine/io/gguf.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kiln_gguf_decode_bench: %s\n", s.ToString().c_str());
  return 1;
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int Main(int argc, char** argv) {
  std::string dir;
  std::vector<int32_t> prompt = {1, 5, 9, 33, 200, 7, 300, 12};
  int tokens = 64, threads = 2;
  bool int8_activations = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") dir = value;
    if (flag == "--tokens") tokens = std::max(1, std::atoi(value.c_str()));
    if (flag == "--threads") threads = std::max(1, std::atoi(value.c_str()));
    if (flag == "--int8-activations") int8_activations = std::atoi(value.c_str()) != 0;
    if (flag == "--prompt") {
      prompt.clear();
      for (absl::string_view t : absl::StrSplit(value, ',')) {
        int32_t v = 0;
        if (!absl::SimpleAtoi(t, &v)) return Fail(absl::InvalidArgumentError("bad --prompt"));
        prompt.push_back(v);
      }
    }
  }
  if (dir.empty() || prompt.empty()) {
    return Fail(absl::InvalidArgumentError("usage: --model DIR [--prompt 1,5,9] [--tokens N]"));
  }
  std::ifstream in(dir + "/model.pb", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  v1::Graph graph;
  if (!in || !graph.ParseFromString(bytes.str())) {
    return Fail(absl::InvalidArgumentError(dir + "/model.pb is not a kiln.v1.Graph"));
  }
  absl::StatusOr<io::GgufFile> gguf = io::GgufFile::Open(dir + "/model.gguf");
  if (!gguf.ok()) return Fail(gguf.status());

  EngineOptions eo;
  eo.cpu_threads = threads;
  eo.calibration = EngineOptions::Calibration::kNever;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) return Fail(engine.status());
  absl::StatusOr<GraphSignature> sig = (*engine)->Inspect(graph);
  if (!sig.ok()) return Fail(sig.status());

  CompileOptions co;
  co.device = "cpu:0";
  co.state_updates = {{"cache_out", "cache"}};
  co.allow_int8_activations = int8_activations;
  const int64_t p = static_cast<int64_t>(prompt.size());
  auto prefill = (*engine)->Compile(graph, co, {{"tokens", {1, p}}, {"positions", {p}}});
  if (!prefill.ok()) return Fail(prefill.status());
  auto decode = (*engine)->Compile(graph, co, {{"tokens", {1, 1}}, {"positions", {1}}});
  if (!decode.ok()) return Fail(decode.status());

  // Every param from the GGUF file (read in place from its mapping), the cache zero.
  std::vector<TensorRef> refs;
  HostTensor cache;
  for (const GraphSignature::Entry& e : sig->params) {
    if (e.name == "cache") {
      Dims dims;
      for (const v1::Dim& d : e.type.dims()) dims.push_back(d.size());
      auto z = HostTensor::Create(e.type.dtype(), dims);
      if (!z.ok()) return Fail(z.status());
      cache = *std::move(z);
      refs.push_back(TensorRef::Of("cache", cache));
      continue;
    }
    const io::GgufTensorInfo* t = gguf->Find(e.name);
    if (t == nullptr) return Fail(absl::NotFoundError("no tensor " + e.name + " in model.gguf"));
    const std::string_view b = gguf->Bytes(*t);
    refs.push_back({e.name, t->dtype, t->dims, b.data(), static_cast<int64_t>(b.size())});
  }
  auto set = (*engine)->CreateStateParams(*prefill->executable, refs);
  if (!set.ok()) return Fail(set.status());

  HostTensor tok = HostTensor::Create(v1::DTYPE_I32, {1, p}).value();
  HostTensor pos = HostTensor::Create(v1::DTYPE_I32, {p}).value();
  for (int64_t i = 0; i < p; ++i) {
    tok.data_as<int32_t>()[i] = prompt[static_cast<size_t>(i)];
    pos.data_as<int32_t>()[i] = static_cast<int32_t>(i);
  }
  const std::vector<TensorRef> prompt_inputs = {TensorRef::Of("tokens", tok),
                                                TensorRef::Of("positions", pos)};
  HostTensor tok1 = HostTensor::Create(v1::DTYPE_I32, {1, 1}).value();
  HostTensor pos1 = HostTensor::Create(v1::DTYPE_I32, {1}).value();
  const std::vector<TensorRef> step_inputs = {TensorRef::Of("tokens", tok1),
                                              TensorRef::Of("positions", pos1)};
  // Warm-up (first-run preparation, packing): a prefill and one step. The
  // timed prefill below rewrites the same cache rows, and every later row is
  // masked until a step rewrites it, so the timed run yields a fresh cache's tokens.
  {
    auto w = (*engine)->Run(*prefill->executable, prompt_inputs, set->get(), {});
    if (!w.ok()) return Fail(w.status());
    tok1.data_as<int32_t>()[0] = w->outputs.at(0).second.data_as<int32_t>()[0];
    pos1.data_as<int32_t>()[0] = static_cast<int32_t>(p);
    auto s = (*engine)->Run(*decode->executable, step_inputs, set->get(), {});
    if (!s.ok()) return Fail(s.status());
  }
  std::vector<int32_t> out;
  const auto t0 = Clock::now();
  auto r = (*engine)->Run(*prefill->executable, prompt_inputs, set->get(), {});
  const auto t1 = Clock::now();
  if (!r.ok()) return Fail(r.status());
  out.push_back(r->outputs.at(0).second.data_as<int32_t>()[0]);

  std::vector<double> steps;
  const auto d0 = Clock::now();
  for (int i = 1; i < tokens; ++i) {
    tok1.data_as<int32_t>()[0] = out.back();
    pos1.data_as<int32_t>()[0] = static_cast<int32_t>(p + i - 1);
    const auto s0 = Clock::now();
    auto s = (*engine)->Run(*decode->executable, step_inputs, set->get(), {});
    steps.push_back(Ms(s0, Clock::now()));
    if (!s.ok()) return Fail(s.status());
    out.push_back(s->outputs.at(0).second.data_as<int32_t>()[0]);
  }
  const double decode_ms = Ms(d0, Clock::now());
  std::sort(steps.begin(), steps.end());
  const double median = steps.empty() ? 0 : steps[steps.size() / 2];
  std::printf(
      "{\"bench\": \"gguf_decode_inproc\", \"threads\": %d, \"prompt\": %lld, \"tokens\": [%s], "
      "\"prefill_ms\": %.4f, \"decode_steps\": %zu, \"decode_ms\": %.4f, \"median_step_ms\": %.4f, "
      "\"tokens_per_s\": %.2f, \"int8_activations\": %s}\n",
      threads, static_cast<long long>(p), absl::StrJoin(out, ", ").c_str(), Ms(t0, t1),
      steps.size(), decode_ms, median, steps.empty() ? 0.0 : 1000.0 * steps.size() / decode_ms,
      int8_activations ? "true" : "false");
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  kiln::UseBoundedOpenMpSpin(argv);  // as kilnd does (base/openmp_policy.h)
  return kiln::Main(argc, argv);
}
