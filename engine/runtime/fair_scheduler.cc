#include "engine/runtime/fair_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kiln::runtime {
namespace {

double CostOf(const FairJob& job) { return std::max(job.cost_micros, 1.0); }

}  // namespace

FairScheduler::FairScheduler(const Options& options)
    : options_(options), started_(absl::Now()) {}

absl::StatusOr<std::unique_ptr<FairScheduler>> FairScheduler::Create(const Options& options) {
  if (options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.name, ": a device scheduler needs at least one slot, got ", options.slots));
  }
  std::unique_ptr<FairScheduler> s(new FairScheduler(options));
  for (int i = 0; i < options.slots; ++i) s->threads_.emplace_back([p = s.get()] { p->Loop(); });
  return s;
}

FairScheduler::~FairScheduler() { Shutdown(); }

void FairScheduler::Shutdown() {
  std::vector<FairJob> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [name, t] : tenants_) {
      for (auto& [key, e] : t.queue) dropped.push_back(std::move(e.job));
      t.queue.clear();
    }
    tickets_.clear();
    queued_ = 0;
  }
  for (FairJob& j : dropped) {
    j.drop(absl::UnavailableError(absl::StrCat(options_.name, " is shutting down")));
    if (j.finish) j.finish();
  }
  for (std::thread& t : threads_) t.join();
  // Jobs running inline on callers' threads still hold slots.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](int* running) { return *running == 0; }, &running_));
}

absl::StatusOr<FairScheduler::Ticket> FairScheduler::Submit(FairJob job) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
  TenantState& t = tenants_[job.tenant.name];
  const int64_t mine = static_cast<int64_t>(t.queue.size());
  if (mine >= std::max<int64_t>(job.tenant.max_queue, 0)) {
    ++rejected_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", job.tenant.name, "\"'s queue on ", options_.name, " is full: ", mine,
        " runs wait, the limit max_queue = ", job.tenant.max_queue));
  }
  if (queued_ >= options_.max_queued) {
    ++rejected_;
    return absl::ResourceExhaustedError(absl::StrCat(options_.name, "'s run queue is full: ",
                                                     queued_, " runs wait, the limit is ",
                                                     options_.max_queued));
  }
  t.weight = std::max(job.tenant.weight, 1e-6);
  t.max_running = std::max(job.tenant.max_running, 0);
  if (t.queue.empty() && t.running == 0) t.pass = std::max(t.pass, virtual_time_);
  const uint64_t seq = next_seq_++;
  const QueueKey key{-job.priority, seq};
  t.queue.emplace(key, Entry{std::move(job), absl::Now()});
  tickets_.emplace(seq, std::make_pair(&t, key));
  ++queued_;
  return seq;
}

void FairScheduler::StartLocked(TenantState& t, double cost) {
  virtual_time_ = std::max(virtual_time_, t.pass);
  t.pass += cost / t.weight;
  ++t.running;
  ++running_;
}

bool FairScheduler::TryRunInline(FairJob& job) {
  TenantState* t = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || queued_ > 0 || running_ >= options_.slots) return false;
    t = &tenants_[job.tenant.name];
    if (job.tenant.max_running > 0 && t->running >= job.tenant.max_running) return false;
    t->weight = std::max(job.tenant.weight, 1e-6);
    if (t->running == 0) t->pass = std::max(t->pass, virtual_time_);
    StartLocked(*t, CostOf(job));
  }
  // The job may end the call, and with it the object that owned `job`.
  FairJob local = std::move(job);
  RunStarted(*t, local, absl::Now(), /*on_caller=*/true);
  return true;
}

void FairScheduler::RunStarted(TenantState& t, FairJob& job, absl::Time enqueued,
                                 bool on_caller) {
  const absl::Time now = absl::Now();
  const double charged = CostOf(job);
  double used = 0;
  bool ran = false;
  if (now > job.deadline) {
    job.drop(absl::DeadlineExceededError(absl::StrCat(
        "the run's deadline passed after ", absl::FormatDuration(now - enqueued), " in ",
        options_.name, "'s queue, before it started")));
  } else {
    used = std::max(0.0, job.run(now - enqueued));
    ran = true;
  }
  {
    absl::MutexLock lock(&mu_);
    // Correct the estimate charged at the start to the device time used.
    t.pass += ((ran ? std::max(used, 1.0) : 0.0) - charged) / t.weight;
    t.device_micros += used;
    --t.running;
    --running_;
    if (ran) {
      ++runs_;
      if (on_caller) ++inline_runs_;
      busy_micros_ += used;
    } else {
      ++dropped_;
    }
  }
  if (job.finish) job.finish();
}

bool FairScheduler::Cancel(Ticket ticket) {
  FairJob job;
  {
    absl::MutexLock lock(&mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return false;
    auto [t, key] = it->second;
    auto e = t->queue.find(key);
    job = std::move(e->second.job);
    t->queue.erase(e);
    tickets_.erase(it);
    --queued_;
    ++dropped_;
  }
  job.drop(absl::CancelledError("the run was cancelled before it started"));
  if (job.finish) job.finish();
  return true;
}

FairSchedulerStats FairScheduler::stats() const {
  absl::MutexLock lock(&mu_);
  FairSchedulerStats s;
  s.name = options_.name;
  s.slots = options_.slots;
  s.runs = runs_;
  s.inline_runs = inline_runs_;
  s.dropped = dropped_;
  s.rejected = rejected_;
  s.busy_micros = busy_micros_;
  s.uptime_micros = absl::ToDoubleMicroseconds(absl::Now() - started_);
  s.queued = static_cast<int>(queued_);
  s.running = running_;
  for (const auto& [name, t] : tenants_) {
    s.tenant_device_micros[name] = t.device_micros;
    if (!t.queue.empty()) s.tenant_queued[name] = static_cast<int>(t.queue.size());
    if (t.running > 0) s.tenant_running[name] = static_cast<int>(t.running);
  }
  return s;
}

FairScheduler::TenantState* FairScheduler::Eligible() {
  // The tenant with the least virtual time among those with a job waiting and
  // room under their running cap; ties go to the earliest head of queue.
  TenantState* best = nullptr;
  for (auto& [name, t] : tenants_) {
    if (t.queue.empty() || (t.max_running > 0 && t.running >= t.max_running)) continue;
    if (best == nullptr || t.pass < best->pass ||
        (t.pass == best->pass && t.queue.begin()->first.second < best->queue.begin()->first.second)) {
      best = &t;
    }
  }
  return best;
}

void FairScheduler::Loop() {
  for (;;) {
    FairJob job;
    absl::Time enqueued;
    TenantState* owner = nullptr;
    {
      absl::MutexLock lock(&mu_);
      // A slot may be held by a job running inline on a caller's thread.
      mu_.Await(absl::Condition(
          +[](FairScheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return (s->stopping_ && s->queued_ == 0) ||
                   (s->running_ < s->options_.slots && s->Eligible() != nullptr);
          },
          this));
      if (queued_ == 0) return;  // stopping and drained
      owner = Eligible();
      auto head = owner->queue.begin();
      tickets_.erase(head->first.second);
      job = std::move(head->second.job);
      enqueued = head->second.enqueued;
      owner->queue.erase(head);
      --queued_;
      StartLocked(*owner, CostOf(job));
    }
    RunStarted(*owner, job, enqueued, /*on_caller=*/false);
  }
}

}  // namespace kiln::runtime
