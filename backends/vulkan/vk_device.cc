#include "backends/vulkan/vk_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/vulkan/vk_kernel.h"
#include "backends/vulkan/vk_pipeline.h"
#include "backends/vulkan/vk_shader_compiler.h"
#include "backends/vulkan/vk_stream.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

std::string Hex(const uint8_t* bytes, size_t n) {
  return absl::BytesToHexString(std::string(reinterpret_cast<const char*>(bytes), n));
}

const char* TypeName(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

std::string VendorName(uint32_t id) {
  switch (id) {
    case 0x10DE:
      return "nvidia";
    case 0x1002:
      return "amd";
    case 0x8086:
      return "intel";
    case 0x13B5:
      return "arm";
    case 0x5143:
      return "qualcomm";
    case 0x106B:
      return "apple";
    case VK_VENDOR_ID_MESA:
      return "mesa";
    default:
      return absl::StrFormat("vendor-0x%04x", id);
  }
}

std::string DecodeDriverVersion(uint32_t vendor, uint32_t v) {
  if (vendor == 0x10DE) {  // NVIDIA packs 10.8.8.6 bits
    return absl::StrCat((v >> 22) & 0x3ff, ".", (v >> 14) & 0xff, ".", (v >> 6) & 0xff);
  }
  return absl::StrCat(VK_API_VERSION_MAJOR(v), ".", VK_API_VERSION_MINOR(v), ".",
                      VK_API_VERSION_PATCH(v));
}

bool HasExtension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  for (const auto& e : exts) {
    if (std::strcmp(e.extensionName, name) == 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<VulkanDevice>> VulkanDevice::Create(
    VkInstance instance, VkPhysicalDevice physical, int ordinal,
    const backend::BackendOptions& options) {
  auto d = std::unique_ptr<VulkanDevice>(new VulkanDevice());
  KILN_RETURN_IF_ERROR(d->Init(instance, physical, ordinal, options));
  return d;
}

absl::Status VulkanDevice::Init(VkInstance instance, VkPhysicalDevice physical, int ordinal,
                                const backend::BackendOptions& options) {
  physical_ = physical;
  DeviceCaps& c = caps_;

  VkPhysicalDeviceVulkan12Properties p12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES};
  VkPhysicalDeviceVulkan11Properties p11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES};
  p11.pNext = &p12;
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  VkPhysicalDeviceProperties base;
  vkGetPhysicalDeviceProperties(physical, &base);
  const std::string name = base.deviceName;
  if (base.apiVersion < VK_API_VERSION_1_2) {
    return absl::FailedPreconditionError(
        absl::StrCat("vulkan: ", name, " offers Vulkan ", VK_API_VERSION_MAJOR(base.apiVersion),
                     ".", VK_API_VERSION_MINOR(base.apiVersion), "; the backend needs 1.2"));
  }
  props.pNext = &p11;
  vkGetPhysicalDeviceProperties2(physical, &props);
  const VkPhysicalDeviceLimits& lim = props.properties.limits;
  c.api_version = props.properties.apiVersion;
  c.vendor_id = props.properties.vendorID;
  c.device_id = props.properties.deviceID;
  c.driver_version = props.properties.driverVersion;
  c.type = props.properties.deviceType;
  std::memcpy(c.pipeline_cache_uuid, props.properties.pipelineCacheUUID, VK_UUID_SIZE);
  std::memcpy(c.device_uuid, p11.deviceUUID, VK_UUID_SIZE);
  c.preserve_inf_nan32 = p12.shaderSignedZeroInfNanPreserveFloat32;
  c.max_workgroup_invocations = lim.maxComputeWorkGroupInvocations;
  std::copy(lim.maxComputeWorkGroupSize, lim.maxComputeWorkGroupSize + 3, c.max_workgroup_size);
  std::copy(lim.maxComputeWorkGroupCount, lim.maxComputeWorkGroupCount + 3, c.max_workgroup_count);
  c.max_shared_memory = lim.maxComputeSharedMemorySize;
  c.max_push_constants = lim.maxPushConstantsSize;
  c.max_storage_buffer_range = lim.maxStorageBufferRange;
  c.min_storage_offset_alignment = lim.minStorageBufferOffsetAlignment;
  c.non_coherent_atom_size = lim.nonCoherentAtomSize;
  c.timestamp_period_ns = lim.timestampPeriod;
  const bool compute_subgroups = p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT;
  c.subgroup_size = std::max<uint32_t>(p11.subgroupSize, 1);
  c.subgroup_basic =
      compute_subgroups && (p11.subgroupSupportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT);
  c.subgroup_arithmetic =
      c.subgroup_basic && (p11.subgroupSupportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
  c.subgroup_shuffle =
      c.subgroup_basic && (p11.subgroupSupportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
  if (const char* off = std::getenv("KILN_VULKAN_NO_SUBGROUPS"); off != nullptr && *off == '1') {
    // A debugging switch: kernels take their shared-memory paths.
    c.subgroup_basic = c.subgroup_arithmetic = c.subgroup_shuffle = false;
  }

  uint32_t ext_count = 0;
  vkEnumerateDeviceExtensionProperties(physical, nullptr, &ext_count, nullptr);
  std::vector<VkExtensionProperties> exts(ext_count);
  vkEnumerateDeviceExtensionProperties(physical, nullptr, &ext_count, exts.data());
  c.coop_matrix_khr = HasExtension(exts, "VK_KHR_cooperative_matrix");
  const bool has_nv_coop = HasExtension(exts, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);

  VkPhysicalDeviceCooperativeMatrixFeaturesNV fcoop{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  if (has_nv_coop) f12.pNext = &fcoop;
  VkPhysicalDeviceFeatures2 feats{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  feats.pNext = &f11;
  vkGetPhysicalDeviceFeatures2(physical, &feats);
  c.storage16 = f11.storageBuffer16BitAccess;
  c.storage8 = f12.storageBuffer8BitAccess;
  c.float16 = f12.shaderFloat16;
  c.int8 = f12.shaderInt8;
  c.int16 = feats.features.shaderInt16;
  c.int64 = feats.features.shaderInt64;
  c.float64 = feats.features.shaderFloat64;
  c.timeline_semaphore = f12.timelineSemaphore;
  c.vulkan_memory_model = f12.vulkanMemoryModel;
  c.host_query_reset = f12.hostQueryReset;
  if (!c.timeline_semaphore) {
    return absl::FailedPreconditionError(
        absl::StrCat("vulkan: ", name, " lacks timeline semaphores"));
  }
  if (has_nv_coop && fcoop.cooperativeMatrix) {
    auto get_props = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    if (get_props != nullptr) {
      uint32_t n = 0;
      get_props(physical, &n, nullptr);
      std::vector<VkCooperativeMatrixPropertiesNV> shapes(
          n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
      get_props(physical, &n, shapes.data());
      for (const auto& s : shapes) {
        if (s.MSize == 16 && s.NSize == 16 && s.KSize == 16 &&
            s.AType == VK_COMPONENT_TYPE_FLOAT16_NV && s.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
            s.CType == VK_COMPONENT_TYPE_FLOAT32_NV && s.DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
            s.scope == VK_SCOPE_SUBGROUP_NV) {
          c.coop_nv_f16_16x16x16 = true;
        }
      }
    }
    c.coop_matrix_nv = true;
  }

  // A compute queue with timestamps; a compute-only family when there is one
  // (it does not contend with graphics work).
  uint32_t fam_count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &fam_count, nullptr);
  std::vector<VkQueueFamilyProperties> fams(fam_count);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &fam_count, fams.data());
  int family = -1, best = -1;
  for (uint32_t i = 0; i < fam_count; ++i) {
    if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || fams[i].queueCount == 0) continue;
    const int score = (fams[i].timestampValidBits > 0 ? 2 : 0) +
                      (fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT ? 0 : 1);
    if (score > best) best = score, family = static_cast<int>(i);
  }
  if (family < 0) {
    return absl::FailedPreconditionError(absl::StrCat("vulkan: ", name, " has no compute queue"));
  }
  queue_family_ = static_cast<uint32_t>(family);
  c.timestamp_valid_bits = lim.timestampComputeAndGraphics || fams[family].timestampValidBits > 0
                               ? fams[family].timestampValidBits
                               : 0;

  // Enable exactly what the kernels use.
  VkPhysicalDeviceCooperativeMatrixFeaturesNV en_coop{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  en_coop.cooperativeMatrix = VK_TRUE;
  VkPhysicalDeviceVulkan12Features en12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  en12.timelineSemaphore = VK_TRUE;
  en12.storageBuffer8BitAccess = f12.storageBuffer8BitAccess;
  en12.shaderFloat16 = f12.shaderFloat16;
  en12.shaderInt8 = f12.shaderInt8;
  en12.hostQueryReset = f12.hostQueryReset;
  en12.vulkanMemoryModel = f12.vulkanMemoryModel;
  if (c.coop_matrix_nv) en12.pNext = &en_coop;
  VkPhysicalDeviceVulkan11Features en11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  en11.storageBuffer16BitAccess = f11.storageBuffer16BitAccess;
  en11.pNext = &en12;
  VkPhysicalDeviceFeatures2 enabled{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  enabled.features.shaderInt16 = feats.features.shaderInt16;
  enabled.features.shaderInt64 = feats.features.shaderInt64;
  enabled.features.shaderFloat64 = feats.features.shaderFloat64;
  enabled.pNext = &en11;
  std::vector<const char*> enabled_exts;
  if (c.coop_matrix_nv) enabled_exts.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qinfo{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qinfo.queueFamilyIndex = queue_family_;
  qinfo.queueCount = 1;
  qinfo.pQueuePriorities = &priority;
  VkDeviceCreateInfo dinfo{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  dinfo.pNext = &enabled;
  dinfo.queueCreateInfoCount = 1;
  dinfo.pQueueCreateInfos = &qinfo;
  dinfo.enabledExtensionCount = static_cast<uint32_t>(enabled_exts.size());
  dinfo.ppEnabledExtensionNames = enabled_exts.data();
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreateDevice(physical, &dinfo, nullptr, &device_), "vkCreateDevice"))
      << "on " << name;
  {
    absl::MutexLock lock(&queue_mu_);
    vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
  }

  // Memory: 64 MiB device blocks (smaller on small heaps), 16 MiB staging blocks.
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(physical, &mem);
  uint64_t main_heap = 0;
  for (uint32_t h = 0; h < mem.memoryHeapCount; ++h) {
    if (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      main_heap = std::max<uint64_t>(main_heap, mem.memoryHeaps[h].size);
    }
  }
  const uint64_t granularity =
      std::max<uint64_t>({256, c.min_storage_offset_alignment, c.non_coherent_atom_size});
  MemoryPool::Options dopt;
  dopt.kind = MemoryKind::kDevice;
  dopt.block_size = std::clamp<uint64_t>(main_heap / 16, uint64_t{4} << 20, uint64_t{64} << 20);
  dopt.granularity = granularity;
  dopt.name = "device";
  KILN_ASSIGN_OR_RETURN(device_pool_, MemoryPool::Create(physical, device_, dopt));
  MemoryPool::Options sopt = dopt;
  sopt.kind = MemoryKind::kStaging;
  sopt.block_size = uint64_t{16} << 20;
  sopt.name = "staging";
  KILN_ASSIGN_OR_RETURN(staging_pool_, MemoryPool::Create(physical, device_, sopt));
  KILN_ASSIGN_OR_RETURN(dummy_, device_pool_->Allocate(256));

  // Identity and info.
  backend::DeviceInfo& info = info_;
  info.id = absl::StrCat("vulkan:", ordinal);
  info.kind = c.type == VK_PHYSICAL_DEVICE_TYPE_CPU ? backend::DeviceKind::kCpu
                                                    : backend::DeviceKind::kGpu;
  // Several runs at once: one records and uploads while another's batches run.
  info.max_concurrent_runs = 4;
  info.buffer_alignment = std::max<int64_t>(64, static_cast<int64_t>(c.min_storage_offset_alignment));
  // What our shaders reach of the roofline (docs/benchmarks.md).
  info.roofline_efficiency = {{"matmul", 0.3}, {"attention", 0.2}, {"elementwise", 0.6}};
  info.backend = "vulkan";
  info.name = name;
  info.arch = absl::StrCat(TypeName(c.type), ":", VendorName(c.vendor_id));
  const std::string decoded = DecodeDriverVersion(c.vendor_id, c.driver_version);
  info.driver_version = absl::StrCat(p12.driverName, " ", p12.driverInfo, " (", decoded, ")");
  info.identity = absl::StrFormat("vulkan|%04x:%04x|device-uuid=%s|cache-uuid=%s|driver=%u",
                                  c.vendor_id, c.device_id, Hex(c.device_uuid, VK_UUID_SIZE),
                                  Hex(c.pipeline_cache_uuid, VK_UUID_SIZE), c.driver_version);
  info.memory_bytes = static_cast<int64_t>(main_heap);
  info.threads = 0;
  info.host_memory = false;
  auto& f = info.features;
  f.push_back(absl::StrCat("vulkan", VK_API_VERSION_MAJOR(c.api_version), ".",
                           VK_API_VERSION_MINOR(c.api_version)));
  if (c.subgroup_basic) f.push_back(absl::StrCat("subgroups:", c.subgroup_size));
  if (c.subgroup_arithmetic) f.push_back("subgroup_arithmetic");
  if (c.subgroup_shuffle) f.push_back("subgroup_shuffle");
  if (c.float16) f.push_back("fp16");
  if (c.storage16) f.push_back("storage16");
  if (c.storage8) f.push_back("storage8");
  if (c.int8) f.push_back("int8");
  if (c.int64) f.push_back("int64");
  if (c.float64) f.push_back("fp64");
  f.push_back("timeline_semaphore");
  if (c.timestamp_valid_bits > 0) f.push_back("timestamps");
  if (c.coop_matrix_khr || c.coop_matrix_nv) f.push_back("cooperative_matrix");
  if (c.coop_matrix_khr) f.push_back("cooperative_matrix_khr");
  if (c.coop_matrix_nv) f.push_back("cooperative_matrix_nv");
  if (device_pool_->host_visible()) f.push_back("host_visible_device_memory");
  // Nominal until the engine calibrates: coarse by device type.
  backend::DeviceProfile& p = info.profile;
  switch (c.type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      p = {20000, 40000, 1000, 8, 25, false};
      break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      p = {1000, 2000, 50, 10, 0, false};
      break;
    default:  // CPU implementations (lavapipe) and others
      p = {50, 50, 10, 30, 10, false};
      break;
  }

  std::string cache_path;
  if (!options.cache_dir.empty()) {
    cache_path =
        absl::StrFormat("%s/vulkan/pipelines-%04x-%04x-%s.bin", options.cache_dir, c.vendor_id,
                        c.device_id, Hex(c.pipeline_cache_uuid, VK_UUID_SIZE));
  }
  KILN_ASSIGN_OR_RETURN(pipelines_, PipelineManager::Create(device_, caps_, cache_path));
  KILN_ASSIGN_OR_RETURN(shaders_, ShaderCompiler::Create(info.identity));
  return absl::OkStatus();
}

VulkanDevice::~VulkanDevice() {
  if (device_ == VK_NULL_HANDLE) return;
  vkDeviceWaitIdle(device_);
  {
    absl::MutexLock lock(&timelines_mu_);
    for (const Timeline& t : free_timelines_) vkDestroySemaphore(device_, t.semaphore, nullptr);
    free_timelines_.clear();
  }
  pipelines_.reset();  // saves the pipeline cache
  shaders_.reset();
  if (device_pool_ && dummy_.block != nullptr) device_pool_->Free(dummy_);
  staging_pool_.reset();
  device_pool_.reset();
  vkDestroyDevice(device_, nullptr);
}

absl::Status VulkanDevice::Submit(const VkSubmitInfo& submit) {
  absl::MutexLock lock(&queue_mu_);
  return VkCheck(vkQueueSubmit(queue_, 1, &submit, VK_NULL_HANDLE), "vkQueueSubmit");
}

absl::StatusOr<VulkanDevice::Timeline> VulkanDevice::AcquireTimeline() {
  {
    absl::MutexLock lock(&timelines_mu_);
    if (!free_timelines_.empty()) {
      Timeline t = free_timelines_.back();
      free_timelines_.pop_back();
      return t;
    }
  }
  VkSemaphoreTypeCreateInfo tinfo{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  tinfo.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  tinfo.initialValue = 0;
  VkSemaphoreCreateInfo sinfo{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  sinfo.pNext = &tinfo;
  Timeline t;
  KILN_RETURN_IF_ERROR(VkCheck(vkCreateSemaphore(device_, &sinfo, nullptr, &t.semaphore),
                               "vkCreateSemaphore(timeline)"));
  return t;
}

void VulkanDevice::ReleaseTimeline(Timeline timeline) {
  if (timeline.semaphore == VK_NULL_HANDLE) return;
  absl::MutexLock lock(&timelines_mu_);
  free_timelines_.push_back(timeline);
}

absl::StatusOr<std::unique_ptr<backend::Buffer>> VulkanDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("vulkan: negative allocation");
  if (bytes == 0) {
    return std::unique_ptr<backend::Buffer>(
        std::make_unique<VulkanBuffer>(this, nullptr, Allocation{}, 0, memory_in_use_));
  }
  absl::StatusOr<Allocation> a = device_pool_->Allocate(static_cast<uint64_t>(bytes));
  if (!a.ok()) {
    return StatusBuilder(a.status()) << info_.id << ": cannot allocate " << bytes << " bytes";
  }
  return std::unique_ptr<backend::Buffer>(
      std::make_unique<VulkanBuffer>(this, device_pool_.get(), *a, bytes, memory_in_use_));
}

absl::StatusOr<std::unique_ptr<backend::Stream>> VulkanDevice::CreateStream() {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<VulkanStream> s, VulkanStream::Create(*this));
  return std::unique_ptr<backend::Stream>(std::move(s));
}

absl::StatusOr<VulkanStream*> AsVulkanStream(backend::Stream& stream, const VulkanDevice& device) {
  auto* s = dynamic_cast<VulkanStream*>(&stream);
  if (s == nullptr || &s->device() != &device) {
    return absl::InvalidArgumentError(
        absl::StrCat(device.info().id, ": the stream belongs to another device"));
  }
  return s;
}

absl::StatusOr<BufferBinding> VulkanDevice::ResolveTransfer(const backend::BufferView& view,
                                                            int64_t need,
                                                            const std::string& what) const {
  const auto* buf = dynamic_cast<const VulkanBuffer*>(view.buffer);
  if (buf == nullptr || buf->owner() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.id, ": ", what, " is not a buffer of this device"));
  }
  if (view.offset < 0 || need < 0 || view.bytes < need || view.offset + need > buf->size()) {
    return absl::OutOfRangeError(
        absl::StrCat(info_.id, ": ", what, " needs ", need, " bytes at offset ", view.offset,
                     " of a ", view.bytes, "-byte view into a ", buf->size(), "-byte buffer"));
  }
  const Allocation& a = buf->allocation();
  return BufferBinding{a.buffer(), a.offset + static_cast<uint64_t>(view.offset),
                       static_cast<uint64_t>(need),
                       a.mapped() ? a.mapped() + view.offset : nullptr};
}

absl::StatusOr<BufferBinding> VulkanDevice::Resolve(const backend::BufferView& view, int64_t need,
                                                    const std::string& what) const {
  if (need == 0) return BufferBinding{dummy_.buffer(), dummy_.offset, 256, dummy_.mapped()};
  KILN_ASSIGN_OR_RETURN(BufferBinding b, ResolveTransfer(view, need, what));
  if (b.offset % caps_.min_storage_offset_alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.id, ": ", what, " starts at byte ", view.offset,
                     " of its buffer; vulkan kernels bind views at multiples of ",
                     caps_.min_storage_offset_alignment));
  }
  return b;
}

absl::Status VulkanDevice::CopyToDevice(backend::Stream& stream, const void* src,
                                        backend::BufferView dst) {
  KILN_ASSIGN_OR_RETURN(VulkanStream * s, AsVulkanStream(stream, *this));
  if (dst.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(BufferBinding d, ResolveTransfer(dst, dst.bytes, "copy destination"));
  KILN_RETURN_IF_ERROR(s->Upload(src, d, d.range));
  return s->MaybeFlush();
}

absl::Status VulkanDevice::CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) {
  KILN_ASSIGN_OR_RETURN(VulkanStream * s, AsVulkanStream(stream, *this));
  if (src.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(BufferBinding b, ResolveTransfer(src, src.bytes, "copy source"));
  KILN_RETURN_IF_ERROR(s->Download(b, dst, b.range));
  return s->MaybeFlush();
}

absl::Status VulkanDevice::CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                                        backend::BufferView dst) {
  KILN_ASSIGN_OR_RETURN(VulkanStream * s, AsVulkanStream(stream, *this));
  if (src.bytes == 0) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(BufferBinding from, ResolveTransfer(src, src.bytes, "copy source"));
  KILN_ASSIGN_OR_RETURN(BufferBinding to, ResolveTransfer(dst, src.bytes, "copy destination"));
  KILN_RETURN_IF_ERROR(s->Copy(from, to, from.range));
  return s->MaybeFlush();
}

backend::Claim VulkanDevice::CheckTensorLimits(const backend::KernelSpec& spec) const {
  auto check = [&](const backend::TensorDesc& t, const char* kind, size_t i) -> std::string {
    if (t.num_elements() >= (int64_t{1} << 31)) {
      return absl::StrCat(kind, " ", i, " has ", t.num_elements(),
                          " elements; vulkan kernels index with 31 bits");
    }
    if (static_cast<uint64_t>(t.num_bytes()) > caps_.max_storage_buffer_range) {
      return absl::StrCat(kind, " ", i, " takes ", t.num_bytes(),
                          " bytes, over this device's maxStorageBufferRange of ",
                          caps_.max_storage_buffer_range);
    }
    return "";
  };
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (std::string why = check(spec.inputs[i], "input", i); !why.empty()) {
      return backend::Claim::No(why);
    }
  }
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    if (std::string why = check(spec.outputs[i], "output", i); !why.empty()) {
      return backend::Claim::No(why);
    }
  }
  return backend::Claim::Yes();
}

