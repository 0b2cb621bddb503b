#include "engine/runtime/calibration.h"

#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
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

// Asks for transparent huge pages over the whole 2 MiB pages inside
// [p, p + bytes), before first touch: a fresh 4 KiB page costs ~15 us to fault
// on a virtualized host, and the memory probe's buffers are up to 32 MiB each.
// A hint only: no THP, no change.
void AdviseHugePages(void* p, int64_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
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
      backend::BufferView v{buf.get(), 0, t.num_bytes()};
      // Ordinary values in [0.5, 1): zeros would let a backend shortcut, and
      // denormals would measure a CPU's microcode assists, not its peak.
      if (buf->host_ptr() != nullptr && t.dtype == v1::DTYPE_F32) {
        // Host memory is filled in place: no staging tensor and copy (the
        // matmul and memory probes' buffers are tens of MiB), huge pages where
        // the OS gives them.
        AdviseHugePages(buf->host_ptr(), t.num_bytes());
        float* f = v.as<float>();
        for (int64_t i = 0; i < t.num_elements(); ++i)
          f[i] = 0.5f + static_cast<float>(i % 61) / 128.0f;
      } else {
        KILN_ASSIGN_OR_RETURN(HostTensor fill, HostTensor::Create(t.dtype, t.dims));
        for (int64_t i = 0; i < fill.num_elements(); ++i)
          fill.SetFromDouble(i, 0.5 + (i % 61) / 128.0);
        KILN_RETURN_IF_ERROR(device.CopyToDevice(*b->stream, fill.data(), v));
      }
      b->ins.push_back(v);
      b->buffers.push_back(std::move(buf));
    }
    for (const auto& t : spec.outputs) {
      KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(t.num_bytes()));
      if (buf->host_ptr() != nullptr) AdviseHugePages(buf->host_ptr(), t.num_bytes());
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

// GB/s of an f32 add over `n` elements (3 x 4n bytes a launch), timed on warm
// buffers only (the first pass faults the pages in and is not counted).
absl::StatusOr<double> AddGbps(backend::Device& device, int64_t n) {
  KILN_ASSIGN_OR_RETURN(auto bench, Bench::Create(device, AddSpec(n)));
  KILN_ASSIGN_OR_RETURN(double once, bench->Time(1, 1));
  const int reps = std::clamp(static_cast<int>(kBatchSeconds / std::max(once, 1e-6)), 1, 50);
  KILN_ASSIGN_OR_RETURN(double s, bench->Time(reps, 3));
  return 3.0 * 4.0 * n / s / 1e9;
}

// 3 x 8 MiB of traffic per add: past a GPU's caches (the H100's L2 is 50 MiB,
// so on it this is partly a cache figure), and the probe of a host device
// whose cache size is unknown.
constexpr int64_t kDefaultBandwidthElems = int64_t{1} << 21;
// The memory probe of a host device: its three buffers together at least
// twice its last-level cache, each at most 32 MiB: the first touch of fresh
// pages is what costs (~15 us a 4 KiB page on a virtualized host), and every
// kilnd start with an empty cache directory pays it.
constexpr int64_t kMaxBandwidthElems = int64_t{1} << 23;

backend::KernelSpec TanhSpec(int64_t n) {
  backend::KernelSpec s;
  s.name = "calibrate_tanh";
  s.label = s.name;
  s.op = v1::OP_UNARY;
  s.attrs.mutable_unary()->set_kind(v1::UNARY_TANH);
  s.inputs = {{v1::DTYPE_F32, {n}}};
  s.outputs = {{v1::DTYPE_F32, {n}}};
  return s;
}

// Billions of tanh a second over 2^20 elements (8 MiB in and out).
absl::StatusOr<double> TanhGelems(backend::Device& device) {
  const int64_t n = int64_t{1} << 20;
  KILN_ASSIGN_OR_RETURN(auto bench, Bench::Create(device, TanhSpec(n)));
  KILN_ASSIGN_OR_RETURN(double once, bench->Time(1, 1));
  const int reps = std::clamp(static_cast<int>(kBatchSeconds / std::max(once, 1e-6)), 1, 50);
  KILN_ASSIGN_OR_RETURN(double s, bench->Time(reps, 3));
  return n / s / 1e9;
}

// The small parallel kernel of the team probe: a one-row product of
// 64 x threads columns over K = 512, which the CPU's small-M matmul splits
// into one 4-panel chunk (~32k FMAs) per thread (backends/cpu/small_matmul.cc),
// the shape of a batch-1 MLP layer.
backend::KernelSpec TeamSpec(int threads) {
  backend::KernelSpec s;
  s.name = "calibrate_team";
  s.label = s.name;
  s.op = v1::OP_MATMUL;
  s.attrs.mutable_matmul();
  const int64_t n = int64_t{64} * std::max(threads, 1);
  s.inputs = {{v1::DTYPE_F32, {1, 512}}, {v1::DTYPE_F32, {512, n}}};
  s.outputs = {{v1::DTYPE_F32, {1, n}}};
  return s;
}

