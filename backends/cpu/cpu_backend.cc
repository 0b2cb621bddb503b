#include "backends/cpu/cpu_backend.h"

#include <cpuid.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "backends/cpu/parallel.h"


namespace kiln::cpu {
namespace {

using backend::BufferView;

// UseCpuThreads' count; 0 until a CPU backend is made.
std::atomic<int> g_cpu_threads{0};

absl::flat_hash_map<int, CpuOpEntry>& OpTable() {
  static auto* table = new absl::flat_hash_map<int, CpuOpEntry>();
  return *table;
}

class HostBuffer final : public backend::Buffer {
 public:
  HostBuffer(void* data, int64_t size, std::atomic<int64_t>& counter)
      : data_(data), size_(size), counter_(counter) {
    counter_ += size_;
  }
  ~HostBuffer() override {
    std::free(data_);
    counter_ -= size_;
  }
  int64_t size() const override { return size_; }
  void* host_ptr() const override { return data_; }

 private:
  void* data_;
  int64_t size_;
  std::atomic<int64_t>& counter_;
};

class HostEvent final : public backend::Event {
 public:
  explicit HostEvent(const void* stream) : stream_(stream), time_(std::chrono::steady_clock::now()) {}
  absl::StatusOr<double> MicrosSince(const backend::Event& earlier) const override {
    const auto* e = dynamic_cast<const HostEvent*>(&earlier);
    if (e == nullptr || e->stream_ != stream_) {
      return absl::InvalidArgumentError("cpu: events are from different streams");
    }
    return std::chrono::duration<double, std::micro>(time_ - e->time_).count();
  }

 private:
  const void* stream_;
  std::chrono::steady_clock::time_point time_;
};

class HostStream final : public backend::Stream {
 public:
  // Work completes as it is enqueued: nothing to wait for.
  absl::Status SynchronizeFor(absl::Duration) override { return absl::OkStatus(); }
  // Every CPU stream's work is done when enqueued: any CPU event has passed.
  absl::Status Wait(const backend::Event& event) override {
    if (dynamic_cast<const HostEvent*>(&event) == nullptr) {
      return absl::InvalidArgumentError("cpu: Wait takes an event of a cpu stream");
    }
    return absl::OkStatus();
  }
  absl::Status FlushWork() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<backend::Event>> Record() override {
    return std::make_unique<HostEvent>(this);
  }
};

absl::Status CheckView(const BufferView& v, int64_t bytes, const char* what) {
  if (v.buffer == nullptr || v.buffer->host_ptr() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a host buffer"));
  }
  if (v.offset < 0 || bytes < 0 || v.offset + bytes > v.buffer->size()) {
    return absl::OutOfRangeError(absl::StrCat(what, ": range [", v.offset, ", ", v.offset + bytes,
                                              ") exceeds the buffer of ", v.buffer->size()));
  }
  return absl::OkStatus();
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "unknown CPU";
}

std::vector<std::string> CpuFeatures() {
  std::vector<std::string> f;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) f.push_back("avx2");
  if (__builtin_cpu_supports("fma")) f.push_back("fma");
  // clang 14 (the sanitizer and fuzz builds) has no "f16c" for
  // __builtin_cpu_supports; CPUID leaf 1, ECX bit 29 is the same test.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C)) f.push_back("f16c");
  if (__builtin_cpu_supports("avx512f")) f.push_back("avx512f");
  if (__builtin_cpu_supports("avx512bw")) f.push_back("avx512bw");
  if (__builtin_cpu_supports("avx512vl")) f.push_back("avx512vl");
  return f;
}

class CpuBackend final : public backend::Backend {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Backend>> Create(
      const backend::BackendOptions& options) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      return absl::FailedPreconditionError(
          "the CPU backend is built for x86-64-v3 (AVX2 + FMA); this CPU lacks them");
    }
    int threads = options.cpu_threads > 0 ? options.cpu_threads : omp_get_num_procs();
    g_cpu_threads.store(threads, std::memory_order_relaxed);
    UseCpuThreads();
    backend::DeviceInfo info;
    info.id = "cpu:0";
    // What our kernels reach of the roofline on the reference machines
    // (docs/benchmarks.md); calibration measures matmul and elementwise.
    info.roofline_efficiency = {{"matmul", 0.85}, {"conv", 0.6},   {"attention", 0.5},
                                {"elementwise", 0.7}, {"reduce", 0.6}, {"norm", 0.6},
                                {"shape", 0.5}};
    info.backend = "cpu";
    info.name = CpuModelName();
    info.features = CpuFeatures();
    // DequantMatMul honours KernelSpec.allow_int8_activations (dequant_dot.h).
    info.features.push_back(backend::kFeatureInt8Activations);
    info.arch = "x86-64-v3";
    for (const auto& f : info.features) {
      if (f == "avx512f") info.arch += "+avx512";
    }
    info.threads = threads;
    info.host_memory = true;
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGE_SIZE);
    info.memory_bytes = static_cast<int64_t>(pages) * page_size;
    info.identity = absl::StrCat("cpu|", info.name, "|", info.arch, "|threads=", threads);
    // Nominal until calibrated: ~2 FMA ports x 8 lanes x 2 flops x 3 GHz per core.
    info.profile.peak_gflops_f32 = 96.0 * threads;
    info.profile.peak_gflops_f16 = info.profile.peak_gflops_f32;
    info.profile.bandwidth_gbps = 20.0;
    info.profile.launch_overhead_us = 1.0;
    info.profile.host_to_device_gbps = 0;
    auto backend = std::unique_ptr<CpuBackend>(new CpuBackend());
    backend->device_ = std::make_unique<CpuDevice>(std::move(info));
    return backend;
  }

  std::string name() const override { return "cpu"; }
  std::string version() const override { return "kiln-cpu-1"; }
  std::vector<backend::Device*> devices() const override { return {device_.get()}; }

 private:
  CpuBackend() = default;
  std::unique_ptr<CpuDevice> device_;
};

