// Attention forward through cuDNN's backend graph API (cudnn_graph.h): the
// fused flash-attention op graph that cuDNN's runtime-fusion engine
// recognises, built as cuDNN 9.14 accepts it (the unified SDPA_FWD operation
// of newer releases has no causal mask of its own and is not used):
//   S = Q K^T (f32) -> S * scale -> [causal: GEN_INDEX row (+ Sk - Sq) >=
//   GEN_INDEX col, BINARY_SELECT S or -inf] -> softmax as max, sub, exp,
//   sum, div (with log-sum-exp statistics, virtual) -> P (q's dtype) -> P V.
// Which shapes it serves: cudnn_sdpa_plan.h.
//
// CudnnContext is one device's cuDNN handle and its execution plans, cached
// per CudnnSdpaKey (shape, strides, mask, dtype, cuDNN version). Plans are
// immutable once built and shared by every kernel of that key; the
// workspace is the kernel's own, from the device's pool, so a launch
// allocates nothing and a CUDA graph captures it as is.
//
// Lifetimes: the context lives in its CudaDevice (CudaDevice::Cudnn) and is
// destroyed before the device releases its CUDA context; plans it returned
// stay valid while a kernel holds them. Thread safety: every method is
// thread-safe; executes on the handle are serialized (cudnnSetStream then
// cudnnBackendExecute, which only enqueues).
#pragma once

#include <cuda.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/cuda/cudnn_api.h"
#include "backends/cuda/cudnn_sdpa_plan.h"

namespace kiln::cuda {

class CudaDevice;

// A finalized execution plan for one SdpaShape, and the descriptors it was
// built from (kept alive with it).
class CudnnSdpaPlan {
 public:
  CudnnSdpaPlan() = default;
  ~CudnnSdpaPlan();
  CudnnSdpaPlan(const CudnnSdpaPlan&) = delete;
  CudnnSdpaPlan& operator=(const CudnnSdpaPlan&) = delete;

  const SdpaShape& shape() const { return shape_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // The engine's global index (which cuDNN engine the heuristic chose).
  int64_t engine() const { return engine_; }

 private:
  friend class CudnnContext;
  SdpaShape shape_;
  int64_t workspace_bytes_ = 0;
  int64_t engine_ = -1;
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned_;  // every descriptor, destroyed last to first
};

class CudnnContext {
 public:
  // REQUIRES: LoadCudnn() returned OK. Creates the handle on `device`'s context.
  static absl::StatusOr<std::unique_ptr<CudnnContext>> Create(const CudaDevice& device);
  ~CudnnContext();
  CudnnContext(const CudnnContext&) = delete;
  CudnnContext& operator=(const CudnnContext&) = delete;

  // The plan for `shape`: from this context's memo; else loaded from
  // `context->binaries` (a "cudnn-plan" entry: the plan's JSON as cuDNN
  // serializes it, its runtime-compiled kernels included, prepare_cache.h);
  // else built and finalized (the first engine of cuDNN's heuristic that
  // finalizes) and stored there. A memo or cache hit counts in
  // context->kernel_cache_hits, a build in kernel_cache_misses. An entry that
  // does not decode or that cuDNN cannot finalize is rebuilt and overwritten.
  // A shape cuDNN refused is remembered too and refused again with the same
  // status. `context` may be null (no disk cache, nothing counted).
  // REQUIRES: CudnnSdpaServes(shape, ...) OK.
  absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>> SdpaPlan(
      const SdpaShape& shape, backend::PrepareContext* context = nullptr);

  // Enqueues `plan` on `stream`: O = attention(Q, K, V) with `scale`, the
  // workspace at `workspace` (plan.workspace_bytes() bytes; 0 when none).
  absl::Status ExecuteSdpa(const CudnnSdpaPlan& plan, CUstream stream, CUdeviceptr q, CUdeviceptr k,
                           CUdeviceptr v, CUdeviceptr o, CUdeviceptr workspace, float scale);

  // How many plans were built (not served from the memo or the disk cache),
  // and how many were loaded from the disk cache; for tests.
  int64_t plans_built() const;
  int64_t plans_loaded() const;

 private:
  explicit CudnnContext(const CudaDevice& device) : device_(device) {}
  absl::Status Check(cudnnStatus_t r, const char* call) const;
  absl::Status Build(const SdpaShape& shape, CudnnSdpaPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(handle_mu_);
  // Finalizes `plan` from its JSON representation.
  absl::Status Load(const SdpaShape& shape, const std::string& json, CudnnSdpaPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(handle_mu_);
  // The finalized plan's JSON representation (empty when cuDNN cannot
  // serialize the plan's engine).
  std::string Serialize(const CudnnSdpaPlan& plan) const;
  // Workspace size and engine index of a finalized plan.
  absl::Status Describe(CudnnSdpaPlan& plan) const;

  const CudaDevice& device_;

  absl::Mutex handle_mu_;
  cudnnHandle_t handle_ ABSL_GUARDED_BY(handle_mu_) = nullptr;

  mutable absl::Mutex plans_mu_;
  absl::flat_hash_map<std::string, absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>>> plans_
      ABSL_GUARDED_BY(plans_mu_);
  int64_t plans_built_ ABSL_GUARDED_BY(plans_mu_) = 0;
  int64_t plans_loaded_ ABSL_GUARDED_BY(plans_mu_) = 0;
};

}  // namespace kiln::cuda
