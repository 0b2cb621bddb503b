// Admission and fair queuing of runs (DESIGN.md section 5, "Scheduling").
//
// A job enters its tenant's bounded queue (full -> RESOURCE_EXHAUSTED at
// once); `workers` threads execute jobs. Across tenants the next job comes
// from the tenant with the least weighted service so far (stride scheduling:
// each start advances the tenant's pass by 1/weight; a tenant whose queue was
// empty rejoins at the current virtual time, so idleness banks no credit).
// Inside a tenant: higher priority first, then arrival. A job whose deadline
// passed while it waited is dropped (DEADLINE_EXCEEDED) instead of started.
//
// The interface is narrow on purpose: a job is two callbacks, so per-device
// workers can later sit below this without the RPC layer changing.
//
// Thread safety: every method is thread-safe. For each admitted job exactly
// one of `run` or `drop` is called, never while the scheduler's lock is held:
// `run` on a worker thread; `drop` on a worker thread (deadline), on the
// caller of Cancel, or in the destructor (UNAVAILABLE).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln::server {

// What the scheduler needs to know about a tenant, read at each Submit.
struct TenantPolicy {
  std::string name;
  double weight = 1;          // > 0
  int64_t max_in_flight = 1;  // jobs admitted at once: queued + running
  int64_t max_queue = 1;      // jobs waiting for a worker
};

class Scheduler {
 public:
  struct Options {
    int workers = 2;  // jobs executing at once, all tenants
  };

  struct Job {
    int priority = 0;  // higher first within the tenant
    absl::Time deadline = absl::InfiniteFuture();
    // Executes the job; `queued` is the time it waited.
    std::function<void(absl::Duration queued)> run;
    // Optional; called after `run` once the job no longer counts against its
    // tenant's in-flight quota. Reply to the client here: a client that has
    // its answer may submit again at once and must find its slot free.
    std::function<void()> finish;
    // Called instead of `run` when the job is not started.
    std::function<void(absl::Status why)> drop;
  };
  using Ticket = uint64_t;

  struct Load {
    int64_t queued = 0;
    int64_t running = 0;
  };

  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const Options& options);
  // Drops every queued job (UNAVAILABLE), waits for running jobs, joins.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Admits `job` or returns RESOURCE_EXHAUSTED naming the tenant's quota
  // (max_in_flight or max_queue) and its limit; neither callback is called
  // then. The ticket identifies the job for Cancel.
  absl::StatusOr<Ticket> Submit(const TenantPolicy& tenant, Job job);

  // Runs `job` on the calling thread at once (`run`, then `finish` after the
  // slot is released) when a worker slot is free, no job waits and the
  // tenant's quota admits it: what a worker would do at once, without waking
  // one (a cross-thread wake-up costs tens of microseconds on a virtualized
  // host). Returns false, `job` untouched, when it must be queued instead. For
  // short jobs only: the caller's thread is busy until the job ends.
  bool TryRunInline(const TenantPolicy& tenant, Job& job);

  // Drops a job that has not started (`drop` gets CANCELLED). Returns false
  // when it already started or is gone.
  bool Cancel(Ticket ticket);

  // Per tenant, those with any job admitted now or before.
  std::map<std::string, Load> Loads() const;

 private:
  struct Entry {
    Job job;
    absl::Time enqueued;
  };
  // Queue order inside a tenant: (-priority, arrival sequence).
  using QueueKey = std::pair<int, uint64_t>;
  struct TenantState {
    double pass = 0;
    double stride = 1;
    int64_t running = 0;
    std::map<QueueKey, Entry> queue;
  };

  explicit Scheduler(const Options& options) : options_(options) {}
  void WorkerLoop();
  // Runs (or drops, past its deadline) a job that holds a slot, then frees
  // the slot and calls its finish.
  void RunStarted(const std::string& tenant, Job& job, absl::Time enqueued);

  const Options options_;
  std::vector<std::thread> workers_;

  mutable absl::Mutex queue_mu_;
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  int64_t queued_total_ ABSL_GUARDED_BY(queue_mu_) = 0;
  int64_t running_total_ ABSL_GUARDED_BY(queue_mu_) = 0;  // <= options_.workers
  uint64_t next_seq_ ABSL_GUARDED_BY(queue_mu_) = 1;
  double virtual_time_ ABSL_GUARDED_BY(queue_mu_) = 0;
  std::map<std::string, TenantState> tenants_ ABSL_GUARDED_BY(queue_mu_);
  // ticket -> (tenant, queue key) of a queued job
  absl::flat_hash_map<Ticket, std::pair<TenantState*, QueueKey>> queued_ ABSL_GUARDED_BY(queue_mu_);
};

}  // namespace kiln::server
