// In-process engine benchmarks. Each subcommand prints one JSON object.
//
//   kiln_bench encoder [--batch 1] [--iters 50] [--warmup 10] [--threads 2] [--export DIR]
//                      [--layers L]  (L layers in a row: 12 is BERT-base's encoder)
//                      [--kernels N]  (per-kernel medians over N reported runs)
//   kiln_bench matmul  [--sizes 512,1024,2048] [--rounds 7] [--threads 2]
//   kiln_bench compile [--rounds 5]
//   kiln_bench memory
//   kiln_bench placement [--reps 5] [--cache_dir DIR] [--threads N]
//                        [--graphs a,b (matmul_N: any N)] [--explain 1] [--tf32 1]
//   kiln_bench mlp | fixed_cost: small_batch_bench.h
//   kiln_bench timings [--threads 2]  (a worker: "mlp N" / "encoder N" on stdin)
//   kiln_bench onednn_matmul [--iters 100]  (dnnl_sgemm alone, no engine)
//   kiln_bench encoder_gemms [--m 128] [--rounds 15]  (the layer's six products alone,
//                      Kiln's kernels vs dnnl_sgemm: the matmul floor)
//
// `matmul` alternates Kiln (a one-node graph through Engine::Run, output copy
// included) with oneDNN's own dnnl_sgemm on the same operands, A B A B, and
// reports medians and their ratio. `encoder --export` writes the layer's
// weights and input as raw little-endian f32 files plus manifest.json, which
// bench/encoder_vs_ort.py turns into the same model for ONNX Runtime.
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "backends/cpu/small_matmul.h"
#include "base/openmp_policy.h"
#include "bench/engine/small_batch_bench.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "clients/cpp/graph_builder.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"
#include "tests/e2e/models.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    a = a.substr(2);
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      flags[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      flags[a] = argv[++i];
    } else {
      flags[a] = "1";
    }
  }
  return flags;
}

int64_t Flag(const std::map<std::string, std::string>& f, const std::string& name, int64_t def) {
  auto it = f.find(name);
  return it == f.end() ? def : std::stoll(it->second);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::unique_ptr<Engine> MakeEngine(int threads, const std::string& cache_dir = "") {
  EngineOptions o;
  o.cpu_threads = threads;
  o.cache_dir = cache_dir;
  auto e = Engine::Create(o);
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(e.status().message()).c_str());
    std::exit(1);
  }
  return std::move(e).value();
}

void WriteRaw(const std::filesystem::path& path, const HostTensor& t) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(t.data()), t.num_bytes());
}

// The BERT-base encoder layer, its input for `batch`, an engine and the
// layer's params on it: what the encoder benchmarks share.
struct EncoderSetup {
  models::EncoderConfig cfg;
  models::Model m;
  HostTensor x;
  std::unique_ptr<Engine> engine;
  absl::StatusOr<std::shared_ptr<ParamSet>> params;

  // layers > 1: the stack of that many layers (models::EncoderStack).
  EncoderSetup(int64_t batch, int threads, int layers = 1)
      : m(layers > 1 ? models::EncoderStack(cfg, layers) : models::EncoderLayer(cfg)) {
    std::mt19937_64 rng(99);
    x = models::RandomF32(rng, {batch, cfg.seq, cfg.hidden}, 1.0);
    engine = MakeEngine(threads);
    params = engine->CreateParams(models::ParamRefs(m));
  }
};

