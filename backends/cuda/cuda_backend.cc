// The CUDA backend: one CudaDevice per GPU the driver lists ("cuda:0" ..
// "cuda:n-1" in driver order). Registered at priority 5 (after the CPU,
// before Vulkan). Without libcuda.so.1, a driver that cuInit refuses or a
// usable GPU, the factory fails or lists no devices; it never takes kilnd down.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/cuda_device.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kiln::cuda {
namespace {

class CudaBackend final : public backend::Backend {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Backend>> Create(
      const backend::BackendOptions& options) {
    KILN_RETURN_IF_ERROR(LoadDriver());
    int count = 0;
    KILN_RETURN_IF_ERROR(CuCheck(Driver().cuDeviceGetCount(&count), "cuDeviceGetCount", "cuda"));
    auto backend = std::unique_ptr<CudaBackend>(new CudaBackend());
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(i, options);
      if (!d.ok()) {
        spdlog::warn("cuda: skipping device {}: {}", i, std::string(d.status().message()));
        continue;
      }
      backend->devices_.push_back(std::move(d).value());
    }
    return std::unique_ptr<backend::Backend>(std::move(backend));
  }

  std::string name() const override { return "cuda"; }
  std::string version() const override { return absl::StrCat("kiln-cuda-", kBackendVersion); }
  std::vector<backend::Device*> devices() const override {
    std::vector<backend::Device*> out;
    for (const auto& d : devices_) out.push_back(d.get());
    return out;
  }

 private:
  static constexpr int kBackendVersion = 1;
  CudaBackend() = default;
  std::vector<std::unique_ptr<CudaDevice>> devices_;
};

const backend::BackendRegistration kRegistration("cuda", 5, &CudaBackend::Create);

}  // namespace
}  // namespace kiln::cuda
