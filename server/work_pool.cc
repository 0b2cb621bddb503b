#include "server/work_pool.h"

namespace kiln::server {

WorkPool::WorkPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&tasks_mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkPool::Post(std::function<void()> task) {
  absl::MutexLock lock(&tasks_mu_);
  tasks_.push_back(std::move(task));
}

void WorkPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&tasks_mu_);
      tasks_mu_.Await(absl::Condition(
          +[](WorkPool* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->stopping_ || !p->tasks_.empty(); },
          this));
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace kiln::server