int Encoder(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int64_t batch = Flag(flags, "batch", 1);
  const int iters = static_cast<int>(Flag(flags, "iters", 50));
  const int warmup = static_cast<int>(Flag(flags, "warmup", 10));
  const int layers = static_cast<int>(Flag(flags, "layers", 1));
  EncoderSetup setup(batch, threads, layers);
  const models::EncoderConfig& cfg = setup.cfg;
  const models::Model& m = setup.m;
  const HostTensor& x = setup.x;
  Engine* engine = setup.engine.get();
  auto& params = setup.params;
  CompileOptions copts;
  if (flags.contains("device")) copts.device = flags.at("device");
  // --cuda_graphs auto|on|off (CompileOptions.cuda_graphs)
  const std::string graphs = flags.contains("cuda_graphs") ? flags.at("cuda_graphs") : "auto";
  copts.cuda_graphs = graphs == "on"    ? v1::CUDA_GRAPHS_ON
                      : graphs == "off" ? v1::CUDA_GRAPHS_OFF
                                        : v1::CUDA_GRAPHS_AUTO;
  auto compiled = engine->Compile(m.graph, copts, {{"x", x.dims()}});
  if (!params.ok() || !compiled.ok()) {
    std::fprintf(stderr, "setup failed\n");
    return 1;
  }
  std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
  std::vector<double> ms;
  RunResult last;
  RunOptions timed;  // --with_report 1: time runs that also build the dispatch report (as kilnd's do)
  timed.report = Flag(flags, "with_report", 0) != 0;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = Clock::now();
    auto r = engine->Run(*compiled->executable, inputs, params->get(), timed);
    const auto t1 = Clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "run: %s\n", std::string(r.status().message()).c_str());
      return 1;
    }
    if (i >= warmup) ms.push_back(Ms(t0, t1));
    if (i + 1 == warmup + iters) last = std::move(r).value();
  }
  // Device time from the dispatch report: the kernels and copies alone,
  // without the host's input upload and output download around them.
  std::vector<double> busy;
  std::string graph_state;
  for (int i = 0; i < 5; ++i) {
    RunOptions ro;
    ro.report = true;
    auto r = engine->Run(*compiled->executable, inputs, params->get(), ro);
    if (!r.ok()) return 1;
    graph_state = r->report.cuda_graph();
    double us = 0;
    for (const auto& t : r->report.totals()) us += t.busy_micros();
    busy.push_back(us / 1000.0);
    if (i == 0 && flags.contains("report_out")) {
      std::ofstream(flags.at("report_out")) << r->report.DebugString();
    }
  }
  // --kernels N: N more runs with a report; per step the median time, and the
  // median of the gaps between consecutive steps (threads waking, the
  // executor's own work): where a run's time goes beyond its kernels.
  json kernels = json::array();
  double gaps_ms = 0, run_ms = 0;
  if (const int n = static_cast<int>(Flag(flags, "kernels", 0)); n > 0) {
    std::vector<std::vector<double>> step_us;
    std::vector<double> gaps, runs;
    RunResult first;
    for (int i = 0; i < n; ++i) {
      RunOptions ro;
      ro.report = true;
      auto r = engine->Run(*compiled->executable, inputs, params->get(), ro);
      if (!r.ok()) return 1;
      const auto& steps = r->report.steps();
      step_us.resize(steps.size());
      double gap = 0;
      for (int s = 0; s < steps.size(); ++s) {
        step_us[s].push_back(steps[s].duration_micros());
        if (s > 0) {
          gap += steps[s].start_micros() -
                 (steps[s - 1].start_micros() + steps[s - 1].duration_micros());
        }
      }
      gaps.push_back(gap / 1000.0);
      runs.push_back(r->report.run_micros() / 1000.0);
      if (i == 0) first = std::move(r).value();
    }
    for (int s = 0; s < first.report.steps().size(); ++s) {
      const auto& step = first.report.steps(s);
      const double us = Median(step_us[s]);
      kernels.push_back({{"kernel", step.kernel()},
                         {"implementation", step.implementation()},
                         {"us", us},
                         {"min_us", *std::min_element(step_us[s].begin(), step_us[s].end())},
                         {"gflops", step.flops() / us / 1e3}});
    }
    gaps_ms = Median(gaps);
    run_ms = Median(runs);
  }
  if (flags.contains("export")) {
    const std::filesystem::path dir = flags.at("export");
    std::filesystem::create_directories(dir);
    json manifest = {{"config",
                      {{"seq", cfg.seq},
                       {"hidden", cfg.hidden},
                       {"heads", cfg.heads},
                       {"ffn", cfg.ffn},
                       {"epsilon", cfg.epsilon},
                       {"layers", layers}}},
                     {"tensors", json::array()}};
    auto add = [&](const std::string& name, const HostTensor& t) {
      WriteRaw(dir / (name + ".bin"), t);
      manifest["tensors"].push_back({{"name", name}, {"dims", t.dims()}});
    };
    for (const auto& [name, t] : m.params) add(name, t);
    add("x", x);
    add("y_kiln", last.outputs[0].second);
    std::ofstream(dir / "manifest.json") << manifest.dump(1);
    // The graph itself (a serialized kiln.v1.Graph), for clients that send it to kilnd.
    std::ofstream(dir / "graph.pb", std::ios::binary) << m.graph.SerializeAsString();
  }
  json out = {{"bench", "encoder_layer_fp32"},
              {"impl", "kiln"},
              {"threads", threads},
              {"device", compiled->executable->lir().placement().chosen()},
              {"batch", batch},
              {"seq", cfg.seq},
              {"layers", layers},
              {"iters", iters},
              {"p50_ms", Median(ms)},
              {"p90_ms", Percentile(ms, 0.9)},
              {"device_busy_ms", Median(busy)},
              {"cuda_graphs", graphs},
              {"cuda_graph", graph_state},
              {"min_ms", *std::min_element(ms.begin(), ms.end())}};
  if (!kernels.empty()) {
    out["kernels"] = kernels;
    out["kernel_gaps_ms"] = gaps_ms;
    out["report_run_ms"] = run_ms;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// kiln_bench onednn_matmul [--iters 100] [--threads 2]: the encoder's
// 128x768 @ 768x768 product through dnnl_sgemm, called from this one thread,
// with no engine in the process (so libgomp's team is the only one and keeps
// its configured spin): p50 and p10 micros. bench/openmp_wait_policy.py runs it
// under each OpenMP wait policy.
int OneDnnMatMulAlone(const std::map<std::string, std::string>& flags) {
  const int iters = static_cast<int>(Flag(flags, "iters", 100));
  omp_set_num_threads(static_cast<int>(Flag(flags, "threads", 2)));
  const int64_t m = 128, k = 768, n = 768;
  std::mt19937_64 rng(11);
  const HostTensor a = models::RandomF32(rng, {m, k}, 1.0),
                   b = models::RandomF32(rng, {k, n}, 0.05);
  std::vector<float> c(m * n);
  std::vector<double> us;
  for (int i = 0; i < iters + 5; ++i) {
    const auto t0 = Clock::now();
    dnnl_sgemm('N', 'N', m, n, k, 1.0f, a.data_as<float>(), k, b.data_as<float>(), n, 0.0f,
               c.data(), n);
    if (i >= 5) us.push_back(Ms(t0, Clock::now()) * 1000.0);
  }
  std::printf("%s\n", json({{"bench", "onednn_matmul_alone"},
                            {"p50_us", Median(us)},
                            {"p10_us", Percentile(us, 0.1)}})
                          .dump()
                          .c_str());
  return 0;
}

double ProcessCpuMicros() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

// kiln_bench timings: a worker for drivers that alternate processes started
// with different environments (bench/openmp_wait_policy.py: one per OpenMP
// wait policy, which libgomp reads only at start). Reads lines "mlp N" (the
// 784-512-512-10 MLP at batch 1) or "encoder N" (the encoder layer) on stdin,
// runs that model N times and prints one JSON line with each run's micros and
// the process's CPU micros per run.
int Timings(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  EncoderSetup enc(1, threads);
  Engine* engine = enc.engine.get();
  const models::Model mlp = models::Mlp();
  std::mt19937_64 rng(7);
  const HostTensor mlp_x = models::RandomF32(rng, {1, 784}, 1.0);
  auto mlp_params = engine->CreateParams(models::ParamRefs(mlp));
  auto mlp_compiled = engine->Compile(mlp.graph, {}, {{"x", mlp_x.dims()}});
  auto enc_compiled = engine->Compile(enc.m.graph, {}, {{"x", enc.x.dims()}});
  if (!enc.params.ok() || !mlp_params.ok() || !mlp_compiled.ok() || !enc_compiled.ok()) {
    std::fprintf(stderr, "setup failed\n");
    return 1;
  }
  const std::vector<TensorRef> mlp_in = {TensorRef::Of("x", mlp_x)};
  const std::vector<TensorRef> enc_in = {TensorRef::Of("x", enc.x)};
  std::printf("{\"ready\": true}\n");
  std::fflush(stdout);
  char what[32];
  int n = 0;
  while (std::scanf("%31s %d", what, &n) == 2) {
    const bool is_mlp = std::string(what) == "mlp";
    std::vector<double> us;
    const double cpu0 = ProcessCpuMicros();
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      auto r = is_mlp ? engine->Run(*mlp_compiled->executable, mlp_in, mlp_params->get(), {})
                      : engine->Run(*enc_compiled->executable, enc_in, enc.params->get(), {});
      if (!r.ok()) return 1;
      us.push_back(Ms(t0, Clock::now()) * 1000.0);
    }
    // CPU time of the whole process per run: unlike wall time, it leaves out
    // the time other processes held the cores (spinning threads count).
    std::printf("%s\n",
                json({{"us", us}, {"cpu_us_per_run", (ProcessCpuMicros() - cpu0) / std::max(n, 1)}})
                    .dump()
                    .c_str());
    std::fflush(stdout);
  }
  return 0;
}

