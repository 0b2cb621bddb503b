#include "engine/runtime/calibration.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/host_tensor.h"
#include "base/status.h"
#include "engine/compile/cache_key.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace kiln::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Buffers, a kernel and a stream for one spec on one device.
struct Bench {
  backend::Device& device;
  std::unique_ptr<backend::Stream> stream;
  std::unique_ptr<backend::Kernel> kernel;
  std::vector<std::unique_ptr<backend::Buffer>> buffers;
  std::vector<backend::BufferView> ins, outs;

  static absl::StatusOr<std::unique_ptr<Bench>> Create(backend::Device& device,
                                                        const backend::KernelSpec& spec) {
    auto b = std::make_unique<Bench>(Bench{device, nullptr, nullptr, {}, {}, {}});
    if (!device.Supports(spec).native) return absl::UnimplementedError("not claimed");
    backend::PrepareContext ctx;
    KILN_ASSIGN_OR_RETURN(b->kernel, device.PrepareKernel(spec, ctx));
    KILN_ASSIGN_OR_RETURN(b->stream, device.CreateStream());
    for (const auto& t : spec.inputs) {
      KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(t.num_bytes()));
      // Ordinary values in [0.5, 1): zeros would let a backend shortcut, and
      // denormals would measure a CPU's microcode assists, not its peak.
      KILN_ASSIGN_OR_RETURN(HostTensor fill, HostTensor::Create(t.dtype, t.dims));
      for (int64_t i = 0; i < fill.num_elements(); ++i) fill.SetFromDouble(i, 0.5 + (i % 61) / 128.0);
      backend::BufferView v{buf.get(), 0, t.num_bytes()};
      KILN_RETURN_IF_ERROR(device.CopyToDevice(*b->stream, fill.data(), v));
      b->ins.push_back(v);
      b->buffers.push_back(std::move(buf));
    }
    for (const auto& t : spec.outputs) {
      KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(t.num_bytes()));
      b->outs.push_back(backend::BufferView{buf.get(), 0, t.num_bytes()});
      b->buffers.push_back(std::move(buf));
    }
    KILN_RETURN_IF_ERROR(b->stream->Synchronize());
    return b;
  }

  // Best seconds per launch over `rounds` rounds of `reps` launches each.
  absl::StatusOr<double> Time(int reps, int rounds) {
    double best = 1e30;
    for (int r = 0; r < rounds; ++r) {
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) KILN_RETURN_IF_ERROR(kernel->Launch(*stream, ins, outs));
      KILN_RETURN_IF_ERROR(stream->Synchronize());
      best = std::min(best, Seconds(t0, Clock::now()) / reps);
    }
    return best;
  }
};

backend::KernelSpec MatMulSpec(DType dtype, int64_t n) {
  backend::KernelSpec s;
  s.name = "calibrate_matmul";
  s.label = s.name;
  s.op = v1::OP_MATMUL;
  s.attrs.mutable_matmul();
  s.inputs = {{dtype, {n, n}}, {dtype, {n, n}}};
  s.outputs = {{dtype, {n, n}}};
  return s;
}

backend::KernelSpec AddSpec(int64_t n) {
  backend::KernelSpec s;
  s.name = "calibrate_add";
  s.label = s.name;
  s.op = v1::OP_BINARY;
  s.attrs.mutable_binary()->set_kind(v1::BINARY_ADD);
  s.inputs = {{v1::DTYPE_F32, {n}}, {v1::DTYPE_F32, {n}}};
  s.outputs = {{v1::DTYPE_F32, {n}}};
  return s;
}

backend::KernelSpec TinySpec() {
  backend::KernelSpec s;
  s.name = "calibrate_tiny";
  s.label = s.name;
  s.op = v1::OP_UNARY;
  s.attrs.mutable_unary()->set_kind(v1::UNARY_RELU);
  s.inputs = {{v1::DTYPE_F32, {1}}};
  s.outputs = {{v1::DTYPE_F32, {1}}};
  return s;
}

