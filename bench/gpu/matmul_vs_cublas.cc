// Kiln's MatMul on one device (our kernels, through the backend interface:
// vulkan:0's shaders, or cuda:0's cuBLASLt path) vs cuBLAS on the same GPU in
// the same process: f32 vs cuBLAS SGEMM (no TF32 on either side), f16 and
// bf16 vs cuBLAS GemmEx with f32 accumulation. Both sides multiply the same
// random operands in [-1, 1); the Kiln result is checked against cuBLAS
// (16-bit types: a GemmEx with an f32 result, so the reference is not
// rounded twice): max_abs_err, and max_rel_err = max_abs_err / max
// |reference|. Medians of timed batches after warm-up (device events on
// both sides); prints JSON with ratio = cuBLAS time / Kiln time.
//
// --epilogues none,bias_gelu: bias_gelu times C = gelu_tanh(A @ B + bias)
// (bias [n]): Kiln's FusedMatMul (has_bias, GELU tanh) against cuBLASLt's
// CUBLASLT_EPILOGUE_GELU_BIAS with the heuristic's first algorithm and a
// 32 MiB workspace; both results have the operand dtype and are compared
// with each other. f16/bf16 only (cuBLASLt has no f32 GELU epilogue without
// TF32 on every version); the entry is "<dtype>_bias_gelu".
//
// --dtypes tf32: f32 operands, Kiln's MatMul with MatMulAttrs.allow_tf32
// (what CompileOptions.allow_tf32 sets; cuBLASLt FAST_TF32) against
// cublasSgemm in CUBLAS_TF32_TENSOR_OP_MATH; the errors are against the
// pedantic (f32) SGEMM, and the entry also gives Kiln's f32 product without
// TF32 in the same run (kiln_f32_ms, tf32_speedup = kiln_f32_ms / kiln_ms).
//
//   matmul_vs_cublas [--device vulkan:0] [--dtypes f32,f16,bf16,tf32] [--sizes 1024,2048,4096,8192]
//                    [--reps 10] [--coop_tiles 128x128x32x2x4x8,...] [--epilogues none,bias_gelu]
// --coop_tiles (vulkan) also times the f16 product once per
// KILN_VULKAN_COOP_TILE (BMxBNxBKxSG_MxSG_NxGROUP_M) given, for tuning.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/half.h"
#include "nlohmann/json.hpp"
#include "bench/gpu/bench_device.h"
#include "bench/gpu/bench_util.h"

namespace {

using json = nlohmann::json;

using kiln::bench::Median;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= s.size();) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    if (q > p) out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

// `count` random values in [-1, 1), as the dtype stores them.
std::vector<char> RandomValues(kiln::DType dt, int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const bool wide = dt == kiln::v1::DTYPE_F32;
  std::vector<char> bytes(count * (wide ? 4 : 2));
  for (int64_t i = 0; i < count; ++i) {
    const float v = dist(rng);
    if (wide) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      continue;
    }
    const uint16_t h = dt == kiln::v1::DTYPE_F16 ? kiln::FloatToHalf(v) : kiln::FloatToBf16(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

std::vector<float> ToFloats(kiln::DType dt, const std::vector<char>& bytes) {
  const bool wide = dt == kiln::v1::DTYPE_F32;
  std::vector<float> out(bytes.size() / (wide ? 4 : 2));
  for (size_t i = 0; i < out.size(); ++i) {
    if (wide) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      continue;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = dt == kiln::v1::DTYPE_F16 ? kiln::HalfToFloat(h) : kiln::Bf16ToFloat(h);
  }
  return out;
}

struct Errors {
  double max_abs = -1, max_rel = -1;
};

Errors Compare(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size() || want.empty()) return {};
  double max_abs = 0, ref_max = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    max_abs = std::isfinite(d) ? std::max(max_abs, d) : INFINITY;
    ref_max = std::max(ref_max, std::fabs(double(want[i])));
  }
  return {max_abs, ref_max > 0 ? max_abs / ref_max : max_abs};
}

