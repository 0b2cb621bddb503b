// The Vulkan backend: one VkInstance, one VulkanDevice per usable physical
// device ("vulkan:0".."vulkan:n-1" in enumeration order). Registered at
// priority 10 (after the CPU). Without a loader, a driver or a usable device
// the factory fails or lists no devices; it never takes kilnd down.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_loader.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kiln::vulkan {
namespace {

class VulkanBackend final : public backend::Backend {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Backend>> Create(
      const backend::BackendOptions& options) {
    KILN_RETURN_IF_ERROR(LoadVulkanLoader());
    uint32_t loader_version = VK_API_VERSION_1_0;
    if (vkEnumerateInstanceVersion != nullptr) vkEnumerateInstanceVersion(&loader_version);
    if (loader_version < VK_API_VERSION_1_2) {
      return absl::FailedPreconditionError("vulkan: the loader predates Vulkan 1.2");
    }
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "kiln";
    app.pEngineName = "kiln";
    app.apiVersion = loader_version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;
    VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    info.pApplicationInfo = &app;
    VkInstance instance = VK_NULL_HANDLE;
    KILN_RETURN_IF_ERROR(VkCheck(vkCreateInstance(&info, nullptr, &instance), "vkCreateInstance"))
        << "(no Vulkan driver?)";
    auto backend = std::unique_ptr<VulkanBackend>(new VulkanBackend(instance));
    uint32_t count = 0;
    KILN_RETURN_IF_ERROR(VkCheck(vkEnumeratePhysicalDevices(instance, &count, nullptr),
                                 "vkEnumeratePhysicalDevices"));
    std::vector<VkPhysicalDevice> physical(count);
    KILN_RETURN_IF_ERROR(VkCheck(vkEnumeratePhysicalDevices(instance, &count, physical.data()),
                                 "vkEnumeratePhysicalDevices"));
    for (VkPhysicalDevice p : physical) {
      const int ordinal = static_cast<int>(backend->devices_.size());
      absl::StatusOr<std::unique_ptr<VulkanDevice>> d =
          VulkanDevice::Create(instance, p, ordinal, options);
      if (!d.ok()) {
        spdlog::warn("vulkan: skipping a device: {}", std::string(d.status().message()));
        continue;
      }
      backend->devices_.push_back(std::move(d).value());
    }
    return std::unique_ptr<backend::Backend>(std::move(backend));
  }

  ~VulkanBackend() override {
    devices_.clear();  // before the instance they were created from
    vkDestroyInstance(instance_, nullptr);
  }

  std::string name() const override { return "vulkan"; }
  std::string version() const override { return absl::StrCat("kiln-vulkan-", kBackendVersion); }
  std::vector<backend::Device*> devices() const override {
    std::vector<backend::Device*> out;
    for (const auto& d : devices_) out.push_back(d.get());
    return out;
  }

 private:
  static constexpr int kBackendVersion = 1;
  explicit VulkanBackend(VkInstance instance) : instance_(instance) {}

  VkInstance instance_;
  std::vector<std::unique_ptr<VulkanDevice>> devices_;
};

const backend::BackendRegistration kRegistration("vulkan", 10, &VulkanBackend::Create);

}  // namespace
}  // namespace kiln::vulkan
