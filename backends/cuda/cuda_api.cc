#include "backends/cuda/cuda_api.h"

#include <dlfcn.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"

namespace kiln::cuda {
namespace {

// dlopen of the first name that loads; the toolkit's lib64 as a last resort
// (the GPU machine's libraries live there, not always on the loader's path).
// `error` gets the loader's message for the first (canonical) name.
void* OpenFirst(std::initializer_list<const char*> names, std::string* error) {
  for (const char* n : names) {
    for (const std::string& path : {std::string(n), absl::StrCat("/usr/local/cuda/lib64/", n)}) {
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
      const char* err = dlerror();
      if (error->empty()) *error = err != nullptr ? err : path;
    }
  }
  return nullptr;
}

struct Loaded {
  std::once_flag once;
  absl::Status status;
};

DriverApi g_driver;
NvrtcApi g_nvrtc;
CublasLtApi g_cublaslt;
Loaded g_driver_loaded, g_nvrtc_loaded, g_cublaslt_loaded;

absl::Status DoLoadDriver() {
  std::string error;
  void* lib = OpenFirst({"libcuda.so.1", "libcuda.so"}, &error);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda: no NVIDIA driver library (", error, ")"));
  }
  using GetProc =
      CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    return absl::FailedPreconditionError(
        "cuda: the driver predates cuGetProcAddress_v2 (CUDA 12); update the NVIDIA driver");
  }
#define KILN_CUDA_RESOLVE(name)                                                               \
  {                                                                                           \
    void* fn = nullptr;                                                                       \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;              \
    if (get(#name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || \
        fn == nullptr) {                                                                      \
      return absl::FailedPreconditionError(                                                   \
          absl::StrCat("cuda: the driver lacks " #name " (for CUDA ", CUDA_VERSION, ")"));    \
    }                                                                                         \
    g_driver.name = reinterpret_cast<decltype(g_driver.name)>(fn);                            \
  }
  KILN_CUDA_DRIVER_FUNCTIONS(KILN_CUDA_RESOLVE)
#undef KILN_CUDA_RESOLVE
  const CUresult r = g_driver.cuInit(0);
  if (r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(absl::StrCat("cuda: cuInit failed: ", CuErrorText(r)));
  }
  return absl::OkStatus();
}

absl::Status DoLoadNvrtc() {
  std::string error;
  void* lib = OpenFirst({"libnvrtc.so.13", "libnvrtc.so"}, &error);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cuda: no NVRTC library (", error, ")"));
  }
#define KILN_CUDA_RESOLVE(name)                                               \
  g_nvrtc.name = reinterpret_cast<decltype(g_nvrtc.name)>(dlsym(lib, #name)); \
  if (g_nvrtc.name == nullptr) {                                              \
    return absl::FailedPreconditionError("cuda: libnvrtc lacks " #name);      \
  }
  KILN_NVRTC_FUNCTIONS(KILN_CUDA_RESOLVE)
#undef KILN_CUDA_RESOLVE
  return absl::OkStatus();
}

absl::Status DoLoadCublasLt() {
  std::string error;
  void* lib = OpenFirst({"libcublasLt.so.13", "libcublasLt.so"}, &error);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cuda: no cuBLASLt library (", error, ")"));
  }
#define KILN_CUDA_RESOLVE(name)                                                     \
  g_cublaslt.name = reinterpret_cast<decltype(g_cublaslt.name)>(dlsym(lib, #name)); \
  if (g_cublaslt.name == nullptr) {                                                 \
    return absl::FailedPreconditionError("cuda: libcublasLt lacks " #name);         \
  }
  KILN_CUBLASLT_FUNCTIONS(KILN_CUDA_RESOLVE)
#undef KILN_CUDA_RESOLVE
  return absl::OkStatus();
}

absl::Status LoadOnce(Loaded& l, absl::Status (*load)()) {
  std::call_once(l.once, [&] { l.status = load(); });
  return l.status;
}

}  // namespace

absl::Status LoadDriver() { return LoadOnce(g_driver_loaded, &DoLoadDriver); }
absl::Status LoadNvrtc() { return LoadOnce(g_nvrtc_loaded, &DoLoadNvrtc); }
absl::Status LoadCublasLt() { return LoadOnce(g_cublaslt_loaded, &DoLoadCublasLt); }

const DriverApi& Driver() { return g_driver; }
const NvrtcApi& Nvrtc() { return g_nvrtc; }
const CublasLtApi& CublasLt() { return g_cublaslt; }

bool IsStickyError(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_DEVICE_NOT_LICENSED:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_UNKNOWN:
      return true;
    default:
      return false;
  }
}

std::string CuErrorText(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_driver.cuGetErrorName != nullptr) g_driver.cuGetErrorName(r, &name);
  if (g_driver.cuGetErrorString != nullptr) g_driver.cuGetErrorString(r, &text);
  return absl::StrCat(name != nullptr ? name : absl::StrCat("CUresult ", static_cast<int>(r)),
                      text != nullptr ? absl::StrCat(": ", text) : "");
}

absl::Status CuCheck(CUresult r, const char* call, const std::string& device) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const std::string what = absl::StrCat(call, " failed: ", CuErrorText(r));
  if (IsStickyError(r)) return backend::DeviceFault(device, what);
  const std::string msg = absl::StrCat(device, ": ", what);
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(msg);
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
      return absl::InvalidArgumentError(msg);
    case CUDA_ERROR_NOT_READY:
      return absl::UnavailableError(msg);
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status NvrtcCheck(nvrtcResult r, const char* call) {
  if (r == NVRTC_SUCCESS) return absl::OkStatus();
  const char* text = g_nvrtc.nvrtcGetErrorString != nullptr ? g_nvrtc.nvrtcGetErrorString(r) : "";
  const std::string msg =
      absl::StrCat("cuda: ", call, " failed: ", text, " (nvrtcResult ", static_cast<int>(r), ")");
  if (r == NVRTC_ERROR_OUT_OF_MEMORY) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status CublasCheck(cublasStatus_t r, const char* call, const std::string& device) {
  if (r == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const char* name = "CUBLAS_STATUS_UNKNOWN";
  switch (r) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      name = "CUBLAS_STATUS_NOT_INITIALIZED";
      break;
    case CUBLAS_STATUS_ALLOC_FAILED:
      name = "CUBLAS_STATUS_ALLOC_FAILED";
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      name = "CUBLAS_STATUS_INVALID_VALUE";
      break;
    case CUBLAS_STATUS_ARCH_MISMATCH:
      name = "CUBLAS_STATUS_ARCH_MISMATCH";
      break;
    case CUBLAS_STATUS_MAPPING_ERROR:
      name = "CUBLAS_STATUS_MAPPING_ERROR";
      break;
    case CUBLAS_STATUS_EXECUTION_FAILED:
      name = "CUBLAS_STATUS_EXECUTION_FAILED";
      break;
    case CUBLAS_STATUS_INTERNAL_ERROR:
      name = "CUBLAS_STATUS_INTERNAL_ERROR";
      break;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      name = "CUBLAS_STATUS_NOT_SUPPORTED";
      break;
    case CUBLAS_STATUS_LICENSE_ERROR:
      name = "CUBLAS_STATUS_LICENSE_ERROR";
      break;
    default:
      break;
  }
  const std::string what = absl::StrCat(call, " failed: ", name);
  // A kernel that failed on the device leaves the context as a failed launch does.
  if (r == CUBLAS_STATUS_EXECUTION_FAILED) return backend::DeviceFault(device, what);
  const std::string msg = absl::StrCat(device, ": ", what);
  switch (r) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace kiln::cuda
