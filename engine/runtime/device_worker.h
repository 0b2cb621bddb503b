// DeviceWorker: one thread per device running the work queued for it in
// order (DESIGN.md section 5: "each device has a worker and queues"). Runs
// placed on different devices proceed concurrently; runs on one device take
// turns, which on the CPU keeps one OpenMP team busy instead of several
// fighting over the cores. Fairness across tenants is decided above (kilnd's
// scheduler), so this queue is plain FIFO.
//
// Thread safety: Submit may be called from any thread. The destructor drains
// the queue and joins the thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace kiln::runtime {

struct WorkerStats {
  std::string device;
  int64_t runs = 0;
  double busy_micros = 0;   // total time spent running work
  double uptime_micros = 0;
  int queued = 0;
};

class DeviceWorker {
 public:
  explicit DeviceWorker(std::string device);
  ~DeviceWorker();
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Queues `fn` and returns a future for its result.
  template <typename Fn>
  auto Submit(Fn fn) -> std::future<decltype(fn())> {
    using R = decltype(fn());
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> result = task->get_future();
    Push([task] { (*task)(); });
    return result;
  }

  WorkerStats stats() const;

 private:
  void Push(std::function<void()> work);
  void Loop();

  const std::string device_;
  const std::chrono::steady_clock::time_point started_;
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;  // guarded by queue_mu_
  bool stopping_ = false;                    // guarded by queue_mu_
  int64_t runs_ = 0;                         // guarded by queue_mu_
  double busy_micros_ = 0;                   // guarded by queue_mu_
  std::thread thread_;
};

}  // namespace kiln::runtime
