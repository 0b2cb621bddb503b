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
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

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

  // Queues `fn` and returns a future for its result. The statistics count
  // the run before the future becomes ready, so a caller that waited for its
  // result sees it in stats().
  template <typename Fn>
  auto Submit(Fn fn) -> std::future<decltype(fn())> {
    using R = decltype(fn());
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> result = promise->get_future();
    if constexpr (std::is_void_v<R>) {
      Push([fn = std::move(fn)]() mutable { fn(); }, [promise] { promise->set_value(); });
    } else {
      auto value = std::make_shared<std::optional<R>>();
      Push([fn = std::move(fn), value]() mutable { value->emplace(fn()); },
           [promise, value] { promise->set_value(std::move(**value)); });
    }
    return result;
  }

  WorkerStats stats() const;

 private:
  struct Work {
    std::function<void()> run;      // does the work on the worker thread
    std::function<void()> publish;  // hands the result to the waiter
  };
  void Push(std::function<void()> run, std::function<void()> publish);
  void Loop();

  const std::string device_;
  const std::chrono::steady_clock::time_point started_;
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Work> queue_;  // guarded by queue_mu_
  bool stopping_ = false;                    // guarded by queue_mu_
  int64_t runs_ = 0;                         // guarded by queue_mu_
  double busy_micros_ = 0;                   // guarded by queue_mu_
  std::thread thread_;
};

}  // namespace kiln::runtime
