#include "server/work_pool.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace kiln::server {

WorkPool::WorkPool(int threads, int max_per_tenant)
    : max_per_tenant_(max_per_tenant > 0 ? max_per_tenant : std::max(1, threads - 1)) {
  runtime::FairScheduler::Options o;
  o.name = "work pool";
  o.slots = std::max(1, threads);
  o.max_queued = std::numeric_limits<int64_t>::max();
  auto s = runtime::FairScheduler::Create(o);
  if (!s.ok()) {  // slots >= 1: cannot fail
    spdlog::critical("work pool: {}", std::string(s.status().message()));
    std::abort();
  }
  scheduler_ = std::move(s).value();
}

// The scheduler stays valid while it shuts down: a task it runs then may Post.
WorkPool::~WorkPool() { scheduler_->Shutdown(); }

void WorkPool::Post(const std::string& tenant, double cost, int max_running,
                    std::function<void()> task) {
  runtime::FairJob job;
  job.tenant = {tenant, 1, std::numeric_limits<int64_t>::max(),
                max_running > 0 ? std::min(max_running, max_per_tenant_) : max_per_tenant_};
  job.cost_micros = cost;
  auto shared = std::make_shared<std::function<void()>>(std::move(task));
  job.run = [shared](absl::Duration) {
    const absl::Time t0 = absl::Now();
    (*shared)();
    return absl::ToDoubleMicroseconds(absl::Now() - t0);  // the charge: time used
  };
  // Posted work always runs: a task dropped at shutdown runs here instead.
  job.drop = [shared](absl::Status) { (*shared)(); };
  // Unbounded queues: Submit fails only while the pool is being destroyed,
  // when a task it runs at shutdown posts its next step (a param stream's
  // next chunk). Posted work always runs: that one runs here.
  if (!scheduler_->Submit(std::move(job)).ok()) (*shared)();
}

}  // namespace kiln::server
