// FairScheduler: the one scheduler of one device (DESIGN.md section 5,
// "Scheduling"); kilnd's work pool (compiles, param transfers) is one too.
// Every run placed on a device enters its scheduler; `slots` jobs execute at
// once (the device's concurrent-run limit: one OpenMP team on the CPU,
// several streams on a GPU), each run on a run context of its program.
//
// Across tenants: weighted fair queuing by device time. A tenant's virtual
// time advances by a run's cost divided by the tenant's weight: the cost
// model's estimate when the run starts, corrected to the measured time when it
// ends, so a tenant with weight 3 gets three times the device time of one with
// weight 1 whatever the size of their runs. A tenant whose queue was empty
// rejoins at the current virtual time (idleness banks no credit). Inside a
// tenant: higher priority first, then arrival.
//
// Queues are bounded: per tenant (`max_queue` of the job's tenant) and per
// device (Options::max_queued); a full queue answers RESOURCE_EXHAUSTED at
// once. A job whose deadline passed while it waited is dropped before it
// starts (DEADLINE_EXCEEDED); cancellation between kernels is the run's own
// (RunOptions). One inline rule: a job the caller marks short runs on the
// caller's thread when a slot is free and nothing waits (a cross-thread wake
// costs tens of microseconds on a virtualized host, more than a small run).
//
// Each device has its own scheduler, so a backlog on one device never holds
// the slots another device needs.
//
// Thread safety: every method is thread-safe. For each admitted job exactly
// one of `run` or `drop` is called, then `finish`, never under the
// scheduler's lock: `run`
// on a device thread or inline on the submitting thread; `drop` on a device
// thread (deadline), the caller of Cancel, or the destructor (UNAVAILABLE).
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

namespace kiln::runtime {

struct SchedulerTenant {
  std::string name;
  double weight = 1;         // > 0
  int64_t max_queue = 1024;  // this tenant's jobs waiting here
  int max_running = 0;       // this tenant's jobs executing at once; 0 = no limit
};

struct FairJob {
  SchedulerTenant tenant;
  int priority = 0;  // higher first within the tenant
  absl::Time deadline = absl::InfiniteFuture();
  double cost_micros = 0;  // the cost model's estimate; 0 = unknown (counted as 1 us)
  // Executes the job; `queued` is the time it waited. Returns the device
  // time it used, in microseconds (the measured run time).
  std::function<double(absl::Duration queued)> run;
  // Called instead of `run` when the job is not started.
  std::function<void(absl::Status why)> drop;
  // Optional; called last (after `run` or `drop`), once the job no longer
  // holds a slot and the statistics count it: answer the caller here, so a
  // caller that submits again at once finds the slot free.
  std::function<void()> finish;
};

struct FairSchedulerStats {
  std::string name;
  int slots = 0;
  int64_t runs = 0;
  int64_t inline_runs = 0;  // of `runs`, run on the caller's thread
  int64_t dropped = 0;      // deadline passed in the queue, or cancelled
  int64_t rejected = 0;     // queue full
  double busy_micros = 0;   // summed over slots
  double uptime_micros = 0;
  int queued = 0;
  int running = 0;
  std::map<std::string, double> tenant_device_micros;  // measured, per tenant
  std::map<std::string, int> tenant_queued;            // tenants with jobs waiting
  std::map<std::string, int> tenant_running;           // tenants with jobs executing
};

class FairScheduler {
 public:
  struct Options {
    std::string name;          // the device id, or the pool's name
    int slots = 1;             // jobs executing at once; >= 1
    int64_t max_queued = 4096;  // all tenants' jobs waiting here
  };
  using Ticket = uint64_t;

  static absl::StatusOr<std::unique_ptr<FairScheduler>> Create(const Options& options);
  // Drops every queued job (UNAVAILABLE), waits for running ones, joins.
  // Submit meanwhile (a dropped job's own callback, say) fails UNAVAILABLE.
  // The destructor calls it; a second call returns at once.
  void Shutdown();
  ~FairScheduler();
  FairScheduler(const FairScheduler&) = delete;
  FairScheduler& operator=(const FairScheduler&) = delete;

  // Queues `job`, or returns RESOURCE_EXHAUSTED naming the full queue and its
  // limit (neither callback is called then).
  absl::StatusOr<Ticket> Submit(FairJob job);
  // Runs `job` at once on the calling thread when a slot is free and nothing
  // waits; returns false with `job` untouched otherwise.
  bool TryRunInline(FairJob& job);
  // Drops a queued job (`drop` gets CANCELLED); false when it started or is gone.
  bool Cancel(Ticket ticket);

  FairSchedulerStats stats() const;
  const std::string& name() const { return options_.name; }

 private:
  struct Entry {
    FairJob job;
    absl::Time enqueued;
  };
  using QueueKey = std::pair<int, uint64_t>;  // (-priority, arrival)
  struct TenantState {
    double pass = 0;  // virtual time, in cost units / weight
    double weight = 1;
    int max_running = 0;
    int64_t running = 0;
    double device_micros = 0;
    std::map<QueueKey, Entry> queue;
  };

  explicit FairScheduler(const Options& options);
  void Loop();
  // Charges the start, runs (or drops), corrects the charge, frees the slot.
  void RunStarted(TenantState& tenant, FairJob& job, absl::Time enqueued, bool on_caller);
  void StartLocked(TenantState& t, double cost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TenantState* Eligible() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const absl::Time started_;
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // <= options_.slots
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  double virtual_time_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t runs_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t inline_runs_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  double busy_micros_ ABSL_GUARDED_BY(mu_) = 0;
  // std::map: TenantState addresses stay valid while jobs run.
  std::map<std::string, TenantState> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Ticket, std::pair<TenantState*, QueueKey>> tickets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::runtime
