// A Vulkan stream: an in-order queue of copies and dispatches on one device.
//
// Work is recorded into a "batch" (one command buffer with its descriptor
// pools, transient staging/scratch memory, error slots and host completions).
// Dispatches enqueued back to back share a batch; the stream inserts a
// pipeline barrier only where a command touches a range an earlier command of
// the batch wrote (or writes one it read). A batch is submitted at
// Synchronize or when it grows large (MaybeFlush, which kernels
// call only between launches, so a kernel's dispatches and the transients
// they use always share a batch). Each submission signals the next value of
// the stream's timeline semaphore; it never waits on a semaphore. Batches are
// ordered by the queue's submission order and the full memory barrier each
// batch opens with (its first scope holds every command submitted earlier).
//
// Why no submission waits on the stream's own previous value: Mesa 22.3's
// emulated timelines (lavapipe) keep a reference to a submission's *wait*
// point past the signal the host waits for, and drop it later on the queue
// thread; destroying the semaphore after the host wait (legal Vulkan) then
// lets the queue thread write freed memory and, once that memory is reused,
// block forever on it: the kiln_vulkan_test hang. tests/backends/vulkan/repro/
// proves it without Kiln's code (valgrind: errors with self-waits, none
// without). Semaphores are also never destroyed while the device lives: a
// stream returns its semaphore to the device's pool (VulkanDevice::
// ReleaseTimeline), so no late reference can reach freed memory.
//
// Every host wait is bounded (SynchronizeFor); one that times out is a device
// fault, reported UNAVAILABLE naming the device, and the stream stays failed.
//
// Data-dependent failures (an out-of-range gather index) are written by the
// shader into the batch's error slots; they surface as the status of the
// Synchronize that retires the batch.
//
// Thread safety: one thread at a time (backend.h). The device outlives the stream.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_loader.h"
#include "backends/vulkan/vk_memory.h"

namespace kiln::vulkan {

class Pipeline;
class VulkanDevice;

// A pool of timestamp queries shared by a stream and its events.
class QueryPool {
 public:
  QueryPool(VkDevice device, VkQueryPool pool, uint32_t capacity)
      : device_(device), pool_(pool), capacity_(capacity) {}
  ~QueryPool() { vkDestroyQueryPool(device_, pool_, nullptr); }
  QueryPool(const QueryPool&) = delete;
  QueryPool& operator=(const QueryPool&) = delete;
  VkDevice device() const { return device_; }
  VkQueryPool pool() const { return pool_; }
  uint32_t capacity() const { return capacity_; }

 private:
  VkDevice device_;
  VkQueryPool pool_;
  uint32_t capacity_;
};

class VulkanStream final : public backend::Stream {
 public:
  // Decodes a nonzero error slot (code, details) into the status Synchronize returns.
  using ErrorDecoder =
      std::function<absl::Status(uint32_t code, const std::array<uint32_t, 3>& details)>;
  // A slot is 4 words: the code (0 = fine; the first failing invocation sets
  // it with atomicCompSwap and then writes the 3 detail words).
  struct ErrorSlot {
    BufferBinding buffer;  // bind it; the shader writes words [4 * index, 4 * index + 4)
    uint32_t index = 0;
  };

  static absl::StatusOr<std::unique_ptr<VulkanStream>> Create(VulkanDevice& device);
  ~VulkanStream() override;  // waits for the work in flight
  VulkanStream(const VulkanStream&) = delete;
  VulkanStream& operator=(const VulkanStream&) = delete;

  absl::Status SynchronizeFor(absl::Duration timeout) override;
  absl::Status Wait(const backend::Event& event) override;
  absl::Status FlushWork() override;
  absl::StatusOr<std::unique_ptr<backend::Event>> Record() override;

  const VulkanDevice& device() const { return device_; }

