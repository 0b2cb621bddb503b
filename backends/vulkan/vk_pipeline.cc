#include "backends/vulkan/vk_pipeline.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kiln::vulkan {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'V', 'K', 'P', 'C'};
constexpr uint32_t kFormatVersion = 1;

// The on-disk header, little-endian, before the driver's cache data.
struct FileHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t vendor_id;
  uint32_t device_id;
  uint32_t driver_version;
  uint8_t uuid[VK_UUID_SIZE];
  uint64_t data_bytes;
  uint64_t checksum;  // XXH64 of the data
};
static_assert(sizeof(FileHeader) == 56);

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create the directory of ", path, ": ", ec.message()));
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string PipelineManager::CacheHeader(const DeviceCaps& caps, uint64_t data_bytes,
                                         uint64_t checksum) {
  FileHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.format_version = kFormatVersion;
  h.vendor_id = caps.vendor_id;
  h.device_id = caps.device_id;
  h.driver_version = caps.driver_version;
  std::memcpy(h.uuid, caps.pipeline_cache_uuid, VK_UUID_SIZE);
  h.data_bytes = data_bytes;
  h.checksum = checksum;
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

PipelineManager::PipelineManager(VkDevice device, const DeviceCaps& caps, std::string cache_path)
    : device_(device),
      caps_(caps),
      cache_path_(std::move(cache_path)),
      log_pipelines_(std::getenv("KILN_VULKAN_LOG_PIPELINES") != nullptr) {}

absl::StatusOr<std::unique_ptr<PipelineManager>> PipelineManager::Create(VkDevice device,
                                                                         const DeviceCaps& caps,
                                                                         std::string cache_path) {
  auto m =
      std::unique_ptr<PipelineManager>(new PipelineManager(device, caps, std::move(cache_path)));
  std::vector<char> data;
  if (!m->cache_path_.empty()) {
    if (auto s = m->LoadCache(&data); !s.ok()) {
      spdlog::warn("vulkan: ignoring pipeline cache {}: {}", m->cache_path_,
                   std::string(s.message()));
      m->cache_state_ = CacheState::kRejected;
      data.clear();
    }
  }
  VkPipelineCacheCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  info.initialDataSize = data.size();
  info.pInitialData = data.empty() ? nullptr : data.data();
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreatePipelineCache(device, &info, nullptr, &m->cache_), "vkCreatePipelineCache"));
  return m;
}

absl::Status PipelineManager::LoadCache(std::vector<char>* data) {
  std::ifstream in(cache_path_, std::ios::binary);
  if (!in) {
    cache_state_ = CacheState::kAbsent;
    return absl::OkStatus();
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < sizeof(FileHeader)) return absl::DataLossError("truncated header");
  FileHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return absl::DataLossError("bad magic");
  if (h.format_version != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("format version ", h.format_version));
  }
  if (h.vendor_id != caps_.vendor_id || h.device_id != caps_.device_id ||
      h.driver_version != caps_.driver_version ||
      std::memcmp(h.uuid, caps_.pipeline_cache_uuid, VK_UUID_SIZE) != 0) {
    return absl::FailedPreconditionError("written by another device or driver");
  }
  if (h.data_bytes != bytes.size() - sizeof(FileHeader)) return absl::DataLossError("truncated");
  const char* payload = bytes.data() + sizeof(FileHeader);
  if (XXH64(payload, h.data_bytes, 0) != h.checksum) return absl::DataLossError("bad checksum");
  // The driver's own header (VkPipelineCacheHeaderVersionOne) must agree too.
  VkPipelineCacheHeaderVersionOne vh;
  if (h.data_bytes < sizeof(vh)) return absl::DataLossError("no driver header");
  std::memcpy(&vh, payload, sizeof(vh));
  if (vh.headerVersion != VK_PIPELINE_CACHE_HEADER_VERSION_ONE || vh.vendorID != caps_.vendor_id ||
      vh.deviceID != caps_.device_id ||
      std::memcmp(vh.pipelineCacheUUID, caps_.pipeline_cache_uuid, VK_UUID_SIZE) != 0) {
    return absl::FailedPreconditionError("driver header names another device");
  }
  data->assign(payload, payload + h.data_bytes);
  cache_state_ = CacheState::kLoaded;
  return absl::OkStatus();
}

PipelineManager::~PipelineManager() {
  if (auto s = Save(); !s.ok()) spdlog::warn("vulkan: {}", std::string(s.message()));
  absl::MutexLock lock(&mu_);
  for (auto& [key, p] : pipelines_) vkDestroyPipeline(device_, p->pipeline(), nullptr);
  for (auto& [key, l] : layouts_) vkDestroyPipelineLayout(device_, l, nullptr);
  for (auto& [key, l] : set_layouts_) vkDestroyDescriptorSetLayout(device_, l, nullptr);
  for (auto& [key, m] : modules_) vkDestroyShaderModule(device_, m, nullptr);
  if (cache_ != VK_NULL_HANDLE) vkDestroyPipelineCache(device_, cache_, nullptr);
}

