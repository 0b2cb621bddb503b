// kiln_quant_bench: DequantMatMul on block-quantized weights vs oneDNN's f32
// matmul on the same weights dequantized, side by side in one run, with the
// machine's memory bandwidth measured in the same run so "% of bandwidth" is
// honest. Prints one JSON object (docs/benchmarks.md records the results).
//
// Each timed call reads a different copy of the weights (a rotation larger
// than the last-level cache), so every call streams its weights from DRAM as
// a decode step of a model much larger than the cache does. Samples alternate
// A B A B; the figures are medians, with the 10th percentile and the best
// sample beside them (a shared 2-core machine preempts threads for whole
// scheduler ticks, which the median of a short call often includes). Runs at
// 1 thread and at every power of two up to OMP's limit.
//
// For M = 1 a fourth contender is the portable matvec loop (dq::Generic(),
// what a CPU without AVX-512 ran before the AVX2 loop of dequant_dot_avx2.cc),
// called on the same rows with the same split over threads: the before and
// after of that loop in one run. --ktypes 1 adds q5_k and q6_k, --ktypes 2
// q4_0, q5_k and q6_k.
//
// --int8 1 adds Kiln's DequantMatMul with int8 activations
// (KernelSpec.allow_int8_activations, CompileOptions.allow_int8_activations)
// as a fifth contender on the same weight copies and x, and the error it adds:
// the rms and max of (int8 - exact) over the rms of the exact result.
//
//   kiln_quant_bench [--n 4096] [--k 4096] [--samples 40] [--set_mib 700] [--ktypes 0] [--int8 0]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"
#include "base/half.h"
#include "engine/runtime/device_registry.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The q-th quantile (0 = the fastest sample, 0.5 = the median).
double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * (v.size() - 1))];
}

// Sum of a[begin, end) (u64 lanes; end - begin a multiple of 16) with four
// independent AVX2 accumulators: as fast as one core can read, so the sweeps
// below measure the memory, not the loop.
uint64_t SumRange(const uint64_t* a, int64_t begin, int64_t end) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = begin; i < end; i += 16) {
    const __m256i* p = reinterpret_cast<const __m256i*>(a + i);
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(p));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(p + 1));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(p + 2));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(p + 3));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Threads split [0, n) (a multiple of 16 per thread's share) and sum their parts.
uint64_t ParallelSum(const uint64_t* a, int64_t n) {
  uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t blocks = n / 16;
    total += SumRange(a, blocks * t / nt * 16, blocks * (t + 1) / nt * 16);
  }
  return total;
}

// The machine's read bandwidth: both cores summing disjoint halves of a buffer
// far larger than the cache (best of a few sweeps), and memcpy's (bytes read +
// written).
struct Bandwidth {
  double read_gbps = 0, copy_gbps = 0;
};

Bandwidth MeasureBandwidth(std::vector<uint64_t>& a, std::vector<uint64_t>& b) {
  const int64_t n = static_cast<int64_t>(a.size()), bytes = n * 8;
  Bandwidth bw;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    const uint64_t total = ParallelSum(a.data(), n);
    const auto t1 = Clock::now();
    if (total != static_cast<uint64_t>(n)) std::abort();
    bw.read_gbps = std::max(bw.read_gbps, bytes / Seconds(t0, t1) / 1e9);
    const auto t2 = Clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < 64; ++c) {
      const int64_t lo = n * c / 64, hi = n * (c + 1) / 64;
      std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * 8);
    }
    const auto t3 = Clock::now();
    bw.copy_gbps = std::max(bw.copy_gbps, 2.0 * bytes / Seconds(t2, t3) / 1e9);
  }
  return bw;
}

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = FloatToHalf(v);
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Random quants with sane f16 scales (no subnormal or NaN arithmetic).
std::vector<uint8_t> RandomBlocks(std::mt19937_64& rng, DType dtype, int64_t bytes) {
  std::vector<uint8_t> w(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : w) x = static_cast<uint8_t>(byte(rng));
  const DTypeLayout l = LayoutOf(dtype);
  for (int64_t b = 0; b < bytes / l.block_bytes; ++b) {
    uint8_t* p = w.data() + b * l.block_bytes;
    if (dtype == v1::DTYPE_Q6_K) {
      PutHalf(p + 208, 1e-3f);
    } else {
      PutHalf(p, 1e-3f);
      if (dtype == v1::DTYPE_Q4_K || dtype == v1::DTYPE_Q5_K) PutHalf(p + 2, 1e-3f);
    }
  }
  return w;
}