const backend::BackendRegistration kRegistration("cpu", 0, &CpuBackend::Create);

}  // namespace

void UseCpuThreads() {
  const int threads = g_cpu_threads.load(std::memory_order_relaxed);
  if (threads > 0 && omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

bool IsHostStream(const backend::Stream& stream) {
  return dynamic_cast<const HostStream*>(&stream) != nullptr;
}

absl::Status CheckHostStream(const backend::Stream& stream, const char* what) {
  if (IsHostStream(stream)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": the stream is not a cpu stream"));
}

CpuOpRegistration::CpuOpRegistration(std::initializer_list<CpuOpEntry> entries) {
  for (const CpuOpEntry& e : entries) OpTable()[e.op] = e;
}

void ParallelMemcpy(void* dst, const void* src, int64_t bytes) {
  if (dst == src || bytes <= 0) return;
  ParallelFor(bytes, kCopyGrainBytes, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  });
}

absl::StatusOr<std::unique_ptr<backend::Buffer>> CpuDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
  const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size == 0 ? 64 : size);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cpu:0: cannot allocate ", bytes, " bytes"));
  }
  return std::make_unique<HostBuffer>(p, bytes, memory_in_use_);
}

absl::StatusOr<std::unique_ptr<backend::Stream>> CpuDevice::CreateStream() {
  return std::make_unique<HostStream>();
}

absl::Status CpuDevice::CopyToDevice(backend::Stream& stream, const void* src, BufferView dst) {
  if (auto s = CheckHostStream(stream, "copy to cpu"); !s.ok()) return s;
  if (auto s = CheckView(dst, dst.bytes, "copy to cpu"); !s.ok()) return s;
  ParallelMemcpy(dst.host(), src, dst.bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyToHost(backend::Stream& stream, BufferView src, void* dst) {
  if (auto s = CheckHostStream(stream, "copy from cpu"); !s.ok()) return s;
  if (auto s = CheckView(src, src.bytes, "copy from cpu"); !s.ok()) return s;
  ParallelMemcpy(dst, src.host(), src.bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyOnDevice(backend::Stream& stream, BufferView src, BufferView dst) {
  if (auto s = CheckHostStream(stream, "copy on cpu"); !s.ok()) return s;
  if (auto s = CheckView(src, src.bytes, "copy source"); !s.ok()) return s;
  if (auto s = CheckView(dst, src.bytes, "copy destination"); !s.ok()) return s;
  std::memmove(dst.host(), src.host(), src.bytes);
  return absl::OkStatus();
}

backend::Claim CpuDevice::Supports(const backend::KernelSpec& spec) const {
  auto it = OpTable().find(spec.op);
  if (it == OpTable().end()) {
    return backend::Claim::No(absl::StrCat("cpu has no kernel for ", v1::OpKind_Name(spec.op)));
  }
  return it->second.supports(spec);
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CpuDevice::PrepareKernel(
    const backend::KernelSpec& spec, backend::PrepareContext&) {
  UseCpuThreads();
  backend::Claim claim = Supports(spec);
  if (!claim.native) {
    return absl::UnimplementedError(absl::StrCat(spec.label, ": ", claim.reason));
  }
  return OpTable().at(spec.op).create(spec);
}

}  // namespace kiln::cpu