// Each measurement aims at ~5 ms per timed batch: enough to rise above the
// clock and launch noise, short enough that a first start calibrates every
// device in well under a second.
constexpr double kBatchSeconds = 0.005;

// Peak matmul GFLOP/s: grow the size until one product takes >= 5 ms, at
// least 256 (small products measure launch cost, not the device), at most 4096.
absl::StatusOr<double> MatMulGflops(backend::Device& device, DType dtype) {
  double best = 0;
  for (int64_t n = 256; n <= 4096; n *= 2) {
    KILN_ASSIGN_OR_RETURN(auto bench, Bench::Create(device, MatMulSpec(dtype, n)));
    KILN_ASSIGN_OR_RETURN(double once, bench->Time(1, 1));  // warm-up, and sizes the reps
    const int reps = std::clamp(static_cast<int>(kBatchSeconds / std::max(once, 1e-6)), 1, 50);
    KILN_ASSIGN_OR_RETURN(double s, bench->Time(reps, 3));
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
    if (once >= kBatchSeconds) break;
  }
  return best;
}

absl::StatusOr<double> BandwidthGbps(backend::Device& device) {
  const int64_t n = int64_t{1} << 21;  // 3 x 8 MiB of traffic per add: past the caches
  KILN_ASSIGN_OR_RETURN(auto bench, Bench::Create(device, AddSpec(n)));
  KILN_ASSIGN_OR_RETURN(double once, bench->Time(1, 1));
  const int reps = std::clamp(static_cast<int>(kBatchSeconds / std::max(once, 1e-6)), 1, 50);
  KILN_ASSIGN_OR_RETURN(double s, bench->Time(reps, 3));
  return 3.0 * 4.0 * n / s / 1e9;
}

}  // namespace

absl::StatusOr<backend::DeviceProfile> Calibrate(backend::Device& device) {
  backend::DeviceProfile p = device.info().profile;
  KILN_ASSIGN_OR_RETURN(p.peak_gflops_f32, MatMulGflops(device, v1::DTYPE_F32));
  auto f16 = MatMulGflops(device, v1::DTYPE_F16);
  p.peak_gflops_f16 = f16.ok() ? *f16 : p.peak_gflops_f32;
  KILN_ASSIGN_OR_RETURN(p.bandwidth_gbps, BandwidthGbps(device));
  KILN_ASSIGN_OR_RETURN(auto tiny, Bench::Create(device, TinySpec()));
  KILN_RETURN_IF_ERROR(tiny->Time(10, 1).status());
  // Back-to-back launches amortize the queue's submit + wait; single synced
  // launches pay it each time: the difference is the per-run sync cost.
  KILN_ASSIGN_OR_RETURN(double batched, tiny->Time(100, 3));
  KILN_ASSIGN_OR_RETURN(double synced, tiny->Time(1, 20));
  p.launch_overhead_us = batched * 1e6;
  p.sync_overhead_us = std::max(0.0, (synced - batched) * 1e6);
  if (!device.info().host_memory) {
    const int64_t bytes = int64_t{16} << 20;
    KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(bytes));
    KILN_ASSIGN_OR_RETURN(auto stream, device.CreateStream());
    std::vector<char> host(bytes, 1);
    double up = 1e30, down = 1e30;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      KILN_RETURN_IF_ERROR(device.CopyToDevice(*stream, host.data(), {buf.get(), 0, bytes}));
      KILN_RETURN_IF_ERROR(stream->Synchronize());
      up = std::min(up, Seconds(t0, Clock::now()));
      t0 = Clock::now();
      KILN_RETURN_IF_ERROR(device.CopyToHost(*stream, {buf.get(), 0, bytes}, host.data()));
      KILN_RETURN_IF_ERROR(stream->Synchronize());
      down = std::min(down, Seconds(t0, Clock::now()));
    }
    p.host_to_device_gbps = bytes / up / 1e9;
    p.device_to_host_gbps = bytes / down / 1e9;
  }
  p.calibrated = true;
  return p;
}

