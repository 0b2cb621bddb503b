// Issue 8's bf16 layer targets on cuda:0, Kiln's side (bench/gpu/torch_layers.py is
// PyTorch eager's, run in the same device call by cudnn_layers.sh):
// - bert: the BERT-base encoder layer (post-LN, biases, GELU (erf), no mask),
//   bf16, B32 S512 (issue: <= 0.8x eager's time);
// - decoder: a 7B-style decoder layer (d 4096, 32 heads, ffn 16384, causal,
//   pre-norm with RmsNorm, no biases, GELU (erf) MLP), bf16, B4 S2048
//   (issue: <= 0.95x eager's time).
// The engine compiles the graph for cuda:0 and runs it (CUDA graphs as asked); the
// JSON line gives the p50 wall time of Engine::Run (with the host upload of x and the
// download of y) and the device busy time of the dispatch report (the kernels alone),
// plus the kernels' implementations. --export DIR writes the weights, x and Kiln's y
// (as f32 .bin files, the bf16 values exactly) for the PyTorch peer.
// --outputs reused hands Run a destination for y (RunOptions::output_destinations,
// one buffer written every run, as kilnd writes a local client's outputs into its
// shared memory) instead of a fresh HostTensor per run (whose pages are new each
// time: y is 25 / 64 MiB, above glibc's mmap threshold).
//   layers_bf16 --layer bert|decoder [--iters 20] [--cuda_graphs auto|on|off] [--export DIR]
//               [--outputs fresh|reused]
//               [--label kiln]   (the JSON "impl": say kiln_own for a KILN_CUDNN=0 run)
//               [--io host|resident] [--dtype bf16|f32] [--seq N]
// --io resident (res8) keeps x and y on the device through an API users have: x is a
// param of a state set (Engine::CreateStateParams) and the graph's y is bound to it
// (CompileOptions::state_updates {y -> x}), so each Run computes y = layer(x) and
// writes y in place over x on the device: no host upload or download, the
// device-resident counterpart of PyTorch eager with its tensors on the GPU. The host
// copies of the weights (and x) are dropped once uploaded, as a user would.
// --dtype f32 --seq 128 --batch 8 is the fp32 BERT encoder layer (B8 S128).
// bert8 (issue 8, where a Run's time goes besides the kernels):
//   --isolation auto|thread|process  the device in kilnd's process or in its worker;
//   --report every|last  every timed run asks for the dispatch report (its events
//     around each kernel), or none does and one run after them gives the report's
//     figures (device busy, kernels);
//   --cache_dir DIR  a compile cache for several runs of a script (no calibration);
//   --inline_run_micros N  EngineOptions::inline_run_micros (0: every run through the
//     device's scheduler thread);
//   "hops_us": medians over the timed runs of where each Run's time went, from the
//     timestamps of its last round trip to the device worker (worker_client.h,
//     RoundTripTimes): before_submit (Run entry to the Submit written: the scheduler,
//     Program::Run, the command list), to_worker, worker_queue (its reader thread to
//     the stream's thread), launch (the commands handed to the device), device_wait,
//     answer (the event times), to_kilnd, wake_caller, after (the outputs, the report).
// graphs8 (issue 8, CUDA graphs' AUTO and TF32):
//   --allow_tf32 on|off  CompileOptions.allow_tf32 (f32 GEMMs on cuBLASLt's TF32 compute
//   type; default off);
//   the JSON gives what AUTO weighed: "kernels" (the program's steps), "estimate_us"
//   (the cost model's), "launch_us" (the device's launch cost per kernel), "uses_graphs".
//   layers_bf16 --layer decoder --compile_once DIR
//     issue 8's compile target: one Engine::Compile of the layer for the device with the
//     disk cache in DIR, timed alone (the Engine, its calibration and the weights are made
//     before the clock starts; the compile includes preparing every kernel, i.e. NVRTC or
//     the cubin load on a warm cache, and cuBLASLt / cuDNN plan creation). Prints one JSON
//     line with the milliseconds and the cache outcome; bench/gpu/compile_cache.sh runs it
//     in fresh processes, cold (empty DIR) then warm.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "engine/runtime/program.h"
#include "engine/runtime/worker_client.h"
#include "nlohmann/json.hpp"

