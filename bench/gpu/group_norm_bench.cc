// GroupNorm (x [N, C, H, W], 32 groups, per-channel scale and bias) on one
// device through the backend interface (cuda:0's NVRTC kernel, vulkan:0's
// SPIR-V), against the device's own copy of the same bytes (CopyOnDevice: the
// bandwidth ceiling) in the same process. The shapes are Stable Diffusion's
// UNet and VAE GroupNorms. Bytes moved = x read + y written. Device events;
// the median of `rounds` batches of `reps` launches after warm-up. Each result
// is checked against an f64 host reference on three groups (max_abs_err).
// bench/gpu/group_norm.sh runs it beside PyTorch's F.group_norm
// (torch_group_norm.py, the same shapes) and prints the ratio. Prints one
// JSON object:
//   {"bench":"group_norm", "device":..., "dtype":..., "results":[{"shape":[2,320,64,64],
//    "groups":32, "ms":..., "gbps":..., "copy_gbps":..., "of_copy":..., "impl":...,
//    "max_abs_err":...}, ...]}
//
//   group_norm_bench [--device cuda:0] [--dtype bf16] [--reps 20] [--rounds 7]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "backends/backend.h"
#include "base/half.h"
#include "bench/gpu/bench_device.h"
#include "bench/gpu/bench_util.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, device, "cuda:0", "device id (cuda:0, vulkan:0)");
ABSL_FLAG(std::string, dtype, "bf16", "f32, f16 or bf16");
ABSL_FLAG(int, reps, 20, "launches per timed batch");
ABSL_FLAG(int, rounds, 7, "timed batches (the median is reported)");

namespace {

using json = nlohmann::json;
using kiln::DType;
namespace v1 = kiln::v1;

using kiln::bench::DecodeFloat;
using kiln::bench::EncodeFloats;
using kiln::bench::FloatBytes;

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device_id = absl::GetFlag(FLAGS_device), dtype_name = absl::GetFlag(FLAGS_dtype);
  const int reps = absl::GetFlag(FLAGS_reps), rounds = absl::GetFlag(FLAGS_rounds);
  if (reps <= 0 || rounds <= 0) {
    std::fprintf(stderr, "bad --reps/--rounds\n");
    return 2;
  }
  if (dtype_name != "f32" && dtype_name != "f16" && dtype_name != "bf16") {
    std::fprintf(stderr, "--dtype must be f32, f16 or bf16\n");
    return 2;
  }
  const DType dt = dtype_name == "f32"   ? v1::DTYPE_F32
                   : dtype_name == "f16" ? v1::DTYPE_F16
                                         : v1::DTYPE_BF16;
  std::vector<std::unique_ptr<kiln::backend::Backend>> backends;
  kiln::backend::Device* dev = kiln::bench::OpenDevice(device_id, &backends);
  if (dev == nullptr) {
    std::fprintf(stderr, "no device %s\n", device_id.c_str());
    return 1;
  }
  auto stream_or = dev->CreateStream();
  if (!stream_or.ok()) return 1;
  auto& stream = *stream_or;

  // Times `launch` (one call = one pass) on the stream with its events.
  auto time = [&](const std::function<bool()>& launch) {
    return kiln::bench::TimeOnStream(*stream, rounds, reps, launch);
  };