absl::Status PipelineManager::Save() {
  if (cache_path_.empty()) return absl::OkStatus();
  absl::MutexLock save_lock(&save_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (created_ == created_at_last_save_) return absl::OkStatus();
    created_at_last_save_ = created_;
  }
  size_t size = 0;
  KILN_RETURN_IF_ERROR(
      VkCheck(vkGetPipelineCacheData(device_, cache_, &size, nullptr), "vkGetPipelineCacheData"));
  std::string data(size, '\0');
  const VkResult r = vkGetPipelineCacheData(device_, cache_, &size, data.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return VkError(r, "vkGetPipelineCacheData");
  data.resize(size);
  std::string file = CacheHeader(caps_, data.size(), XXH64(data.data(), data.size(), 0));
  file += data;
  KILN_RETURN_IF_ERROR(WriteFileAtomically(cache_path_, file)) << "saving the pipeline cache";
  return absl::OkStatus();
}

int64_t PipelineManager::pipelines_created() const {
  absl::MutexLock lock(&mu_);
  return created_;
}

absl::StatusOr<VkShaderModule> PipelineManager::Module(const PipelineDesc& desc) {
  if (auto it = modules_.find(desc.module_key); it != modules_.end()) return it->second;
  VkShaderModuleCreateInfo info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  info.codeSize = desc.spirv.size() * sizeof(uint32_t);
  info.pCode = desc.spirv.data();
  VkShaderModule module;
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreateShaderModule(device_, &info, nullptr, &module), "vkCreateShaderModule"))
      << "for " << desc.name;
  modules_.emplace(desc.module_key, module);
  return module;
}

absl::StatusOr<VkDescriptorSetLayout> PipelineManager::SetLayout(uint32_t bindings) {
  if (auto it = set_layouts_.find(bindings); it != set_layouts_.end()) return it->second;
  std::vector<VkDescriptorSetLayoutBinding> b(bindings);
  for (uint32_t i = 0; i < bindings; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  info.bindingCount = bindings;
  info.pBindings = b.data();
  VkDescriptorSetLayout layout;
  KILN_RETURN_IF_ERROR(VkCheck(vkCreateDescriptorSetLayout(device_, &info, nullptr, &layout),
                               "vkCreateDescriptorSetLayout"));
  set_layouts_.emplace(bindings, layout);
  return layout;
}

absl::StatusOr<VkPipelineLayout> PipelineManager::Layout(uint32_t bindings, uint32_t push_bytes) {
  const uint64_t key = (uint64_t{bindings} << 32) | push_bytes;
  if (auto it = layouts_.find(key); it != layouts_.end()) return it->second;
  KILN_ASSIGN_OR_RETURN(VkDescriptorSetLayout set_layout, SetLayout(bindings));
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo info{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  info.setLayoutCount = 1;
  info.pSetLayouts = &set_layout;
  info.pushConstantRangeCount = push_bytes > 0 ? 1 : 0;
  info.pPushConstantRanges = push_bytes > 0 ? &range : nullptr;
  VkPipelineLayout layout;
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreatePipelineLayout(device_, &info, nullptr, &layout), "vkCreatePipelineLayout"));
  layouts_.emplace(key, layout);
  return layout;
}

absl::StatusOr<std::shared_ptr<const Pipeline>> PipelineManager::Get(const PipelineDesc& desc) {
  if (desc.push_bytes % 4 != 0 || desc.push_bytes > caps_.max_push_constants) {
    return absl::InvalidArgumentError(
        absl::StrCat("vulkan: ", desc.name, " wants ", desc.push_bytes, " push-constant bytes"));
  }
  const std::string key = absl::StrCat(desc.module_key, "|", desc.bindings, "|", desc.push_bytes,
                                       "|", absl::StrJoin(desc.specialization, ","));
  absl::MutexLock lock(&mu_);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;
  KILN_ASSIGN_OR_RETURN(VkShaderModule module, Module(desc));
  KILN_ASSIGN_OR_RETURN(VkPipelineLayout layout, Layout(desc.bindings, desc.push_bytes));
  std::vector<VkSpecializationMapEntry> entries(desc.specialization.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i] = {static_cast<uint32_t>(i), static_cast<uint32_t>(i * sizeof(uint32_t)),
                  sizeof(uint32_t)};
  }
  VkSpecializationInfo spec{static_cast<uint32_t>(entries.size()), entries.data(),
                            desc.specialization.size() * sizeof(uint32_t),
                            desc.specialization.data()};
  VkComputePipelineCreateInfo info{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  info.stage.module = module;
  info.stage.pName = "main";
  info.stage.pSpecializationInfo = entries.empty() ? nullptr : &spec;
  info.layout = layout;
  VkPipeline pipeline;
  const auto start = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreateComputePipelines(device_, cache_, 1, &info, nullptr, &pipeline),
              "vkCreateComputePipelines"))
      << "for " << desc.name;
  ++created_;
  if (log_pipelines_) {
    spdlog::info("vulkan: pipeline {} [{}] created in {:.1f} ms", desc.name,
                 absl::StrJoin(desc.specialization, ","),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  auto p = std::make_shared<const Pipeline>(
      desc.name, pipeline, layout, set_layouts_.at(desc.bindings), desc.bindings, desc.push_bytes);
  pipelines_.emplace(key, p);
  return std::shared_ptr<const Pipeline>(p);
}

}  // namespace kiln::vulkan
