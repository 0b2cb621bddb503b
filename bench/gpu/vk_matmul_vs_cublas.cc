// Vulkan MatMul (our kernels, through the backend interface) vs cuBLAS on the
// same GPU in the same process: f32 vs cuBLAS SGEMM (no TF32), and f16 (the
// cooperative-matrix path where the device has it) vs cuBLAS HGEMM with f32
// accumulation. Medians of timed batches after warm-up; prints JSON.
//
//   vk_matmul_vs_cublas [--sizes 1024,2048,4096,8192] [--reps 10]
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "engine/base/half.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#define CHECK_CUDA(x)                                                          \
  do {                                                                         \
    auto e = (x);                                                              \
    if (e != 0) {                                                              \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, int(e), __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// Milliseconds per product, median over `rounds` batches of `reps`.
double TimeVulkan(kiln::backend::Device& dev, kiln::DType dtype, int64_t n, int reps, int rounds,
                  std::string* impl) {
  kiln::backend::KernelSpec spec;
  spec.name = spec.label = "bench_matmul";
  spec.op = kiln::v1::OP_MATMUL;
  spec.attrs.mutable_matmul();
  spec.inputs = {{dtype, {n, n}}, {dtype, {n, n}}};
  spec.outputs = {{dtype, {n, n}}};
  if (!dev.Supports(spec).native) return -1;
  kiln::backend::PrepareContext ctx;
  auto kernel = dev.PrepareKernel(spec, ctx);
  auto stream = dev.CreateStream();
  if (!kernel.ok() || !stream.ok()) return -1;
  *impl = (*kernel)->implementation();
  const int64_t bytes = spec.inputs[0].num_bytes();
  std::vector<std::unique_ptr<kiln::backend::Buffer>> bufs;
  std::vector<kiln::backend::BufferView> views;
  std::vector<char> host(bytes);
  for (int64_t i = 0; i < bytes; i += 2) host[i] = static_cast<char>((i / 2) % 7);  // small finite values
  for (int i = 0; i < 3; ++i) {
    bufs.push_back(std::move(dev.Allocate(bytes)).value());
    views.push_back({bufs.back().get(), 0, bytes});
    if (i < 2 && !dev.CopyToDevice(**stream, host.data(), views.back()).ok()) return -1;
  }
  std::vector<kiln::backend::BufferView> ins = {views[0], views[1]}, outs = {views[2]};
  for (int i = 0; i < 3; ++i) (void)(*kernel)->Launch(**stream, ins, outs);
  (void)(*stream)->Synchronize();
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    auto e0 = (*stream)->Record();
    for (int i = 0; i < reps; ++i) (void)(*kernel)->Launch(**stream, ins, outs);
    auto e1 = (*stream)->Record();
    (void)(*stream)->Synchronize();
    auto us = (*e1)->MicrosSince(**e0);
    if (!us.ok()) return -1;
    ms.push_back(*us / 1000.0 / reps);
  }
  return Median(ms);
}

double TimeCublas(cublasHandle_t h, bool half, int64_t n, int reps, int rounds) {
  const size_t elem = half ? 2 : 4;
  void *a, *b, *c;
  CHECK_CUDA(cudaMalloc(&a, n * n * elem));
  CHECK_CUDA(cudaMalloc(&b, n * n * elem));
  CHECK_CUDA(cudaMalloc(&c, n * n * elem));
  CHECK_CUDA(cudaMemset(a, 0, n * n * elem));
  CHECK_CUDA(cudaMemset(b, 0, n * n * elem));
  const float one = 1.f, zero = 0.f;
  auto gemm = [&] {
    if (half) {
      CHECK_CUDA(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16F, n, b,
                              CUDA_R_16F, n, &zero, c, CUDA_R_16F, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    } else {
      CHECK_CUDA(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, static_cast<float*>(a), n,
                             static_cast<float*>(b), n, &zero, static_cast<float*>(c), n));
    }
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
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return Median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {1024, 2048, 4096, 8192};
  int reps = 10;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      std::string s = argv[i + 1];
      for (size_t p = 0; p <= s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        sizes.push_back(std::stoll(s.substr(p, q - p)));
        p = q + 1;
      }
    }
  }
  std::vector<std::unique_ptr<kiln::backend::Backend>> backends;
  kiln::backend::Device* vk = nullptr;
  for (const auto& reg : kiln::backend::RegisteredBackends()) {
    if (reg.name != "vulkan") continue;
    auto b = reg.factory({});
    if (!b.ok() || (*b)->devices().empty()) {
      std::fprintf(stderr, "no Vulkan device\n");
      return 1;
    }
    vk = (*b)->devices()[0];
    backends.push_back(std::move(b).value());
  }
  if (vk == nullptr) return 1;
  cublasHandle_t h;
  CHECK_CUDA(cublasCreate(&h));
  CHECK_CUDA(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));  // SGEMM without TF32
  json results = json::array();
  for (int64_t n : sizes) {
    const int r = n >= 8192 ? std::max(2, reps / 4) : reps;
    std::string impl32, impl16;
    const double vk32 = TimeVulkan(*vk, kiln::v1::DTYPE_F32, n, r, 5, &impl32);
    const double cb32 = TimeCublas(h, false, n, r, 5);
    const double vk16 = TimeVulkan(*vk, kiln::v1::DTYPE_F16, n, r, 5, &impl16);
    CHECK_CUDA(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    const double cb16 = TimeCublas(h, true, n, r, 5);
    CHECK_CUDA(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    const double flop = 2.0 * n * n * n;
    auto tflops = [&](double ms) { return ms > 0 ? flop / ms / 1e9 : 0.0; };
    results.push_back({{"n", n},
                       {"f32", {{"kiln_vulkan_ms", vk32}, {"cublas_sgemm_ms", cb32},
                                {"kiln_tflops", tflops(vk32)}, {"cublas_tflops", tflops(cb32)},
                                {"ratio", vk32 > 0 ? cb32 / vk32 : 0.0}, {"impl", impl32}}},
                       {"f16", {{"kiln_vulkan_ms", vk16}, {"cublas_hgemm_ms", cb16},
                                {"kiln_tflops", tflops(vk16)}, {"cublas_tflops", tflops(cb16)},
                                {"ratio", vk16 > 0 ? cb16 / vk16 : 0.0}, {"impl", impl16}}}});
  }
  cublasDestroy(h);
  std::printf("%s\n", json({{"bench", "vulkan_matmul_vs_cublas"}, {"device", vk->info().name},
                            {"driver", vk->info().driver_version}, {"features", vk->info().features},
                            {"results", results}})
                          .dump()
                          .c_str());
  return 0;
}