// One n x n product's operands on the Kiln device, reused across kernels.
class Operands {
 public:
  Operands(kiln::backend::Device& dev, kiln::DType dtype, int64_t n, const std::vector<char>& a,
           const std::vector<char>& b, const std::vector<char>& bias)
      : dev_(dev), dtype_(dtype), n_(n) {
    const int64_t bytes = static_cast<int64_t>(a.size());
    auto stream = dev.CreateStream();
    if (!stream.ok()) return;
    stream_ = std::move(stream).value();
    for (int i = 0; i < 3; ++i) {
      auto buf = dev.Allocate(bytes);
      if (!buf.ok()) return;
      bufs_.push_back(std::move(buf).value());
      views_.push_back({bufs_.back().get(), 0, bytes});
    }
    const int64_t bias_bytes = static_cast<int64_t>(bias.size());
    auto bias_buf = dev.Allocate(bias_bytes);
    if (!bias_buf.ok()) return;
    bufs_.push_back(std::move(bias_buf).value());
    views_.push_back({bufs_.back().get(), 0, bias_bytes});
    ok_ = dev.CopyToDevice(*stream_, a.data(), views_[0]).ok() &&
          dev.CopyToDevice(*stream_, b.data(), views_[1]).ok() &&
          dev.CopyToDevice(*stream_, bias.data(), views_[3]).ok() && stream_->Synchronize().ok();
  }

  // Milliseconds per product (median over `rounds` batches of `reps`), the
  // kernel's implementation name and its result; -1 ms where it cannot run.
  // bias_gelu: FusedMatMul with the bias and GELU (tanh).
  double Time(int reps, int rounds, bool bias_gelu, std::string* impl, std::vector<float>* result,
              bool tf32 = false) {
    kiln::backend::KernelSpec spec;
    spec.name = spec.label = "bench_matmul";
    spec.inputs = {{dtype_, {n_, n_}}, {dtype_, {n_, n_}}};
    spec.outputs = {{dtype_, {n_, n_}}};
    if (bias_gelu) {
      spec.op = kiln::v1::OP_FUSED_MATMUL;
      spec.attrs.mutable_fused_matmul()->set_has_bias(true);
      spec.attrs.mutable_fused_matmul()->set_activation(kiln::v1::UNARY_GELU_TANH);
      spec.inputs.push_back({dtype_, {n_}});
    } else {
      spec.op = kiln::v1::OP_MATMUL;
      spec.attrs.mutable_matmul()->set_allow_tf32(tf32);
    }
    if (!ok_ || !dev_.Supports(spec).native) return -1;
    kiln::backend::PrepareContext ctx;
    auto kernel = dev_.PrepareKernel(spec, ctx);
    if (!kernel.ok()) return -1;
    *impl = (*kernel)->implementation();
    std::vector<kiln::backend::BufferView> ins = {views_[0], views_[1]}, outs = {views_[2]};
    if (bias_gelu) ins.push_back(views_[3]);
    // A kernel that fails must not pass on the previous kernel's result.
    const std::vector<char> zeros(views_[2].bytes);
    if (!dev_.CopyToDevice(*stream_, zeros.data(), views_[2]).ok()) return -1;
    for (int i = 0; i < 3; ++i) {
      if (!(*kernel)->Launch(*stream_, ins, outs).ok()) return -1;
    }
    if (!stream_->Synchronize().ok()) return -1;
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) {
      auto e0 = stream_->Record();
      for (int i = 0; i < reps; ++i) (void)(*kernel)->Launch(*stream_, ins, outs);
      auto e1 = stream_->Record();
      if (!e0.ok() || !e1.ok() || !stream_->Synchronize().ok()) return -1;
      auto us = (*e1)->MicrosSince(**e0);
      if (!us.ok()) return -1;
      ms.push_back(*us / 1000.0 / reps);
    }
    std::vector<char> host(views_[2].bytes);
    if (!dev_.CopyToHost(*stream_, views_[2], host.data()).ok() || !stream_->Synchronize().ok()) {
      return -1;
    }
    *result = ToFloats(dtype_, host);
    return Median(ms);
  }

 private:
  kiln::backend::Device& dev_;
  kiln::DType dtype_;
  int64_t n_;
  bool ok_ = false;
  std::unique_ptr<kiln::backend::Stream> stream_;
  std::vector<std::unique_ptr<kiln::backend::Buffer>> bufs_;
  std::vector<kiln::backend::BufferView> views_;
};