double HostLoadPerCore() {
  double load = 0;
  std::ifstream in("/proc/loadavg");
  if (!(in >> load)) return 0;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return load / cores;
}

absl::StatusOr<CalibrationResult> CalibrateCached(backend::Device& device,
                                                  const std::string& cache_dir,
                                                  double max_load_per_core) {
  const backend::DeviceInfo& info = device.info();
  const std::string id_key = absl::StrCat("calibration-v", kCalibrationVersion, "|", info.identity);
  const std::filesystem::path dir = std::filesystem::path(cache_dir) / "calibration";
  const std::filesystem::path file = dir / (compile::Sha256Hex(id_key).substr(0, 32) + ".json");
  CalibrationResult result;
  if (!cache_dir.empty()) {
    // Only a regular file is read: a FIFO planted in its place would block
    // this open, and the engine's start with it.
    std::error_code ec;
    const bool regular = std::filesystem::is_regular_file(std::filesystem::symlink_status(file, ec));
    std::ifstream in;
    if (regular) in.open(file);
    if (regular && in) {
      auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded() && j.value("key", "") == id_key) {
        backend::DeviceProfile& p = result.profile;
        p.peak_gflops_f32 = j.value("peak_gflops_f32", 0.0);
        p.peak_gflops_f16 = j.value("peak_gflops_f16", 0.0);
        p.bandwidth_gbps = j.value("bandwidth_gbps", 0.0);
        p.launch_overhead_us = j.value("launch_overhead_us", 0.0);
        p.sync_overhead_us = j.value("sync_overhead_us", 0.0);
        p.host_to_device_gbps = j.value("host_to_device_gbps", 0.0);
        p.device_to_host_gbps = j.value("device_to_host_gbps", 0.0);
        p.calibrated = true;
        if (p.peak_gflops_f32 > 0 && p.bandwidth_gbps > 0) {
          result.from_cache = true;
          return result;
        }
      }
      spdlog::warn("calibration cache {} is unreadable or foreign; measuring again", file.string());
    }
  }
  // Other processes' work slows every measurement; a reading taken on a busy
  // host is not kept on disk (the load average lags, so it is read on both
  // sides of the measurement).
  const double load_before = HostLoadPerCore();
  const auto t0 = Clock::now();
  KILN_ASSIGN_OR_RETURN(result.profile, Calibrate(device));
  result.seconds = Seconds(t0, Clock::now());
  const double load = std::max(load_before, HostLoadPerCore());
  result.contended = load > max_load_per_core;
  if (result.contended && !cache_dir.empty()) {
    spdlog::warn(
        "{}: the host is busy (load average {:.1f} per core) while calibrating; the profile is "
        "used now but not cached, the next start measures again",
        info.id, load);
  }
  if (!cache_dir.empty() && !result.contended) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const backend::DeviceProfile& p = result.profile;
    const nlohmann::json j = {{"key", id_key},
                              {"device", info.id},
                              {"name", info.name},
                              {"peak_gflops_f32", p.peak_gflops_f32},
                              {"peak_gflops_f16", p.peak_gflops_f16},
                              {"bandwidth_gbps", p.bandwidth_gbps},
                              {"launch_overhead_us", p.launch_overhead_us},
                              {"sync_overhead_us", p.sync_overhead_us},
                              {"host_to_device_gbps", p.host_to_device_gbps},
                              {"device_to_host_gbps", p.device_to_host_gbps}};
    const std::filesystem::path tmp = file.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp);
      out << j.dump(1);
    }
    std::filesystem::rename(tmp, file, ec);
    if (ec) spdlog::warn("cannot store calibration in {}: {}", file.string(), ec.message());
  }
  return result;
}

}  // namespace kiln::runtime
