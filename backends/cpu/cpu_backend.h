// The CPU backend: the guaranteed fallback that claims every op of the core
// set. Buffers are host memory (64-byte aligned); streams are synchronous (a
// launch completes before it returns), so events are host timestamps.
// Kernels parallelize with OpenMP, sharing oneDNN's thread pool.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace kiln::cpu {

// A kernel body: reads `in`, writes `out` (host pointers), returns a status
// for data-dependent failures (an out-of-range gather index).
// Whether `stream` is the CPU backend's (its kernels and copies refuse others).
bool IsHostStream(const backend::Stream& stream);
absl::Status CheckHostStream(const backend::Stream& stream, const char* what);

// OpenMP's thread count (omp_set_num_threads) is a per-thread setting, and
// kernels are prepared and launched on whatever thread compiles or runs
// (kilnd's work pool, not the thread that made the backend). So the count the
// backend was made with (BackendOptions::cpu_threads, else every core) is
// applied on the calling thread wherever kernels are prepared (oneDNN sizes
// its primitives then) and launched. Process-wide: the last CPU backend made
// sets it.
void UseCpuThreads();

class CpuKernel : public backend::Kernel {
 public:
  absl::Status Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                      std::span<const backend::BufferView> outputs) final {
    if (absl::Status s = CheckHostStream(stream, "cpu kernel launch"); !s.ok()) return s;
    UseCpuThreads();
    return Run(inputs, outputs);
  }
  virtual absl::Status Run(std::span<const backend::BufferView> inputs,
                           std::span<const backend::BufferView> outputs) = 0;
};

// One op kind's entry in the CPU backend: whether a spec is claimed, and how
// its kernel is built. Kernel files register theirs at static init
// (CpuOpRegistration); the backend library links whole-archive.
struct CpuOpEntry {
  v1::OpKind op;
  backend::Claim (*supports)(const backend::KernelSpec& spec);
  absl::StatusOr<std::unique_ptr<backend::Kernel>> (*create)(const backend::KernelSpec& spec);
};

struct CpuOpRegistration {
  explicit CpuOpRegistration(std::initializer_list<CpuOpEntry> entries);
};

class CpuDevice final : public backend::Device {
 public:
  explicit CpuDevice(backend::DeviceInfo info) : info_(std::move(info)) {}
  const backend::DeviceInfo& info() const override { return info_; }

  absl::StatusOr<std::unique_ptr<backend::Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<backend::Stream>> CreateStream() override;
  absl::Status CopyToDevice(backend::Stream& stream, const void* src,
                            backend::BufferView dst) override;
  absl::Status CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) override;
  absl::Status CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                            backend::BufferView dst) override;
  backend::Claim Supports(const backend::KernelSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<backend::Kernel>> PrepareKernel(
      const backend::KernelSpec& spec, backend::PrepareContext& context) override;
  int64_t memory_in_use() const override { return memory_in_use_.load(); }

  std::atomic<int64_t>& memory_counter() { return memory_in_use_; }

 private:
  backend::DeviceInfo info_;
  std::atomic<int64_t> memory_in_use_{0};
};

// Copies with OpenMP across threads when large.
void ParallelMemcpy(void* dst, const void* src, int64_t bytes);

}  // namespace kiln::cpu
