// The CUDA libraries the backend uses, opened at run time with dlopen: the
// driver (libcuda.so.1), NVRTC (libnvrtc.so.13) and cuBLASLt
// (libcublasLt.so.13). Only the toolkit's headers are used at build time, so
// kilnd, kilnctl and the device worker start, and list no CUDA device, on a
// host without a driver or without the CUDA libraries (docs/cuda.md).
//
// Driver entry points are resolved through cuGetProcAddress with the
// header's CUDA_VERSION, so each pointer has exactly the ABI of the
// prototype it is declared with (cuda.h maps cuMemcpyHtoDAsync to its _v2
// form, and so does the lookup).
//
// Error mapping: every CUresult, nvrtcResult and cublasStatus_t becomes an
// absl::Status naming the call. Sticky driver errors (an illegal address, a
// failed launch: the context is unusable afterwards) are device faults
// (backend::DeviceFault), so the runtime discards and restarts the worker.
//
// Thread safety: the tables are loaded once (LoadCuda* are thread-safe and
// idempotent) and immutable afterwards.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <nvrtc.h>

#include <string>

#include "absl/status/status.h"

namespace kiln::cuda {

// The entry points each library table holds (one X per function).
// clang-format off
#define KILN_CUDA_DRIVER_FUNCTIONS(X) \
  X(cuInit)                           \
  X(cuDriverGetVersion)               \
  X(cuGetErrorName)                   \
  X(cuGetErrorString)                 \
  X(cuDeviceGetCount)                 \
  X(cuDeviceGet)                      \
  X(cuDeviceGetName)                  \
  X(cuDeviceGetAttribute)             \
  X(cuDeviceTotalMem)                 \
  X(cuDeviceGetUuid)                  \
  X(cuDevicePrimaryCtxRetain)         \
  X(cuDevicePrimaryCtxRelease)        \
  X(cuCtxSetCurrent)                  \
  X(cuDeviceCanAccessPeer)            \
  X(cuDeviceGetDefaultMemPool)        \
  X(cuMemPoolSetAttribute)            \
  X(cuMemPoolSetAccess)               \
  X(cuMemAllocFromPoolAsync)          \
  X(cuMemFreeAsync)                   \
  X(cuMemHostAlloc)                   \
  X(cuMemFreeHost)                    \
  X(cuMemHostGetDevicePointer)        \
  X(cuMemcpyHtoDAsync)                \
  X(cuMemcpyDtoHAsync)                \
  X(cuMemcpyDtoDAsync)                \
  X(cuStreamCreate)                   \
  X(cuStreamDestroy)                  \
  X(cuStreamQuery)                    \
  X(cuStreamWaitEvent)                \
  X(cuEventCreate)                    \
  X(cuEventDestroy)                   \
  X(cuEventRecord)                    \
  X(cuEventQuery)                     \
  X(cuEventElapsedTime)               \
  X(cuModuleLoadData)                 \
  X(cuModuleUnload)                   \
  X(cuModuleGetFunction)              \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuFuncSetAttribute)               \
  X(cuStreamBeginCapture)             \
  X(cuStreamEndCapture)               \
  X(cuGraphInstantiateWithFlags)      \
  X(cuGraphLaunch)                    \
  X(cuGraphExecDestroy)               \
  X(cuGraphDestroy)                   \
  X(cuEventRecordWithFlags)           \
  X(cuMemHostRegister)                \
  X(cuMemHostUnregister)              \
  X(cuLaunchKernel)

#define KILN_NVRTC_FUNCTIONS(X) \
  X(nvrtcVersion)               \
  X(nvrtcGetErrorString)        \
  X(nvrtcCreateProgram)         \
  X(nvrtcDestroyProgram)        \
  X(nvrtcCompileProgram)        \
  X(nvrtcGetProgramLogSize)     \
  X(nvrtcGetProgramLog)         \
  X(nvrtcGetCUBINSize)          \
  X(nvrtcGetCUBIN)

#define KILN_CUBLASLT_FUNCTIONS(X)        \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)     \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulAlgoCheck)              \
  X(cublasLtGetVersion)                   \
  X(cublasLtMatmul)
// clang-format on

#define KILN_CUDA_DECLARE_FN(name) decltype(&::name) name = nullptr;

struct DriverApi {
  KILN_CUDA_DRIVER_FUNCTIONS(KILN_CUDA_DECLARE_FN)
};
struct NvrtcApi {
  KILN_NVRTC_FUNCTIONS(KILN_CUDA_DECLARE_FN)
};
struct CublasLtApi {
  KILN_CUBLASLT_FUNCTIONS(KILN_CUDA_DECLARE_FN)
};

// Each loads its library once and resolves every entry point. Failure
// (library absent, symbol missing, cuInit failing: no driver, no device)
// is FAILED_PRECONDITION naming what was missing; later calls return the
// same status.
absl::Status LoadDriver();
absl::Status LoadNvrtc();
absl::Status LoadCublasLt();

// REQUIRES: the matching Load* returned OK.
const DriverApi& Driver();
const NvrtcApi& Nvrtc();
const CublasLtApi& CublasLt();

// Whether `r` leaves the context unusable (every later call fails).
bool IsStickyError(CUresult r);

// OK for CUDA_SUCCESS. Otherwise: for a sticky error a device fault of
// `device` ("cuda:0") naming `call`; else an error status whose code follows
// the result (out of memory -> RESOURCE_EXHAUSTED, invalid values ->
// INVALID_ARGUMENT, not ready -> UNAVAILABLE, others INTERNAL).
absl::Status CuCheck(CUresult r, const char* call, const std::string& device);
absl::Status NvrtcCheck(nvrtcResult r, const char* call);
absl::Status CublasCheck(cublasStatus_t r, const char* call, const std::string& device);

// "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered".
std::string CuErrorText(CUresult r);

}  // namespace kiln::cuda
