#include "bench/engine/small_batch_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <unordered_map>
#include <vector>

#include "absl/strings/match.h"
#include "clients/cpp/graph_builder.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/models.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

int64_t Flag(const std::map<std::string, std::string>& f, const std::string& name, int64_t def) {
  auto it = f.find(name);
  return it == f.end() ? def : std::stoll(it->second);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

std::unique_ptr<Engine> MakeEngine(int threads) {
  EngineOptions o;
  o.cpu_threads = threads;
  auto e = Engine::Create(o);
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(e.status().message()).c_str());
    std::exit(1);
  }
  return std::move(e).value();
}

// One MLP layer as a oneDNN matmul primitive: weights reordered once into
// the layout the primitive prefers, bias and (but for the last) ReLU fused.
struct DnnlLayer {
  dnnl::matmul prim;
  dnnl::memory src, weights, bias, dst;
};

struct DnnlMlp {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::vector<DnnlLayer> layers;
  std::vector<std::vector<float>> acts;  // activations between layers

  DnnlMlp(const models::Model& m, int64_t batch, const float* x) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    int64_t k = 784;
    const float* in = x;
    for (int i = 1;; ++i) {
      auto w = m.params.find("w" + std::to_string(i));
      if (w == m.params.end()) break;
      const int64_t n = w->second.dims()[1];
      const bool relu = m.params.contains("w" + std::to_string(i + 1));
      const dnnl::memory::desc src_md({batch, k}, dt::f32, tag::ab);
      const dnnl::memory::desc any_md({k, n}, dt::f32, tag::any);
      const dnnl::memory::desc bias_md({1, n}, dt::f32, tag::ab);
      const dnnl::memory::desc dst_md({batch, n}, dt::f32, tag::ab);
      dnnl::post_ops ops;
      if (relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0, 0);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_md, bias_md, dst_md),
                                            attr, engine);
      DnnlLayer l;
      l.prim = dnnl::matmul(pd);
      dnnl::memory user({{k, n}, dt::f32, tag::ab}, engine,
                        const_cast<float*>(w->second.data_as<float>()));
      l.weights = dnnl::memory(pd.weights_desc(), engine);
      dnnl::reorder(user, l.weights).execute(stream, user, l.weights);
      l.bias = dnnl::memory(bias_md, engine,
                            const_cast<float*>(m.params.at("b" + std::to_string(i)).data_as<float>()));
      l.src = dnnl::memory(src_md, engine, const_cast<float*>(in));
      acts.emplace_back(batch * n);
      l.dst = dnnl::memory(dst_md, engine, acts.back().data());
      in = acts.back().data();
      layers.push_back(std::move(l));
      k = n;
    }
    stream.wait();
  }

  void RunLayer(size_t i) {
    DnnlLayer& l = layers[i];
    l.prim.execute(stream, {{DNNL_ARG_SRC, l.src},
                            {DNNL_ARG_WEIGHTS, l.weights},
                            {DNNL_ARG_BIAS, l.bias},
                            {DNNL_ARG_DST, l.dst}});
    stream.wait();
  }
  void Run() {
    for (size_t i = 0; i < layers.size(); ++i) RunLayer(i);
  }
};

void WriteRaw(const std::filesystem::path& path, const HostTensor& t) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(t.data()), t.num_bytes());
}

}  // namespace