int MatMul(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int rounds = static_cast<int>(Flag(flags, "rounds", 7));
  std::vector<int64_t> sizes = {512, 1024, 1536, 2048};
  if (flags.contains("sizes")) {
    sizes.clear();
    std::string s = flags.at("sizes");
    for (size_t p = 0; p <= s.size();) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      sizes.push_back(std::stoll(s.substr(p, q - p)));
      p = q + 1;
    }
  }
  auto engine = MakeEngine(threads);
  omp_set_num_threads(threads);
  json results = json::array();
  for (int64_t n : sizes) {
    GraphBuilder g("matmul");
    auto a = g.input("a", v1::DTYPE_F32, {n, n});
    auto b = g.input("b", v1::DTYPE_F32, {n, n});
    g.output("c", g.matmul(a, b));
    auto compiled = engine->Compile(g.Build(), {}, {});
    if (!compiled.ok()) return 1;
    std::mt19937_64 rng(n);
    HostTensor ha = models::RandomF32(rng, {n, n}, 1.0), hb = models::RandomF32(rng, {n, n}, 1.0);
    std::vector<float> c(n * n);
    std::vector<TensorRef> inputs = {TensorRef::Of("a", ha), TensorRef::Of("b", hb)};
    const int reps = n <= 512 ? 20 : (n <= 1024 ? 6 : 3);
    std::vector<double> kiln_ms, dnnl_ms;
    auto time_kiln = [&] {
      const auto t0 = Clock::now();
      for (int r = 0; r < reps; ++r) {
        auto out = engine->Run(*compiled->executable, inputs, nullptr, {});
        if (!out.ok()) std::exit(1);
      }
      return Ms(t0, Clock::now()) / reps;
    };
    auto time_dnnl = [&] {
      const auto t0 = Clock::now();
      for (int r = 0; r < reps; ++r) {
        dnnl_sgemm('N', 'N', n, n, n, 1.0f, ha.data_as<float>(), n, hb.data_as<float>(), n, 0.0f,
                   c.data(), n);
      }
      return Ms(t0, Clock::now()) / reps;
    };
    time_kiln();
    time_dnnl();
    for (int r = 0; r < rounds; ++r) {
      kiln_ms.push_back(time_kiln());
      dnnl_ms.push_back(time_dnnl());
    }
    const double k = Median(kiln_ms), d = Median(dnnl_ms);
    const double flop = 2.0 * n * n * n;
    results.push_back({{"n", n}, {"kiln_ms", k}, {"onednn_sgemm_ms", d},
                       {"kiln_gflops", flop / k / 1e6}, {"onednn_gflops", flop / d / 1e6},
                       {"kiln_vs_onednn", d / k}});
  }
  std::printf("%s\n", json({{"bench", "matmul_f32"}, {"threads", threads}, {"results", results}}).dump().c_str());
  return 0;
}

