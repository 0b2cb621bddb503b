#include "backends/vulkan/vk_stream.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_pipeline.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

// A batch is submitted once it holds this many commands or staged bytes, so
// the device starts on long launch sequences before the next Synchronize.
constexpr int kMaxBatchCommands = 256;
constexpr uint64_t kMaxBatchStagedBytes = uint64_t{64} << 20;
constexpr uint32_t kErrorSlots = 256;  // per batch; flushed at half
constexpr uint32_t kErrorSlotBytes = 16;
constexpr uint32_t kQueriesPerPool = 256;
constexpr uint32_t kSetsPerDescriptorPool = 256;
constexpr uint32_t kBuffersPerDescriptorPool = kSetsPerDescriptorPool * 8;

constexpr VkPipelineStageFlags kWorkStages =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

bool Overlaps(const auto& a, const auto& b) {
  return a.buffer == b.buffer && a.begin < b.end && b.begin < a.end;
}

// Where an event stands among its stream's submissions: the batch holding it
// signals `batch_signal`, and `submitted` follows the stream's newest
// submission (Stream::Wait needs the event's batch on the queue).
struct PointInfo {
  const void* stream;
  const void* device;
  std::shared_ptr<const std::atomic<uint64_t>> submitted;
  uint64_t batch_signal;
};

class StreamPoint : public backend::Event {
 public:
  explicit StreamPoint(PointInfo info) : stream_(info.stream), info_(std::move(info)) {}
  const void* stream() const { return info_.stream; }
  const void* device() const { return info_.device; }
  bool on_queue() const { return info_.submitted->load() >= info_.batch_signal; }

 protected:
  const void* stream_;

 private:
  PointInfo info_;
};

class VulkanEvent final : public StreamPoint {
 public:
  VulkanEvent(PointInfo point, std::shared_ptr<QueryPool> queries, uint32_t index,
              double period_ns, uint32_t valid_bits)
      : StreamPoint(std::move(point)),
        queries_(std::move(queries)),
        index_(index),
        period_ns_(period_ns),
        mask_(valid_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << valid_bits) - 1) {}

  absl::StatusOr<double> MicrosSince(const backend::Event& earlier) const override {
    const auto* e = dynamic_cast<const VulkanEvent*>(&earlier);
    if (e == nullptr || e->stream_ != stream_) {
      return absl::InvalidArgumentError("vulkan: events are from different streams");
    }
    KILN_ASSIGN_OR_RETURN(uint64_t t1, Ticks());
    KILN_ASSIGN_OR_RETURN(uint64_t t0, e->Ticks());
    const uint64_t delta = (t1 - t0) & mask_;  // modular: counters may wrap
    return static_cast<double>(delta) * period_ns_ / 1000.0;
  }

 private:
  absl::StatusOr<uint64_t> Ticks() const {
    uint64_t ticks = 0;
    const VkResult r =
        vkGetQueryPoolResults(queries_->device(), queries_->pool(), index_, 1, sizeof(ticks),
                              &ticks, sizeof(ticks), VK_QUERY_RESULT_64_BIT);
    if (r == VK_NOT_READY) {
      return absl::FailedPreconditionError(
          "vulkan: event not reached yet (synchronize the stream first)");
    }
    KILN_RETURN_IF_ERROR(VkCheck(r, "vkGetQueryPoolResults"));
    return ticks & mask_;
  }

  std::shared_ptr<QueryPool> queries_;
  uint32_t index_;
  double period_ns_;
  uint64_t mask_;
};

// Devices whose compute queue has no timestamps get host-clock events, taken
// when Record() submits.
class HostClockEvent final : public StreamPoint {
 public:
  explicit HostClockEvent(PointInfo point)
      : StreamPoint(std::move(point)), time_(std::chrono::steady_clock::now()) {}
  absl::StatusOr<double> MicrosSince(const backend::Event& earlier) const override {
    const auto* e = dynamic_cast<const HostClockEvent*>(&earlier);
    if (e == nullptr || e->stream_ != stream_) {
      return absl::InvalidArgumentError("vulkan: events are from different streams");
    }
    return std::chrono::duration<double, std::micro>(time_ - e->time_).count();
  }

