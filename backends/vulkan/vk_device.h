// One Vulkan physical device as a backend::Device ("vulkan:N").
//
// Owns the logical device, one compute queue (submissions serialized by
// `queue_mu_`), the memory pools, the pipeline manager (with the persisted
// VkPipelineCache) and the shader compiler for generated kernels.
//
// Lifetimes: the VkInstance (owned by the backend) outlives the device; the
// device outlives every Buffer, Stream and Kernel it created.
// Thread safety: every public method is thread-safe (backend.h).
//
// Debugging switches (environment, read at creation or preparation):
//   KILN_VULKAN_NO_SUBGROUPS=1  kernels take their shared-memory paths
//   KILN_VULKAN_NO_COOPMAT      f16 matmuls skip the cooperative-matrix path
//   KILN_VULKAN_COOP_TILE=BMxBNxBKxSG_MxSG_NxGROUP_M[xSTAGESxORDER]  the
//                               cooperative-matrix matmul's tile (tuning;
//                               ignored if it does not fit)
//   KILN_VULKAN_COOP_EMULATE=1  without cooperative matrices, f16 matmuls run
//                               that kernel's emulation (tests its tiling)
//   KILN_VULKAN_LOG_PIPELINES   log every pipeline creation and its time
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_loader.h"
#include "backends/vulkan/vk_memory.h"

namespace kiln::vulkan {

class PipelineManager;
class ShaderCompiler;

// What the physical device offers, queried once at creation; immutable.
struct DeviceCaps {
  uint32_t api_version = 0;
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  uint32_t driver_version = 0;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint8_t pipeline_cache_uuid[VK_UUID_SIZE] = {};
  uint8_t device_uuid[VK_UUID_SIZE] = {};

  // Limits kernels size themselves by.
  uint32_t max_workgroup_invocations = 128;
  uint32_t max_workgroup_size[3] = {128, 1, 1};
  uint32_t max_workgroup_count[3] = {65535, 65535, 65535};
  uint32_t max_shared_memory = 16384;
  uint32_t max_push_constants = 128;
  uint64_t max_storage_buffer_range = 1u << 27;
  uint64_t min_storage_offset_alignment = 256;
  uint64_t non_coherent_atom_size = 256;

  // Subgroups in compute shaders.
  uint32_t subgroup_size = 1;
  bool subgroup_basic = false;
  bool subgroup_arithmetic = false;
  bool subgroup_shuffle = false;

  // Storage and arithmetic types.
  bool storage16 = false;  // storageBuffer16BitAccess: f16/bf16/i16 tensors
  bool storage8 = false;   // storageBuffer8BitAccess: i8/u8/bool tensors
  bool float16 = false;    // shaderFloat16
  bool int8 = false;       // shaderInt8
  bool int16 = false;
  bool int64 = false;  // shaderInt64: i64 arithmetic
  bool float64 = false;
  // Shaders may declare SignedZeroInfNanPreserve for f32 (IEEE NaN/inf/-0).
  bool preserve_inf_nan32 = false;

  bool vulkan_memory_model = false;  // the cooperative-matrix shader declares it
  bool timeline_semaphore = false;
  bool host_query_reset = false;
  float timestamp_period_ns = 1.0f;
  uint32_t timestamp_valid_bits = 0;

  // Cooperative matrices. Debian 12's Vulkan headers (1.3.239) and glslc
  // (shaderc 2023.2, glslang 11.13: no GL_KHR_cooperative_matrix) predate
  // VK_KHR_cooperative_matrix, so the kernel path uses
  // VK_NV_cooperative_matrix; the KHR extension is only recorded.
  bool coop_matrix_khr = false;
  bool coop_matrix_nv = false;
  bool coop_nv_f16_16x16x16 = false;  // fp16 A/B, fp32 C/D, 16x16x16, subgroup scope
};

class VulkanDevice final : public backend::Device {
 public:
  // Creates the logical device on `physical`. Fails (the backend then skips
  // the device) when it lacks Vulkan 1.2, timeline semaphores or a compute
  // queue with timestamps. `instance` must outlive the device.
  static absl::StatusOr<std::unique_ptr<VulkanDevice>> Create(
      VkInstance instance, VkPhysicalDevice physical, int ordinal,
      const backend::BackendOptions& options);
  ~VulkanDevice() override;  // waits for the queue, saves the pipeline cache
  VulkanDevice(const VulkanDevice&) = delete;
  VulkanDevice& operator=(const VulkanDevice&) = delete;