// kiln_bench encoder_gemms [--m 128] [--rounds 15] [--reps 10] [--threads 2]:
// the encoder layer's six products alone, at its shapes (M = batch * seq
// rows): each as a one-node graph through the engine with its weights as a
// packed param and its epilogue (bias; GELU for the FFN up; a residual for
// the output projection and the FFN down), timed by the run's report (the
// kernel alone), alternating round by round with dnnl_sgemm on the same
// operands (the product alone, B unpacked). Per product the median micros,
// GFLOP/s and the kernel that ran; "layer_ms" sums the six (Q, K, V and the
// output projection are the same shape): the layer's matmul floor for each.
int EncoderGemms(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int rounds = static_cast<int>(Flag(flags, "rounds", 15));
  const int reps = static_cast<int>(Flag(flags, "reps", 10));
  const int64_t m = Flag(flags, "m", 128);
  const models::EncoderConfig cfg;
  auto engine = MakeEngine(threads);
  omp_set_num_threads(threads);
  struct Product {
    const char* name;
    int64_t k, n;
    bool gelu, residual;
    int count;  // times it appears in the layer
  };
  const Product products[] = {{"qkv_o", cfg.hidden, cfg.hidden, false, false, 3},
                              {"o_residual", cfg.hidden, cfg.hidden, false, true, 1},
                              {"ffn_up_gelu", cfg.hidden, cfg.ffn, true, false, 1},
                              {"ffn_down_residual", cfg.ffn, cfg.hidden, false, true, 1}};
  json results = json::array();
  double kiln_layer = 0, dnnl_layer = 0;
  for (const Product& p : products) {
    std::mt19937_64 rng(p.k * 7 + p.n);
    models::Model model;
    GraphBuilder g("gemm");
    auto x = g.input("x", v1::DTYPE_F32, {m, p.k});
    model.params["w"] = models::RandomF32(rng, {p.k, p.n}, 1.0 / std::sqrt(double(p.k)));
    model.params["b"] = models::RandomF32(rng, {p.n}, 0.02);
    auto y = g.add(g.matmul(x, g.param("w", v1::DTYPE_F32, {p.k, p.n})),
                   g.param("b", v1::DTYPE_F32, {p.n}));
    if (p.gelu) y = g.gelu(y);
    std::vector<TensorRef> inputs;
    HostTensor hx = models::RandomF32(rng, {m, p.k}, 1.0);
    HostTensor hr = models::RandomF32(rng, {m, p.n}, 1.0);
    inputs.push_back(TensorRef::Of("x", hx));
    if (p.residual) {
      y = g.add(y, g.input("r", v1::DTYPE_F32, {m, p.n}));
      inputs.push_back(TensorRef::Of("r", hr));
    }
    g.output("y", y);
    auto compiled = engine->Compile(g.Build(), {}, {});
    auto params = engine->CreateParams(models::ParamRefs(model));
    if (!compiled.ok() || !params.ok()) {
      std::fprintf(stderr, "encoder_gemms: setup failed\n");
      return 1;
    }
    std::string kernel;
    auto time_kiln = [&] {
      std::vector<double> us;
      for (int r = 0; r < reps; ++r) {
        RunOptions ro;
        ro.report = true;
        auto out = engine->Run(*compiled->executable, inputs, params->get(), ro);
        if (!out.ok()) std::exit(1);
        double step_us = 0;
        for (const auto& step : out->report.steps()) {
          step_us += step.duration_micros();
          if (step.kernel().rfind("fused_matmul", 0) == 0) kernel = step.implementation();
        }
        us.push_back(step_us);
      }
      return Median(us);
    };
    std::vector<float> c(m * p.n);
    const HostTensor& w = model.params["w"];
    auto time_dnnl = [&] {
      std::vector<double> us;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        dnnl_sgemm('N', 'N', m, p.n, p.k, 1.0f, hx.data_as<float>(), p.k, w.data_as<float>(), p.n,
                   0.0f, c.data(), p.n);
        us.push_back(Ms(t0, Clock::now()) * 1000.0);
      }
      return Median(us);
    };
    // The own kernel called directly (no engine around it), B packed once.
    std::vector<float> packed(cpu::PackedBFloats(p.k, p.n));
    cpu::PackB(w.data_as<float>(), p.k, p.n, false, packed.data());
    cpu::SmallMatMulArgs args;
    args.m = m, args.n = p.n, args.k = p.k;
    args.a = hx.data_as<float>(), args.lda = p.k;
    args.b = packed.data(), args.b_panel_stride = p.k * cpu::kSmallPanel;
    args.b_row_stride = cpu::kSmallPanel;
    args.bias = model.params["b"].data_as<float>();
    if (p.residual) args.residual = hr.data_as<float>(), args.ldr = p.n;
    args.c = c.data(), args.ldc = p.n;
    args.act = p.gelu ? cpu::SmallAct::kGelu : cpu::SmallAct::kNone;
    auto time_direct = [&] {
      std::vector<double> us;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        cpu::SmallMatMul(cpu::BestSmallMatMulIsa(), args);
        us.push_back(Ms(t0, Clock::now()) * 1000.0);
      }
      return Median(us);
    };
    time_kiln();
    time_dnnl();
    time_direct();
    std::vector<double> kiln_us, dnnl_us, direct_us;
    for (int r = 0; r < rounds; ++r) {
      kiln_us.push_back(time_kiln());
      dnnl_us.push_back(time_dnnl());
      direct_us.push_back(time_direct());
    }
    const double k = Median(kiln_us), d = Median(dnnl_us), direct = Median(direct_us);
    const double flop = 2.0 * m * p.k * p.n;
    kiln_layer += p.count * k / 1000.0;
    dnnl_layer += p.count * d / 1000.0;
    results.push_back({{"product", p.name}, {"m", m}, {"k", p.k}, {"n", p.n},
                       {"kiln_kernel", kernel}, {"kiln_us", k}, {"onednn_sgemm_us", d},
                       {"kiln_gflops", flop / k / 1e3}, {"onednn_sgemm_gflops", flop / d / 1e3},
                       {"small_matmul_direct_us", direct}});
  }
  std::printf("%s\n", json({{"bench", "encoder_gemms"}, {"threads", threads}, {"m", m},
                            {"rounds", rounds}, {"results", results},
                            {"kiln_layer_ms", kiln_layer}, {"onednn_sgemm_layer_ms", dnnl_layer}})
                           .dump()
                           .c_str());
  return 0;
}

// One compile of the encoder layer in this process (kiln_bench compile_once
// --cache_dir DIR): prints "<ms> <cache outcome>". The engine (and its
// calibration) is set up before the clock starts.
int CompileOnce(const std::map<std::string, std::string>& flags) {
  models::EncoderConfig cfg;
  models::Model m = models::EncoderLayer(cfg);
  auto engine = MakeEngine(2, flags.at("cache_dir"));
  const auto t0 = Clock::now();
  auto c = engine->Compile(m.graph, {}, {{"x", {1, cfg.seq, cfg.hidden}}});
  const double ms = Ms(t0, Clock::now());
  if (!c.ok()) return 1;
  std::printf("%f %s\n", ms, v1::CacheOutcome_Name(c->report.executable_cache()).c_str());
  if (flags.contains("verbose")) std::fprintf(stderr, "%s\n", c->report.DebugString().c_str());
  return 0;
}