// Row-major C = A @ B with cuBLAS (column-major): C^T = B^T A^T. f16/bf16:
// the timed GEMM has a 16-bit result; `reference` gets an f32-result GEMM.
double TimeCublas(cublasHandle_t h, kiln::DType dt, int64_t n, const std::vector<char>& ha,
                  const std::vector<char>& hb, int reps, int rounds,
                  std::vector<float>* reference) {
  const bool half = dt != kiln::v1::DTYPE_F32;
  const cudaDataType in_type = dt == kiln::v1::DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
  const size_t elem = half ? 2 : 4;
  void *a, *b, *c, *ref;
  CHECK_CUDA(cudaMalloc(&a, n * n * elem));
  CHECK_CUDA(cudaMalloc(&b, n * n * elem));
  CHECK_CUDA(cudaMalloc(&c, n * n * elem));
  CHECK_CUDA(cudaMalloc(&ref, n * n * 4));
  CHECK_CUDA(cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, hb.data(), hb.size(), cudaMemcpyHostToDevice));
  const float one = 1.f, zero = 0.f;
  auto gemm = [&](void* out, cudaDataType out_type) {
    if (half) {
      CHECK_CUDA(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, in_type, n, a, in_type,
                              n, &zero, out, out_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      CHECK_CUDA(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, static_cast<float*>(b), n,
                             static_cast<float*>(a), n, &zero, static_cast<float*>(out), n));
    }
  };
  const cudaDataType out_type = half ? in_type : CUDA_R_32F;
  for (int i = 0; i < 3; ++i) gemm(c, out_type);
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) gemm(c, out_type);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / reps);
  }
  gemm(ref, CUDA_R_32F);
  reference->resize(n * n);
  CHECK_CUDA(cudaMemcpy(reference->data(), ref, n * n * 4, cudaMemcpyDeviceToHost));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(ref);
  return Median(ms);
}

