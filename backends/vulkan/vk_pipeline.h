// Compute pipelines and the persisted VkPipelineCache.
//
// Every pipeline has one descriptor set of N storage buffers (binding i = the
// i-th BufferBinding of a dispatch) and one push-constant range. Shader
// modules, layouts and pipelines are deduplicated: kernels with the same
// SPIR-V and specialization share one VkPipeline.
//
// The VkPipelineCache is loaded from `<cache_dir>/vulkan/pipelines-<device>.bin`
// at creation and written back (temp file + fsync + rename) by Save(), which
// the device calls every few new pipelines and on destruction. A file whose
// header (format version, vendor, device, driver version, pipelineCacheUUID,
// checksum) does not match this device is ignored, never handed to the driver.
//
// Thread safety: all methods are thread-safe. Pipelines are immutable and
// live as long as the manager (kernels hold shared_ptrs).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/vulkan/vk_loader.h"

namespace kiln::vulkan {

struct DeviceCaps;

class Pipeline {
 public:
  Pipeline(std::string name, VkPipeline pipeline, VkPipelineLayout layout,
           VkDescriptorSetLayout set_layout, uint32_t bindings, uint32_t push_bytes)
      : name_(std::move(name)),
        pipeline_(pipeline),
        layout_(layout),
        set_layout_(set_layout),
        bindings_(bindings),
        push_bytes_(push_bytes) {}
  const std::string& name() const { return name_; }
  VkPipeline pipeline() const { return pipeline_; }
  VkPipelineLayout layout() const { return layout_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }
  uint32_t bindings() const { return bindings_; }
  uint32_t push_bytes() const { return push_bytes_; }

 private:
  std::string name_;
  VkPipeline pipeline_;
  VkPipelineLayout layout_;           // owned by the manager
  VkDescriptorSetLayout set_layout_;  // owned by the manager
  uint32_t bindings_;
  uint32_t push_bytes_;
};

struct PipelineDesc {
  std::string name;                 // for reports and errors, e.g. "softmax_f32"
  std::string module_key;           // identifies the SPIR-V: "embedded:<name>" or "gen:<hash>"
  std::span<const uint32_t> spirv;  // read during Get only
  uint32_t bindings = 0;
  uint32_t push_bytes = 0;               // multiple of 4, <= maxPushConstantsSize
  std::vector<uint32_t> specialization;  // constant_id i = specialization[i]
};

class PipelineManager {
 public:
  enum class CacheState { kNone, kAbsent, kLoaded, kRejected };

  // `cache_path` empty = no persistence. `device` must outlive the manager.
  static absl::StatusOr<std::unique_ptr<PipelineManager>> Create(VkDevice device,
                                                                 const DeviceCaps& caps,
                                                                 std::string cache_path);
  ~PipelineManager();
  PipelineManager(const PipelineManager&) = delete;
  PipelineManager& operator=(const PipelineManager&) = delete;

  absl::StatusOr<std::shared_ptr<const Pipeline>> Get(const PipelineDesc& desc);

  // Writes the pipeline cache when pipelines were created since the last save.
  absl::Status Save();

  CacheState cache_state() const { return cache_state_; }
  const std::string& cache_path() const { return cache_path_; }
  int64_t pipelines_created() const;

  // The file header this device writes and accepts (exposed for tests).
  static std::string CacheHeader(const DeviceCaps& caps, uint64_t data_bytes, uint64_t checksum);

 private:
  PipelineManager(VkDevice device, const DeviceCaps& caps, std::string cache_path);
  absl::Status LoadCache(std::vector<char>* data);
  absl::StatusOr<VkShaderModule> Module(const PipelineDesc& desc)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<VkDescriptorSetLayout> SetLayout(uint32_t bindings)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<VkPipelineLayout> Layout(uint32_t bindings, uint32_t push_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  VkDevice device_;
  const DeviceCaps& caps_;
  std::string cache_path_;
  CacheState cache_state_ = CacheState::kNone;
  const bool log_pipelines_;  // KILN_VULKAN_LOG_PIPELINES: log each creation and its time
  VkPipelineCache cache_ = VK_NULL_HANDLE;  // internally synchronized by the driver

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, VkShaderModule> modules_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, VkDescriptorSetLayout> set_layouts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, VkPipelineLayout> layouts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const Pipeline>> pipelines_ ABSL_GUARDED_BY(mu_);
  int64_t created_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t created_at_last_save_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex save_mu_;  // one writer of the cache file at a time
};

}  // namespace kiln::vulkan
