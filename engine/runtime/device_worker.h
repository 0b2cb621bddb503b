// DeviceWorker: the lane through which runs reach one device (DESIGN.md
// section 5: "each device has a worker and queues"). Runs on different devices
// proceed concurrently; runs on one device take turns in arrival order, which
// on the CPU keeps one OpenMP team busy instead of several fighting over the
// cores. Fairness across tenants is decided above (kilnd's scheduler), so the
// lane is plain FIFO.
//
// A run either waits in the queue for the worker thread, or, when the caller
// allows it and the lane is idle, runs at once on the caller's thread: waking
// another thread costs tens of microseconds on a virtualized host, more than a
// small graph takes to run, while a long CPU run gains from the worker's warm
// OpenMP team. Either way at most one run uses the device at a time.
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
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

namespace kiln::runtime {

struct WorkerStats {
  std::string device;
  int64_t runs = 0;
  int64_t inline_runs = 0;  // of `runs`, those run on the caller's thread
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

  // Runs `fn` on the device's lane and returns a future for its result. With
  // `may_run_inline` and an idle lane, `fn` runs on the calling thread before
  // Submit returns. The statistics count the run before the future becomes
  // ready, so a caller that waited for its result sees it in stats().
  template <typename Fn>
  auto Submit(Fn fn, bool may_run_inline = false) -> std::future<decltype(fn())> {
    using R = decltype(fn());
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> result = promise->get_future();
    Work work;
    if constexpr (std::is_void_v<R>) {
      work.run = [fn = std::move(fn)]() mutable { fn(); };
      work.publish = [promise] { promise->set_value(); };
    } else {
      auto value = std::make_shared<std::optional<R>>();
      work.run = [fn = std::move(fn), value]() mutable { value->emplace(fn()); };
      work.publish = [promise, value] { promise->set_value(std::move(**value)); };
    }
    if (!(may_run_inline && TryRunInline(work))) Push(std::move(work));
    return result;
  }

  WorkerStats stats() const;

 private:
  struct Work {
    std::function<void()> run;      // does the work
    std::function<void()> publish;  // hands the result to the waiter
  };
  void Push(Work work);
  // Runs `work` here when the lane is idle; false (and `work` untouched) if not.
  bool TryRunInline(Work& work);
  // Runs `work` while holding the lane, then records it and releases the lane.
  void RunHoldingLane(Work& work, bool on_caller);
  void Loop();

  const std::string device_;
  const std::chrono::steady_clock::time_point started_;
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Work> queue_;    // guarded by queue_mu_
  bool busy_ = false;         // a run holds the lane; guarded by queue_mu_
  bool stopping_ = false;     // guarded by queue_mu_
  int64_t runs_ = 0;          // guarded by queue_mu_
  int64_t inline_runs_ = 0;   // guarded by queue_mu_
  double busy_micros_ = 0;    // guarded by queue_mu_
  std::thread thread_;
};

}  // namespace kiln::runtime
