// A pool of threads for the blocking parts of RPCs other than runs (graph
// parsing and compiles, param uploads and reads), so gRPC's callback threads
// never block on them. Runs go through their device's scheduler instead.
//
// The pool is fair across tenants (runtime::FairScheduler): a task carries
// its tenant and a cost (the request's bytes, a stand-in for a graph's node
// count before it is parsed); the thread that frees up takes the task of the
// tenant with the least cost served so far, and one tenant's tasks never take
// more than `max_per_tenant` threads, so one tenant's large compiles cannot
// hold up another tenant's small one.
//
// Thread safety: Post is thread-safe. The destructor runs every task already
// posted (queued ones on the destructor's thread), then joins.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/runtime/fair_scheduler.h"

namespace kiln::server {

class WorkPool {
 public:
  // REQUIRES: threads >= 1. `max_per_tenant` 0 = threads - 1 (at least 1).
  explicit WorkPool(int threads, int max_per_tenant = 0);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Untenanted work (kilnd's own, param streams) and tenants' work: `tenant`
  // names the fair-share account (a tenant's compiles use "<tenant>/compile"),
  // `max_running` caps that account's tasks running at once (0 = the pool's
  // max_per_tenant).
  void Post(std::function<void()> task) { Post("", 1, 0, std::move(task)); }
  void Post(const std::string& tenant, double cost, int max_running, std::function<void()> task);

  runtime::FairSchedulerStats stats() const { return scheduler_->stats(); }

 private:
  int max_per_tenant_;
  std::unique_ptr<runtime::FairScheduler> scheduler_;
};

}  // namespace kiln::server
