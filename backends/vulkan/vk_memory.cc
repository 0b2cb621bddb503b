#include "backends/vulkan/vk_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"

namespace kiln::vulkan {

// ---- RangeAllocator --------------------------------------------------------

RangeAllocator::RangeAllocator(uint64_t capacity) : capacity_(capacity), free_bytes_(0) {
  if (capacity > 0) Insert(0, capacity);
}

void RangeAllocator::Insert(uint64_t offset, uint64_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void RangeAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t size) {
  if (size == 0) return std::nullopt;
  auto fit = by_size_.lower_bound({size, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const uint64_t offset = fit->second, range = fit->first;
  Erase(by_offset_.find(offset));
  if (range > size) Insert(offset + size, range - size);
  return offset;
}

void RangeAllocator::Free(uint64_t offset, uint64_t size) {
  uint64_t begin = offset, end = offset + size;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    auto victim = next++;
    Erase(victim);
  }
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      Erase(prev);
    }
  }
  Insert(begin, end - begin);
}

// ---- MemoryPool ------------------------------------------------------------

namespace {

constexpr VkBufferUsageFlags kBlockUsage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                           VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                           VK_BUFFER_USAGE_TRANSFER_DST_BIT;

// Picks the memory type for `kind` among `type_bits`; -1 when none fits.
int ChooseMemoryType(const VkPhysicalDeviceMemoryProperties& props, uint32_t type_bits,
                     MemoryKind kind) {
  // The largest device-local heap is "the" device memory; on UMA devices (and
  // lavapipe) it is also host-visible, which lets copies be plain memcpys.
  int main_heap = -1;
  for (uint32_t h = 0; h < props.memoryHeapCount; ++h) {
    if (!(props.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) continue;
    if (main_heap < 0 || props.memoryHeaps[h].size > props.memoryHeaps[main_heap].size) {
      main_heap = static_cast<int>(h);
    }
  }
  int best = -1, best_score = -1;
  for (uint32_t t = 0; t < props.memoryTypeCount; ++t) {
    if (!(type_bits & (1u << t))) continue;
    const VkMemoryPropertyFlags f = props.memoryTypes[t].propertyFlags;
    const bool local = f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const bool visible = f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
    const bool coherent = f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const bool cached = f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    const bool on_main = static_cast<int>(props.memoryTypes[t].heapIndex) == main_heap;
    if (f & (VK_MEMORY_PROPERTY_PROTECTED_BIT | VK_MEMORY_PROPERTY_LAZILY_ALLOCATED_BIT)) continue;
    int score;
    if (kind == MemoryKind::kDevice) {
      if (!local) continue;
      score = (on_main ? 8 : 0) + (visible && coherent && on_main ? 4 : 0);
    } else {
      if (!visible || !coherent) continue;
      // Cached memory makes read-back fast; on a discrete GPU keep staging out
      // of the (possibly small) device-local BAR heap.
      score = (cached ? 4 : 0) + (!local || on_main ? 2 : 0);
    }
    if (score > best_score) best = static_cast<int>(t), best_score = score;
  }
  return best;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryPool>> MemoryPool::Create(VkPhysicalDevice physical,
                                                               VkDevice device, Options options) {
  auto pool = std::unique_ptr<MemoryPool>(new MemoryPool(device, std::move(options)));
  // The memory types a storage buffer may use: ask with a small probe buffer.
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = 4096;
  info.usage = kBlockUsage;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer probe;
  KILN_RETURN_IF_ERROR(VkCheck(vkCreateBuffer(device, &info, nullptr, &probe), "vkCreateBuffer"));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device, probe, &req);
  vkDestroyBuffer(device, probe, nullptr);
  VkPhysicalDeviceMemoryProperties props;
  vkGetPhysicalDeviceMemoryProperties(physical, &props);
  const int type = ChooseMemoryType(props, req.memoryTypeBits, pool->options_.kind);
  if (type < 0) {
    return absl::UnavailableError(
        absl::StrCat("vulkan: no memory type fits the ", pool->options_.name, " pool"));
  }
  pool->memory_type_ = static_cast<uint32_t>(type);
  const VkMemoryPropertyFlags f = props.memoryTypes[type].propertyFlags;
  pool->host_visible_ = f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  pool->host_coherent_ = f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  pool->host_cached_ = f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  pool->options_.granularity = std::max<uint64_t>(pool->options_.granularity, req.alignment);
  pool->options_.block_size = AlignUp(pool->options_.block_size, pool->options_.granularity);
  return pool;
}

MemoryPool::~MemoryPool() {
  absl::MutexLock lock(&blocks_mu_);
  for (auto& b : blocks_) DestroyBlock(*b);
}

absl::StatusOr<std::unique_ptr<MemoryBlock>> MemoryPool::NewBlock(uint64_t size, bool dedicated) {
  auto block = std::make_unique<MemoryBlock>();
  block->size = size;
  block->dedicated = dedicated;
  VkBufferCreateInfo binfo{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  binfo.size = size;
  binfo.usage = kBlockUsage;
  binfo.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreateBuffer(device_, &binfo, nullptr, &block->buffer), "vkCreateBuffer"))
      << "for a " << size << "-byte " << options_.name << " block";
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, block->buffer, &req);
  VkMemoryAllocateInfo ainfo{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ainfo.allocationSize = req.size;
  ainfo.memoryTypeIndex = memory_type_;
  VkMemoryDedicatedAllocateInfo dinfo{VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO};
  if (dedicated) {
    dinfo.buffer = block->buffer;
    ainfo.pNext = &dinfo;
  }
  if (VkResult r = vkAllocateMemory(device_, &ainfo, nullptr, &block->memory); r != VK_SUCCESS) {
    vkDestroyBuffer(device_, block->buffer, nullptr);
    return StatusBuilder(VkError(r, "vkAllocateMemory"))
           << "for a " << size << "-byte " << options_.name << " block";
  }
  if (VkResult r = vkBindBufferMemory(device_, block->buffer, block->memory, 0); r != VK_SUCCESS) {
    DestroyBlock(*block);
    return VkError(r, "vkBindBufferMemory");
  }
  if (host_visible_) {
    void* p = nullptr;
    if (VkResult r = vkMapMemory(device_, block->memory, 0, VK_WHOLE_SIZE, 0, &p);
        r != VK_SUCCESS) {
      DestroyBlock(*block);
      return VkError(r, "vkMapMemory");
    }
    block->mapped = static_cast<char*>(p);
  }
  block->ranges = std::make_unique<RangeAllocator>(size);
  return block;
}

void MemoryPool::DestroyBlock(MemoryBlock& block) {
  if (block.mapped != nullptr) vkUnmapMemory(device_, block.memory);
  if (block.buffer != VK_NULL_HANDLE) vkDestroyBuffer(device_, block.buffer, nullptr);
  if (block.memory != VK_NULL_HANDLE) vkFreeMemory(device_, block.memory, nullptr);
  block.mapped = nullptr;
  block.buffer = VK_NULL_HANDLE;
  block.memory = VK_NULL_HANDLE;
}

absl::StatusOr<Allocation> MemoryPool::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("vulkan: zero-byte sub-allocation");
  const uint64_t size = AlignUp(bytes, options_.granularity);
  absl::MutexLock lock(&blocks_mu_);
  const bool dedicated = size > options_.block_size / 2;
  if (!dedicated) {
    // First block (oldest first) with room: keeps young blocks free to release.
    for (auto& b : blocks_) {
      if (b->dedicated || b->ranges->free_bytes() < size) continue;
      if (auto offset = b->ranges->Allocate(size)) {
        used_bytes_ += size;
        ++allocations_;
        return Allocation{b.get(), *offset, size};
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBlock> block,
                        NewBlock(dedicated ? size : options_.block_size, dedicated));
  const uint64_t offset = *block->ranges->Allocate(size);
  Allocation a{block.get(), offset, size};
  blocks_.push_back(std::move(block));
  used_bytes_ += size;
  ++allocations_;
  return a;
}

void MemoryPool::Free(const Allocation& a) {
  if (a.block == nullptr) return;
  absl::MutexLock lock(&blocks_mu_);
  a.block->ranges->Free(a.offset, a.size);
  used_bytes_ -= a.size;
  --allocations_;
  if (!a.block->ranges->all_free()) return;
  // Keep one empty shared block cached so alternating alloc/free does not
  // churn driver allocations; release dedicated and surplus empty blocks.
  bool other_empty = false;
  for (const auto& b : blocks_) {
    if (b.get() != a.block && !b->dedicated && b->ranges->all_free()) other_empty = true;
  }
  if (!a.block->dedicated && !other_empty) return;
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    if (it->get() == a.block) {
      DestroyBlock(**it);
      blocks_.erase(it);
      break;
    }
  }
}

MemoryPool::Stats MemoryPool::stats() const {
  absl::MutexLock lock(&blocks_mu_);
  Stats s;
  s.blocks = static_cast<int64_t>(blocks_.size());
  for (const auto& b : blocks_) s.reserved_bytes += static_cast<int64_t>(b->size);
  s.used_bytes = used_bytes_;
  s.allocations = allocations_;
  return s;
}

// ---- VulkanBuffer ----------------------------------------------------------

VulkanBuffer::VulkanBuffer(const void* owner, MemoryPool* pool, Allocation allocation, int64_t size,
                           std::atomic<int64_t>& counter)
    : owner_(owner), pool_(pool), allocation_(allocation), size_(size), counter_(counter) {
  counter_ += size_;
}

VulkanBuffer::~VulkanBuffer() {
  if (pool_ != nullptr) pool_->Free(allocation_);
  counter_ -= size_;
}

}  // namespace kiln::vulkan