  // Records a dispatch of `pipeline`: bindings[i] at binding i, bit i of
  // `write_mask` set when the shader writes it; `push` holds exactly the
  // pipeline's push-constant bytes.
  absl::Status Dispatch(const Pipeline& pipeline, std::span<const BufferBinding> bindings,
                        uint32_t write_mask, const void* push, uint32_t push_bytes,
                        uint32_t groups_x, uint32_t groups_y = 1, uint32_t groups_z = 1);
  // Device-to-device copy of `bytes`; the ranges may overlap.
  absl::Status Copy(const BufferBinding& src, const BufferBinding& dst, uint64_t bytes);
  // Fills `bytes` (a multiple of 4) of `dst` with the 32-bit `value`.
  absl::Status Fill(const BufferBinding& dst, uint64_t bytes, uint32_t value);
  // Host -> device. `src` is read before this returns.
  absl::Status Upload(const void* src, const BufferBinding& dst, uint64_t bytes);
  // Device -> host. `dst` is written by the Synchronize that passes this point
  // (or before this returns when the stream is idle); it must stay valid until then.
  absl::Status Download(const BufferBinding& src, void* dst, uint64_t bytes);

  // Device-local memory that stays valid for the dispatches recorded until the
  // next MaybeFlush / Synchronize / Record, and is released once they finished.
  absl::StatusOr<BufferBinding> Scratch(uint64_t bytes);
  // An error slot for the dispatches recorded until the next flush point.
  absl::StatusOr<ErrorSlot> ReserveErrorSlot(ErrorDecoder decoder);

  // Submits the open batch when it holds many commands or much staging.
  absl::Status MaybeFlush();

  // Nothing recorded and nothing in flight (after retiring finished batches).
  bool Idle();
  // Submissions so far (for tests of batching).
  int64_t submissions() const { return submissions_; }

 private:
  struct Range {
    VkBuffer buffer;
    uint64_t begin, end;
  };
  struct Batch {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> descriptor_pools;
    size_t descriptor_pool = 0;  // the pool sets come from now
    std::vector<std::pair<MemoryPool*, Allocation>> transients;
    std::vector<std::function<void()>> completions;
    Allocation errors;  // staging words, zeroed on allocation
    std::vector<ErrorDecoder> error_slots;
    uint64_t signal = 0;
    int commands = 0;
    uint64_t staged_bytes = 0;
    std::vector<Range> reads, writes;  // since the last barrier
    // Query pools this batch writes: a pool is destroyed only once no
    // unfinished batch uses it, whoever else drops it (vkDestroyQueryPool
    // needs its commands complete; lavapipe also touches its queue's context).
    std::vector<std::shared_ptr<QueryPool>> queries;
  };

  explicit VulkanStream(VulkanDevice& device) : device_(device) {}
  absl::Status Init();
  absl::StatusOr<Batch*> Open();
  absl::Status Flush();
  // Retires batches whose signal has passed; with a nonzero `wait`, first
  // waits up to that long for all of them (a timeout fails the stream).
  absl::Status Retire(absl::Duration wait);
  void Recycle(std::unique_ptr<Batch> batch);
  // Inserts a barrier when [bindings] conflict with the batch's ranges.
  void Track(Batch& b, std::span<const Range> reads, std::span<const Range> writes);
  absl::StatusOr<VkDescriptorSet> AllocateSet(Batch& b, VkDescriptorSetLayout layout);
  absl::StatusOr<Allocation> Transient(Batch& b, MemoryPool& pool, uint64_t bytes);

  VulkanDevice& device_;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkSemaphore timeline_ = VK_NULL_HANDLE;  // from the device's pool
  uint64_t last_signal_ = 0;  // value of the newest submission
  absl::Status failed_;       // a device fault (timed-out wait): sticky
  // The newest submitted signal value, shared with this stream's events.
  std::shared_ptr<std::atomic<uint64_t>> submitted_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<Batch> open_;
  std::deque<std::unique_ptr<Batch>> in_flight_;
  std::vector<std::unique_ptr<Batch>> spare_;
  std::shared_ptr<QueryPool> queries_;
  uint32_t next_query_ = 0;
  absl::Status pending_error_;  // first failure of a retired batch, until reported
  int64_t submissions_ = 0;
};

}  // namespace kiln::vulkan
