// Bandwidth-bound kernels against a device-to-device copy, in one process on
// one GPU: Kiln's LayerNorm (scale and bias), RmsNorm (scale) and GELU (erf)
// on a rows x cols tensor through the backend interface (cuda:0's NVRTC
// kernels), vs cudaMemcpyAsync of the same bytes (the copy ceiling) and
// Kiln's own CopyOnDevice. Bytes moved = the tensor read + the result
// written (scale/bias are counted too, a rounding error at 8192 columns).
// Device events; the median of `rounds` batches of `reps` launches after
// warm-up. Each Kiln result is checked against a host reference on a few
// sampled rows (max_abs_err). Prints one JSON object:
//   {"bench":"bandwidth_vs_copy", "copy_gbps":..., "results":[{"op":"layer_norm",
//    "ms":..., "gbps":..., "of_copy":..., "impl":..., "max_abs_err":...}, ...]}
//
//   bandwidth_vs_copy [--device cuda:0] [--rows 8192] [--cols 8192] [--dtype bf16]
//                     [--reps 20] [--rounds 7]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
using kiln::DType;
namespace v1 = kiln::v1;

using kiln::bench::Median;

using kiln::bench::DecodeFloat;
using kiln::bench::EncodeFloats;
using kiln::bench::FloatBytes;

struct Case {
  std::string op;
  kiln::backend::KernelSpec spec;
  int operands = 1;  // x, then scale, bias
};

Case MakeCase(const std::string& op, DType dt, int64_t rows, int64_t cols) {
  Case c;
  c.op = op;
  auto& s = c.spec;
  s.name = s.label = "bench_" + op;
  s.inputs = {{dt, {rows, cols}}};
  s.outputs = {{dt, {rows, cols}}};
  if (op == "layer_norm") {
    s.op = v1::OP_LAYER_NORM;
    s.attrs.mutable_layer_norm()->set_axis(-1);
    s.inputs.push_back({dt, {cols}});
    s.inputs.push_back({dt, {cols}});
    c.operands = 3;
  } else if (op == "rms_norm") {
    s.op = v1::OP_RMS_NORM;
    s.attrs.mutable_rms_norm()->set_axis(-1);
    s.inputs.push_back({dt, {cols}});
    c.operands = 2;
  } else {
    s.op = v1::OP_UNARY;
    s.attrs.mutable_unary()->set_kind(v1::UNARY_GELU);
  }
  return c;
}