// The team probe's own work in microseconds (no launch, no team).
double TeamWorkMicros(const backend::KernelSpec& spec, const backend::DeviceProfile& p,
                      const HostProfile& host) {
  const Work w = EstimateWork(spec);
  const double gbps = host.cache_bandwidth_gbps > 0 ? host.cache_bandwidth_gbps : p.bandwidth_gbps;
  return std::max(p.peak_gflops_f32 > 0 ? w.flops / (p.peak_gflops_f32 * 1e3) : 0.0,
                  gbps > 0 ? w.bytes / (gbps * 1e3) : 0.0);
}

// The thread team's cost per kernel on a host device (HostProfile), beyond
// each kernel's work and launch: back to back at one team size (fork + join),
// and alternating between the whole team and half of it, as the layers of a
// small model do: fc1 of the batch-1 MLP splits 16 ways, fc2 8 ways, and on a
// 16-core VM that run took 0.39 ms against an estimate of 0.02, while
// one-kernel graphs of the same size took a tenth of it. Teams whose size
// changes between kernels are the likely difference (libgomp docks the threads
// a smaller team leaves out); this probe times it, whatever the cause.
absl::Status MeasureTeam(backend::Device& device, const backend::DeviceProfile& p,
                         HostProfile* host) {
  const int threads = device.info().threads;
  const backend::KernelSpec whole_spec = TeamSpec(threads), half_spec = TeamSpec(threads / 2);
  KILN_ASSIGN_OR_RETURN(auto whole, Bench::Create(device, whole_spec));
  KILN_ASSIGN_OR_RETURN(auto half, Bench::Create(device, half_spec));
  KILN_RETURN_IF_ERROR(whole->Time(10, 1).status());
  KILN_RETURN_IF_ERROR(half->Time(10, 1).status());
  KILN_ASSIGN_OR_RETURN(double whole_s, whole->Time(50, 3));
  double pair_s = 1e30;
  constexpr int kPairs = 25;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kPairs; ++i) {
      KILN_RETURN_IF_ERROR(whole->kernel->Launch(*whole->stream, whole->ins, whole->outs));
      KILN_RETURN_IF_ERROR(half->kernel->Launch(*half->stream, half->ins, half->outs));
    }
    KILN_RETURN_IF_ERROR(whole->stream->Synchronize());
    KILN_RETURN_IF_ERROR(half->stream->Synchronize());
    pair_s = std::min(pair_s, Seconds(t0, Clock::now()) / kPairs);
  }
  const double whole_work = TeamWorkMicros(whole_spec, p, *host);
  const double half_work = TeamWorkMicros(half_spec, p, *host);
  host->parallel_launch_us = std::max(0.0, whole_s * 1e6 - whole_work - p.launch_overhead_us);
  host->mixed_launch_us = std::max(
      host->parallel_launch_us, (pair_s * 1e6 - whole_work - half_work) / 2 - p.launch_overhead_us);
  return absl::OkStatus();
}

}  // namespace

int64_t LastLevelCacheBytes() {
  // sysfs names each cache of cpu0 with its level; the highest level wins.
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", i);
    std::ifstream level_in(dir + "/level"), size_in(dir + "/size"), type_in(dir + "/type");
    int level = 0;
    std::string size, type;
    if (!(level_in >> level) || !(size_in >> size)) continue;
    type_in >> type;
    if (type == "Instruction" || size.empty()) continue;
    int64_t bytes = 0;
    try {
      bytes = std::stoll(size);
    } catch (...) {
      continue;
    }
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    if (level > best_level || (level == best_level && bytes > best_bytes)) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  if (best_bytes > 0) return best_bytes;
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = ::sysconf(name);
    if (v > 0) return v;
  }
  return 0;
}

std::string CalibrationFingerprint(const backend::DeviceInfo& info) {
  struct utsname u {};
  const std::string kernel = ::uname(&u) == 0 ? u.release : "";
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);
  // Memory in GiB: the kernel's own reservations move the byte count by a
  // few pages between boots of one machine.
  const int64_t memory_gib = static_cast<int64_t>(pages) * page_size >> 30;
  return absl::StrCat(info.identity, "|driver=", info.driver_version, "|cores=", cores,
                      "|memory_gib=", memory_gib, "|llc=", LastLevelCacheBytes(),
                      "|kernel=", kernel);
}

