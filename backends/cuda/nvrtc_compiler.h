// Kiln's own CUDA kernels are CUDA C++ source (hand-written families under
// kernels/, embedded at build time; generated elementwise regions), compiled
// at prepare time by NVRTC to a cubin for the device's arch, never by nvcc at
// build time. Cubins are stored in the kernel level of the compile cache
// (PrepareContext::binaries) under a SHA-256 key over the ordered components
// {kind, codegen version, NVRTC version, arch, flags, source}, and memoized
// per device as loaded modules, so a warm start compiles nothing.
//
// Thread-safe. The device outlives its ModuleCache.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/cuda/cuda_api.h"

namespace kiln::cuda {

class CudaDevice;

// Bumped whenever generated or embedded kernel code changes meaning.
inline constexpr int kCodegenVersion = 1;

// The NVRTC options every kernel is compiled with (IEEE division and square
// roots, denormals kept: results follow the f32 references).
inline constexpr char kNvrtcFlags[] = "-std=c++17;-default-device;--extra-device-vectorization";

// The kernel-cache key of `source` for `arch` ("sm_90"): "cuda-cubin-" + hex
// SHA-256. The key includes NVRTC's version (loading NVRTC if need be).
std::string CubinCacheKey(const std::string& source, const std::string& arch);

// Compiles `source` to a cubin for `arch` without any caching (used by the
// cache and by the tests, which need no GPU). `name` labels compile errors.
absl::StatusOr<std::string> CompileCubin(const std::string& name, const std::string& source,
                                         const std::string& arch);

// A loaded module; unloaded when the last kernel using it goes.
class Module {
 public:
  Module(const CudaDevice& device, CUmodule module) : device_(device), module_(module) {}
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  absl::StatusOr<CUfunction> Function(const std::string& name) const;

 private:
  const CudaDevice& device_;
  CUmodule module_;
};

class ModuleCache {
 public:
  explicit ModuleCache(CudaDevice& device) : device_(device) {}
  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

  // The loaded module of `source`. A memo or binary-cache hit counts in
  // context.kernel_cache_hits; a compile counts in kernel_cache_misses and is
  // stored in context.binaries. A cached entry that is not a loadable cubin
  // is recompiled and overwritten.
  absl::StatusOr<std::shared_ptr<const Module>> Get(const std::string& name,
                                                    const std::string& source,
                                                    backend::PrepareContext& context);

 private:
  CudaDevice& device_;
  absl::Mutex memo_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Module>> memo_ ABSL_GUARDED_BY(memo_mu_);
};

}  // namespace kiln::cuda
