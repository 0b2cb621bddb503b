#include "backends/vulkan/vk_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace kiln::vulkan {

#define KILN_VK_DEFINE(name) PFN_##name name = nullptr;
KILN_VK_FUNCTIONS(KILN_VK_DEFINE)
#undef KILN_VK_DEFINE
PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion = nullptr;

absl::Status LoadVulkanLoader() {
  static std::once_flag once;
  static absl::Status* status = new absl::Status();
  std::call_once(once, [] {
    void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      *status = absl::UnavailableError(
          absl::StrCat("vulkan: cannot load libvulkan.so.1 (no Vulkan loader): ", dlerror()));
      return;
    }
    std::string missing;
    // `name` is a function name pasted into identifiers, never an expression.
#define KILN_VK_RESOLVE(name)                                          \
  name = reinterpret_cast<PFN_##name>(dlsym(lib, #name)); /* NOLINT */ \
  if ((name) == nullptr) missing += absl::StrCat(missing.empty() ? "" : ", ", #name);
    KILN_VK_FUNCTIONS(KILN_VK_RESOLVE)
#undef KILN_VK_RESOLVE
    vkEnumerateInstanceVersion =
        reinterpret_cast<PFN_vkEnumerateInstanceVersion>(dlsym(lib, "vkEnumerateInstanceVersion"));
    if (!missing.empty()) {
      *status = absl::UnavailableError(
          absl::StrCat("vulkan: the loader lacks ", missing, " (it predates Vulkan 1.2)"));
    }
    // The library stays loaded for the life of the process.
  });
  return *status;
}

}  // namespace kiln::vulkan