// Cold vs warm compile, each in a fresh process (process-wide caches such as
// oneDNN's JIT kernels start empty, as after a restart): cold with an empty
// cache dir, warm with the one the cold run filled.
int CompileBench(const std::map<std::string, std::string>& flags) {
  const int rounds = static_cast<int>(Flag(flags, "rounds", 5));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln_bench_cache_" + std::to_string(::getpid()));
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto once = [&](std::string* outcome) -> double {
    const std::string cmd = self + " compile_once --cache_dir " + dir.string() + " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return -1;
    double ms = -1;
    char name[64] = {};
    if (std::fscanf(p, "%lf %63s", &ms, name) != 2) ms = -1;
    if (::pclose(p) != 0) ms = -1;
    *outcome = name;
    return ms;
  };
  std::vector<double> cold, warm;
  std::string cold_outcome, warm_outcome;
  for (int r = 0; r < rounds; ++r) {
    std::filesystem::remove_all(dir);
    cold.push_back(once(&cold_outcome));
    warm.push_back(once(&warm_outcome));
    if (cold.back() < 0 || warm.back() < 0 || cold_outcome != "CACHE_MISS") return 1;
  }
  // The same within one process: a new Engine on the cache dir (memory cache
  // empty) while process-wide caches (oneDNN's JIT kernels) stay warm, as for
  // a second Engine in an application.
  std::vector<double> cold_ip, warm_ip;
  {
    models::EncoderConfig cfg;
    models::Model m = models::EncoderLayer(cfg);
    for (int r = 0; r < rounds; ++r) {
      std::filesystem::remove_all(dir);
      for (std::vector<double>* into : {&cold_ip, &warm_ip}) {
        auto engine = MakeEngine(2, dir.string());
        const auto t0 = Clock::now();
        auto c = engine->Compile(m.graph, {}, {{"x", {1, cfg.seq, cfg.hidden}}});
        into->push_back(Ms(t0, Clock::now()));
        if (!c.ok()) return 1;
      }
    }
  }
  std::filesystem::remove_all(dir);
  const json out = {{"bench", "compile_encoder_layer"}, {"cold_ms", Median(cold)},
                    {"in_process", {{"cold_ms", Median(cold_ip)}, {"warm_disk_ms", Median(warm_ip)},
                                    {"speedup", Median(cold_ip) / Median(warm_ip)}}},
                    {"warm_disk_ms", Median(warm)}, {"speedup", Median(cold) / Median(warm)},
                    {"cold_ms_all", cold}, {"warm_ms_all", warm},
                    {"warm_outcome", warm_outcome}, {"rounds", rounds},
                    {"method", "each compile in a fresh process; cold: empty cache dir, warm: "
                               "the cache dir the cold run filled"}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int Memory(const std::map<std::string, std::string>&) {
  auto engine = MakeEngine(2);
  json results = json::array();
  auto plan = [&](const std::string& name, const v1::Graph& g,
                  const std::vector<std::pair<std::string, Dims>>& shapes) {
    auto c = engine->Compile(g, {}, shapes);
    if (!c.ok()) std::exit(1);
    for (const auto& m : c->report.memory()) {
      results.push_back({{"graph", name}, {"device", m.device()}, {"arena_bytes", m.arena_bytes()},
                         {"naive_bytes", m.naive_bytes()}, {"lower_bound_bytes", m.lower_bound_bytes()},
                         {"arena_over_lower_bound",
                          m.lower_bound_bytes() ? double(m.arena_bytes()) / m.lower_bound_bytes() : 1.0},
                         {"in_place", m.in_place()}, {"aliases", m.aliases()}});
    }
  };
  plan("mlp_b64", models::Mlp().graph, {{"x", {64, 784}}});
  models::EncoderConfig cfg;
  plan("encoder_layer_b1", models::EncoderLayer(cfg).graph, {{"x", {1, cfg.seq, cfg.hidden}}});
  plan("encoder_layer_b8", models::EncoderLayer(cfg).graph, {{"x", {8, cfg.seq, cfg.hidden}}});
  std::printf("%s\n", json({{"bench", "memory_plan"}, {"results", results}}).dump().c_str());
  return 0;
}

// Graphs from tiny to large; each runs pinned to every device and under
// `auto`, and the auto choice is compared with the fastest measured device.
struct PlacementCase {
  std::string name;
  v1::Graph graph;
  std::vector<HostTensor> inputs;
  std::vector<std::string> input_names;
  models::Model params;  // for graphs with params
};

std::vector<PlacementCase> PlacementCases(const std::vector<std::string>& extra) {
  std::vector<PlacementCase> cases;
  std::mt19937_64 rng(5);
  auto elementwise = [&](const std::string& name, int64_t n, int depth) {
    GraphBuilder g(name);
    auto x = g.input("x", v1::DTYPE_F32, {n});
    auto y = x;
    for (int i = 0; i < depth; ++i) y = g.tanh(g.add(g.mul(y, y), x));
    g.output("y", y);
    PlacementCase c{name, g.Build(), {}, {"x"}, {}};
    c.inputs.push_back(models::RandomF32(rng, {n}, 1.0));
    cases.push_back(std::move(c));
  };
  auto matmul = [&](const std::string& name, int64_t n) {
    GraphBuilder g(name);
    auto a = g.input("a", v1::DTYPE_F32, {n, n});
    auto b = g.input("b", v1::DTYPE_F32, {n, n});
    g.output("c", g.matmul(a, b));
    PlacementCase c{name, g.Build(), {}, {"a", "b"}, {}};
    c.inputs.push_back(models::RandomF32(rng, {n, n}, 1.0));
    c.inputs.push_back(models::RandomF32(rng, {n, n}, 1.0));
    cases.push_back(std::move(c));
  };
  auto softmax = [&](const std::string& name, int64_t rows, int64_t cols) {
    GraphBuilder g(name);
    auto x = g.input("x", v1::DTYPE_F32, {rows, cols});
    g.output("y", g.softmax(x));
    PlacementCase c{name, g.Build(), {}, {"x"}, {}};
    c.inputs.push_back(models::RandomF32(rng, {rows, cols}, 3.0));
    cases.push_back(std::move(c));
  };
  auto attention = [&](const std::string& name, int64_t heads, int64_t seq) {
    GraphBuilder g(name);
    auto q = g.input("q", v1::DTYPE_F32, {1, heads, seq, 64});
    auto k = g.input("k", v1::DTYPE_F32, {1, heads, seq, 64});
    auto v = g.input("v", v1::DTYPE_F32, {1, heads, seq, 64});
    v1::AttentionAttrs a;
    a.set_mask(v1::MASK_CAUSAL);
    g.output("o", g.attention(q, k, v, a));
    PlacementCase c{name, g.Build(), {}, {"q", "k", "v"}, {}};
    for (int i = 0; i < 3; ++i) c.inputs.push_back(models::RandomF32(rng, {1, heads, seq, 64}, 1.0));
    cases.push_back(std::move(c));
  };
  auto model = [&](const std::string& name, models::Model m, Dims x_dims) {
    PlacementCase c{name, m.graph, {}, {"x"}, std::move(m)};
    c.inputs.push_back(models::RandomF32(rng, x_dims, 1.0));
    cases.push_back(std::move(c));
  };
  elementwise("tiny_add", 1, 1);
  model("mlp_b1", models::Mlp(), {1, 784});
  elementwise("elementwise_64k", 1 << 16, 4);
  softmax("softmax_256x256", 256, 256);
  matmul("matmul_128", 128);
  matmul("matmul_512", 512);
  elementwise("elementwise_16m", 1 << 24, 4);
  softmax("softmax_4096x4096", 4096, 4096);
  model("mlp_b512", models::Mlp(), {512, 784});
  matmul("matmul_1024", 1024);
  models::EncoderConfig cfg;
  model("encoder_b1", models::EncoderLayer(cfg), {1, cfg.seq, cfg.hidden});
  model("encoder_b16", models::EncoderLayer(cfg), {16, cfg.seq, cfg.hidden});
  matmul("matmul_2048", 2048);
  attention("attention_h16_s2048", 16, 2048);
  matmul("matmul_4096", 4096);
  // Probes beyond the 15 (--graphs matmul_N): matmuls of any size.
  for (const std::string& name : extra) {
    int64_t n = 0;
    if (name.rfind("matmul_", 0) == 0) n = std::atoll(name.c_str() + 7);
    if (n > 0) matmul(name, n);
  }
  return cases;
}

// One reported run of `executable`: where its time went (the run's own time,
// kernel and copy steps, the largest steps), for the explain output.
json ExplainRun(Engine& engine, Executable& executable, std::span<const TensorRef> inputs,
                const ParamSet* params) {
  RunOptions ro;
  ro.report = true;
  const auto t0 = Clock::now();
  auto run = engine.Run(executable, inputs, params, ro);
  const double wall_ms = Ms(t0, Clock::now());
  if (!run.ok()) return {{"error", std::string(run.status().message())}};
  const v1::DispatchReport& r = run->report;
  double kernel_us = 0, copy_us = 0;
  std::vector<std::pair<double, std::string>> steps;
  for (const v1::DispatchStep& st : r.steps()) {
    (st.kind() == v1::STEP_COPY ? copy_us : kernel_us) += st.duration_micros();
    steps.emplace_back(st.duration_micros(),
                       absl::StrCat(st.kind() == v1::STEP_COPY ? "copy" : st.implementation(), "@",
                                    st.device(), "+", static_cast<int64_t>(st.start_micros())));
  }
  std::sort(steps.rbegin(), steps.rend());
  json top = json::array();
  for (size_t i = 0; i < steps.size() && i < 4; ++i) {
    top.push_back({{"step", steps[i].second}, {"us", steps[i].first}});
  }
  return {{"wall_ms", wall_ms},           {"run_us", r.run_micros()},
          {"queue_us", r.queue_micros()}, {"kernels_us", kernel_us},
          {"copies_us", copy_us},         {"steps", r.steps_size()},
          {"cuda_graph", r.cuda_graph()}, {"top", top}};
}

int Placement(const std::map<std::string, std::string>& flags) {
  const int reps = static_cast<int>(Flag(flags, "reps", 5));
  EngineOptions o;
  o.cpu_threads = static_cast<int>(Flag(flags, "threads", 0));
  o.cache_dir = flags.contains("cache_dir") ? flags.at("cache_dir") : "";
  // Measured at every start, or read from --cache_dir's calibration cache.
  o.calibration = o.cache_dir.empty() ? EngineOptions::Calibration::kAlways
                                      : EngineOptions::Calibration::kIfCacheDir;
  auto created = Engine::Create(o);
  if (!created.ok()) return 1;
  auto engine = std::move(created).value();
  std::vector<std::string> devices;
  json profiles = json::array();
  for (const auto* d : engine->Devices()) {
    devices.push_back(d->id);
    profiles.push_back({{"device", d->id},
                        {"name", d->name},
                        {"gflops_f32", d->profile.peak_gflops_f32},
                        {"bandwidth_gbps", d->profile.bandwidth_gbps},
                        {"launch_us", d->profile.launch_overhead_us},
                        {"sync_us", d->profile.sync_overhead_us},
                        {"h2d_gbps", d->profile.host_to_device_gbps},
                        {"d2h_gbps", d->profile.device_to_host_gbps}});
  }
  // --graphs a,b: only these (matmul_N of any N is made on demand); a name
  // that matches no graph is an error, not an empty run.
  std::vector<std::string> only;
  if (flags.contains("graphs")) only = absl::StrSplit(flags.at("graphs"), ',', absl::SkipEmpty());
  std::vector<PlacementCase> cases = PlacementCases(only);
  if (!only.empty()) {
    std::vector<PlacementCase> kept;
    for (const std::string& name : only) {
      auto it = std::find_if(cases.begin(), cases.end(),
                             [&](const PlacementCase& c) { return c.name == name; });
      if (it == cases.end()) {
        std::fprintf(stderr, "--graphs: no graph named %s\n", name.c_str());
        return 2;
      }
      kept.push_back(std::move(*it));
      cases.erase(it);
    }
    cases = std::move(kept);
  }
  const bool explain = Flag(flags, "explain", 0) != 0;
  const bool tf32 = Flag(flags, "tf32", 0) != 0;
  std::fprintf(stderr, "devices %s\n", profiles.dump().c_str());
  json results = json::array();
  int good = 0, total = 0;
  for (PlacementCase& c : cases) {
    std::vector<TensorRef> inputs;
    for (size_t i = 0; i < c.inputs.size(); ++i) inputs.push_back(TensorRef::Of(c.input_names[i], c.inputs[i]));
    std::shared_ptr<ParamSet> params;
    if (!c.params.params.empty()) {
      auto p = engine->CreateParams(models::ParamRefs(c.params));
      if (!p.ok()) return 1;
      params = *p;
    }
    json estimates = json::object();  // the cost model's view, from the auto compile
    json explained = json::object();
    auto time_on = [&](const std::string& device, std::string* chosen) -> double {
      CompileOptions co;
      co.device = device;
      co.allow_tf32 = tf32;
      std::vector<std::pair<std::string, Dims>> shapes;
      for (const auto& t : inputs) shapes.emplace_back(t.name, t.dims);
      auto compiled = engine->Compile(c.graph, co, shapes);
      if (!compiled.ok()) {
        std::fprintf(stderr, "%s on %s: %s\n", c.name.c_str(), device.c_str(),
                     std::string(compiled.status().message()).c_str());
        return -1;
      }
      if (chosen) {
        const v1::Placement& pl = compiled->executable->lir().placement();
        *chosen = pl.chosen();
        for (const v1::DeviceEstimate& e : pl.estimates()) {
          if (e.feasible()) estimates[e.device()] = e.estimate_micros() / 1000.0;
        }
      }
      std::vector<double> ms;
      for (int r = 0; r < reps + 1; ++r) {
        const auto t0 = Clock::now();
        auto run = engine->Run(*compiled->executable, inputs, params.get(), {});
        if (!run.ok()) return -1;
        if (r > 0) ms.push_back(Ms(t0, Clock::now()));
      }
      if (explain && chosen == nullptr) {
        json e = ExplainRun(*engine, *compiled->executable, inputs, params.get());
        e["median_ms"] = Median(ms);
        e["min_ms"] = *std::min_element(ms.begin(), ms.end());
        explained[device] = e;
        std::fprintf(stderr, "explain %s %s %s\n", c.name.c_str(), device.c_str(),
                     e.dump().c_str());
      }
      return Median(ms);
    };
    json per_device = json::object();
    std::string fastest;
    double fastest_ms = 1e30;
    for (const std::string& d : devices) {
      const double ms = time_on(d, nullptr);
      per_device[d] = ms;
      if (ms >= 0 && ms < fastest_ms) fastest_ms = ms, fastest = d;
    }
    std::string chosen;
    time_on("auto", &chosen);
    const double chosen_ms = per_device.contains(chosen) ? per_device[chosen].get<double>() : -1;
    const bool ok = chosen == fastest || (chosen_ms >= 0 && chosen_ms <= 1.1 * fastest_ms);
    good += ok;
    ++total;
    results.push_back({{"graph", c.name}, {"ms", per_device}, {"estimate_ms", estimates},
                       {"fastest", fastest},
                       {"auto", chosen}, {"auto_within_10pct", ok}});
    if (explain) results.back()["explain"] = explained;
    std::fprintf(stderr, "placement %s\n", results.back().dump().c_str());
  }
  std::printf("%s\n", json({{"bench", "placement_accuracy"}, {"devices", profiles},
                            {"graphs", total}, {"auto_fastest_or_within_10pct", good},
                            {"accuracy", total ? double(good) / total : 0.0},
                            {"results", results}}).dump().c_str());
  return 0;
}

// Runtime v2: one shared encoder program per device, called at once by
// `callers` threads of two tenants. Runs/s for each device alone and for all
// of them together (callers spread across the devices' programs), so the
// curve shows concurrent run contexts on one device and scaling with devices.
//   kiln_bench shared [--devices cpu:0,vulkan:0] [--callers 1,2,4,8] [--seconds 3 (whole)]
int SharedEncoder(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int64_t batch = Flag(flags, "batch", 8);
  const double seconds = static_cast<double>(Flag(flags, "seconds", 3));
  auto list = [&](const std::string& name, const std::string& def) {
    std::vector<std::string> out;
    for (absl::string_view v : absl::StrSplit(flags.contains(name) ? flags.at(name) : def, ',')) {
      if (!v.empty()) out.emplace_back(v);
    }
    return out;
  };
  const std::vector<std::string> devices = list("devices", "cpu:0,vulkan:0");
  std::vector<int> callers;
  for (const std::string& c : list("callers", "1,2,4,8")) callers.push_back(std::stoi(c));
  EncoderSetup setup(batch, threads);
  const models::EncoderConfig& cfg = setup.cfg;
  const models::Model& m = setup.m;
  const HostTensor& x = setup.x;
  Engine* engine = setup.engine.get();
  auto& params = setup.params;
  if (!params.ok()) return 1;
  std::map<std::string, std::shared_ptr<Executable>> programs;
  for (const std::string& d : devices) {
    CompileOptions copts;
    copts.device = d;
    auto c = engine->Compile(m.graph, copts, {{"x", x.dims()}});
    if (!c.ok()) {
      std::fprintf(stderr, "compile on %s: %s\n", d.c_str(), std::string(c.status().message()).c_str());
      return 1;
    }
    programs[d] = c->executable;
  }
  const std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
  for (auto& [d, p] : programs) (void)engine->Run(*p, inputs, params->get(), {});  // warm
  std::vector<std::vector<std::string>> modes;
  for (const std::string& d : devices) modes.push_back({d});
  if (devices.size() > 1) modes.push_back(devices);
  json points = json::array();
  for (const auto& mode : modes) {
    for (int c : callers) {
      std::atomic<bool> stop = false;
      std::atomic<int64_t> runs = 0, errors = 0;
      std::vector<std::thread> pool;
      const auto t0 = Clock::now();
      for (int i = 0; i < c; ++i) {
        pool.emplace_back([&, i] {
          Executable& p = *programs.at(mode[i % mode.size()]);
          RunOptions ro;
          ro.tenant = i % 2 == 0 ? "a" : "b";
          while (!stop.load()) {
            (engine->Run(p, inputs, params->get(), ro).ok() ? runs : errors)++;
          }
        });
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      stop = true;
      for (auto& t : pool) t.join();
      const double s = Ms(t0, Clock::now()) / 1000.0;
      points.push_back({{"devices", mode}, {"callers", c}, {"runs", runs.load()},
                        {"errors", errors.load()}, {"runs_per_s", runs.load() / s}});
      std::fprintf(stderr, "shared encoder: %s x %d callers: %.1f runs/s\n",
                   absl::StrJoin(mode, "+").c_str(), c, runs.load() / s);
    }
  }
  json slots = json::object();
  for (const DeviceStats& d : engine->DeviceStatistics()) slots[d.device] = d.slots;
  std::printf("%s\n", json({{"bench", "shared_encoder_throughput"}, {"batch", batch},
                            {"seq", cfg.seq}, {"threads", threads}, {"device_slots", slots},
                            {"points", points}}).dump().c_str());
  return 0;
}

// The cost of the process boundary (issue 7): a tiny graph and the encoder
// layer on one accelerator device, run by two engines side by side, one with
// the device in kilnd's process (thread isolation) and one with it in a
// device worker process, interleaved run by run. Prints p50 / p99 per run for
// each and the p50 the boundary adds.
int Isolation(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int iters = static_cast<int>(Flag(flags, "iters", 200));
  const int64_t batch = Flag(flags, "batch", 1);
  const std::string device = flags.contains("device") ? flags.at("device") : "vulkan:0";
  auto make = [&](EngineOptions::DeviceIsolation iso) {
    EngineOptions o;
    o.cpu_threads = threads;
    o.device_isolation = iso;
    o.calibration = EngineOptions::Calibration::kNever;
    auto e = Engine::Create(o);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", std::string(e.status().message()).c_str());
      std::exit(1);
    }
    return std::move(e).value();
  };
  std::unique_ptr<Engine> engines[2] = {make(EngineOptions::DeviceIsolation::kThread),
                                        make(EngineOptions::DeviceIsolation::kProcess)};
  const char* names[2] = {"thread", "process"};
  GraphBuilder tb("tiny");
  auto tx = tb.input("x", v1::DTYPE_F32, {16});
  tb.output("y", tb.add(tb.mul(tx, tb.scalar(2.0)), tb.scalar(1.0)));
  const v1::Graph tiny = tb.Build();
  std::mt19937_64 rng(5);
  const HostTensor tiny_x = models::RandomF32(rng, {16}, 1.0);
  models::EncoderConfig cfg;
  const models::Model enc = models::EncoderLayer(cfg);
  const HostTensor enc_x = models::RandomF32(rng, {batch, cfg.seq, cfg.hidden}, 1.0);
  json results = json::array();
  struct Case {
    std::string name;
    const v1::Graph* graph;
    const HostTensor* x;
    bool params;
    int iters;
  };
  for (const Case& c : {Case{"tiny", &tiny, &tiny_x, false, iters},
                        Case{"encoder", &enc.graph, &enc_x, true, std::max(10, iters / 10)}}) {
    std::shared_ptr<Executable> programs[2];
    std::shared_ptr<ParamSet> params[2];
    for (int k = 0; k < 2; ++k) {
      bool found = false;
      for (const auto* d : engines[k]->Devices()) found = found || d->id == device;
      if (!found) {
        std::fprintf(stderr, "no device %s\n", device.c_str());
        return 1;
      }
      CompileOptions co;
      co.device = device;
      auto compiled = engines[k]->Compile(*c.graph, co, {{"x", c.x->dims()}});
      if (!compiled.ok()) {
        std::fprintf(stderr, "compile %s (%s): %s\n", c.name.c_str(), names[k],
                     std::string(compiled.status().message()).c_str());
        return 1;
      }
      programs[k] = compiled->executable;
      if (c.params) {
        auto p = engines[k]->CreateParams(models::ParamRefs(enc));
        if (!p.ok()) return 1;
        params[k] = *p;
      }
    }
    const std::vector<TensorRef> in = {TensorRef::Of("x", *c.x)};
    std::vector<double> ms[2];
    for (int i = 0; i < c.iters + 5; ++i) {
      for (int k = 0; k < 2; ++k) {
        const auto t0 = Clock::now();
        auto r = engines[k]->Run(*programs[k], in, params[k].get(), {});
        const auto t1 = Clock::now();
        if (!r.ok()) {
          std::fprintf(stderr, "run %s (%s): %s\n", c.name.c_str(), names[k],
                       std::string(r.status().message()).c_str());
          return 1;
        }
        if (i >= 5) ms[k].push_back(Ms(t0, t1));  // the first runs warm up
      }
    }
    json row = {{"graph", c.name}, {"device", device}, {"iters", c.iters}};
    for (int k = 0; k < 2; ++k) {
      row[names[k]] = {{"p50_us", Median(ms[k]) * 1000}, {"p99_us", Percentile(ms[k], 0.99) * 1000}};
    }
    row["added_p50_us"] = (Median(ms[1]) - Median(ms[0])) * 1000;
    std::fprintf(stderr, "isolation %s on %s: thread p50 %.1f us, process p50 %.1f us (+%.1f us)\n",
                 c.name.c_str(), device.c_str(), Median(ms[0]) * 1000, Median(ms[1]) * 1000,
                 (Median(ms[1]) - Median(ms[0])) * 1000);
    results.push_back(row);
  }
  std::printf("%s\n", json({{"bench", "device_isolation_cost"}, {"threads", threads},
                            {"batch", batch}, {"results", results}}).dump().c_str());
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  kiln::UseBoundedOpenMpSpin(argv);  // as kilnd does (base/openmp_policy.h)
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: kiln_bench encoder|matmul|compile|memory|placement|shared|isolation|mlp|"
                 "fixed_cost|timings|onednn_matmul|encoder_gemms [flags]\n");
    return 2;
  }
  // stdout carries the JSON; the engine's log lines go to stderr.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("kiln_bench"));
  const std::string cmd = argv[1];
  const auto flags = kiln::ParseFlags(argc, argv);
  if (cmd == "encoder") return kiln::Encoder(flags);
  if (cmd == "timings") return kiln::Timings(flags);
  if (cmd == "onednn_matmul") return kiln::OneDnnMatMulAlone(flags);
  if (cmd == "matmul") return kiln::MatMul(flags);
  if (cmd == "encoder_gemms") return kiln::EncoderGemms(flags);
  if (cmd == "compile") return kiln::CompileBench(flags);
  if (cmd == "compile_once") return kiln::CompileOnce(flags);
  if (cmd == "memory") return kiln::Memory(flags);
  if (cmd == "placement") return kiln::Placement(flags);
  if (cmd == "shared") return kiln::SharedEncoder(flags);
  if (cmd == "isolation") return kiln::Isolation(flags);
  if (cmd == "mlp") return kiln::bench::MlpBench(flags);
  if (cmd == "fixed_cost") return kiln::bench::FixedCostBench(flags);
  std::fprintf(stderr, "unknown benchmark %s\n", cmd.c_str());
  return 2;
}