 private:
  std::chrono::steady_clock::time_point time_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<VulkanStream>> VulkanStream::Create(VulkanDevice& device) {
  auto s = std::unique_ptr<VulkanStream>(new VulkanStream(device));
  KILN_RETURN_IF_ERROR(s->Init());
  return s;
}

absl::Status VulkanStream::Init() {
  VkDevice dev = device_.vk();
  VkCommandPoolCreateInfo pinfo{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pinfo.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pinfo.queueFamilyIndex = device_.queue_family();
  KILN_RETURN_IF_ERROR(
      VkCheck(vkCreateCommandPool(dev, &pinfo, nullptr, &command_pool_), "vkCreateCommandPool"));
  KILN_ASSIGN_OR_RETURN(VulkanDevice::Timeline t, device_.AcquireTimeline());
  timeline_ = t.semaphore;
  last_signal_ = t.value;
  return absl::OkStatus();
}

VulkanStream::~VulkanStream() {
  (void)Flush();
  (void)Retire(kDefaultWaitTimeout);
  VkDevice dev = device_.vk();
  if (!failed_.ok()) {
    // The device may still be using what the unfinished batches reference:
    // leak them (and the semaphore) rather than free memory it may write.
    for (auto& b : in_flight_) b.release();
    in_flight_.clear();
    timeline_ = VK_NULL_HANDLE;
    command_pool_ = VK_NULL_HANDLE;
  }
  auto destroy = [&](std::unique_ptr<Batch>& b) {
    for (auto& [pool, a] : b->transients) pool->Free(a);
    if (b->errors.block != nullptr) device_.staging_pool().Free(b->errors);
    for (VkDescriptorPool p : b->descriptor_pools) vkDestroyDescriptorPool(dev, p, nullptr);
  };
  if (open_) destroy(open_);
  for (auto& b : in_flight_) destroy(b);
  for (auto& b : spare_) destroy(b);
  queries_.reset();
  if (command_pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(dev, command_pool_, nullptr);
  device_.ReleaseTimeline({timeline_, last_signal_});
}

absl::StatusOr<VulkanStream::Batch*> VulkanStream::Open() {
  if (open_) return open_.get();
  std::unique_ptr<Batch> b;
  if (!spare_.empty()) {
    b = std::move(spare_.back());
    spare_.pop_back();
  } else {
    b = std::make_unique<Batch>();
    VkCommandBufferAllocateInfo info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    info.commandPool = command_pool_;
    info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    info.commandBufferCount = 1;
    KILN_RETURN_IF_ERROR(VkCheck(vkAllocateCommandBuffers(device_.vk(), &info, &b->cmd),
                                 "vkAllocateCommandBuffers"));
  }
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  KILN_RETURN_IF_ERROR(VkCheck(vkBeginCommandBuffer(b->cmd, &begin), "vkBeginCommandBuffer"));
  // Orders this batch after everything submitted to the queue before it (this
  // stream's earlier batches among them): no semaphore wait is needed.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(b->cmd, kWorkStages, kWorkStages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  open_ = std::move(b);
  return open_.get();
}

void VulkanStream::Track(Batch& b, std::span<const Range> reads, std::span<const Range> writes) {
  bool hazard = false;
  for (const Range& w : writes) {
    for (const Range& r : b.reads) hazard = hazard || Overlaps(w, r);
    for (const Range& x : b.writes) hazard = hazard || Overlaps(w, x);
  }
  for (const Range& r : reads) {
    for (const Range& x : b.writes) hazard = hazard || Overlaps(r, x);
  }
  if (hazard) {
    VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                            VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(b.cmd, kWorkStages, kWorkStages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
    b.reads.clear();
    b.writes.clear();
  }
  b.reads.insert(b.reads.end(), reads.begin(), reads.end());
  b.writes.insert(b.writes.end(), writes.begin(), writes.end());
}

absl::StatusOr<VkDescriptorSet> VulkanStream::AllocateSet(Batch& b, VkDescriptorSetLayout layout) {
  while (true) {
    if (b.descriptor_pool == b.descriptor_pools.size()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kBuffersPerDescriptorPool};
      VkDescriptorPoolCreateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      info.maxSets = kSetsPerDescriptorPool;
      info.poolSizeCount = 1;
      info.pPoolSizes = &size;
      VkDescriptorPool pool;
      KILN_RETURN_IF_ERROR(VkCheck(vkCreateDescriptorPool(device_.vk(), &info, nullptr, &pool),
                                   "vkCreateDescriptorPool"));
      b.descriptor_pools.push_back(pool);
    }
    VkDescriptorSetAllocateInfo info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    info.descriptorPool = b.descriptor_pools[b.descriptor_pool];
    info.descriptorSetCount = 1;
    info.pSetLayouts = &layout;
    VkDescriptorSet set;
    const VkResult r = vkAllocateDescriptorSets(device_.vk(), &info, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) {
      return VkError(r, "vkAllocateDescriptorSets");
    }
    ++b.descriptor_pool;  // this pool is full: move on to the next (new) one
  }
}

absl::Status VulkanStream::Dispatch(const Pipeline& pipeline,
                                    std::span<const BufferBinding> bindings, uint32_t write_mask,
                                    const void* push, uint32_t push_bytes, uint32_t groups_x,
                                    uint32_t groups_y, uint32_t groups_z) {
  if (bindings.size() != pipeline.bindings() || push_bytes != pipeline.push_bytes()) {
    return absl::InternalError(absl::StrCat(
        "vulkan: ", pipeline.name(), " takes ", pipeline.bindings(), " buffers and ",
        pipeline.push_bytes(), " push bytes, got ", bindings.size(), " and ", push_bytes));
  }
  if (groups_x == 0 || groups_y == 0 || groups_z == 0) return absl::OkStatus();
  const DeviceCaps& caps = device_.caps();
  if (groups_x > caps.max_workgroup_count[0] || groups_y > caps.max_workgroup_count[1] ||
      groups_z > caps.max_workgroup_count[2]) {
    return absl::InternalError(absl::StrCat("vulkan: ", pipeline.name(), " grid ", groups_x, "x",
                                            groups_y, "x", groups_z, " exceeds the device limit"));
  }
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  std::vector<Range> reads, writes;
  std::vector<VkDescriptorBufferInfo> infos(bindings.size());
  std::vector<VkWriteDescriptorSet> set_writes(bindings.size());
  KILN_ASSIGN_OR_RETURN(VkDescriptorSet set, AllocateSet(*b, pipeline.set_layout()));
  for (size_t i = 0; i < bindings.size(); ++i) {
    const BufferBinding& x = bindings[i];
    const Range r{x.buffer, x.offset, x.offset + x.range};
    ((write_mask >> i) & 1 ? writes : reads).push_back(r);
    infos[i] = {x.buffer, x.offset, x.range};
    set_writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    set_writes[i].dstSet = set;
    set_writes[i].dstBinding = static_cast<uint32_t>(i);
    set_writes[i].descriptorCount = 1;
    set_writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    set_writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(device_.vk(), static_cast<uint32_t>(set_writes.size()), set_writes.data(),
                         0, nullptr);
  Track(*b, reads, writes);
  vkCmdBindPipeline(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline());
  vkCmdBindDescriptorSets(b->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout(), 0, 1, &set, 0,
                          nullptr);
  if (push_bytes > 0) {
    vkCmdPushConstants(b->cmd, pipeline.layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  }
  vkCmdDispatch(b->cmd, groups_x, groups_y, groups_z);
  ++b->commands;
  return absl::OkStatus();
}

absl::Status VulkanStream::Copy(const BufferBinding& src, const BufferBinding& dst,
                                uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const Range rs{src.buffer, src.offset, src.offset + bytes};
  const Range rd{dst.buffer, dst.offset, dst.offset + bytes};
  if (src.buffer == dst.buffer && src.offset == dst.offset) return absl::OkStatus();
  if (Overlaps(rs, rd)) {
    // vkCmdCopyBuffer forbids overlap: bounce through scratch.
    KILN_ASSIGN_OR_RETURN(BufferBinding tmp, Scratch(bytes));
    KILN_RETURN_IF_ERROR(Copy(src, tmp, bytes));
    return Copy(tmp, dst, bytes);
  }
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  Track(*b, std::span<const Range>(&rs, 1), std::span<const Range>(&rd, 1));
  VkBufferCopy region{src.offset, dst.offset, bytes};
  vkCmdCopyBuffer(b->cmd, src.buffer, dst.buffer, 1, &region);
  ++b->commands;
  return absl::OkStatus();
}

absl::Status VulkanStream::Fill(const BufferBinding& dst, uint64_t bytes, uint32_t value) {
  if (bytes == 0) return absl::OkStatus();
  if (bytes % 4 != 0 || dst.offset % 4 != 0) {
    return absl::InternalError("vulkan: fill needs 4-byte multiples");
  }
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  const Range rd{dst.buffer, dst.offset, dst.offset + bytes};
  Track(*b, {}, std::span<const Range>(&rd, 1));
  vkCmdFillBuffer(b->cmd, dst.buffer, dst.offset, bytes, value);
  ++b->commands;
  return absl::OkStatus();
}

absl::StatusOr<Allocation> VulkanStream::Transient(Batch& b, MemoryPool& pool, uint64_t bytes) {
  KILN_ASSIGN_OR_RETURN(Allocation a, pool.Allocate(bytes));
  b.transients.emplace_back(&pool, a);
  return a;
}

absl::Status VulkanStream::Upload(const void* src, const BufferBinding& dst, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst.mapped != nullptr && device_.device_pool().host_coherent() && Idle()) {
    std::memcpy(dst.mapped, src, bytes);  // nothing pending can touch dst
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  KILN_ASSIGN_OR_RETURN(Allocation staging, Transient(*b, device_.staging_pool(), bytes));
  std::memcpy(staging.mapped(), src, bytes);
  b->staged_bytes += bytes;
  return Copy(BufferBinding{staging.buffer(), staging.offset, bytes, staging.mapped()}, dst, bytes);
}

absl::Status VulkanStream::Download(const BufferBinding& src, void* dst, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const MemoryPool& pool = device_.device_pool();
  if (src.mapped != nullptr && pool.host_coherent() && pool.host_cached() && Idle()) {
    std::memcpy(dst, src.mapped, bytes);
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  KILN_ASSIGN_OR_RETURN(Allocation staging, Transient(*b, device_.staging_pool(), bytes));
  b->staged_bytes += bytes;
  KILN_RETURN_IF_ERROR(
      Copy(src, BufferBinding{staging.buffer(), staging.offset, bytes, staging.mapped()}, bytes));
  char* from = staging.mapped();
  b->completions.push_back([from, dst, bytes] { std::memcpy(dst, from, bytes); });
  return absl::OkStatus();
}

absl::StatusOr<BufferBinding> VulkanStream::Scratch(uint64_t bytes) {
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  KILN_ASSIGN_OR_RETURN(Allocation a, Transient(*b, device_.device_pool(), bytes));
  return BufferBinding{a.buffer(), a.offset, AlignUp(bytes, 4), a.mapped()};
}

absl::StatusOr<VulkanStream::ErrorSlot> VulkanStream::ReserveErrorSlot(ErrorDecoder decoder) {
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  if (b->errors.block == nullptr) {
    KILN_ASSIGN_OR_RETURN(b->errors,
                          device_.staging_pool().Allocate(kErrorSlots * kErrorSlotBytes));
    std::memset(b->errors.mapped(), 0, kErrorSlots * kErrorSlotBytes);
  }
  if (b->error_slots.size() == kErrorSlots) {
    return absl::ResourceExhaustedError("vulkan: too many checked dispatches in one batch");
  }
  b->error_slots.push_back(std::move(decoder));
  return ErrorSlot{BufferBinding{b->errors.buffer(), b->errors.offset,
                                 kErrorSlots * kErrorSlotBytes, b->errors.mapped()},
                   static_cast<uint32_t>(b->error_slots.size() - 1)};
}

absl::Status VulkanStream::MaybeFlush() {
  if (!open_) return absl::OkStatus();
  if (open_->commands >= kMaxBatchCommands || open_->staged_bytes >= kMaxBatchStagedBytes ||
      open_->error_slots.size() >= kErrorSlots / 2) {
    return Flush();
  }
  return absl::OkStatus();
}

absl::Status VulkanStream::Flush() {
  if (!failed_.ok()) return failed_;
  if (!open_) return absl::OkStatus();
  Batch& b = *open_;
  // Make the batch's writes visible to the host (read-back staging, error slots).
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(b.cmd, kWorkStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, nullptr,
                       0, nullptr);
  KILN_RETURN_IF_ERROR(VkCheck(vkEndCommandBuffer(b.cmd), "vkEndCommandBuffer"));
  b.signal = last_signal_ + 1;
  // Signal only: the barrier the batch opens with orders it (vk_stream.h).
  VkTimelineSemaphoreSubmitInfo tinfo{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  tinfo.signalSemaphoreValueCount = 1;
  tinfo.pSignalSemaphoreValues = &b.signal;
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.pNext = &tinfo;
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &b.cmd;
  submit.signalSemaphoreCount = 1;
  submit.pSignalSemaphores = &timeline_;
  std::unique_ptr<Batch> batch = std::move(open_);
  if (absl::Status s = device_.Submit(submit); !s.ok()) {
    // Never submitted: release its resources and report.
    Recycle(std::move(batch));
    return s;
  }
  last_signal_ = batch->signal;
  submitted_->store(last_signal_);
  ++submissions_;
  in_flight_.push_back(std::move(batch));
  return absl::OkStatus();
}

void VulkanStream::Recycle(std::unique_ptr<Batch> b) {
  for (auto& [pool, a] : b->transients) pool->Free(a);
  b->transients.clear();
  if (b->errors.block != nullptr) device_.staging_pool().Free(b->errors);
  b->errors = Allocation{};
  b->error_slots.clear();
  b->completions.clear();
  for (VkDescriptorPool p : b->descriptor_pools) vkResetDescriptorPool(device_.vk(), p, 0);
  b->descriptor_pool = 0;
  b->commands = 0;
  b->staged_bytes = 0;
  b->signal = 0;
  b->queries.clear();
  b->reads.clear();
  b->writes.clear();
  spare_.push_back(std::move(b));
}

absl::Status VulkanStream::Retire(absl::Duration wait) {
  if (!failed_.ok()) return failed_;
  if (in_flight_.empty()) return absl::OkStatus();
  if (wait > absl::ZeroDuration()) {
    VkSemaphoreWaitInfo info{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    info.semaphoreCount = 1;
    info.pSemaphores = &timeline_;
    info.pValues = &last_signal_;
    const uint64_t ns = wait == absl::InfiniteDuration()
                            ? UINT64_MAX
                            : static_cast<uint64_t>(absl::ToInt64Nanoseconds(wait));
    const VkResult r = vkWaitSemaphores(device_.vk(), &info, ns);
    if (r == VK_TIMEOUT || r == VK_ERROR_DEVICE_LOST) {
      uint64_t reached = 0;
      (void)vkGetSemaphoreCounterValue(device_.vk(), timeline_, &reached);
      failed_ = backend::DeviceFault(
          device_.info().id,
          absl::StrCat(r == VK_TIMEOUT ? absl::StrCat("work did not finish within ",
                                                      absl::FormatDuration(wait))
                                       : std::string("device lost"),
                       " (", last_signal_ - reached, " of this stream's submissions unfinished)"));
      return failed_;
    }
    KILN_RETURN_IF_ERROR(VkCheck(r, "vkWaitSemaphores"));
  }
  uint64_t reached = 0;
  KILN_RETURN_IF_ERROR(VkCheck(vkGetSemaphoreCounterValue(device_.vk(), timeline_, &reached),
                               "vkGetSemaphoreCounterValue"));
  while (!in_flight_.empty() && in_flight_.front()->signal <= reached) {
    std::unique_ptr<Batch> b = std::move(in_flight_.front());
    in_flight_.pop_front();
    for (auto& done : b->completions) done();
    if (b->errors.block != nullptr) {
      const auto* words = reinterpret_cast<const uint32_t*>(b->errors.mapped());
      for (size_t i = 0; i < b->error_slots.size(); ++i) {
        if (words[4 * i] != 0 && pending_error_.ok()) {
          pending_error_ = b->error_slots[i](
              words[4 * i], {words[4 * i + 1], words[4 * i + 2], words[4 * i + 3]});
        }
      }
    }
    Recycle(std::move(b));
  }
  return absl::OkStatus();
}

bool VulkanStream::Idle() {
  if (open_ && open_->commands > 0) return false;
  if (!in_flight_.empty() && !Retire(absl::ZeroDuration()).ok()) return false;
  return in_flight_.empty();
}

absl::Status VulkanStream::SynchronizeFor(absl::Duration timeout) {
  if (!failed_.ok()) return failed_;
  KILN_RETURN_IF_ERROR(Flush()) << "while synchronizing " << device_.info().id;
  // A zero timeout would only poll; every wait here waits for completion.
  KILN_RETURN_IF_ERROR(Retire(std::max(timeout, absl::Nanoseconds(1))))
      << "while synchronizing " << device_.info().id;
  absl::Status s = std::move(pending_error_);
  pending_error_ = absl::OkStatus();
  return s;
}

absl::Status VulkanStream::Wait(const backend::Event& event) {
  if (!failed_.ok()) return failed_;
  const auto* point = dynamic_cast<const StreamPoint*>(&event);
  if (point == nullptr || point->device() != &device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        device_.info().id, ": Wait takes an event of a stream of the same device"));
  }
  if (point->stream() == this) return absl::OkStatus();  // in order already
  if (!point->on_queue()) {
    return absl::FailedPreconditionError(absl::StrCat(
        device_.info().id,
        ": the event's stream has not submitted it yet; Flush that stream first"));
  }
  // The event's batch is on the device's one queue ahead of anything this
  // stream submits next, and every batch opens with a barrier whose first
  // scope is all work submitted before it: nothing more to do.
  return absl::OkStatus();
}

absl::Status VulkanStream::FlushWork() { return Flush(); }

absl::StatusOr<std::unique_ptr<backend::Event>> VulkanStream::Record() {
  if (!failed_.ok()) return failed_;
  const DeviceCaps& caps = device_.caps();
  if (caps.timestamp_valid_bits == 0) {
    PointInfo point{this, &device_, submitted_, last_signal_ + 1};
    KILN_RETURN_IF_ERROR(Flush());
    return std::unique_ptr<backend::Event>(std::make_unique<HostClockEvent>(std::move(point)));
  }
  if (!queries_ || next_query_ == queries_->capacity()) {
    VkQueryPoolCreateInfo info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    info.queryCount = kQueriesPerPool;
    VkQueryPool pool;
    KILN_RETURN_IF_ERROR(
        VkCheck(vkCreateQueryPool(device_.vk(), &info, nullptr, &pool), "vkCreateQueryPool"));
    queries_ = std::make_shared<QueryPool>(device_.vk(), pool, kQueriesPerPool);
    next_query_ = 0;
  }
  KILN_ASSIGN_OR_RETURN(Batch * b, Open());
  const uint32_t index = next_query_++;
  if (b->queries.empty() || b->queries.back() != queries_) b->queries.push_back(queries_);
  vkCmdResetQueryPool(b->cmd, queries_->pool(), index, 1);
  vkCmdWriteTimestamp(b->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_->pool(), index);
  ++b->commands;
  // No submission: the timestamp rides in the open batch (the event is
  // readable once a Synchronize has passed it).
  return std::unique_ptr<backend::Event>(std::make_unique<VulkanEvent>(
      PointInfo{this, &device_, submitted_, last_signal_ + 1}, queries_, index, caps.timestamp_period_ns, caps.timestamp_valid_bits));
}

}  // namespace kiln::vulkan