absl::Status MeasureCopyRates(backend::Device& device, backend::DeviceProfile* p) {
  if (device.info().host_memory) return absl::OkStatus();
  // Copies are timed on the path a run's inputs and outputs take: from and
  // into a HostTensor, as Engine::Run's callers pass inputs and as it makes
  // each fresh output. Once a CUDA worker serves the device, HostTensors of
  // 1 MiB or more live in the host arena that the worker registered, so the
  // worker DMAs straight from and into them (res8); elsewhere (heap memory,
  // in-process devices, lavapipe) they take the device's staging path, and
  // so does the probe. A std::vector here timed the staging path even where
  // runs take the direct one: 17.6 / 26 GB/s on an H100 whose runs moved
  // 64-192 MiB at ~52 GB/s each way.
  // Copies pay a fixed cost (a worker's round trip) besides their
  // bandwidth: on a GPU the rate is the slope between 4 and 64 MiB, the
  // fixed part the launch and sync costs' (CostModel::CopyMicros). Other
  // devices (lavapipe) keep one 16 MiB copy: every test's kilnd start
  // calibrates them.
  const bool gpu = device.info().kind == backend::DeviceKind::kGpu;
  const int64_t small = gpu ? int64_t{4} << 20 : 0;
  const int64_t bytes = gpu ? int64_t{64} << 20 : int64_t{16} << 20;
  KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(bytes));
  KILN_ASSIGN_OR_RETURN(auto stream, device.CreateStream());
  // Zero-filled: its pages are touched before the first timed copy.
  KILN_ASSIGN_OR_RETURN(HostTensor host, HostTensor::Create(v1::DTYPE_U8, {bytes}));
  // Best seconds of 3 copies of `n` bytes each way.
  auto time_copies = [&](int64_t n, double* up, double* down) -> absl::Status {
    *up = *down = 1e30;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      KILN_RETURN_IF_ERROR(device.CopyToDevice(*stream, host.data(), {buf.get(), 0, n}));
      KILN_RETURN_IF_ERROR(stream->Synchronize());
      *up = std::min(*up, Seconds(t0, Clock::now()));
      t0 = Clock::now();
      KILN_RETURN_IF_ERROR(device.CopyToHost(*stream, {buf.get(), 0, n}, host.data()));
      KILN_RETURN_IF_ERROR(stream->Synchronize());
      *down = std::min(*down, Seconds(t0, Clock::now()));
    }
    return absl::OkStatus();
  };
  double up = 0, down = 0, small_up = 0, small_down = 0;
  KILN_RETURN_IF_ERROR(time_copies(bytes, &up, &down));
  if (small > 0) KILN_RETURN_IF_ERROR(time_copies(small, &small_up, &small_down));
  auto rate = [&](double t, double t_small) {
    return t_small > 0 && t > t_small ? (bytes - small) / (t - t_small) / 1e9 : bytes / t / 1e9;
  };
  p->host_to_device_gbps = rate(up, small_up);
  p->device_to_host_gbps = rate(down, small_down);
  return absl::OkStatus();
}

