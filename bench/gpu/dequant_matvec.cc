// DequantMatMul on cuda:0 against the device's copy bandwidth, in one process:
// Kiln's fused dequant kernels (kernels/dequant_matmul.cu, through the
// backend interface) on LLM-layer weights, q4_k and q8_0, M = 1 (decode) and 8
// (the matvec kernel), 16 .. 512 (batches and prefill: the tensor-core kernel), as GB/s of
// quantized weights streamed, vs cudaMemcpyAsync device to device (read +
// write counted) in the same process. bench/gpu/torch_dequant_matvec.py is
// the PyTorch peer (a bf16 matvec of the dequantized weight), run beside it
// by bench/gpu/dequant_matvec.sh. Each result is checked on sampled outputs
// against an f64 dequantize-then-matmul reference (max_rel_err, relative to
// sum |x w|). Device events; the median of --rounds batches of --reps
// launches after warm-up. Prints one JSON object.
//
//   dequant_matvec [--device=cuda:0] [--types=q4_k,q8_0] [--shapes=4096x4096,14336x4096,...]
//                  [--ms=1,8,16,32,64,128,512] [--act=f32|bf16] [--reps=50] [--rounds=7]
//                  [--variants=default,KILN_DEQUANT_PATH=mma+KILN_DEQUANT_SPLITS=2,...]
//                  (shapes are N x K; each variant's ENV=VALUE pairs are set while its
//                  kernel is prepared, so one process times several kernel choices)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "backends/backend.h"
#include "backends/common/quant_blocks.h"
#include "base/half.h"
#include "nlohmann/json.hpp"
#include "bench/gpu/bench_device.h"
#include "bench/gpu/bench_util.h"

ABSL_FLAG(std::string, device, "cuda:0", "device id");
ABSL_FLAG(std::vector<std::string>, types, std::vector<std::string>({"q4_k", "q8_0"}),
          "block types");
ABSL_FLAG(std::vector<std::string>, shapes,
          std::vector<std::string>({"4096x4096", "14336x4096", "4096x14336"}),
          "weights, N x K (stored [N, K] as GGUF stores a linear layer)");
ABSL_FLAG(std::vector<std::string>, ms,
          std::vector<std::string>({"1", "8", "16", "32", "64", "128", "512"}),
          "activation rows (<= 8: the matvec kernel; more: the tensor-core one on sm_80+; "
          "KILN_DEQUANT_PATH=matvec|mma|tiled forces one)");
ABSL_FLAG(std::string, act, "f32", "activation type: f32 or bf16");
ABSL_FLAG(int, reps, 50, "launches per timed batch");
ABSL_FLAG(int, rounds, 7, "timed batches (the median is reported)");
ABSL_FLAG(std::vector<std::string>, variants, std::vector<std::string>({"default"}),
          "kernel choices to time: 'default', or '+'-joined ENV=VALUE pairs set while the "
          "kernel is prepared (KILN_DEQUANT_PATH, KILN_DEQUANT_SPLITS, KILN_DEQUANT_MV_ROWS)");

namespace {

using json = nlohmann::json;
using kiln::DType;
namespace v1 = kiln::v1;

using kiln::bench::Median;

// A --variants entry as (name, value) pairs; "default" sets nothing.
std::vector<std::pair<std::string, std::string>> VariantEnv(const std::string& variant) {
  std::vector<std::pair<std::string, std::string>> env;
  if (variant == "default") return env;
  for (absl::string_view kv : absl::StrSplit(variant, '+')) {
    std::vector<std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.size() == 2 && !p[0].empty()) env.emplace_back(p[0], p[1]);
  }
  return env;
}