  // backend::Device
  const backend::DeviceInfo& info() const override { return info_; }
  absl::StatusOr<std::unique_ptr<backend::Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<backend::Stream>> CreateStream() override;
  absl::Status CopyToDevice(backend::Stream& stream, const void* src,
                            backend::BufferView dst) override;
  absl::Status CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) override;
  absl::Status CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                            backend::BufferView dst) override;
  backend::Claim Supports(const backend::KernelSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<backend::Kernel>> PrepareKernel(
      const backend::KernelSpec& spec, backend::PrepareContext& context) override;
  int64_t memory_in_use() const override { return memory_in_use_.load(); }

  // ---- For the backend's own streams and kernels ----
  VkDevice vk() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  const DeviceCaps& caps() const { return caps_; }
  uint32_t queue_family() const { return queue_family_; }
  MemoryPool& device_pool() { return *device_pool_; }
  MemoryPool& staging_pool() { return *staging_pool_; }
  PipelineManager& pipelines() { return *pipelines_; }
  ShaderCompiler& shaders() { return *shaders_; }

  // Submits to the device's queue. Thread-safe.
  absl::Status Submit(const VkSubmitInfo& submit);

  // A timeline semaphore for a stream, and the value it has reached (a
  // recycled one continues from there). Semaphores are never destroyed while
  // the device lives (vk_stream.h says why); a stream gives its semaphore back
  // with ReleaseTimeline once every submission that signals it has finished.
  // Thread-safe.
  struct Timeline {
    VkSemaphore semaphore = VK_NULL_HANDLE;
    uint64_t value = 0;
  };
  absl::StatusOr<Timeline> AcquireTimeline();
  void ReleaseTimeline(Timeline timeline);

  // Resolves `view` to a bindable range of `need` bytes: the buffer must be
  // this device's, the range inside it, and the start aligned to
  // minStorageBufferOffsetAlignment. A zero-byte `need` resolves to a small
  // dummy range (descriptors cannot be empty). `what` names the operand.
  absl::StatusOr<BufferBinding> Resolve(const backend::BufferView& view, int64_t need,
                                        const std::string& what) const;
  // As Resolve, for transfers (copies have no alignment rule). REQUIRES: need > 0.
  absl::StatusOr<BufferBinding> ResolveTransfer(const backend::BufferView& view, int64_t need,
                                                const std::string& what) const;

  // Whether every tensor of `spec` fits one storage-buffer binding and has
  // fewer than 2^31 elements; the reason otherwise.
  backend::Claim CheckTensorLimits(const backend::KernelSpec& spec) const;

 private:
  VulkanDevice() = default;
  absl::Status Init(VkInstance instance, VkPhysicalDevice physical, int ordinal,
                    const backend::BackendOptions& options);

  backend::DeviceInfo info_;
  DeviceCaps caps_;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;

  absl::Mutex queue_mu_;
  VkQueue queue_ ABSL_GUARDED_BY(queue_mu_) = VK_NULL_HANDLE;

  absl::Mutex timelines_mu_;
  std::vector<Timeline> free_timelines_ ABSL_GUARDED_BY(timelines_mu_);

  std::unique_ptr<MemoryPool> device_pool_;
  std::unique_ptr<MemoryPool> staging_pool_;
  Allocation dummy_;  // 256 bytes bound for empty tensors
  std::unique_ptr<PipelineManager> pipelines_;
  std::unique_ptr<ShaderCompiler> shaders_;
  std::atomic<int64_t> memory_in_use_{0};
};

// The VulkanStream behind `stream`, or INVALID_ARGUMENT when it belongs to
// another device or backend.
class VulkanStream;
absl::StatusOr<VulkanStream*> AsVulkanStream(backend::Stream& stream, const VulkanDevice& device);

}  // namespace kiln::vulkan