namespace {

using json = nlohmann::json;
using kiln::GraphBuilder;
using kiln::HostTensor;
using V = GraphBuilder::Value;
namespace v1 = kiln::v1;

struct Layer {
  v1::Graph graph;
  std::map<std::string, HostTensor> params;
  HostTensor x;
  json config;
};

HostTensor Random(std::mt19937_64& rng, v1::DType dtype, const kiln::Dims& dims, double scale,
                  double offset) {
  auto t = HostTensor::Create(dtype, dims);
  std::uniform_real_distribution<double> u(-scale, scale);
  for (int64_t i = 0; i < t->num_elements(); ++i) t->SetFromDouble(i, offset + u(rng));
  return std::move(t).value();
}

// resident: x is a param (bound to y as state) instead of an input.
Layer Build(const std::string& which, int64_t batch, int64_t seq, v1::DType dt, bool resident) {
  Layer L;
  std::mt19937_64 rng(7);
  const bool bert = which == "bert";
  const int64_t h = bert ? 768 : 4096, heads = bert ? 12 : 32,
                ffn = bert ? 3072 : 16384, dh = h / heads;
  const double eps = bert ? 1e-12 : 1e-6;
  L.config = {{"layer", which}, {"batch", batch}, {"seq", seq},    {"hidden", h},
              {"heads", heads}, {"ffn", ffn},     {"epsilon", eps},
              {"dtype", dt == v1::DTYPE_F32 ? "f32" : "bf16"}};
  GraphBuilder g(bert ? "bert_layer_bf16" : "decoder_layer_bf16");
  auto param = [&](const std::string& name, const kiln::Dims& dims, double scale,
                   double offset = 0) {
    L.params[name] = Random(rng, dt, dims, scale, offset);
    return g.param(name, dt, dims);
  };
  const double ws = 1.0 / std::sqrt(static_cast<double>(h));
  V x = resident ? g.param("x", dt, {batch, seq, h}) : g.input("x", dt, {batch, seq, h});
  L.x = Random(rng, dt, {batch, seq, h}, 1.0, 0);
  auto heads_of = [&](V t) {
    return g.transpose(g.reshape(t, {batch, seq, heads, dh}), {0, 2, 1, 3});
  };
  auto merge = [&](V t) { return g.reshape(g.transpose(t, {0, 2, 1, 3}), {batch, seq, h}); };
  v1::AttentionAttrs attn;
  if (bert) {
    attn.set_mask(v1::MASK_BIDIRECTIONAL);
    V q = heads_of(g.add(g.matmul(x, param("wq", {h, h}, ws)), param("bq", {h}, 0.02)));
    V k = heads_of(g.add(g.matmul(x, param("wk", {h, h}, ws)), param("bk", {h}, 0.02)));
    V v = heads_of(g.add(g.matmul(x, param("wv", {h, h}, ws)), param("bv", {h}, 0.02)));
    V a = merge(g.attention(q, k, v, attn));
    V o = g.add(g.matmul(a, param("wo", {h, h}, ws)), param("bo", {h}, 0.02));
    V h1 = g.layer_norm(g.add(o, x), param("ln1_g", {h}, 0.1, 1.0), param("ln1_b", {h}, 0.1), eps);
    V f = g.gelu(g.add(g.matmul(h1, param("w1", {h, ffn}, ws)), param("b1", {ffn}, 0.02)));
    V f2 = g.add(g.matmul(f, param("w2", {ffn, h}, 1.0 / std::sqrt(double(ffn)))),
                 param("b2", {h}, 0.02));
    g.output("y", g.layer_norm(g.add(f2, h1), param("ln2_g", {h}, 0.1, 1.0),
                               param("ln2_b", {h}, 0.1), eps));
  } else {
    attn.set_mask(v1::MASK_CAUSAL);
    V n1 = g.rms_norm(x, param("norm1", {h}, 0.1, 1.0), eps);
    V q = heads_of(g.matmul(n1, param("wq", {h, h}, ws)));
    V k = heads_of(g.matmul(n1, param("wk", {h, h}, ws)));
    V v = heads_of(g.matmul(n1, param("wv", {h, h}, ws)));
    V h1 = g.add(x, g.matmul(merge(g.attention(q, k, v, attn)), param("wo", {h, h}, ws)));
    V n2 = g.rms_norm(h1, param("norm2", {h}, 0.1, 1.0), eps);
    V f = g.gelu(g.matmul(n2, param("w1", {h, ffn}, ws)));
    g.output("y", g.add(h1, g.matmul(f, param("w2", {ffn, h}, 1.0 / std::sqrt(double(ffn))))));
  }
  L.graph = g.Build();
  return L;
}

void WriteF32(const std::filesystem::path& path, const HostTensor& t) {
  std::vector<float> f(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) f[i] = static_cast<float>(t.GetAsDouble(i));
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size() * 4));
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  auto flag = [&](const char* name, const std::string& def) {
    return flags.contains(name) ? flags.at(name) : def;
  };
  const std::string which = flag("--layer", "bert");
  const int iters = std::stoi(flag("--iters", "20"));
  const std::string graphs = flag("--cuda_graphs", "auto");
  const std::string outputs = flag("--outputs", "fresh");
  const std::string io = flag("--io", "host");
  const std::string dtype = flag("--dtype", "bf16");
  const int64_t batch = std::stoll(flag("--batch", which == "bert" ? "32" : "4"));
  const int64_t seq = std::stoll(flag("--seq", which == "bert" ? "512" : "2048"));
  const bool resident = io == "resident";
  const std::string isolation = flag("--isolation", "auto");
  const std::string report_mode = flag("--report", "every");
  const std::string tf32 = flag("--allow_tf32", "off");
  if ((which != "bert" && which != "decoder") || iters <= 0 || batch <= 0 || seq <= 0 ||
      (outputs != "fresh" && outputs != "reused") || (io != "host" && io != "resident") ||
      (dtype != "bf16" && dtype != "f32") ||
      (isolation != "auto" && isolation != "thread" && isolation != "process") ||
      (report_mode != "every" && report_mode != "last") || (tf32 != "on" && tf32 != "off") ||
      (resident && (outputs == "reused" || flags.contains("--compile_once"))) ||
      ((outputs == "reused" || resident) && flags.contains("--export"))) {  // y is not kept then
    return 2;
  }
  kiln::EngineOptions eo;
  eo.cpu_threads = 4;
  // 0 hands every run to the device's scheduler thread (main's path before bert8).
  // A compile cache shared by several processes of one script (the kernels compile
  // once); no calibration, whose figures would come from it.
  if (flags.contains("--cache_dir")) {
    eo.cache_dir = flags.at("--cache_dir");
    eo.calibration = kiln::EngineOptions::Calibration::kNever;
  }
  if (flags.contains("--inline_run_micros")) eo.inline_run_micros = std::stod(flags.at("--inline_run_micros"));
  eo.device_isolation = isolation == "thread"    ? kiln::EngineOptions::DeviceIsolation::kThread
                        : isolation == "process" ? kiln::EngineOptions::DeviceIsolation::kProcess
                                                 : kiln::EngineOptions::DeviceIsolation::kAuto;
  const bool compile_once = flags.contains("--compile_once");
  if (compile_once) {
    eo.cache_dir = flags.at("--compile_once");
    // The device profiles come from the cache too, so a warm start measures nothing.
  }
  const auto e0 = std::chrono::steady_clock::now();
  auto engine = kiln::Engine::Create(eo);
  const auto e1 = std::chrono::steady_clock::now();
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  // After the engine: host tensors made now may come from the host arena its device
  // workers map (base/host_arena.h), as a user's would.
  Layer L = Build(which, batch, seq, dtype == "f32" ? v1::DTYPE_F32 : v1::DTYPE_BF16, resident);
  kiln::CompileOptions co;
  co.device = flag("--device", "cuda:0");
  co.cuda_graphs = graphs == "on"    ? v1::CUDA_GRAPHS_ON
                   : graphs == "off" ? v1::CUDA_GRAPHS_OFF
                                     : v1::CUDA_GRAPHS_AUTO;
  if (resident) co.state_updates = {{"y", "x"}};
  co.allow_tf32 = tf32 == "on";
  const auto c0 = std::chrono::steady_clock::now();
  auto compiled = (*engine)->Compile(L.graph, co, {});
  const auto c1 = std::chrono::steady_clock::now();
  if (!compiled.ok()) {
    std::fprintf(stderr, "compile: %s\n", std::string(compiled.status().message()).c_str());
    return 1;
  }
  std::vector<kiln::TensorRef> prefs;
  for (const auto& [name, t] : L.params) prefs.push_back(kiln::TensorRef::Of(name, t));
  if (resident) prefs.push_back(kiln::TensorRef::Of("x", L.x));
  auto params = resident ? (*engine)->CreateStateParams(*compiled->executable, prefs)
                         : (*engine)->CreateParams(prefs);
  if (!params.ok()) {
    std::fprintf(stderr, "params: %s\n", std::string(params.status().message()).c_str());
    return 1;
  }
  if (!flags.contains("--export")) {
    // Uploaded: the host copies go, as a user's would (they are not run I/O).
    L.params.clear();
    if (resident) L.x = HostTensor();
  }
  if (compile_once) {
    // The first run after the compile: whatever the compile left to the first use
    // (a run context's kernels, CUDA graph capture) is paid here.
    kiln::RunOptions ro;
    ro.report = true;
    const std::vector<kiln::TensorRef> x = {kiln::TensorRef::Of("x", L.x)};
    const auto r0 = std::chrono::steady_clock::now();
    auto r = (*engine)->Run(*compiled->executable, x, params->get(), ro);
    const auto r1 = std::chrono::steady_clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "run: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    // The second run: what the first paid once (the params' upload to the
    // device, the pool's growth, lazily loaded library kernels) is the
    // difference.
    const auto r2 = std::chrono::steady_clock::now();
    auto again = (*engine)->Run(*compiled->executable, x, params->get(), ro);
    const auto r3 = std::chrono::steady_clock::now();
    if (!again.ok()) {
      std::fprintf(stderr, "run: %s\n", std::string(again.status().message()).c_str());
      return 1;
    }
    auto busy_ms = [](const kiln::RunResult& run) {
      double us = 0;
      for (const auto& t : run.report.totals()) us += t.busy_micros();
      return us / 1e3;
    };
    int64_t param_bytes = 0;
    for (const auto& [name, t] : L.params) param_bytes += t.num_bytes();
    // Where the compile's time went (the report's stages, the kernel cache), so a
    // warm start's cost can be attributed without another GPU call.
    json stages = json::object();
    json stage_counts = json::object();  // how many times each load.* phase ran
    for (const auto& st : compiled->report.stages()) {
      stages[st.stage()] = st.micros() / 1e3;
      if (st.stage().starts_with("load.")) stage_counts[st.stage()] = st.nodes_after();
    }
    const json out = {
        {"bench", "compile_layer"},
        {"stages_ms", stages},
        {"load_counts", stage_counts},
        {"report_total_ms", compiled->report.total_micros() / 1e3},
        {"kernels", compiled->report.kernels()},
        {"kernel_cache_hits", compiled->report.kernel_cache_hits()},
        {"kernel_cache_misses", compiled->report.kernel_cache_misses()},
        {"layer", which},
        {"device", co.device},
        {"compile_ms", std::chrono::duration<double, std::milli>(c1 - c0).count()},
        // Engine::Create, outside the compile's clock: device discovery, the
        // device worker's start (CUDA context, libraries), calibration.
        {"engine_start_ms", std::chrono::duration<double, std::milli>(e1 - e0).count()},
        {"first_run_ms", std::chrono::duration<double, std::milli>(r1 - r0).count()},
        {"first_run_busy_ms", busy_ms(*r)},
        {"second_run_ms", std::chrono::duration<double, std::milli>(r3 - r2).count()},
        {"second_run_busy_ms", busy_ms(*again)},
        {"param_mib", param_bytes / double(1 << 20)},
        {"cache", v1::CacheOutcome_Name(compiled->report.executable_cache())}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::vector<kiln::TensorRef> inputs;
  if (!resident) inputs.push_back(kiln::TensorRef::Of("x", L.x));
  std::vector<double> wall, busy;
  kiln::RunResult last;
  std::map<std::string, double> by_impl;
  std::string graph_state;
  // y has x's shape and dtype in both layers; a HostTensor, so that it is in the host
  // arena when there is one, as a user's destination allocated as a HostTensor would be.
  HostTensor y_destination;
  if (outputs == "reused") {
    y_destination = std::move(HostTensor::CreateUninitialized(L.x.dtype(), L.x.dims())).value();
  }
  namespace worker = kiln::runtime::worker;
  const char* hop_names[] = {"before_submit", "to_worker", "worker_queue", "launch",
                             "device_wait", "answer", "to_kilnd", "wake_caller", "after"};
  std::vector<std::vector<double>> hops(std::size(hop_names));
  const int total_runs = 3 + iters + (report_mode == "last" ? 1 : 0);
  for (int i = 0; i < total_runs; ++i) {
    const bool timed = i >= 3 && i < 3 + iters;
    kiln::RunOptions ro;
    ro.report = report_mode == "every" || i == total_runs - 1;
    if (outputs == "reused") {
      ro.output_destinations.push_back({"y", y_destination.data(), y_destination.num_bytes()});
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*engine)->Run(*compiled->executable, inputs, params->get(), ro);
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "run: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    if (timed) {
      wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      const int64_t n0 = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
      const int64_t n1 = std::chrono::duration_cast<std::chrono::nanoseconds>(t1.time_since_epoch()).count();
      const std::optional<worker::RoundTripTimes> trip = worker::LastRoundTrip();
      if (trip && trip->sent >= n0 && trip->woken <= n1) {
        const int64_t at[] = {n0, trip->sent, trip->received, trip->started, trip->launched,
                              trip->done, trip->replied, trip->read, trip->woken, n1};
        for (size_t h = 0; h < hops.size(); ++h) hops[h].push_back((at[h + 1] - at[h]) / 1e3);
      }
    }
    if (i + 1 != total_runs && !(report_mode == "every" && timed)) continue;
    double us = 0;
    for (const auto& t : r->report.totals()) us += t.busy_micros();
    busy.push_back(us / 1000.0);
    graph_state = r->report.cuda_graph();
    if (i + 1 == total_runs) {
      for (const auto& step : r->report.steps()) {
        by_impl[step.implementation()] += step.duration_micros() / 1000.0;
      }
      last = std::move(r).value();
    }
  }
  if (flags.contains("--export")) {
    const std::filesystem::path dir = flags.at("--export");
    std::filesystem::create_directories(dir);
    json manifest = {{"config", L.config}, {"tensors", json::array()}};
    auto add = [&](const std::string& name, const HostTensor& t) {
      WriteF32(dir / (name + ".bin"), t);
      manifest["tensors"].push_back({{"name", name}, {"dims", t.dims()}});
    };
    for (const auto& [name, t] : L.params) add(name, t);
    add("x", L.x);
    add("y_kiln", last.outputs[0].second);
    std::ofstream(dir / "manifest.json") << manifest.dump(1);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(busy.begin(), busy.end());
  json kernels = json::object();
  for (const auto& [impl, ms] : by_impl) kernels[impl] = ms;
  json hops_us = json::object();
  for (size_t h = 0; h < hops.size() && !hops[0].empty(); ++h) {
    std::sort(hops[h].begin(), hops[h].end());
    hops_us[hop_names[h]] = hops[h][hops[h].size() / 2];
  }
  // What CUDA graphs' AUTO weighed (runtime::UseCapturedGraphs).
  const auto* program = dynamic_cast<const kiln::runtime::Program*>(compiled->executable.get());
  double launch_us = 0;
  for (const auto* d : (*engine)->Devices()) {
    if (d->id == co.device) launch_us = d->profile.launch_overhead_us;
  }
  const json out = {{"bench", "layer_bf16"},
                    {"allow_tf32", co.allow_tf32},
                    {"kernels", program ? program->lir().steps_size() : -1},
                    {"estimate_us", compiled->executable->estimated_run_micros()},
                    {"launch_us", launch_us},
                    {"uses_graphs", program != nullptr && program->uses_graphs()},
                    {"impl", flag("--label", "kiln")},
                    {"layer", which},
                    {"config", L.config},
                    {"cuda_graphs", graphs},
                    {"cuda_graph", graph_state},
                    {"outputs", outputs},
                    {"io", io},
                    {"dtype", dtype},
                    {"iters", iters},
                    {"isolation", isolation},
                    {"report", report_mode},
                    {"hops_us", hops_us},
                    {"p50_ms", wall[wall.size() / 2]},
                    {"device_busy_ms", busy[busy.size() / 2]},
                    {"kernels_ms", kernels}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