absl::StatusOr<CalibrationResult> Calibrate(backend::Device& device) {
  CalibrationResult result;
  backend::DeviceProfile& p = result.profile;
  HostProfile& host = result.host;
  p = device.info().profile;
  KILN_ASSIGN_OR_RETURN(p.peak_gflops_f32, MatMulGflops(device, v1::DTYPE_F32));
  auto f16 = MatMulGflops(device, v1::DTYPE_F16);
  p.peak_gflops_f16 = f16.ok() ? *f16 : p.peak_gflops_f32;
  KILN_ASSIGN_OR_RETURN(p.bandwidth_gbps, AddGbps(device, kDefaultBandwidthElems));
  // Host devices: the probe above is a cache figure when the last-level cache
  // (as the OS reports it) holds its 24 MiB; memory bandwidth is then measured
  // past the cache, when three buffers of at most 32 MiB hold twice it. A
  // larger cache (this project's VMs report 260-508 MiB, shared with the
  // host) keeps the one figure: a probe past it would cost seconds a start.
  const int64_t llc = device.info().host_memory ? LastLevelCacheBytes() : 0;
  const int64_t memory_elems = 2 * llc / 12 + 1;
  if (llc >= 12 * kDefaultBandwidthElems && memory_elems <= kMaxBandwidthElems) {
    const double cache_gbps = p.bandwidth_gbps;
    KILN_ASSIGN_OR_RETURN(p.bandwidth_gbps, AddGbps(device, memory_elems));
    if (cache_gbps > p.bandwidth_gbps) {
      host.cache_bandwidth_gbps = cache_gbps;
      host.cache_bytes = llc;
    }
  }
  KILN_ASSIGN_OR_RETURN(auto tiny, Bench::Create(device, TinySpec()));
  KILN_RETURN_IF_ERROR(tiny->Time(10, 1).status());
  // Back-to-back launches amortize the queue's submit + wait; single synced
  // launches pay it each time: the difference is the per-run sync cost.
  KILN_ASSIGN_OR_RETURN(double batched, tiny->Time(100, 3));
  KILN_ASSIGN_OR_RETURN(double synced, tiny->Time(1, 20));
  p.launch_overhead_us = batched * 1e6;
  p.sync_overhead_us = std::max(0.0, (synced - batched) * 1e6);
  if (device.info().host_memory && device.info().kind == backend::DeviceKind::kCpu) {
    KILN_ASSIGN_OR_RETURN(host.transcendental_gelems, TanhGelems(device));
    if (device.info().threads > 1) {
      KILN_RETURN_IF_ERROR(MeasureTeam(device, p, &host)) << "while timing the thread team";
    }
  }
  KILN_RETURN_IF_ERROR(MeasureCopyRates(device, &p)) << "while timing copies";
  p.calibrated = true;
  return result;
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
                                                  double max_load_per_core, bool refresh) {
  const backend::DeviceInfo& info = device.info();
  const std::string id_key =
      absl::StrCat("calibration-v", kCalibrationVersion, "|", CalibrationFingerprint(info));
  const std::filesystem::path dir = std::filesystem::path(cache_dir) / "calibration";
  const std::filesystem::path file = dir / (compile::Sha256Hex(id_key).substr(0, 32) + ".json");
  if (!cache_dir.empty() && !refresh) {
    // Only a regular file is read: a FIFO planted in its place would block
    // this open, and the engine's start with it.
    std::error_code ec;
    const bool regular = std::filesystem::is_regular_file(std::filesystem::symlink_status(file, ec));
    std::ifstream in;
    if (regular) in.open(file);
    if (regular && in) {
      auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      // Every figure must be a number: a file edited by hand or cut short is
      // measured over (j.value would throw on a string where a number was).
      auto number = [&](const char* name, double* out) {
        auto it = j.find(name);
        if (it == j.end() || !it->is_number()) return false;
        *out = it->get<double>();
        return std::isfinite(*out) && *out >= 0;
      };
      CalibrationResult result;
      backend::DeviceProfile& p = result.profile;
      HostProfile& h = result.host;
      double cache_bytes = 0;
      const bool complete = !j.is_discarded() && j.is_object() && j.contains("key") &&
                            j["key"].is_string() && j["key"].get<std::string>() == id_key &&
                            number("peak_gflops_f32", &p.peak_gflops_f32) &&
                            number("peak_gflops_f16", &p.peak_gflops_f16) &&
                            number("bandwidth_gbps", &p.bandwidth_gbps) &&
                            number("launch_overhead_us", &p.launch_overhead_us) &&
                            number("sync_overhead_us", &p.sync_overhead_us) &&
                            number("host_to_device_gbps", &p.host_to_device_gbps) &&
                            number("device_to_host_gbps", &p.device_to_host_gbps) &&
                            number("parallel_launch_us", &h.parallel_launch_us) &&
                            number("mixed_launch_us", &h.mixed_launch_us) &&
                            number("cache_bandwidth_gbps", &h.cache_bandwidth_gbps) &&
                            number("cache_bytes", &cache_bytes) &&
                            number("transcendental_gelems", &h.transcendental_gelems);
      if (complete && p.peak_gflops_f32 > 0 && p.bandwidth_gbps > 0) {
        h.cache_bytes = static_cast<int64_t>(cache_bytes);
        p.calibrated = true;
        result.from_cache = true;
        return result;
      }
      spdlog::warn("calibration cache {} is unreadable or foreign; measuring again", file.string());
    }
  }
  // Other processes' work slows every measurement; a reading taken on a busy
  // host is not kept on disk (the load average lags, so it is read on both
  // sides of the measurement).
  const double load_before = HostLoadPerCore();
  const auto t0 = Clock::now();
  KILN_ASSIGN_OR_RETURN(CalibrationResult result, Calibrate(device));
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
    const HostProfile& h = result.host;
    const nlohmann::json j = {{"key", id_key},
                              {"device", info.id},
                              {"name", info.name},
                              {"peak_gflops_f32", p.peak_gflops_f32},
                              {"peak_gflops_f16", p.peak_gflops_f16},
                              {"bandwidth_gbps", p.bandwidth_gbps},
                              {"launch_overhead_us", p.launch_overhead_us},
                              {"sync_overhead_us", p.sync_overhead_us},
                              {"host_to_device_gbps", p.host_to_device_gbps},
                              {"device_to_host_gbps", p.device_to_host_gbps},
                              {"parallel_launch_us", h.parallel_launch_us},
                              {"mixed_launch_us", h.mixed_launch_us},
                              {"cache_bandwidth_gbps", h.cache_bandwidth_gbps},
                              {"cache_bytes", h.cache_bytes},
                              {"transcendental_gelems", h.transcendental_gelems}};
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
