// A fixed pool of threads for the blocking parts of RPCs other than runs
// (graph parsing and compiles, param uploads and reads), so gRPC's callback
// threads never block on them. Runs go through the Scheduler instead.
//
// Thread safety: Post is thread-safe. The destructor runs every task already
// posted, then joins.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kiln::server {

class WorkPool {
 public:
  // REQUIRES: threads >= 1.
  explicit WorkPool(int threads);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  void Post(std::function<void()> task);

 private:
  void Loop();

  std::vector<std::thread> threads_;
  absl::Mutex tasks_mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(tasks_mu_);
  bool stopping_ ABSL_GUARDED_BY(tasks_mu_) = false;
};

}  // namespace kiln::server
