// One NVIDIA GPU as a backend::Device ("cuda:N", in driver enumeration order).
//
// Owns a retained primary context (shared with the CUDA runtime, so cuBLASLt
// and any runtime-API code in the process see the same memory), the device's
// default memory pool (stream-ordered allocation; freed blocks stay cached
// in the pool, whose release threshold is raised to "never"), an internal
// stream that orders Allocate and buffer frees, the NVRTC module cache and
// the cuBLASLt handle with its per-shape algorithm cache.
//
// Faults: a sticky driver error (an illegal address, a failed launch) or a
// wait that timed out marks the device faulted; every later call fails with
// that device fault (UNAVAILABLE, backend::FaultedDevice names the device),
// so the engine restarts the worker process the device lives in.
//
// Lifetimes: the device outlives every Buffer, Stream, Event and Kernel it
// created. Thread safety: every public method is thread-safe (backend.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "backends/capture.h"
#include "backends/host_memory.h"
#include "backends/cuda/cuda_api.h"

namespace kiln::cuda {

class ModuleCache;
class CudaStream;
class CudnnContext;

// What the device is, queried once at creation; immutable.
struct DeviceCaps {
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int max_threads_per_block = 1024;
  int max_grid_x = 65535;
  int max_shared_per_block_optin = 48 << 10;
  int64_t memory_bytes = 0;
  int memory_clock_khz = 0, bus_width_bits = 0, clock_khz = 0;
  std::string arch;  // "sm_90"
};

class CudaDevice final : public backend::Device, public backend::HostMemoryRegistrar {
 public:
  // Creates the device for driver ordinal `ordinal`. REQUIRES: LoadDriver() OK.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal,
                                                            const backend::BackendOptions& options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // backend::Device
  const backend::DeviceInfo& info() const override { return info_; }
  absl::StatusOr<std::unique_ptr<backend::Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<backend::Stream>> CreateStream() override;
  absl::Status CopyToDevice(backend::Stream& stream, const void* src,
                            backend::BufferView dst) override;
  absl::Status CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) override;
  absl::Status CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                            backend::BufferView dst) override;
  absl::Status CopyFromPeer(backend::Stream& stream, backend::Device& peer,
                            backend::Stream& peer_stream, backend::BufferView src,
                            backend::BufferView dst) override;
  backend::Claim Supports(const backend::KernelSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<backend::Kernel>> PrepareKernel(
      const backend::KernelSpec& spec, backend::PrepareContext& context) override;
  int64_t memory_in_use() const override { return memory_in_use_.load(); }
  // backend::HostMemoryRegistrar (cuMemHostRegister): copies from and to the
  // range are DMA on the stream.
  absl::StatusOr<std::unique_ptr<backend::HostRegistration>> RegisterHostMemory(
      void* base, int64_t bytes) override;

  // ---- For the backend's own streams and kernels ----
  const DeviceCaps& caps() const { return caps_; }
  CUcontext context() const { return context_; }
  CUmemoryPool pool() const { return pool_; }
  ModuleCache& modules() { return *modules_; }

  // Makes the device's context current on the calling thread (cheap when it
  // already is) and returns the device's fault, if it has one.
  absl::Status Enter() const;
  // CuCheck for this device; a device fault it returns also marks the device.
  absl::Status Check(CUresult r, const char* call) const;
  absl::Status CheckCublas(cublasStatus_t r, const char* call) const;
  // Marks the device faulted with `fault` (a backend::DeviceFault); the first wins.
  void MarkFaulted(const absl::Status& fault) const;
  // OK, or the fault the device was marked with.
  absl::Status Health() const;

  // Polls `query` (cuStreamQuery / cuEventQuery) until it stops answering
  // CUDA_ERROR_NOT_READY or `timeout` passes. A timeout is a device fault
  // (the caller's stream stays failed) but does not mark the device: slow is
  // not broken, and the engine decides what to restart. `what` names the wait.
  template <typename Query>
  absl::Status PollUntilDone(Query query, absl::Duration timeout, const std::string& what) const;

  // The device address of `view` for `need` bytes: the buffer must be this
  // device's and the range inside it. `what` names the operand.
  absl::StatusOr<CUdeviceptr> Resolve(const backend::BufferView& view, int64_t need,
                                      const std::string& what) const;

  // cuBLASLt handle (created at first use; cuBLASLt handles are thread-safe).
  absl::StatusOr<cublasLtHandle_t> LtHandle();
  // cuBLASLt's first heuristic choice for `desc` over the layouts a, b and c
  // (c is also the output's), within `workspace_bytes` of workspace and for
  // operands aligned to `min_alignment` bytes. UNIMPLEMENTED naming `what`
  // when cuBLASLt has none.
  absl::StatusOr<cublasLtMatmulAlgo_t> LtHeuristicAlgo(cublasLtMatmulDesc_t desc,
                                                       cublasLtMatrixLayout_t a,
                                                       cublasLtMatrixLayout_t b,
                                                       cublasLtMatrixLayout_t c,
                                                       uint64_t workspace_bytes,
                                                       uint32_t min_alignment,
                                                       absl::string_view what);
  // The cuBLASLt algorithms chosen on this device, by the product's key
  // (kernels_matmul.cc): each shape asks the heuristic or the kernel cache
  // once per device.
  std::optional<cublasLtMatmulAlgo_t> FindAlgo(const std::string& key) const;
  void KeepAlgo(const std::string& key, const cublasLtMatmulAlgo_t& algo);

  // cuDNN's version (91400 for 9.14.0) when libcudnn was found at creation,
  // else 0; the device's features then list "cudnn-9.14.0".
  size_t cudnn_version() const { return cudnn_version_; }
  // Why cuDNN is not used (no library, KILN_CUDNN=0, ...); empty when it is.
  const std::string& cudnn_missing() const { return cudnn_missing_; }
  // The device's cuDNN handle and plan cache, created at first use.
  // REQUIRES: cudnn_version() != 0.
  absl::StatusOr<CudnnContext*> cudnn_context();

  // Whether [ptr, ptr + bytes) lies inside one live host registration (its
  // pages are pinned: the driver copies it asynchronously, no staging).
  bool IsRegistered(const void* ptr, int64_t bytes) const;

  // Frees a buffer's memory, ordered on the allocation stream.
  void FreeBuffer(CUdeviceptr ptr, int64_t bytes);

 private:
  CudaDevice() = default;
  absl::Status Init(int ordinal, const backend::BackendOptions& options);
  // Opens the libraries that preparing kernels asks (NVRTC for the cubin
  // cache keys, cuBLASLt and its handle, cuDNN's handle) when the device is
  // created, i.e. when a device worker starts: a one-time cost of the
  // engine's start, logged with its parts, which a compile (a warm one
  // included, which compiles nothing) then does not pay. Calibration, which
  // runs matmuls, paid it at the start before; a start that took the profile
  // from the cache left it to the first compile.
  //
  // The slow parts (WarmUp: cuBLASLt's handle and its per-type set-up below,
  // 420-480 ms on an H200; cuDNN's engine libraries) run before the device is
  // returned (the measured behaviour). KILN_CUDA_WARMUP=background runs them
  // on a thread of their own, warm_up_ (the device is usable at once; a
  // prepare that needs cuBLASLt before the thread is done waits for the
  // handle's lock or cuBLASLt's own set-up; not yet run on a GPU), =0 not at
  // all (the first use pays them).
  void OpenLibraries();
  void WarmUp();
  // cuBLASLt sets up its heuristic for a data type at the first query that
  // uses it: on an H100 the first bf16 matmul's prepare took 76-116 ms in a
  // warm compile, with its algorithm from the cache (cublasLtMatmulAlgoCheck)
  // as with the heuristic (cold), against 2-5 ms for the next five products
  // together, while calibration's f32 and f16 products had not paid it. One
  // small product per type (bf16, f16, f32) is asked for and checked here.
  void WarmUpCublasLt(cublasLtHandle_t handle);
  absl::Status WaitInternal(CUstream stream, const char* what) const;

  backend::DeviceInfo info_;
  DeviceCaps caps_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUmemoryPool pool_ = nullptr;
  std::unique_ptr<ModuleCache> modules_;
  std::atomic<int64_t> memory_in_use_{0};

  // Allocate and buffer frees are ordered on this stream.
  absl::Mutex alloc_mu_;
  CUstream alloc_stream_ ABSL_GUARDED_BY(alloc_mu_) = nullptr;

  absl::Mutex lt_mu_;
  cublasLtHandle_t lt_ ABSL_GUARDED_BY(lt_mu_) = nullptr;
  mutable absl::Mutex algos_mu_;
  absl::flat_hash_map<std::string, cublasLtMatmulAlgo_t> algos_ ABSL_GUARDED_BY(algos_mu_);

  std::thread warm_up_;  // WarmUp's, joined first by the destructor

  size_t cudnn_version_ = 0;
  std::string cudnn_missing_;
  absl::Mutex cudnn_mu_;
  std::unique_ptr<CudnnContext> cudnn_ ABSL_GUARDED_BY(cudnn_mu_);

  friend class CudaHostRegistration;
  // Live host registrations: start address -> end address.
  mutable absl::Mutex host_mu_;
  std::map<uintptr_t, uintptr_t> registered_ ABSL_GUARDED_BY(host_mu_);

  // Devices whose pools this device's copies may read (CopyFromPeer).
  absl::Mutex peers_mu_;
  absl::flat_hash_map<const CudaDevice*, bool> peer_access_ ABSL_GUARDED_BY(peers_mu_);

  mutable std::atomic<bool> faulted_{false};
  mutable absl::Mutex fault_mu_;
  mutable absl::Status fault_ ABSL_GUARDED_BY(fault_mu_);
};

