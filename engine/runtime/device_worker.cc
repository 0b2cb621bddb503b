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

void DeviceWorker::Push(Work work) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(std::move(work));
  }
  queue_cv_.notify_all();
}

bool DeviceWorker::TryRunInline(Work& work) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (busy_ || !queue_.empty() || stopping_) return false;
    busy_ = true;
  }
  RunHoldingLane(work, /*on_caller=*/true);
  return true;
}

void DeviceWorker::RunHoldingLane(Work& work, bool on_caller) {
  const auto t0 = std::chrono::steady_clock::now();
  work.run();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    ++runs_;
    if (on_caller) ++inline_runs_;
    busy_micros_ += us;
    busy_ = false;
    wake = on_caller && !queue_.empty();
  }
  // Runs queued behind an inline run wait for the worker thread.
  if (wake) queue_cv_.notify_all();
  work.publish();
}

void DeviceWorker::Loop() {
  for (;;) {
    Work work;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return (stopping_ || !queue_.empty()) && !busy_; });
      if (queue_.empty()) return;  // stopping and drained
      work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    RunHoldingLane(work, /*on_caller=*/false);
  }
}

WorkerStats DeviceWorker::stats() const {
  std::lock_guard<std::mutex> lock(queue_mu_);
  WorkerStats s;
  s.device = device_;
  s.runs = runs_;
  s.inline_runs = inline_runs_;
  s.busy_micros = busy_micros_;
  s.uptime_micros =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started_).count();
  s.queued = static_cast<int>(queue_.size());
  return s;
}

}  // namespace kiln::runtime