// The host reference of one row (f64 math on the stored inputs).
std::vector<double> ReferenceRow(const std::string& op, const std::vector<float>& x,
                                 const std::vector<float>& scale, const std::vector<float>& bias) {
  const size_t n = x.size();
  std::vector<double> y(n);
  if (op == "gelu") {
    for (size_t i = 0; i < n; ++i) y[i] = 0.5 * x[i] * std::erfc(-x[i] / std::sqrt(2.0));
    return y;
  }
  double mean = 0, sq = 0;
  if (op == "layer_norm") {
    for (float v : x) mean += v;
    mean /= static_cast<double>(n);
  }
  for (float v : x) sq += (v - mean) * (v - mean);
  const double eps = op == "layer_norm" ? 1e-5 : 1e-6;
  const double rstd = 1 / std::sqrt(sq / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) {
    y[i] = (x[i] - mean) * rstd * scale[i] + (op == "layer_norm" ? bias[i] : 0.0);
  }
  return y;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_id = "cuda:0", dtype_name = "bf16";
  int64_t rows = 8192, cols = 8192;
  int reps = 20, rounds = 7;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) device_id = argv[i + 1];
    if (std::strcmp(argv[i], "--dtype") == 0) dtype_name = argv[i + 1];
    if (std::strcmp(argv[i], "--rows") == 0) rows = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--cols") == 0) cols = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  const DType dt = dtype_name == "f32"   ? v1::DTYPE_F32
                   : dtype_name == "f16" ? v1::DTYPE_F16
                                         : v1::DTYPE_BF16;
  if (rows <= 0 || cols <= 0 || rows > (int64_t{1} << 20) || cols > (int64_t{1} << 20) ||
      reps <= 0 || rounds <= 0) {
    std::fprintf(stderr, "bad --rows/--cols/--reps/--rounds\n");
    return 2;
  }
  std::vector<std::unique_ptr<kiln::backend::Backend>> backends;
  kiln::backend::Device* dev = kiln::bench::OpenDevice(device_id, &backends);
  if (dev == nullptr) {
    std::fprintf(stderr, "no device %s\n", device_id.c_str());
    return 1;
  }
  const int64_t n = rows * cols, bytes = n * FloatBytes(dt);

  // Operands: x in [-2, 2), scale around 1, bias small.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> x(n), scale(cols), bias(cols);
  for (float& v : x) v = dist(rng);
  for (float& v : scale) v = 1.f + 0.25f * dist(rng);
  for (float& v : bias) v = 0.1f * dist(rng);
  const std::vector<char> hx = EncodeFloats(dt, x), hs = EncodeFloats(dt, scale),
                          hb = EncodeFloats(dt, bias);
  // The reference reads the values as stored.
  for (int64_t i = 0; i < n; ++i) x[i] = DecodeFloat(dt, hx.data() + i * FloatBytes(dt));
  for (int64_t i = 0; i < cols; ++i) {
    scale[i] = DecodeFloat(dt, hs.data() + i * FloatBytes(dt));
    bias[i] = DecodeFloat(dt, hb.data() + i * FloatBytes(dt));
  }

  auto stream_or = dev->CreateStream();
  if (!stream_or.ok()) return 1;
  auto& stream = *stream_or;
  std::vector<std::unique_ptr<kiln::backend::Buffer>> bufs;
  auto alloc = [&](int64_t b) -> kiln::backend::BufferView {
    auto buf = dev->Allocate(b);
    if (!buf.ok()) {
      std::fprintf(stderr, "allocate: %s\n", std::string(buf.status().message()).c_str());
      std::exit(1);
    }
    bufs.push_back(std::move(buf).value());
    return {bufs.back().get(), 0, b};
  };
  const auto vx = alloc(bytes), vy = alloc(bytes), vs = alloc(hs.size()), vb = alloc(hb.size());
  if (!dev->CopyToDevice(*stream, hx.data(), vx).ok() ||
      !dev->CopyToDevice(*stream, hs.data(), vs).ok() ||
      !dev->CopyToDevice(*stream, hb.data(), vb).ok() || !stream->Synchronize().ok()) {
    std::fprintf(stderr, "upload failed\n");
    return 1;
  }

  // Times `launch` (one call = one pass) on Kiln's stream with its events.
  auto time_kiln = [&](const std::function<bool()>& launch) {
    return kiln::bench::TimeOnStream(*stream, rounds, reps, launch);
  };

  // The peer: cudaMemcpyAsync device to device on buffers of the same size.
  double copy_ms = 0;
  {
    void *a, *b;
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&b, bytes));
    CHECK_CUDA(cudaMemcpy(a, hx.data(), bytes, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) {
      CHECK_CUDA(cudaEventRecord(e0));
      for (int i = 0; i < reps; ++i) {
        CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
      }
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t / reps);
    }
    copy_ms = Median(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
  }
  const double copy_gbps = 2.0 * bytes / copy_ms / 1e6;
  std::fprintf(stderr, "copy (cudaMemcpyAsync d2d) %lld x %lld %s: %.4f ms, %.0f GB/s\n",
               static_cast<long long>(rows), static_cast<long long>(cols), dtype_name.c_str(),
               copy_ms, copy_gbps);

  json results = json::array();
  {
    const double ms = time_kiln([&] { return dev->CopyOnDevice(*stream, vx, vy).ok(); });
    const double gbps = ms > 0 ? 2.0 * bytes / ms / 1e6 : 0;
    results.push_back({{"op", "kiln_copy"},
                       {"ms", ms},
                       {"gbps", gbps},
                       {"of_copy", gbps / copy_gbps},
                       {"impl", "CopyOnDevice"}});
  }
  for (const std::string op : {"layer_norm", "rms_norm", "gelu"}) {
    Case c = MakeCase(op, dt, rows, cols);
    json entry = {{"op", op}};
    if (!dev->Supports(c.spec).native) {
      entry["error"] = "not claimed";
      results.push_back(entry);
      continue;
    }
    kiln::backend::PrepareContext ctx;
    auto kernel = dev->PrepareKernel(c.spec, ctx);
    if (!kernel.ok()) {
      entry["error"] = std::string(kernel.status().message());
      results.push_back(entry);
      continue;
    }
    std::vector<kiln::backend::BufferView> ins = {vx, vs, vb};
    ins.resize(c.operands);
    const std::vector<kiln::backend::BufferView> outs = {vy};
    const double ms = time_kiln([&] { return (*kernel)->Launch(*stream, ins, outs).ok(); });
    int64_t moved = 2 * bytes;
    if (c.operands > 1) moved += (c.operands - 1) * cols * FloatBytes(dt);
    const double gbps = ms > 0 ? moved / ms / 1e6 : 0;
    // Check sampled rows against the host reference.
    std::vector<char> host(bytes);
    double max_err = -1;
    if (ms > 0 && dev->CopyToHost(*stream, vy, host.data()).ok() && stream->Synchronize().ok()) {
      max_err = 0;
      for (int64_t r : {int64_t{0}, rows / 3, rows - 1}) {
        const std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
        const std::vector<double> want = ReferenceRow(op, row, scale, bias);
        for (int64_t j = 0; j < cols; ++j) {
          const double got = DecodeFloat(dt, host.data() + (r * cols + j) * FloatBytes(dt));
          max_err = std::max(max_err, std::fabs(got - want[j]));
        }
      }
    }
    entry.update({{"ms", ms},
                  {"gbps", gbps},
                  {"of_copy", gbps / copy_gbps},
                  {"impl", (*kernel)->implementation()},
                  {"max_abs_err", max_err}});
    std::fprintf(stderr, "%s %s: %.4f ms, %.0f GB/s, %.3f of copy (%s), max abs err %.3g\n",
                 device_id.c_str(), op.c_str(), ms, gbps, gbps / copy_gbps,
                 (*kernel)->implementation().c_str(), max_err);
    results.push_back(entry);
  }
  std::printf("%s\n", json({{"bench", "bandwidth_vs_copy"},
                            {"device", dev->info().id},
                            {"name", dev->info().name},
                            {"rows", rows},
                            {"cols", cols},
                            {"dtype", dtype_name},
                            {"copy_ms", copy_ms},
                            {"copy_gbps", copy_gbps},
                            {"results", results}})
                          .dump()
                          .c_str());
  return 0;
}
