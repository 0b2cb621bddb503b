#include "engine/runtime/device_worker.h"

namespace kiln::runtime {

DeviceWorker::DeviceWorker(std::string device)
    : device_(std::move(device)), started_(std::chrono::steady_clock::now()) {
  thread_ = std::thread([this] { Loop(); });
}

DeviceWorker::~DeviceWorker() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
}

void DeviceWorker::Push(std::function<void()> run, std::function<void()> publish) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(Work{std::move(run), std::move(publish)});
  }
  queue_cv_.notify_one();
}

void DeviceWorker::Loop() {
  for (;;) {
    Work work;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto t0 = std::chrono::steady_clock::now();
    work.run();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      ++runs_;
      busy_micros_ += us;
    }
    work.publish();
  }
}

WorkerStats DeviceWorker::stats() const {
  std::lock_guard<std::mutex> lock(queue_mu_);
  WorkerStats s;
  s.device = device_;
  s.runs = runs_;
  s.busy_micros = busy_micros_;
  s.uptime_micros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started_).count();
  s.queued = static_cast<int>(queue_.size());
  return s;
}

}  // namespace kiln::runtime