backend::Claim VulkanDevice::Supports(const backend::KernelSpec& spec) const {
  const VulkanOpEntry* entry = FindVulkanOp(spec.op);
  if (entry == nullptr) {
    return backend::Claim::No(absl::StrCat("vulkan has no kernel for ", v1::OpKind_Name(spec.op)));
  }
  if (backend::Claim limits = CheckTensorLimits(spec); !limits.native) return limits;
  return entry->supports(*this, spec);
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> VulkanDevice::PrepareKernel(
    const backend::KernelSpec& spec, backend::PrepareContext& context) {
  const backend::Claim claim = Supports(spec);
  if (!claim.native) {
    return absl::UnimplementedError(absl::StrCat(spec.label, ": ", claim.reason));
  }
  const int64_t before = pipelines_->pipelines_created();
  absl::StatusOr<std::unique_ptr<backend::Kernel>> kernel =
      FindVulkanOp(spec.op)->create(*this, spec, context);
  // Persist the pipeline cache every few new pipelines (and at destruction).
  constexpr int64_t kSaveEvery = 16;
  const int64_t after = pipelines_->pipelines_created();
  if (after / kSaveEvery != before / kSaveEvery) (void)pipelines_->Save();
  if (!kernel.ok()) return StatusBuilder(kernel.status()) << "while preparing " << spec.label;
  return kernel;
}

}  // namespace kiln::vulkan