// Device memory from the device's pool; freed (stream-ordered) when destroyed.
class CudaBuffer final : public backend::Buffer, public backend::CaptureBinding {
 public:
  CudaBuffer(CudaDevice* owner, CUdeviceptr ptr, int64_t size)
      : owner_(owner), ptr_(ptr), size_(size) {}
  ~CudaBuffer() override {
    if (ptr_ != 0) owner_->FreeBuffer(ptr_, size_);
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  int64_t size() const override { return size_; }
  // The device address: what a captured CUDA graph bakes in.
  uint64_t binding_id() const override { return ptr_; }
  const CudaDevice* owner() const { return owner_; }
  CUdeviceptr ptr() const { return ptr_; }

 private:
  CudaDevice* owner_;
  CUdeviceptr ptr_;
  int64_t size_;
};

// The CudaStream behind `stream`, or INVALID_ARGUMENT when it belongs to
// another device or backend.
absl::StatusOr<CudaStream*> AsCudaStream(backend::Stream& stream, const CudaDevice& device);

// ---- implementation of the template ----

inline constexpr absl::Duration kPollSpin = absl::Milliseconds(2);
// Yields for the first kPollSpin (2 ms) of a wait (a run of a few launch-bound
// kernels ends within that: a sleep, which overshoots by the kernel's timer
// slack of ~50 us, would add that to every run), then sleeps in growing
// steps up to 1 ms; never waits past `timeout`.
void PollBackoff(absl::Duration waited, int sleeps);

template <typename Query>
absl::Status CudaDevice::PollUntilDone(Query query, absl::Duration timeout,
                                       const std::string& what) const {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  for (int sleeps = 0;;) {
    const CUresult r = query();
    if (r != CUDA_ERROR_NOT_READY) return Check(r, what.c_str());
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return backend::DeviceFault(
          info_.id, absl::StrCat(what, " did not finish within ", absl::FormatDuration(timeout),
                                 " (the device is hung or overloaded)"));
    }
    PollBackoff(now - start, sleeps);
    if (now - start >= kPollSpin) ++sleeps;
  }
}

}  // namespace kiln::cuda