int MlpBench(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int rounds = static_cast<int>(Flag(flags, "rounds", 7));
  const int iters = static_cast<int>(Flag(flags, "iters", 200));
  std::vector<int64_t> batches = {1, 64};
  if (flags.contains("batches")) {
    batches.clear();
    const std::string s = flags.at("batches");
    for (size_t p = 0; p <= s.size();) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      batches.push_back(std::stoll(s.substr(p, q - p)));
      p = q + 1;
    }
  }
  auto engine = MakeEngine(threads);
  omp_set_num_threads(threads);
  const models::Model m = models::Mlp();
  auto params = engine->CreateParams(models::ParamRefs(m));
  if (!params.ok()) return 1;
  json results = json::array();
  for (int64_t batch : batches) {
    std::mt19937_64 rng(11 + batch);
    const HostTensor x = models::RandomF32(rng, {batch, 784}, 1.0);
    auto compiled = engine->Compile(m.graph, {}, {{"x", x.dims()}});
    if (!compiled.ok()) {
      std::fprintf(stderr, "compile: %s\n", std::string(compiled.status().message()).c_str());
      return 1;
    }
    Executable& exe = *compiled->executable;
    const std::vector<TensorRef> inputs = {TensorRef::Of("x", x)};
    DnnlMlp dnnl_mlp(m, batch, x.data_as<float>());
    const HostTensor want = models::MlpReference(m, x);
    double max_err_kiln = 0, max_err_dnnl = 0;
    auto time_kiln = [&] {
      std::vector<double> us;
      for (int i = 0; i < iters; ++i) {
        const auto t0 = Clock::now();
        auto r = engine->Run(exe, inputs, params->get(), {});
        us.push_back(Us(t0, Clock::now()));
        if (!r.ok()) std::exit(1);
        if (i == 0) max_err_kiln = std::max(max_err_kiln, models::WorstError(r->outputs[0].second, want, 1e-6, 0));
      }
      return Median(us);
    };
    auto time_dnnl = [&] {
      std::vector<double> us;
      for (int i = 0; i < iters; ++i) {
        const auto t0 = Clock::now();
        dnnl_mlp.Run();
        us.push_back(Us(t0, Clock::now()));
      }
      HostTensor y = *HostTensor::Create(v1::DTYPE_F32, want.dims());
      std::copy(dnnl_mlp.acts.back().begin(), dnnl_mlp.acts.back().end(), y.data_as<float>());
      max_err_dnnl = std::max(max_err_dnnl, models::WorstError(y, want, 1e-6, 0));
      return Median(us);
    };
    time_kiln();
    time_dnnl();
    std::vector<double> kiln_us, dnnl_us;
    for (int r = 0; r < rounds; ++r) {
      kiln_us.push_back(time_kiln());
      dnnl_us.push_back(time_dnnl());
    }
    // Per layer: Kiln's kernel time from the dispatch report (median of
    // `iters` runs) and the same layer alone in oneDNN.
    std::map<std::string, std::vector<double>> step_us;
    std::map<std::string, std::string> step_impl;
    for (int i = 0; i < iters; ++i) {
      RunOptions ro;
      ro.report = true;
      auto r = engine->Run(exe, inputs, params->get(), ro);
      if (!r.ok()) return 1;
      for (const auto& s : r->report.steps()) {
        step_us[s.kernel()].push_back(s.duration_micros());
        step_impl[s.kernel()] = s.implementation();
      }
    }
    json layers = json::array();
    for (size_t l = 0; l < dnnl_mlp.layers.size(); ++l) {
      std::vector<double> us;
      for (int i = 0; i < iters; ++i) {
        const auto t0 = Clock::now();
        dnnl_mlp.RunLayer(l);
        us.push_back(Us(t0, Clock::now()));
      }
      layers.push_back({{"layer", "fc" + std::to_string(l + 1)}, {"onednn_us", Median(us)}});
    }
    json steps = json::array();
    for (const auto& [name, us] : step_us) {
      steps.push_back({{"kernel", name}, {"implementation", step_impl[name]}, {"us", Median(us)}});
    }
    const double k = Median(kiln_us), d = Median(dnnl_us);
    results.push_back({{"batch", batch}, {"kiln_us", k}, {"onednn_us", d}, {"kiln_vs_onednn", k / d},
                       {"kiln_rounds_us", kiln_us}, {"onednn_rounds_us", dnnl_us},
                       {"kiln_worst_error_1e-6", max_err_kiln},
                       {"onednn_worst_error_1e-6", max_err_dnnl}, {"kiln_steps", steps},
                       {"onednn_layers", layers}});
    if (flags.contains("export")) {
      const std::filesystem::path dir = std::filesystem::path(flags.at("export")) /
                                        ("b" + std::to_string(batch));
      std::filesystem::create_directories(dir);
      json manifest = {{"batch", batch}, {"tensors", json::array()}};
      auto add = [&](const std::string& name, const HostTensor& t) {
        WriteRaw(dir / (name + ".bin"), t);
        manifest["tensors"].push_back({{"name", name}, {"dims", t.dims()}});
      };
      for (const auto& [name, t] : m.params) add(name, t);
      add("x", x);
      add("y_ref", want);
      std::ofstream(dir / "manifest.json") << manifest.dump(1);
    }
  }
  std::printf("%s\n", json({{"bench", "mlp_784_512_512_10"}, {"threads", threads},
                            {"results", results}})
                          .dump()
                          .c_str());
  return 0;
}

int FixedCostBench(const std::map<std::string, std::string>& flags) {
  const int threads = static_cast<int>(Flag(flags, "threads", 2));
  const int rounds = static_cast<int>(Flag(flags, "rounds", 7));
  const int iters = static_cast<int>(Flag(flags, "iters", 2000));
  auto engine = MakeEngine(threads);
  GraphBuilder g("fixed_cost");
  auto x = g.input("x", v1::DTYPE_F32, {16});
  g.output("y", g.add(x, g.scalar(1.0)));
  auto compiled = engine->Compile(g.Build(), {}, {});
  if (!compiled.ok()) return 1;
  std::mt19937_64 rng(1);
  const HostTensor hx = models::RandomF32(rng, {16}, 1.0);
  const std::vector<TensorRef> inputs = {TensorRef::Of("x", hx)};
  json out = json::object();
  for (bool report : {false, true}) {
    std::vector<double> medians, kernel;
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> us, k_us;
      RunOptions ro;
      ro.report = report;
      for (int i = 0; i < iters; ++i) {
        const auto t0 = Clock::now();
        auto res = engine->Run(*compiled->executable, inputs, nullptr, ro);
        us.push_back(Us(t0, Clock::now()));
        if (!res.ok()) return 1;
        if (report && !res->report.steps().empty()) {
          k_us.push_back(res->report.steps(0).duration_micros());
        }
      }
      medians.push_back(Median(us));
      if (report) kernel.push_back(Median(k_us));
    }
    out[report ? "with_report" : "without_report"] = {{"run_us_p50", Median(medians)},
                                                       {"rounds_us", medians}};
    if (report) out["with_report"]["kernel_us_p50"] = Median(kernel);
  }
  std::printf("%s\n", json({{"bench", "executor_fixed_cost"}, {"graph", "y = x + 1, 16 floats"},
                            {"threads", threads}, {"results", out}})
                          .dump()
                          .c_str());
  return 0;
}

}  // namespace kiln::bench