void PutHalf(uint8_t* p, double v) {
  const uint16_t h = kiln::FloatToHalf(static_cast<float>(v));
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Random blocks with sane scales (decoded weights within about [-1, 1]).
std::vector<uint8_t> RandomBlocks(std::mt19937_64& rng, DType wt, int64_t elements) {
  const kiln::DTypeLayout l = kiln::LayoutOf(wt);
  const int64_t blocks = elements / l.block_elems;
  std::vector<uint8_t> w(blocks * l.block_bytes);
  for (size_t i = 0; i < w.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(w.data() + i, &r, std::min<size_t>(8, w.size() - i));
  }
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = w.data() + i * l.block_bytes;
    switch (wt) {
      case v1::DTYPE_Q8_0: PutHalf(b, 1.0 / 128); break;
      case v1::DTYPE_Q4_0: PutHalf(b, 1.0 / 8); break;
      case v1::DTYPE_Q4_K: PutHalf(b, 1.0 / (63 * 15)), PutHalf(b + 2, 1.0 / 126); break;
      case v1::DTYPE_Q5_K: PutHalf(b, 1.0 / (63 * 31)), PutHalf(b + 2, 1.0 / 126); break;
      default: PutHalf(b + 208, 1.0 / (128 * 32)); break;
    }
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device_id = absl::GetFlag(FLAGS_device);
  const int reps = absl::GetFlag(FLAGS_reps), rounds = absl::GetFlag(FLAGS_rounds);
  const std::string act_name = absl::GetFlag(FLAGS_act);
  if (act_name != "f32" && act_name != "bf16") {
    std::fprintf(stderr, "--act must be f32 or bf16\n");
    return 2;
  }
  const DType act = act_name == "f32" ? v1::DTYPE_F32 : v1::DTYPE_BF16;
  const int64_t esize = act == v1::DTYPE_F32 ? 4 : 2;
  if (reps <= 0 || rounds <= 0) {
    std::fprintf(stderr, "--reps and --rounds must be positive\n");
    return 2;
  }
  std::vector<std::unique_ptr<kiln::backend::Backend>> backends;
  kiln::backend::Device* dev = kiln::bench::OpenDevice(device_id, &backends);
  if (dev == nullptr) {
    std::fprintf(stderr, "no device %s\n", device_id.c_str());
    return 1;
  }
  auto stream_or = dev->CreateStream();
  if (!stream_or.ok()) return 1;
  auto& stream = *stream_or;

  // The copy ceiling: cudaMemcpyAsync d2d of 256 MiB (larger than L2).
  double copy_ms = 0;
  const int64_t copy_bytes = int64_t{256} << 20;
  {
    void *a, *b;
    CHECK_CUDA(cudaMalloc(&a, copy_bytes));
    CHECK_CUDA(cudaMalloc(&b, copy_bytes));
    CHECK_CUDA(cudaMemset(a, 1, copy_bytes));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) {
      CHECK_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice));
    }
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) {
      CHECK_CUDA(cudaEventRecord(e0));
      for (int i = 0; i < 10; ++i) {
        CHECK_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice));
      }
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t / 10);
    }
    copy_ms = Median(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
  }
  const double copy_gbps = 2.0 * copy_bytes / copy_ms / 1e6;
  std::fprintf(stderr, "copy (cudaMemcpyAsync d2d, 256 MiB): %.4f ms, %.0f GB/s\n", copy_ms,
               copy_gbps);

  json results = json::array();
  std::mt19937_64 rng(42);
  for (const std::string& type_name : absl::GetFlag(FLAGS_types)) {
    const std::optional<DType> wt = kiln::ParseDType(type_name);
    if (!wt || !kiln::IsQuantized(*wt)) {
      std::fprintf(stderr, "not a block type: %s\n", type_name.c_str());
      return 2;
    }
    for (const std::string& shape : absl::GetFlag(FLAGS_shapes)) {
      std::vector<std::string> nk = absl::StrSplit(shape, 'x');
      int64_t n = 0, k = 0;
      if (nk.size() != 2 || !absl::SimpleAtoi(nk[0], &n) || !absl::SimpleAtoi(nk[1], &k) ||
          n <= 0 || k <= 0 || n > (1 << 20) || k > (1 << 20) ||
          k % kiln::LayoutOf(*wt).block_elems != 0) {
        std::fprintf(stderr, "bad shape %s\n", shape.c_str());
        return 2;
      }
      const std::vector<uint8_t> w = RandomBlocks(rng, *wt, n * k);
      const int64_t w_bytes = static_cast<int64_t>(w.size());
      auto wbuf = dev->Allocate(w_bytes);
      if (!wbuf.ok() || !dev->CopyToDevice(*stream, w.data(), {wbuf->get(), 0, w_bytes}).ok()) {
        std::fprintf(stderr, "weight upload failed\n");
        return 1;
      }
      for (const std::string& m_text : absl::GetFlag(FLAGS_ms)) {
        int64_t m = 0;
        if (!absl::SimpleAtoi(m_text, &m) || m <= 0 || m > 4096) return 2;
        std::uniform_real_distribution<float> u(-1, 1);
        std::vector<float> x(m * k);
        std::vector<uint16_t> x16(act == v1::DTYPE_BF16 ? m * k : 0);
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = u(rng);
          if (act == v1::DTYPE_BF16) {
            x16[i] = kiln::FloatToBf16(x[i]);
            x[i] = kiln::Bf16ToFloat(x16[i]);
          }
        }
        for (const std::string& variant : absl::GetFlag(FLAGS_variants)) {
          kiln::backend::KernelSpec spec;
          spec.name = spec.label = "bench_dequant_matmul";
          spec.op = v1::OP_DEQUANT_MATMUL;
          spec.attrs.mutable_dequant_matmul()->set_transpose_b(true);
          spec.inputs = {{act, {m, k}}, {*wt, {n, k}}};
          spec.outputs = {{act, {m, n}}};
          json entry = {
              {"type", type_name},       {"act", act_name},   {"n", n}, {"k", k}, {"m", m},
              {"weight_bytes", w_bytes}, {"variant", variant}};
          kiln::backend::PrepareContext ctx;
          const auto env = VariantEnv(variant);
          for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
          auto kernel = dev->PrepareKernel(spec, ctx);
          for (const auto& [name, value] : env) unsetenv(name.c_str());
          auto xbuf = dev->Allocate(m * k * esize);
          auto ybuf = dev->Allocate(m * n * esize);
          if (!kernel.ok() || !xbuf.ok() || !ybuf.ok()) {
            entry["error"] = kernel.ok() ? "allocate" : std::string(kernel.status().message());
            results.push_back(entry);
            continue;
          }
          const kiln::backend::BufferView ins[] = {{xbuf->get(), 0, m * k * esize},
                                                   {wbuf->get(), 0, w_bytes}};
          const kiln::backend::BufferView outs[] = {{ybuf->get(), 0, m * n * esize}};
          const void* xsrc = act == v1::DTYPE_F32 ? static_cast<const void*>(x.data()) : x16.data();
          if (!dev->CopyToDevice(*stream, xsrc, ins[0]).ok()) return 1;
          auto launch = [&] { return (*kernel)->Launch(*stream, ins, outs).ok(); };
          bool ok = launch() && launch() && launch() && stream->Synchronize().ok();
          std::vector<double> ms;
          for (int r = 0; ok && r < rounds; ++r) {
            auto e0 = stream->Record();
            for (int i = 0; ok && i < reps; ++i) ok = launch();
            auto e1 = stream->Record();
            ok = ok && e0.ok() && e1.ok() && stream->Synchronize().ok();
            if (!ok) break;
            auto us = (*e1)->MicrosSince(**e0);
            ok = us.ok();
            if (ok) ms.push_back(*us / 1000.0 / reps);
          }
          if (!ok) {
            entry["error"] = "launch failed";
            results.push_back(entry);
            continue;
          }
          const double t = Median(ms);
          // Sampled outputs against the f64 reference.
          std::vector<float> y(m * n);
          std::vector<uint16_t> y16(act == v1::DTYPE_BF16 ? m * n : 0);
          double max_rel = -1;
          void* ydst = act == v1::DTYPE_F32 ? static_cast<void*>(y.data()) : y16.data();
          if (dev->CopyToHost(*stream, outs[0], ydst).ok() && stream->Synchronize().ok()) {
            for (size_t i = 0; i < y16.size(); ++i) y[i] = kiln::Bf16ToFloat(y16[i]);
            max_rel = 0;
            const int64_t row_bytes = w_bytes / n;
            const int64_t blocks = k / kiln::LayoutOf(*wt).block_elems;
            std::vector<double> wrow(k);
            for (int64_t c : {int64_t{0}, n / 3, n - 1}) {
              kiln::quant::DequantizeBlocks(*wt, w.data() + c * row_bytes, blocks, wrow.data());
              for (int64_t r = 0; r < m; ++r) {
                double ref = 0, scale = 0;
                for (int64_t j = 0; j < k; ++j) {
                  ref += double{x[r * k + j]} * wrow[j];
                  scale += std::fabs(double{x[r * k + j]} * wrow[j]);
                }
                max_rel = std::max(max_rel, std::fabs(y[r * n + c] - ref) / scale);
              }
            }
          }
          const double gbps = w_bytes / t / 1e6;
          entry.update({{"ms", t},
                        {"gbps", gbps},
                        {"of_copy", gbps / copy_gbps},
                        {"impl", (*kernel)->implementation()},
                        {"max_rel_err", max_rel}});
          std::fprintf(
              stderr, "%s %lldx%lld m=%lld: %.4f ms, %.0f GB/s = %.3f of copy (%s), rel err %.2g\n",
              type_name.c_str(), static_cast<long long>(n), static_cast<long long>(k),
              static_cast<long long>(m), t, gbps, gbps / copy_gbps,
              (*kernel)->implementation().c_str(), max_rel);
          results.push_back(entry);
        }  // variants
      }
    }
  }
  std::printf("%s\n", json({{"bench", "dequant_matvec"},
                            {"device", dev->info().id},
                            {"name", dev->info().name},
                            {"copy_ms", copy_ms},
                            {"copy_gbps", copy_gbps},
                            {"results", results}})
                          .dump()
                          .c_str());
  return 0;
}
