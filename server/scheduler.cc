#include "server/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::server {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const Options& options) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the scheduler needs at least one worker, got ", options.workers));
  }
  std::unique_ptr<Scheduler> s(new Scheduler(options));
  for (int i = 0; i < options.workers; ++i) s->workers_.emplace_back([p = s.get()] { p->WorkerLoop(); });
  return s;
}

Scheduler::~Scheduler() {
  std::vector<Job> dropped;
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
    for (auto& [name, t] : tenants_) {
      for (auto& [key, e] : t.queue) dropped.push_back(std::move(e.job));
      t.queue.clear();
    }
    queued_.clear();
    queued_total_ = 0;
  }
  for (Job& j : dropped) j.drop(absl::UnavailableError("kilnd is shutting down"));
  for (std::thread& t : workers_) t.join();
  // Jobs running inline on callers' threads still hold slots.
  absl::MutexLock lock(&queue_mu_);
  queue_mu_.Await(absl::Condition(
      +[](int64_t* running) { return *running == 0; }, &running_total_));
}

absl::StatusOr<Scheduler::Ticket> Scheduler::Submit(const TenantPolicy& tenant, Job job) {
  absl::MutexLock lock(&queue_mu_);
  if (stopping_) return absl::UnavailableError("kilnd is shutting down");
  TenantState& t = tenants_[tenant.name];
  const int64_t queued = static_cast<int64_t>(t.queue.size());
  if (queued + t.running >= tenant.max_in_flight) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", tenant.name, "\" has ", queued + t.running,
        " runs in flight, the quota max_in_flight = ", tenant.max_in_flight,
        "; wait for a run to finish"));
  }
  if (queued >= tenant.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", tenant.name, "\"'s run queue is full: ", queued,
        " runs wait for a worker, the quota max_queue = ", tenant.max_queue));
  }
  t.stride = 1.0 / std::max(tenant.weight, 1e-6);
  // A tenant that was idle rejoins at the current virtual time.
  if (t.queue.empty()) t.pass = std::max(t.pass, virtual_time_);
  const uint64_t seq = next_seq_++;
  const QueueKey key{-job.priority, seq};
  t.queue.emplace(key, Entry{std::move(job), absl::Now()});
  queued_.emplace(seq, std::make_pair(&t, key));
  ++queued_total_;
  return seq;
}

bool Scheduler::TryRunInline(const TenantPolicy& tenant, Job& job) {
  {
    absl::MutexLock lock(&queue_mu_);
    if (stopping_ || queued_total_ > 0 || running_total_ >= options_.workers) return false;
    TenantState& t = tenants_[tenant.name];
    if (t.running >= tenant.max_in_flight) return false;  // Submit names the quota
    t.stride = 1.0 / std::max(tenant.weight, 1e-6);
    t.pass = std::max(t.pass, virtual_time_);
    virtual_time_ = t.pass;
    t.pass += t.stride;
    ++t.running;
    ++running_total_;
  }
  // The job may end the call, and with it the object that owned `job`.
  Job local = std::move(job);
  RunStarted(tenant.name, local, absl::Now());
  return true;
}

void Scheduler::RunStarted(const std::string& tenant, Job& job, absl::Time enqueued) {
  const absl::Time now = absl::Now();
  if (now > job.deadline) {
    job.drop(absl::DeadlineExceededError(absl::StrCat(
        "the run's deadline passed after ", absl::FormatDuration(now - enqueued),
        " in the queue, before it started")));
  } else {
    job.run(now - enqueued);
  }
  {
    absl::MutexLock lock(&queue_mu_);
    --tenants_[tenant].running;
    --running_total_;
  }
  if (job.finish) job.finish();
}

bool Scheduler::Cancel(Ticket ticket) {
  Job job;
  {
    absl::MutexLock lock(&queue_mu_);
    auto it = queued_.find(ticket);
    if (it == queued_.end()) return false;
    auto [t, key] = it->second;
    auto e = t->queue.find(key);
    job = std::move(e->second.job);
    t->queue.erase(e);
    queued_.erase(it);
    --queued_total_;
  }
  job.drop(absl::CancelledError("the client cancelled the run before it started"));
  return true;
}

std::map<std::string, Scheduler::Load> Scheduler::Loads() const {
  absl::MutexLock lock(&queue_mu_);
  std::map<std::string, Load> out;
  for (const auto& [name, t] : tenants_) {
    out[name] = Load{static_cast<int64_t>(t.queue.size()), t.running};
  }
  return out;
}

void Scheduler::WorkerLoop() {
  for (;;) {
    Job job;
    absl::Time enqueued;
    TenantState* owner = nullptr;
    std::string owner_name;
    {
      absl::MutexLock lock(&queue_mu_);
      // A slot may be held by a job running inline on a caller's thread.
      queue_mu_.Await(absl::Condition(
          +[](Scheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return (s->stopping_ && s->queued_total_ == 0) ||
                   (s->queued_total_ > 0 && s->running_total_ < s->options_.workers);
          },
          this));
      if (queued_total_ == 0) return;  // stopping
      // The tenant with the least pass; ties go to the earliest head of queue.
      for (auto& [name, t] : tenants_) {
        if (t.queue.empty()) continue;
        if (owner == nullptr || t.pass < owner->pass ||
            (t.pass == owner->pass &&
             t.queue.begin()->first.second < owner->queue.begin()->first.second)) {
          owner = &t;
          owner_name = name;
        }
      }
      auto head = owner->queue.begin();
      queued_.erase(head->first.second);
      job = std::move(head->second.job);
      enqueued = head->second.enqueued;
      owner->queue.erase(head);
      --queued_total_;
      virtual_time_ = owner->pass;
      owner->pass += owner->stride;
      ++owner->running;
      ++running_total_;
    }
    RunStarted(owner_name, job, enqueued);
  }
}

}  // namespace kiln::server
