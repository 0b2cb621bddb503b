#include "backends/cuda/cudnn_api.h"

#include <dlfcn.h>

#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/backend.h"

namespace kiln::cuda {
namespace {

CudnnApi g_cudnn;
std::once_flag g_once;
absl::Status g_status;
size_t g_version = 0;

absl::Status DoLoad() {
  void* lib = nullptr;
  std::string error;
  for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* err = dlerror();
    if (error.empty() && err != nullptr) error = err;
  }
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cudnn: no cuDNN library (", error, ")"));
  }
#define KILN_CUDNN_RESOLVE(name)                                              \
  g_cudnn.name = reinterpret_cast<decltype(g_cudnn.name)>(dlsym(lib, #name)); \
  if (g_cudnn.name == nullptr) {                                              \
    return absl::FailedPreconditionError("cudnn: libcudnn lacks " #name);     \
  }
  KILN_CUDNN_FUNCTIONS(KILN_CUDNN_RESOLVE)
#undef KILN_CUDNN_RESOLVE
  g_version = g_cudnn.cudnnGetVersion();
  if (g_version < 90000) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudnn: version ", CudnnVersionText(g_version), " is older than 9.0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadCudnn() {
  std::call_once(g_once, [] { g_status = DoLoad(); });
  return g_status;
}

const CudnnApi& Cudnn() { return g_cudnn; }
size_t CudnnVersion() { return g_version; }

std::string CudnnVersionText(size_t version) {
  return absl::StrCat(version / 10000, ".", (version % 10000) / 100, ".", version % 100);
}

bool CudnnDisabledBy(const char* env_value) {
  if (env_value == nullptr) return false;
  const std::string v = absl::AsciiStrToLower(env_value);
  return v == "0" || v == "off" || v == "false" || v == "no";
}

absl::Status CudnnCheck(cudnnStatus_t r, const char* call, const std::string& device) {
  if (r == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  const char* text =
      g_cudnn.cudnnGetErrorString != nullptr ? g_cudnn.cudnnGetErrorString(r) : "cudnnStatus_t";
  char last[512] = {};
  if (g_cudnn.cudnnGetLastErrorString != nullptr) {
    g_cudnn.cudnnGetLastErrorString(last, sizeof(last));
  }
  const std::string what = absl::StrCat(call, " failed: ", text, " (", static_cast<int>(r), ")",
                                        last[0] != 0 ? absl::StrCat(": ", last) : "");
  const int category = static_cast<int>(r) / 1000 * 1000;
  if (category == CUDNN_STATUS_EXECUTION_FAILED) return backend::DeviceFault(device, what);
  const std::string msg = absl::StrCat(device, ": ", what);
  if (r == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      r == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(msg);
  }
  switch (category) {
    case CUDNN_STATUS_BAD_PARAM:
      return absl::InvalidArgumentError(msg);
    case CUDNN_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace kiln::cuda