// gelu_tanh(A @ B + bias) with cuBLASLt's GELU_BIAS epilogue (row-major as
// column-major C^T = B^T A^T: the bias runs along C^T's rows, C's columns).
// `result` gets the 16-bit output, widened.
double TimeCublasLtBiasGelu(cublasLtHandle_t lt, kiln::DType dt, int64_t n,
                            const std::vector<char>& ha, const std::vector<char>& hb,
                            const std::vector<char>& hbias, int reps, int rounds,
                            std::vector<float>* result) {
  const cudaDataType type = dt == kiln::v1::DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
  void *a, *b, *c, *bias, *ws;
  const size_t ws_bytes = size_t{32} << 20;
  CHECK_CUDA(cudaMalloc(&a, n * n * 2));
  CHECK_CUDA(cudaMalloc(&b, n * n * 2));
  CHECK_CUDA(cudaMalloc(&c, n * n * 2));
  CHECK_CUDA(cudaMalloc(&bias, n * 2));
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  CHECK_CUDA(cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, hb.data(), hb.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(bias, hbias.data(), hbias.size(), cudaMemcpyHostToDevice));
  cublasLtMatmulDesc_t op;
  CHECK_CUDA(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_BIAS;
  CHECK_CUDA(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  CHECK_CUDA(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  CHECK_CUDA(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
  cublasLtMatrixLayout_t layout;
  CHECK_CUDA(cublasLtMatrixLayoutCreate(&layout, type, n, n, n));
  cublasLtMatmulPreference_t pref;
  CHECK_CUDA(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_CUDA(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  CHECK_CUDA(cublasLtMatmulAlgoGetHeuristic(lt, op, layout, layout, layout, layout, pref, 1, &heur,
                                            &found));
  if (found == 0) {
    std::fprintf(stderr, "cuBLASLt has no GELU_BIAS algorithm for n=%lld\n",
                 static_cast<long long>(n));
    std::exit(1);
  }
  const float one = 1.f, zero = 0.f;
  auto gemm = [&] {
    CHECK_CUDA(cublasLtMatmul(lt, op, &one, b, layout, a, layout, &zero, c, layout, c, layout,
                              &heur.algo, ws, ws_bytes, 0));
  };
  for (int i = 0; i < 3; ++i) gemm();
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) gemm();
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / reps);
  }
  std::vector<char> host(n * n * 2);
  CHECK_CUDA(cudaMemcpy(host.data(), c, host.size(), cudaMemcpyDeviceToHost));
  *result = ToFloats(dt, host);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(layout);
  cublasLtMatmulDescDestroy(op);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(bias);
  cudaFree(ws);
  return Median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {1024, 2048, 4096, 8192};
  std::vector<std::string> coop_tiles, dtypes = {"f32", "f16"}, epilogues = {"none"};
  std::string device_id = "vulkan:0";
  int reps = 10;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--coop_tiles") == 0) coop_tiles = Split(argv[i + 1]);
    if (std::strcmp(argv[i], "--dtypes") == 0) dtypes = Split(argv[i + 1]);
    if (std::strcmp(argv[i], "--epilogues") == 0) epilogues = Split(argv[i + 1]);
    if (std::strcmp(argv[i], "--device") == 0) device_id = argv[i + 1];
    if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      for (const std::string& s : Split(argv[i + 1])) sizes.push_back(std::stoll(s));
    }
  }
  std::vector<std::unique_ptr<kiln::backend::Backend>> backends;
  kiln::backend::Device* dev = kiln::bench::OpenDevice(device_id, &backends);
  if (dev == nullptr) {
    std::fprintf(stderr, "no device %s\n", device_id.c_str());
    return 1;
  }
  cublasHandle_t h;
  CHECK_CUDA(cublasCreate(&h));
  cublasLtHandle_t lt;
  CHECK_CUDA(cublasLtCreate(&lt));
  const bool want_plain = std::find(epilogues.begin(), epilogues.end(), "none") != epilogues.end();
  const bool want_bias_gelu =
      std::find(epilogues.begin(), epilogues.end(), "bias_gelu") != epilogues.end();
  json results = json::array();
  for (int64_t n : sizes) {
    const int r = n >= 8192 ? std::max(2, reps / 4) : reps;
    const double flop = 2.0 * n * n * n;
    auto tflops = [&](double ms) { return ms > 0 ? flop / ms / 1e9 : 0.0; };
    json row = {{"n", n}};
    for (const std::string& name : dtypes) {
      const kiln::DType dtype = name == "f16"    ? kiln::v1::DTYPE_F16
                                : name == "bf16" ? kiln::v1::DTYPE_BF16
                                                 : kiln::v1::DTYPE_F32;
      const bool half = dtype != kiln::v1::DTYPE_F32;
      const bool tf32 = name == "tf32";
      const std::vector<char> a = RandomValues(dtype, n * n, 2 * n + half);
      const std::vector<char> b = RandomValues(dtype, n * n, 2 * n + half + 7);
      const std::vector<char> bias = RandomValues(dtype, n, 3 * n + half);
      Operands operands(*dev, dtype, n, a, b, bias);
      std::vector<float> want, got;
      auto measure = [&](json entry, bool bias_gelu, double cb) {
        std::string impl;
        const double ms = operands.Time(r, 5, bias_gelu, &impl, &got, tf32);
        const Errors err = ms > 0 ? Compare(got, want) : Errors{};
        entry.update({{"kiln_ms", ms},
                      {"kiln_tflops", tflops(ms)},
                      {"ratio", ms > 0 ? cb / ms : 0.0},
                      {"impl", impl},
                      {"max_abs_err", err.max_abs},
                      {"max_rel_err", err.max_rel}});
        return entry;
      };
      if (want_plain && tf32) {
        // The f32 reference (pedantic SGEMM), then both sides with TF32.
        CHECK_CUDA(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
        std::vector<float> tf32_ref;
        const double exact_cb = TimeCublas(h, dtype, n, a, b, 1, 1, &want);
        CHECK_CUDA(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
        const double cb = TimeCublas(h, dtype, n, a, b, r, 5, &tf32_ref);
        const Errors cublas_err = Compare(tf32_ref, want);
        json entry = measure({{"cublas_ms", cb},
                              {"cublas_tflops", tflops(cb)},
                              {"cublas_max_rel_err", cublas_err.max_rel},
                              {"cublas_f32_ms_one_call", exact_cb}},
                             false, cb);
        std::string f32_impl;
        std::vector<float> f32_got;
        const double f32_ms = operands.Time(r, 5, false, &f32_impl, &f32_got, false);
        entry["kiln_f32_ms"] = f32_ms;
        entry["tf32_speedup"] = f32_ms > 0 && entry["kiln_ms"].get<double>() > 0
                                    ? f32_ms / entry["kiln_ms"].get<double>()
                                    : 0.0;
        row[name] = entry;
        std::fprintf(stderr,
                     "%s n=%lld tf32: kiln %.3f ms (%s), cublas tf32 %.3f ms, ratio %.3f; "
                     "kiln f32 %.3f ms, speedup %.2f; rel err %.2e (cublas %.2e)\n",
                     device_id.c_str(), static_cast<long long>(n), entry["kiln_ms"].get<double>(),
                     entry["impl"].get<std::string>().c_str(), cb, entry["ratio"].get<double>(),
                     f32_ms, entry["tf32_speedup"].get<double>(),
                     entry["max_rel_err"].get<double>(), cublas_err.max_rel);
      } else if (want_plain) {
        // SGEMM without TF32; 16-bit GEMMs on tensor cores.
        CHECK_CUDA(cublasSetMathMode(h, half ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
        const double cb = TimeCublas(h, dtype, n, a, b, r, 5, &want);
        json entry = measure({{"cublas_ms", cb}, {"cublas_tflops", tflops(cb)}}, false, cb);
        if (dtype == kiln::v1::DTYPE_F16 && !coop_tiles.empty()) {
          json sweep = json::array();
          for (const std::string& tile : coop_tiles) {
            setenv("KILN_VULKAN_COOP_TILE", tile.c_str(), 1);
            sweep.push_back(measure({{"tile", tile}}, false, cb));
          }
          unsetenv("KILN_VULKAN_COOP_TILE");
          entry["coop_tiles"] = sweep;
        }
        row[name] = entry;
        std::fprintf(stderr, "%s n=%lld %s: kiln %.3f ms, cublas %.3f ms, ratio %.3f\n",
                     device_id.c_str(), static_cast<long long>(n), name.c_str(),
                     entry["kiln_ms"].get<double>(), cb, entry["ratio"].get<double>());
      }
      if (want_bias_gelu && half) {
        const double cb = TimeCublasLtBiasGelu(lt, dtype, n, a, b, bias, r, 5, &want);
        json entry = measure({{"cublas_ms", cb}, {"cublas_tflops", tflops(cb)}}, true, cb);
        row[name + "_bias_gelu"] = entry;
        std::fprintf(stderr, "%s n=%lld %s+bias+gelu: kiln %.3f ms, cublasLt %.3f ms, ratio %.3f\n",
                     device_id.c_str(), static_cast<long long>(n), name.c_str(),
                     entry["kiln_ms"].get<double>(), cb, entry["ratio"].get<double>());
      }
    }
    results.push_back(row);
  }
  cublasLtDestroy(lt);
  cublasDestroy(h);
  std::printf("%s\n", json({{"bench", "matmul_vs_cublas"},
                            {"device", dev->info().id},
                            {"name", dev->info().name},
                            {"driver", dev->info().driver_version},
                            {"features", dev->info().features},
                            {"results", results}})
                          .dump()
                          .c_str());
  return 0;
}