  const int64_t groups = 32;
  const std::vector<kiln::Dims> shapes = {
      {2, 320, 64, 64}, {2, 640, 32, 32}, {2, 1280, 16, 16}, {1, 512, 128, 128}, {8, 256, 56, 56}};
  json results = json::array();
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  for (const kiln::Dims& shape : shapes) {
    const int64_t n = shape[0] * shape[1] * shape[2] * shape[3], c = shape[1];
    const int64_t bytes = n * FloatBytes(dt), per = n / (shape[0] * groups);
    std::vector<float> x(n), scale(c), bias(c);
    for (float& v : x) v = 0.5f + dist(rng);  // a mean away from 0
    for (float& v : scale) v = 1.f + 0.25f * dist(rng);
    for (float& v : bias) v = 0.1f * dist(rng);
    const std::vector<char> hx = EncodeFloats(dt, x), hs = EncodeFloats(dt, scale),
                            hb = EncodeFloats(dt, bias);
    for (int64_t i = 0; i < n; ++i) x[i] = DecodeFloat(dt, hx.data() + i * FloatBytes(dt));
    for (int64_t i = 0; i < c; ++i) {
      scale[i] = DecodeFloat(dt, hs.data() + i * FloatBytes(dt));
      bias[i] = DecodeFloat(dt, hb.data() + i * FloatBytes(dt));
    }
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
    json entry = {{"shape", shape}, {"groups", groups}};
    const double copy_ms = time([&] { return dev->CopyOnDevice(*stream, vx, vy).ok(); });
    const double copy_gbps = copy_ms > 0 ? 2.0 * bytes / copy_ms / 1e6 : 0;
    kiln::backend::KernelSpec spec;
    spec.name = spec.label = "bench_group_norm";
    spec.op = v1::OP_GROUP_NORM;
    spec.attrs.mutable_group_norm()->set_groups(groups);
    spec.inputs = {{dt, shape}, {dt, {c}}, {dt, {c}}};
    spec.outputs = {{dt, shape}};
    if (!dev->Supports(spec).native) {
      entry["error"] = dev->Supports(spec).reason;
      results.push_back(entry);
      continue;
    }
    kiln::backend::PrepareContext ctx;
    auto kernel = dev->PrepareKernel(spec, ctx);
    if (!kernel.ok()) {
      entry["error"] = std::string(kernel.status().message());
      results.push_back(entry);
      continue;
    }
    const std::vector<kiln::backend::BufferView> ins = {vx, vs, vb}, outs = {vy};
    const double ms = time([&] { return (*kernel)->Launch(*stream, ins, outs).ok(); });
    const double gbps = ms > 0 ? 2.0 * bytes / ms / 1e6 : 0;
    std::vector<char> host(bytes);
    double max_err = -1;
    if (ms > 0 && dev->CopyToHost(*stream, vy, host.data()).ok() && stream->Synchronize().ok()) {
      max_err = 0;
      const int64_t rows = shape[0] * groups, cg = c / groups, spatial = per / cg;
      for (int64_t r : {int64_t{0}, rows / 3, rows - 1}) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < per; ++i) mean += x[r * per + i];
        mean /= static_cast<double>(per);
        for (int64_t i = 0; i < per; ++i) var += (x[r * per + i] - mean) * (x[r * per + i] - mean);
        const double rstd = 1 / std::sqrt(var / static_cast<double>(per) + 1e-5);
        for (int64_t i = 0; i < per; ++i) {
          const int64_t ch = (r % groups) * cg + i / spatial;
          const double want = (x[r * per + i] - mean) * rstd * scale[ch] + bias[ch];
          const double got = DecodeFloat(dt, host.data() + (r * per + i) * FloatBytes(dt));
          max_err = std::max(max_err, std::fabs(got - want));
        }
      }
    }
    entry.update({{"ms", ms},
                  {"gbps", gbps},
                  {"copy_ms", copy_ms},
                  {"copy_gbps", copy_gbps},
                  {"of_copy", copy_gbps > 0 ? gbps / copy_gbps : 0},
                  {"impl", (*kernel)->implementation()},
                  {"max_abs_err", max_err}});
    std::fprintf(stderr, "%s group_norm %s [%lld, %lld, %lld, %lld] g%lld: %.4f ms, %.0f GB/s, %.3f of copy (%s), max abs err %.3g\n",
                 device_id.c_str(), dtype_name.c_str(), static_cast<long long>(shape[0]),
                 static_cast<long long>(shape[1]), static_cast<long long>(shape[2]),
                 static_cast<long long>(shape[3]), static_cast<long long>(groups), ms, gbps,
                 copy_gbps > 0 ? gbps / copy_gbps : 0, (*kernel)->implementation().c_str(), max_err);
    results.push_back(entry);
  }
  std::printf("%s\n", json({{"bench", "group_norm"},
                            {"device", dev->info().id},
                            {"name", dev->info().name},
                            {"dtype", dtype_name},
                            {"results", results}})
                          .dump()
                          .c_str());
  return 0;
}