struct Prepared {
  std::unique_ptr<backend::Kernel> kernel;
  std::unique_ptr<backend::Buffer> x, y;
  std::vector<std::unique_ptr<backend::Buffer>> weights;  // the rotation
  int64_t weight_bytes = 0;
  size_t next = 0;
};

std::unique_ptr<backend::Buffer> Alloc(backend::Device& d, int64_t bytes) {
  auto b = d.Allocate(bytes);
  if (!b.ok()) {
    std::fprintf(stderr, "allocate %lld: %s\n", static_cast<long long>(bytes),
                 std::string(b.status().message()).c_str());
    std::exit(1);
  }
  return std::move(b).value();
}

// op is DequantMatMul on `qtype` blocks, or MatMul on their f32 decoding.
Prepared Prepare(backend::Device& dev, v1::OpKind op, DType qtype, int64_t m, int64_t n, int64_t k,
                 const std::vector<uint8_t>& wq, int64_t set_bytes, bool int8 = false) {
  Prepared p;
  backend::KernelSpec spec;
  spec.allow_int8_activations = int8;
  spec.name = spec.label = op == v1::OP_MATMUL ? "f32_matmul" : "dequant_matmul";
  spec.op = op;
  if (op == v1::OP_MATMUL) {
    spec.attrs.mutable_matmul()->set_transpose_b(true);
  } else {
    spec.attrs.mutable_dequant_matmul()->set_transpose_b(true);
  }
  spec.inputs = {{v1::DTYPE_F32, {m, k}}, {op == v1::OP_MATMUL ? v1::DTYPE_F32 : qtype, {n, k}}};
  spec.outputs = {{v1::DTYPE_F32, {m, n}}};
  backend::PrepareContext ctx;
  auto kernel = dev.PrepareKernel(spec, ctx);
  if (!kernel.ok()) {
    std::fprintf(stderr, "%s\n", std::string(kernel.status().message()).c_str());
    std::exit(1);
  }
  p.kernel = std::move(kernel).value();
  p.x = Alloc(dev, m * k * 4);
  p.y = Alloc(dev, m * n * 4);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  float* x = static_cast<float*>(p.x->host_ptr());
  for (int64_t i = 0; i < m * k; ++i) x[i] = u(rng);
  // The weights: the quantized bytes, or their f32 decoding for oneDNN.
  std::vector<float> wf;
  if (op == v1::OP_MATMUL) {
    wf.resize(n * k);
    quant::DequantizeBlocks(qtype, wq.data(), n * k / LayoutOf(qtype).block_elems, wf.data());
  }
  p.weight_bytes = op == v1::OP_MATMUL ? n * k * 4 : static_cast<int64_t>(wq.size());
  const int64_t copies = std::max<int64_t>(2, set_bytes / p.weight_bytes + 1);
  for (int64_t c = 0; c < copies; ++c) {
    auto b = Alloc(dev, p.weight_bytes);
    std::memcpy(b->host_ptr(),
                op == v1::OP_MATMUL ? static_cast<const void*>(wf.data())
                                    : static_cast<const void*>(wq.data()),
                p.weight_bytes);
    p.weights.push_back(std::move(b));
  }
  return p;
}

double TimeOne(Prepared& p, backend::Stream& stream) {
  backend::Buffer* w = p.weights[p.next++ % p.weights.size()].get();
  const backend::BufferView in[2] = {{p.x.get(), 0, p.x->size()}, {w, 0, p.weight_bytes}};
  const backend::BufferView out[1] = {{p.y.get(), 0, p.y->size()}};
  const auto t0 = Clock::now();
  absl::Status s = p.kernel->Launch(stream, in, out);
  const auto t1 = Clock::now();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  return Seconds(t0, t1);
}

