// A minimal reproducer for the kiln_vulkan_test hang (issue: Runtime v2, item 1),
// written against the plain Vulkan C API with none of Kiln's code, so it tells
// Kiln's bugs from the driver's.
//
// It does what VulkanStream did: one queue, one timeline semaphore per stream,
// every submission of a stream waiting for that stream's previous value and
// signalling the next (`--pattern=chain`), a few submissions in flight, then a
// host wait (vkWaitSemaphores) for the newest value. `--pattern=signal` drops
// the self-wait (the queue's submission order plus a leading barrier orders the
// batches instead). `--streams=N` runs N such streams from N host threads on one
// queue (the queue guarded by a mutex, as VulkanDevice::Submit does).
//
// Every host wait has a timeout (`--timeout_ms`); a wait that times out although
// the GPU work is a few fills is a hang, and the program prints the semaphore's
// counter and the value waited for, then exits 2. A clean run exits 0.
//
//   timeline_repro --pattern=chain  --iters=20000 --streams=2   # hangs on lavapipe 22.3 under load
//   timeline_repro --pattern=signal --iters=20000 --streams=2   # does not
#include <vulkan/vulkan.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CHECK_VK(expr)                                                      \
  do {                                                                      \
    VkResult r_ = (expr);                                                   \
    if (r_ != VK_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #expr, r_, __LINE__); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

struct Options {
  std::string pattern = "chain";
  int iters = 5000;
  int streams = 1;
  int in_flight = 3;  // submissions between host waits
  int timeout_ms = 10000;
  bool timestamps = true;
  // Timestamp query pools of this many queries, each read back and destroyed
  // once the submissions that wrote it finished, while later ones may still
  // run (legal: vkDestroyQueryPool needs only the commands that use it done).
  // 0 = one pool for the whole run.
  int pool_queries = 0;
  // Submissions per semaphore: after this many the stream waits for its
  // newest value, destroys its semaphore at once (legal: every batch that
  // uses it has completed) and creates a new one, as a VulkanStream's
  // destructor and the next stream's creation did. 0 = one semaphore.
  int stream_life = 0;
};

struct Device {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t family = 0;
  uint32_t memory_type = 0;
  std::mutex queue_mu;
};

void OpenDevice(Device& d) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ii{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ii.pApplicationInfo = &app;
  CHECK_VK(vkCreateInstance(&ii, nullptr, &d.instance));
  uint32_t n = 0;
  CHECK_VK(vkEnumeratePhysicalDevices(d.instance, &n, nullptr));
  if (n == 0) {
    std::fprintf(stderr, "no Vulkan device\n");
    std::exit(77);
  }
  std::vector<VkPhysicalDevice> phys(n);
  CHECK_VK(vkEnumeratePhysicalDevices(d.instance, &n, phys.data()));
  d.physical = phys[0];
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(d.physical, &props);
  std::printf("device: %s (driver 0x%x)\n", props.deviceName, props.driverVersion);
  uint32_t nf = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(d.physical, &nf, nullptr);
  std::vector<VkQueueFamilyProperties> fams(nf);
  vkGetPhysicalDeviceQueueFamilyProperties(d.physical, &nf, fams.data());
  for (uint32_t i = 0; i < nf; ++i) {
    if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      d.family = i;
      break;
    }
  }
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(d.physical, &mem);
  for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    if (mem.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
      d.memory_type = i;
      break;
    }
  }
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.timelineSemaphore = VK_TRUE;
  VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f.pNext = &f12;
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = d.family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.pNext = &f;
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  CHECK_VK(vkCreateDevice(d.physical, &di, nullptr, &d.device));
  vkGetDeviceQueue(d.device, d.family, 0, &d.queue);
}

