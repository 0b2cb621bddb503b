// cuDNN, opened at run time with dlopen like the driver, NVRTC and cuBLASLt
// (cuda_api.h): libcudnn.so.9 (the GPU machine's 9.14 in
// /usr/lib/x86_64-linux-gnu, or a PyTorch wheel's nvidia/cudnn/lib on the
// loader's path). Only cudnn_graph.h's backend graph API is used, and only
// entry points that exist in 9.0 and later. Nothing links cuDNN: a host
// without it keeps Kiln's own attention kernels, and the device's features
// say whether cuDNN was found and its version ("cudnn-9.14.0").
//
// KILN_CUDNN=0 (or "off") in the environment when a CUDA device is created
// makes that device use no cuDNN, as if the library were absent: benchmarks
// and tests time and check Kiln's own kernels beside cuDNN's in one process.
//
// Thread safety: the table is loaded once (LoadCudnn is thread-safe and
// idempotent) and immutable afterwards.
#pragma once

#include <cudnn_graph.h>

#include <string>

#include "absl/status/status.h"

namespace kiln::cuda {

// clang-format off
#define KILN_CUDNN_FUNCTIONS(X)     \
  X(cudnnGetVersion)                \
  X(cudnnGetErrorString)            \
  X(cudnnGetLastErrorString)        \
  X(cudnnCreate)                    \
  X(cudnnDestroy)                   \
  X(cudnnSetStream)                 \
  X(cudnnBackendCreateDescriptor)   \
  X(cudnnBackendDestroyDescriptor)  \
  X(cudnnBackendSetAttribute)       \
  X(cudnnBackendGetAttribute)       \
  X(cudnnBackendFinalize)           \
  X(cudnnBackendExecute)
// clang-format on

struct CudnnApi {
#define KILN_CUDNN_DECLARE_FN(name) decltype(&::name) name = nullptr;
  KILN_CUDNN_FUNCTIONS(KILN_CUDNN_DECLARE_FN)
#undef KILN_CUDNN_DECLARE_FN
};

// Loads libcudnn.so.9 once and resolves every entry point; FAILED_PRECONDITION
// naming what was missing otherwise, the same
// status on every later call. A library older than 9.0 is refused.
absl::Status LoadCudnn();
// REQUIRES: LoadCudnn() returned OK.
const CudnnApi& Cudnn();
// cudnnGetVersion(): 91400 for 9.14.0. REQUIRES: LoadCudnn() OK.
size_t CudnnVersion();
// "9.14.0" for 91400.
std::string CudnnVersionText(size_t version);

// Whether KILN_CUDNN's value `env_value` (nullptr when unset) turns cuDNN off.
bool CudnnDisabledBy(const char* env_value);

// OK for CUDNN_STATUS_SUCCESS; otherwise a status naming `call` and cuDNN's
// text (and its last error message), whose code follows the status' category:
// BAD_PARAM -> INVALID_ARGUMENT, NOT_SUPPORTED -> UNIMPLEMENTED, allocation
// failures -> RESOURCE_EXHAUSTED, others INTERNAL; EXECUTION_FAILED is a
// device fault of `device` (a kernel failed on the device).
absl::Status CudnnCheck(cudnnStatus_t r, const char* call, const std::string& device);

}  // namespace kiln::cuda