// The portable matvec (dq::Generic()) on the next weight copy of p (M = 1),
// its rows split over the threads as the kernel splits them.
double TimePortable(Prepared& p, DType wt, int64_t n, int64_t k, size_t& next) {
  const backend::Buffer* w = p.weights[next++ % p.weights.size()].get();
  const uint8_t* wq = static_cast<const uint8_t*>(w->host_ptr());
  const float* x = static_cast<const float*>(p.x->host_ptr());
  float* y = static_cast<float*>(p.y->host_ptr());
  const int64_t row_bytes = p.weight_bytes / n;
  const auto t0 = Clock::now();
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t n0 = n * t / nt, n1 = n * (t + 1) / nt;
    if (n0 < n1) cpu::dq::Generic().dot_rows(wt, wq, row_bytes, n0, n1, k, x, k, 1, y, n);
  }
  return Seconds(t0, Clock::now());
}

// A plain read of one of p's weight copies (the next in its own rotation),
// with the kernels' threads: the bandwidth this machine gives those bytes at
// this moment, alternated with the kernels so preemption hits all alike.
double TimeSweep(Prepared& p, size_t& next) {
  const backend::Buffer* w = p.weights[next++ % p.weights.size()].get();
  const uint64_t* a = static_cast<const uint64_t*>(w->host_ptr());
  const int64_t n = p.weight_bytes / 8;
  const auto t0 = Clock::now();
  const uint64_t total = ParallelSum(a, n);
  const auto t1 = Clock::now();
  if (total == 0x5eed) std::fprintf(stderr, " ");  // keeps the sum alive
  return Seconds(t0, t1);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  using namespace kiln;
  int64_t n = 4096, k = 4096, samples = 40, set_mib = 700, ktypes = 0, int8 = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--n")
      n = v;
    else if (a == "--k")
      k = v;
    else if (a == "--samples")
      samples = v;
    else if (a == "--set_mib")
      set_mib = v;
    else if (a == "--ktypes")
      ktypes = v;
    else if (a == "--int8")
      int8 = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  // The CPU alone: other backends' threads (lavapipe's) would share its cores.
  runtime::RegistryOptions ro;
  ro.disabled = {"vulkan", "cuda"};
  auto registry = runtime::DeviceRegistry::Create(ro);
  if (!registry.ok()) return 1;
  backend::Device& cpu = *(*registry)->cpu();
  auto stream = cpu.CreateStream();
  if (!stream.ok()) return 1;
  const int64_t set_bytes = set_mib << 20;

  nlohmann::json out;
  {
    std::ifstream load("/proc/loadavg");
    std::string l1;
    load >> l1;
    out["machine"]["loadavg_1m_at_start"] = l1;
  }
  out["shape"] = {{"n", n},
                  {"k", k},
                  {"weights_layout", "[N, K] (transpose_b, as GGUF)"},
                  {"weight_set_mib", set_mib},
                  {"samples", samples}};
  std::vector<uint64_t> bw_a(int64_t{1} << 27, 1), bw_b(int64_t{1} << 27, 0);  // 1 GiB each
  const int max_threads = omp_get_max_threads();
  for (int threads = 1; threads <= max_threads; threads *= 2) {
    omp_set_num_threads(threads);
    const Bandwidth bw = MeasureBandwidth(bw_a, bw_b);
    nlohmann::json run;
    run["threads"] = threads;
    run["memory_bandwidth"] = {{"read_gbps", bw.read_gbps},
                               {"memcpy_read_plus_write_gbps", bw.copy_gbps},
                               {"method", "summing a 1 GiB buffer; memcpy of 1 GiB; best of 5"}};
    std::vector<DType> types = {v1::DTYPE_Q4_K, v1::DTYPE_Q8_0};
    if (ktypes == 2) types.push_back(v1::DTYPE_Q4_0);
    if (ktypes != 0) types.insert(types.end(), {v1::DTYPE_Q5_K, v1::DTYPE_Q6_K});
    for (DType wt : types) {
      std::mt19937_64 rng(11);
      const DTypeLayout l = LayoutOf(wt);
      const std::vector<uint8_t> wq =
          RandomBlocks(rng, wt, n * (k / l.block_elems) * l.block_bytes);
      for (int64_t m : {int64_t{1}, int64_t{8}}) {
        Prepared q = Prepare(cpu, v1::OP_DEQUANT_MATMUL, wt, m, n, k, wq, set_bytes);
        Prepared f = Prepare(cpu, v1::OP_MATMUL, wt, m, n, k, wq, set_bytes);
        Prepared i8;
        if (int8 != 0) i8 = Prepare(cpu, v1::OP_DEQUANT_MATMUL, wt, m, n, k, wq, set_bytes, true);
        for (int i = 0; i < 3; ++i) {
          TimeOne(q, **stream), TimeOne(f, **stream);  // warm up
          if (int8 != 0) TimeOne(i8, **stream);
        }
        std::vector<double> tq, tf, tr, tp, t8;
        size_t sweep_next = q.weights.size() / 2;  // a copy the kernel did not just read
        size_t portable_next = q.weights.size() / 4;
        for (int64_t s = 0; s < samples; ++s) {
          tq.push_back(TimeOne(q, **stream));
          if (int8 != 0) t8.push_back(TimeOne(i8, **stream));
          tf.push_back(TimeOne(f, **stream));
          tr.push_back(TimeSweep(q, sweep_next));
          if (m == 1) tp.push_back(TimePortable(q, wt, n, k, portable_next));
        }
        auto figures = [&](const Prepared& p, const std::vector<double>& t) {
          const double med = Quantile(t, 0.5), best = Quantile(t, 0), p10 = Quantile(t, 0.1);
          const double gbps = p.weight_bytes / med / 1e9, best_gbps = p.weight_bytes / best / 1e9;
          return nlohmann::json{{"implementation", p.kernel->implementation()},
                                {"weight_mib", p.weight_bytes / 1048576.0},
                                {"median_ms", med * 1e3},
                                {"p10_ms", p10 * 1e3},
                                {"best_ms", best * 1e3},
                                {"weights_gbps_median", gbps},
                                {"weights_gbps_best", best_gbps},
                                {"pct_of_read_sweep_median", 100 * Quantile(tr, 0.5) / med},
                                {"pct_of_read_sweep_best", 100 * Quantile(tr, 0) / best},
                                {"gflops_median", 2.0 * m * n * k / med / 1e9}};
        };
        nlohmann::json r;
        r["dtype"] = DTypeName(wt);
        r["m"] = m;
        r["kiln"] = figures(q, tq);
        if (int8 != 0) {
          r["kiln_int8_activations"] = figures(i8, t8);
          // Every weight copy holds the same bytes and x is the same: compare
          // the last outputs.
          const float* ye = static_cast<const float*>(q.y->host_ptr());
          const float* y8 = static_cast<const float*>(i8.y->host_ptr());
          double se = 0, sd = 0, md = 0;
          for (int64_t i = 0; i < m * n; ++i) {
            const double d = static_cast<double>(y8[i]) - ye[i];
            se += static_cast<double>(ye[i]) * ye[i];
            sd += d * d;
            md = std::max(md, std::abs(d));
          }
          const double rms = std::sqrt(se / (m * n));
          r["int8_error"] = {{"rms_over_rms_y", std::sqrt(sd / (m * n)) / rms},
                             {"max_over_rms_y", md / rms}};
          r["speedup_int8_vs_exact_median"] = Quantile(tq, 0.5) / Quantile(t8, 0.5);
          r["speedup_int8_vs_exact_best"] = Quantile(tq, 0) / Quantile(t8, 0);
          std::fprintf(stderr,
                       "threads=%d %s m=%lld: int8 median %.3f ms p10 %.3f best %.3f ms (%.1f GB/s best, "
                       "%.0f%% / %.0f%% of the read, median / best), exact best %.3f ms (%.0f%%); "
                       "int8 error rms %.2e max %.2e of rms(y)\n",
                       threads, DTypeName(wt).c_str(), static_cast<long long>(m),
                       Quantile(t8, 0.5) * 1e3, Quantile(t8, 0.1) * 1e3, Quantile(t8, 0) * 1e3,
                       i8.weight_bytes / Quantile(t8, 0) / 1e9,
                       100 * Quantile(tr, 0.5) / Quantile(t8, 0.5), 100 * Quantile(tr, 0) / Quantile(t8, 0),
                       Quantile(tq, 0) * 1e3, 100 * Quantile(tr, 0) / Quantile(tq, 0),
                       std::sqrt(sd / (m * n)) / rms, md / rms);
        }
        r["onednn_f32_dequantized"] = figures(f, tf);
        r["read_sweep_of_the_same_bytes"] =
            nlohmann::json({{"median_ms", Quantile(tr, 0.5) * 1e3},
                            {"best_ms", Quantile(tr, 0) * 1e3},
                            {"gbps_median", q.weight_bytes / Quantile(tr, 0.5) / 1e9},
                            {"gbps_best", q.weight_bytes / Quantile(tr, 0) / 1e9}});
        if (m == 1) {
          const double med = Quantile(tp, 0.5), best = Quantile(tp, 0);
          r["portable_matvec"] = nlohmann::json{
              {"median_ms", med * 1e3},
              {"best_ms", best * 1e3},
              {"weights_gbps_median", q.weight_bytes / med / 1e9},
              {"weights_gbps_best", q.weight_bytes / best / 1e9},
              {"pct_of_read_sweep_median", 100 * Quantile(tr, 0.5) / med},
              {"pct_of_read_sweep_best", 100 * Quantile(tr, 0) / best}};
          r["speedup_vs_portable_median"] = med / Quantile(tq, 0.5);
          std::fprintf(stderr, "threads=%d %s m=1: portable matvec median %.3f ms (%.1f GB/s, %.0f%% of the read)\n",
                       threads, DTypeName(wt).c_str(), med * 1e3, q.weight_bytes / med / 1e9,
                       100 * Quantile(tr, 0.5) / med);
        }
        r["speedup_vs_onednn_f32_median"] = Quantile(tf, 0.5) / Quantile(tq, 0.5);
        r["speedup_vs_onednn_f32_best"] = Quantile(tf, 0) / Quantile(tq, 0);
        std::fprintf(stderr,
                     "threads=%d %s m=%lld: kiln median %.3f ms best %.3f ms (%.1f / %.1f GB/s, "
                     "%.0f%% / %.0f%% of a read sweep of the same bytes; 1 GiB sweep %.1f GB/s), "
                     "onednn f32 median %.3f ms best %.3f ms, %.2fx / %.2fx\n",
                     threads, DTypeName(wt).c_str(), static_cast<long long>(m),
                     r["kiln"]["median_ms"].get<double>(), r["kiln"]["best_ms"].get<double>(),
                     r["kiln"]["weights_gbps_median"].get<double>(),
                     r["kiln"]["weights_gbps_best"].get<double>(),
                     r["kiln"]["pct_of_read_sweep_median"].get<double>(),
                     r["kiln"]["pct_of_read_sweep_best"].get<double>(), bw.read_gbps,
                     r["onednn_f32_dequantized"]["median_ms"].get<double>(),
                     r["onednn_f32_dequantized"]["best_ms"].get<double>(),
                     r["speedup_vs_onednn_f32_median"].get<double>(),
                     r["speedup_vs_onednn_f32_best"].get<double>());
        run["results"].push_back(r);
      }
    }
    out["runs"].push_back(run);
  }
  {
    std::ifstream load("/proc/loadavg");
    std::string l1;
    load >> l1;
    out["machine"]["loadavg_1m_at_end"] = l1;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
