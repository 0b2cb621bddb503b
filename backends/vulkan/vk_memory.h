// Device memory for the Vulkan backend: large VkDeviceMemory blocks, each with
// one VkBuffer spanning it, carved into sub-allocations by a best-fit free
// list, so thousands of small tensors share a handful of driver allocations.
// A request larger than half a block gets a dedicated block of its own.
//
// Every sub-allocation starts at a multiple of the pool's granularity (at
// least minStorageBufferOffsetAlignment and nonCoherentAtomSize), so a view at
// offset 0 of any buffer can be bound as a storage buffer.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_loader.h"

namespace kiln::vulkan {

// Offsets in [0, capacity): best fit by size (lowest offset among equals),
// neighbours coalesced on free. Sizes and offsets are the caller's units; the
// caller keeps them multiples of its granularity. Not thread-safe.
class RangeAllocator {
 public:
  explicit RangeAllocator(uint64_t capacity);
  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;

  // The offset of a free range of `size` (> 0) bytes, or nullopt when none fits.
  std::optional<uint64_t> Allocate(uint64_t size);
  // REQUIRES: [offset, offset + size) was returned by Allocate and not freed.
  void Free(uint64_t offset, uint64_t size);

  uint64_t capacity() const { return capacity_; }
  uint64_t free_bytes() const { return free_bytes_; }
  bool all_free() const { return free_bytes_ == capacity_; }
  size_t free_ranges() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t size);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset)
};

// One driver allocation and the VkBuffer that covers it.
struct MemoryBlock {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t size = 0;
  char* mapped = nullptr;  // persistently mapped when the memory is host-visible
  bool dedicated = false;
  std::unique_ptr<RangeAllocator> ranges;
};

// A sub-allocation. `size` is the rounded size actually reserved.
struct Allocation {
  MemoryBlock* block = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;

  VkBuffer buffer() const { return block ? block->buffer : VK_NULL_HANDLE; }
  // Host address of the first byte, or nullptr when not host-visible.
  char* mapped() const { return block && block->mapped ? block->mapped + offset : nullptr; }
};

enum class MemoryKind {
  kDevice,   // device-local (host-visible too where the device has it on its main heap)
  kStaging,  // host-visible and coherent, preferably host-cached, for copies
};

// Pools blocks of one memory type. Thread-safe.
class MemoryPool {
 public:
  struct Options {
    MemoryKind kind = MemoryKind::kDevice;
    uint64_t block_size = uint64_t{64} << 20;
    uint64_t granularity = 256;
    std::string name = "device";
  };
  struct Stats {
    int64_t blocks = 0;          // driver allocations held
    int64_t reserved_bytes = 0;  // bytes of those allocations
    int64_t used_bytes = 0;      // bytes handed out (rounded)
    int64_t allocations = 0;     // live sub-allocations
  };

  // `device` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<MemoryPool>> Create(VkPhysicalDevice physical,
                                                            VkDevice device, Options options);
  ~MemoryPool();  // releases every block; allocations still held become invalid
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A range of at least `bytes` (> 0). RESOURCE_EXHAUSTED when the device is out of memory.
  absl::StatusOr<Allocation> Allocate(uint64_t bytes);
  // REQUIRES: `a` came from this pool and was not freed.
  void Free(const Allocation& a);

  Stats stats() const;
  bool host_visible() const { return host_visible_; }
  bool host_coherent() const { return host_coherent_; }
  // Host reads of mapped memory are fast only when it is cached (not a
  // write-combined BAR window).
  bool host_cached() const { return host_cached_; }
  uint32_t memory_type() const { return memory_type_; }
  uint64_t granularity() const { return options_.granularity; }
  uint64_t block_size() const { return options_.block_size; }

 private:
  MemoryPool(VkDevice device, Options options) : device_(device), options_(std::move(options)) {}
  absl::StatusOr<std::unique_ptr<MemoryBlock>> NewBlock(uint64_t size, bool dedicated);
  void DestroyBlock(MemoryBlock& block);

  VkDevice device_;
  Options options_;
  uint32_t memory_type_ = 0;
  bool host_visible_ = false;
  bool host_coherent_ = false;
  bool host_cached_ = false;

  mutable absl::Mutex blocks_mu_;
  std::vector<std::unique_ptr<MemoryBlock>> blocks_ ABSL_GUARDED_BY(blocks_mu_);
  int64_t used_bytes_ ABSL_GUARDED_BY(blocks_mu_) = 0;
  int64_t allocations_ ABSL_GUARDED_BY(blocks_mu_) = 0;
};

// A resolved, bindable device range: what a dispatch or a copy touches.
struct BufferBinding {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t offset = 0;     // bytes from the start of `buffer`
  uint64_t range = 0;      // bytes
  char* mapped = nullptr;  // host address of byte `offset` when mapped, else nullptr
};

// A backend::Buffer: one sub-allocation of a device pool. Frees it and updates
// the device's memory_in_use counter on destruction. `pool` and `counter`
// belong to the device, which outlives the buffer. host_ptr() stays nullptr:
// device memory is reached through copies, even where it happens to be mapped.
class VulkanBuffer final : public backend::Buffer {
 public:
  VulkanBuffer(const void* owner, MemoryPool* pool, Allocation allocation, int64_t size,
               std::atomic<int64_t>& counter);
  ~VulkanBuffer() override;
  VulkanBuffer(const VulkanBuffer&) = delete;
  VulkanBuffer& operator=(const VulkanBuffer&) = delete;

  int64_t size() const override { return size_; }
  const Allocation& allocation() const { return allocation_; }
  // The device that created this buffer (to reject foreign buffers).
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
  MemoryPool* pool_;  // null for zero-sized buffers
  Allocation allocation_;
  int64_t size_;
  std::atomic<int64_t>& counter_;
};

}  // namespace kiln::vulkan
