// The Vulkan entry points the backend calls, resolved at run time from
// libvulkan.so.1 (dlopen), so a machine without the Vulkan loader still runs
// kilnd: the backend's factory then fails and lists no devices (DESIGN.md §1).
// The library is compiled with VK_NO_PROTOTYPES; these pointers, named like
// the Vulkan functions, live in namespace kiln::vulkan (their symbols never
// clash with a loader linked by someone else).
//
// Thread safety: LoadVulkanLoader is idempotent and thread-safe; the pointers
// are written once, before it returns OK, and only read afterwards.
#pragma once

#ifndef VK_NO_PROTOTYPES
#error "backends/vulkan is compiled with VK_NO_PROTOTYPES (see its CMakeLists.txt)"
#endif
#include <vulkan/vulkan.h>

#include "absl/status/status.h"

// Core (1.0-1.2) functions exported by every loader.
#define KILN_VK_FUNCTIONS(X)                                                                       \
  X(vkGetInstanceProcAddr)                                                                         \
  X(vkCreateInstance) X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(                        \
      vkGetPhysicalDeviceProperties) X(vkGetPhysicalDeviceProperties2)                             \
      X(vkGetPhysicalDeviceFeatures2) X(vkGetPhysicalDeviceMemoryProperties) X(                    \
          vkGetPhysicalDeviceQueueFamilyProperties) X(vkEnumerateDeviceExtensionProperties)        \
          X(vkCreateDevice) X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkDeviceWaitIdle) X(          \
              vkQueueSubmit) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements) \
              X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory)             \
                  X(vkUnmapMemory) X(vkCreateCommandPool) X(vkDestroyCommandPool) X(               \
                      vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer)      \
                      X(vkCreateSemaphore) X(vkDestroySemaphore) X(vkWaitSemaphores) X(            \
                          vkGetSemaphoreCounterValue) X(vkCreateDescriptorPool)                    \
                          X(vkDestroyDescriptorPool) X(vkResetDescriptorPool) X(                   \
                              vkAllocateDescriptorSets) X(vkUpdateDescriptorSets)                  \
                              X(vkCmdPipelineBarrier) X(vkCmdBindPipeline) X(                      \
                                  vkCmdBindDescriptorSets) X(vkCmdPushConstants) X(vkCmdDispatch)  \
                                  X(vkCmdCopyBuffer) X(vkCmdFillBuffer) X(vkCmdResetQueryPool)     \
                                      X(vkCmdWriteTimestamp) X(vkCreateQueryPool)                  \
                                          X(vkDestroyQueryPool) X(vkGetQueryPoolResults) X(        \
                                              vkCreatePipelineCache) X(vkDestroyPipelineCache)     \
                                              X(vkGetPipelineCacheData) X(vkCreateShaderModule)    \
                                                  X(vkDestroyShaderModule)                         \
                                                      X(vkCreateDescriptorSetLayout)               \
                                                          X(vkDestroyDescriptorSetLayout)          \
                                                              X(vkCreatePipelineLayout)            \
                                                                  X(vkDestroyPipelineLayout)       \
                                                                      X(vkCreateComputePipelines)  \
                                                                          X(vkDestroyPipeline)

namespace kiln::vulkan {

#define KILN_VK_DECLARE(name) extern PFN_##name name;
KILN_VK_FUNCTIONS(KILN_VK_DECLARE)
#undef KILN_VK_DECLARE
// Vulkan 1.1+: null when the loader is 1.0.
extern PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion;

// Opens libvulkan.so.1 and resolves every function above. UNAVAILABLE when
// the loader or a function is missing.
absl::Status LoadVulkanLoader();

}  // namespace kiln::vulkan