// One stream: its command pool, buffer, semaphore, and the loop.
int RunStream(Device& d, const Options& o, int index, std::atomic<bool>& failed) {
  VkDevice dev = d.device;
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = d.family;
  VkCommandPool pool;
  CHECK_VK(vkCreateCommandPool(dev, &pi, nullptr, &pool));
  const int ring = o.in_flight + 1;
  std::vector<VkCommandBuffer> cmds(ring);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = static_cast<uint32_t>(ring);
  CHECK_VK(vkAllocateCommandBuffers(dev, &ai, cmds.data()));

  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = 1 << 16;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  VkBuffer buf;
  CHECK_VK(vkCreateBuffer(dev, &bi, nullptr, &buf));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, buf, &req);
  VkMemoryAllocateInfo mi{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  mi.allocationSize = req.size;
  mi.memoryTypeIndex = d.memory_type;
  VkDeviceMemory memory;
  CHECK_VK(vkAllocateMemory(dev, &mi, nullptr, &memory));
  CHECK_VK(vkBindBufferMemory(dev, buf, memory, 0));

  const uint32_t pool_size = static_cast<uint32_t>(o.pool_queries > 0 ? o.pool_queries : ring);
  auto new_pool = [&] {
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = pool_size;
    VkQueryPool p;
    CHECK_VK(vkCreateQueryPool(dev, &qi, nullptr, &p));
    return p;
  };
  VkQueryPool queries = o.timestamps ? new_pool() : VK_NULL_HANDLE;
  uint32_t next_query = 0;
  uint64_t queries_last_use = 0;
  struct Retired {
    VkQueryPool pool;
    uint64_t last_use;  // timeline value of the last submission writing it
  };
  std::vector<Retired> retired;

  VkSemaphoreTypeCreateInfo ti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  ti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  si.pNext = &ti;
  VkSemaphore timeline;
  CHECK_VK(vkCreateSemaphore(dev, &si, nullptr, &timeline));
  int64_t semaphores = 1;

  const bool chain = o.pattern == "chain";
  uint64_t last = 0;
  int rc = 0;
  for (int i = 0; i < o.iters && !failed.load(); ++i) {
    VkCommandBuffer cmd = cmds[i % ring];
    // The ring slot is free: its submission was waited for (below) before reuse.
    CHECK_VK(vkResetCommandBuffer(cmd, 0));
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    CHECK_VK(vkBeginCommandBuffer(cmd, &begin));
    VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    barrier.dstAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                         &barrier, 0, nullptr, 0, nullptr);
    vkCmdFillBuffer(cmd, buf, 0, bi.size, static_cast<uint32_t>(i));
    if (queries != VK_NULL_HANDLE) {
      if (o.pool_queries > 0 && next_query == pool_size) {
        retired.push_back({queries, queries_last_use});
        queries = new_pool();
        next_query = 0;
      }
      const uint32_t q = o.pool_queries > 0 ? next_query++ : static_cast<uint32_t>(i % ring);
      vkCmdResetQueryPool(cmd, queries, q, 1);
      vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, q);
      queries_last_use = last + 1;
    }
    CHECK_VK(vkEndCommandBuffer(cmd));

    const uint64_t wait_value = last;
    const uint64_t signal_value = last + 1;
    const VkPipelineStageFlags stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    const bool wait = chain && wait_value > 0;
    VkTimelineSemaphoreSubmitInfo tsi{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
    tsi.waitSemaphoreValueCount = wait ? 1 : 0;
    tsi.pWaitSemaphoreValues = &wait_value;
    tsi.signalSemaphoreValueCount = 1;
    tsi.pSignalSemaphoreValues = &signal_value;
    VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    submit.pNext = &tsi;
    submit.waitSemaphoreCount = wait ? 1 : 0;
    submit.pWaitSemaphores = &timeline;
    submit.pWaitDstStageMask = &stage;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd;
    submit.signalSemaphoreCount = 1;
    submit.pSignalSemaphores = &timeline;
    {
      std::lock_guard<std::mutex> lock(d.queue_mu);
      CHECK_VK(vkQueueSubmit(d.queue, 1, &submit, VK_NULL_HANDLE));
    }
    last = signal_value;

    // Keep at most `in_flight` submissions outstanding: wait for the oldest.
    const bool end_of_life = o.stream_life > 0 && last == static_cast<uint64_t>(o.stream_life);
    if (last > static_cast<uint64_t>(o.in_flight) || i + 1 == o.iters || end_of_life) {
      const uint64_t want = i + 1 == o.iters || end_of_life ? last : last - o.in_flight;
      VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
      wi.semaphoreCount = 1;
      wi.pSemaphores = &timeline;
      wi.pValues = &want;
      const VkResult r = vkWaitSemaphores(dev, &wi, uint64_t{1000000} * o.timeout_ms);
      if (r == VK_TIMEOUT) {
        uint64_t reached = 0;
        vkGetSemaphoreCounterValue(dev, timeline, &reached);
        std::printf("HANG: stream %d iteration %d: waited %d ms for value %llu, counter at %llu\n",
                    index, i, o.timeout_ms, static_cast<unsigned long long>(want),
                    static_cast<unsigned long long>(reached));
        std::fflush(stdout);
        failed = true;
        rc = 2;
        break;
      }
      CHECK_VK(r);
      // Read back and destroy the pools whose submissions finished; newer
      // submissions of this stream (and other streams) may still be running.
      for (size_t k = 0; k < retired.size();) {
        if (retired[k].last_use > want) {
          ++k;
          continue;
        }
        std::vector<uint64_t> ticks(pool_size);
        CHECK_VK(vkGetQueryPoolResults(dev, retired[k].pool, 0, pool_size,
                                       ticks.size() * sizeof(uint64_t), ticks.data(),
                                       sizeof(uint64_t), VK_QUERY_RESULT_64_BIT));
        vkDestroyQueryPool(dev, retired[k].pool, nullptr);
        retired.erase(retired.begin() + static_cast<long>(k));
      }
      if (end_of_life) {
        // Every submission that used the semaphore has signalled: destroy it.
        vkDestroySemaphore(dev, timeline, nullptr);
        CHECK_VK(vkCreateSemaphore(dev, &si, nullptr, &timeline));
        ++semaphores;
        last = 0;
      }
    }
  }
  if (rc == 0 && o.stream_life > 0) {
    std::printf("stream %d: %lld semaphores\n", index, static_cast<long long>(semaphores));
  }
  if (rc != 0) std::_Exit(rc);  // the queue thread is stuck: tearing down would hang too
  CHECK_VK(vkDeviceWaitIdle(dev));
  vkDestroySemaphore(dev, timeline, nullptr);
  if (queries != VK_NULL_HANDLE) vkDestroyQueryPool(dev, queries, nullptr);
  for (const Retired& r : retired) vkDestroyQueryPool(dev, r.pool, nullptr);
  vkDestroyBuffer(dev, buf, nullptr);
  vkFreeMemory(dev, memory, nullptr);
  vkDestroyCommandPool(dev, pool, nullptr);
  return rc;
}

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (Flag(argv[i], "--pattern", &v)) {
      o.pattern = v;
    } else if (Flag(argv[i], "--iters", &v)) {
      o.iters = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--streams", &v)) {
      o.streams = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--in_flight", &v)) {
      o.in_flight = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--timeout_ms", &v)) {
      o.timeout_ms = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--pool_queries", &v)) {
      o.pool_queries = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--stream_life", &v)) {
      o.stream_life = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--timestamps", &v)) {
      o.timestamps = v != "0";
    } else {
      std::fprintf(stderr,
                   "usage: %s [--pattern=chain|signal] [--iters=N] [--streams=N] "
                   "[--in_flight=N] [--timeout_ms=N] [--timestamps=0|1] [--pool_queries=N] [--stream_life=N]\n",
                   argv[0]);
      return 64;
    }
  }
  if ((o.pattern != "chain" && o.pattern != "signal") || o.iters < 1 || o.streams < 1 ||
      o.in_flight < 1 || o.timeout_ms < 1) {
    std::fprintf(stderr, "bad options\n");
    return 64;
  }
  Device d;
  OpenDevice(d);
  std::atomic<bool> failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < o.streams; ++s) {
    threads.emplace_back([&, s] { RunStream(d, o, s, failed); });
  }
  for (auto& t : threads) t.join();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("ok: pattern=%s streams=%d iters=%d in_flight=%d pool_queries=%d in %.0f ms\n",
              o.pattern.c_str(), o.streams, o.iters, o.in_flight, o.pool_queries, ms);
  vkDestroyDevice(d.device, nullptr);
  vkDestroyInstance(d.instance, nullptr);
  return 0;
}
