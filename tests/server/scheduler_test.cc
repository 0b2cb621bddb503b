// The run scheduler in-process: weighted fair order across tenants,
// priority then arrival inside one, bounded queues, in-flight quota,
// deadlines and cancellation.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace kiln::server {
namespace {

// Records the order jobs start in. The first job submitted blocks the only
// worker until Release(), so everything after it queues.
class Recorder {
 public:
  explicit Recorder(Scheduler& s) : scheduler_(s) {}

  void Block(const TenantPolicy& t) {
    Scheduler::Job job;
    job.run = [this](absl::Duration) { gate_.WaitForNotification(); };
    job.drop = [](absl::Status) {};
    ASSERT_TRUE(scheduler_.Submit(t, std::move(job)).ok());
    while (scheduler_.Loads()[t.name].running == 0) absl::SleepFor(absl::Milliseconds(1));
  }
  void Release() { gate_.Notify(); }

  absl::StatusOr<Scheduler::Ticket> Add(const TenantPolicy& t, const std::string& label,
                                        int priority = 0,
                                        absl::Time deadline = absl::InfiniteFuture()) {
    Scheduler::Job job;
    job.priority = priority;
    job.deadline = deadline;
    job.run = [this, label](absl::Duration) {
      absl::MutexLock lock(&mu_);
      order_.push_back(label);
    };
    job.drop = [this, label](absl::Status why) {
      absl::MutexLock lock(&mu_);
      dropped_.push_back(label + ":" + std::string(absl::StatusCodeToString(why.code())));
    };
    return scheduler_.Submit(t, std::move(job));
  }

  void WaitFor(size_t finished) {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (order_.size() + dropped_.size() >= finished) return;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  std::vector<std::string> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }
  std::vector<std::string> dropped() {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }

 private:
  Scheduler& scheduler_;
  absl::Notification gate_;
  absl::Mutex mu_;
  std::vector<std::string> order_;
  std::vector<std::string> dropped_;
};

TenantPolicy Policy(const std::string& name, double weight = 1, int64_t in_flight = 100,
                    int64_t queue = 100) {
  return TenantPolicy{name, weight, in_flight, queue};
}

TEST(Scheduler, WeightedFairAcrossTenants) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Recorder r(**s);
  const TenantPolicy a = Policy("a", 2), b = Policy("b", 1), gate = Policy("gate");
  r.Block(gate);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(r.Add(a, "a").ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(r.Add(b, "b").ok());
  r.Release();
  r.WaitFor(16);
  const std::vector<std::string> order = r.order();
  // Weight 2 against 1: A gets two starts for each of B's while both wait.
  int a_first9 = 0;
  for (int i = 0; i < 9; ++i) a_first9 += order[i] == "a";
  EXPECT_EQ(a_first9, 6);
  EXPECT_EQ(order[0], "a");
  EXPECT_EQ(order[1], "b");
}

TEST(Scheduler, IdleTenantBanksNoCredit) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Recorder r(**s);
  const TenantPolicy a = Policy("a"), b = Policy("b"), gate = Policy("gate");
  // A runs alone for a while...
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(r.Add(a, "a").ok());
  r.WaitFor(6);
  // ...then both wait: B, idle until now, does not get six starts in a row.
  r.Block(gate);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.Add(a, "a").ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.Add(b, "b").ok());
  r.Release();
  r.WaitFor(14);
  const std::vector<std::string> order = r.order();
  const std::vector<std::string> tail(order.begin() + 6, order.begin() + 10);
  int b_count = 0;
  for (const auto& x : tail) b_count += x == "b";
  EXPECT_EQ(b_count, 2) << "first four after the gate alternate";
}

TEST(Scheduler, PriorityThenArrivalInsideATenant) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Recorder r(**s);
  const TenantPolicy a = Policy("a"), gate = Policy("gate");
  r.Block(gate);
  ASSERT_TRUE(r.Add(a, "low1", 0).ok());
  ASSERT_TRUE(r.Add(a, "high1", 5).ok());
  ASSERT_TRUE(r.Add(a, "low2", 0).ok());
  ASSERT_TRUE(r.Add(a, "high2", 5).ok());
  ASSERT_TRUE(r.Add(a, "mid", 1).ok());
  r.Release();
  r.WaitFor(5);
  EXPECT_EQ(r.order(), (std::vector<std::string>{"high1", "high2", "mid", "low1", "low2"}));
}

TEST(Scheduler, QueueAndInFlightQuotas) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Recorder r(**s);
  const TenantPolicy gate = Policy("gate");
  r.Block(gate);
  const TenantPolicy q = Policy("q", 1, /*in_flight=*/10, /*queue=*/2);
  ASSERT_TRUE(r.Add(q, "1").ok());
  ASSERT_TRUE(r.Add(q, "2").ok());
  auto full = r.Add(q, "3");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("max_queue = 2"), std::string::npos);

  const TenantPolicy f = Policy("f", 1, /*in_flight=*/1, /*queue=*/10);
  ASSERT_TRUE(r.Add(f, "f1").ok());
  auto over = r.Add(f, "f2");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("max_in_flight = 1"), std::string::npos);
  r.Release();
  r.WaitFor(3);
  EXPECT_EQ(r.order().size(), 3u);
  EXPECT_TRUE(r.dropped().empty());
}

TEST(Scheduler, DeadlinePassedInQueueIsDroppedNotRun) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Recorder r(**s);
  const TenantPolicy a = Policy("a"), gate = Policy("gate");
  r.Block(gate);
  ASSERT_TRUE(r.Add(a, "late", 0, absl::Now() + absl::Milliseconds(20)).ok());
  ASSERT_TRUE(r.Add(a, "fine").ok());
  absl::SleepFor(absl::Milliseconds(50));
  r.Release();
  r.WaitFor(2);
  EXPECT_EQ(r.order(), (std::vector<std::string>{"fine"}));
  EXPECT_EQ(r.dropped(), (std::vector<std::string>{"late:DEADLINE_EXCEEDED"}));
}

TEST(Scheduler, CancelDropsAQueuedJobOnly) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Recorder r(**s);
  const TenantPolicy a = Policy("a", 1, 100, 1), gate = Policy("gate");
  r.Block(gate);
  auto t = r.Add(a, "gone");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE((*s)->Cancel(*t));
  EXPECT_FALSE((*s)->Cancel(*t));
  // Its queue slot is free again.
  EXPECT_TRUE(r.Add(a, "next").ok());
  r.Release();
  r.WaitFor(2);
  EXPECT_EQ(r.order(), (std::vector<std::string>{"next"}));
  EXPECT_EQ(r.dropped(), (std::vector<std::string>{"gone:CANCELLED"}));
}

TEST(Scheduler, WorkersRunConcurrently) {
  auto s = Scheduler::Create({.workers = 2});
  ASSERT_TRUE(s.ok());
  absl::Notification both;
  std::atomic<int> running = 0;
  std::atomic<int> done = 0;
  for (int i = 0; i < 2; ++i) {
    Scheduler::Job job;
    job.run = [&](absl::Duration) {
      if (++running == 2) both.Notify();
      both.WaitForNotificationWithTimeout(absl::Seconds(10));
      ++done;
    };
    job.drop = [](absl::Status) {};
    ASSERT_TRUE((*s)->Submit(Policy("a"), std::move(job)).ok());
  }
  EXPECT_TRUE(both.WaitForNotificationWithTimeout(absl::Seconds(10)));
  while (done < 2) absl::SleepFor(absl::Milliseconds(1));
}

// A job's finish runs after its slot is released: a client answered from
// finish may submit again at once within max_in_flight = 1.
TEST(Scheduler, FinishRunsAfterTheSlotIsReleased) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Scheduler* sched = s->get();
  absl::Notification finished;
  absl::Status resubmit = absl::UnknownError("finish not called");
  Scheduler::Job job;
  job.run = [](absl::Duration) {};
  job.finish = [&] {
    Scheduler::Job again;
    again.run = [](absl::Duration) {};
    again.drop = [](absl::Status) {};
    resubmit = sched->Submit(Policy("a", 1, 1, 1), std::move(again)).status();
    finished.Notify();
  };
  job.drop = [](absl::Status) {};
  ASSERT_TRUE(sched->Submit(Policy("a", 1, 1, 1), std::move(job)).ok());
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(resubmit.ok()) << resubmit;
}

// With a free slot and nothing queued a job runs on the caller's thread;
// with every slot taken it is refused (and then queued by the caller).
TEST(Scheduler, RunsInlineOnlyWithAFreeSlot) {
  auto s = Scheduler::Create({.workers = 1});
  ASSERT_TRUE(s.ok());
  Scheduler* sched = s->get();
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  bool finished = false;
  Scheduler::Job job;
  job.run = [&](absl::Duration) { ran_on = std::this_thread::get_id(); };
  job.finish = [&] { finished = true; };
  job.drop = [](absl::Status) {};
  ASSERT_TRUE(sched->TryRunInline(Policy("a", 1, 1, 1), job));
  EXPECT_EQ(ran_on, caller);
  EXPECT_TRUE(finished);

  // The only slot is held by a queued job that waits on a gate.
  absl::Notification started, gate;
  Scheduler::Job holder;
  holder.run = [&](absl::Duration) {
    started.Notify();
    gate.WaitForNotification();
  };
  holder.drop = [](absl::Status) {};
  ASSERT_TRUE(sched->Submit(Policy("b"), std::move(holder)).ok());
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  bool ran = false;
  Scheduler::Job refused;
  refused.run = [&](absl::Duration) { ran = true; };
  refused.drop = [](absl::Status) {};
  EXPECT_FALSE(sched->TryRunInline(Policy("a"), refused));
  EXPECT_FALSE(ran);
  ASSERT_TRUE(refused.run != nullptr);  // untouched: the caller queues it
  gate.Notify();
}

TEST(Scheduler, DestructionDropsQueuedJobsUnavailable) {
  Recorder* r = nullptr;
  std::vector<std::string> dropped;
  {
    auto s = Scheduler::Create({.workers = 1});
    ASSERT_TRUE(s.ok());
    r = new Recorder(**s);
    r->Block(Policy("gate"));
    ASSERT_TRUE(r->Add(Policy("a"), "queued").ok());
    std::thread release([r] {
      absl::SleepFor(absl::Milliseconds(20));
      r->Release();
    });
    s->reset();
    release.join();
  }
  EXPECT_EQ(r->dropped(), (std::vector<std::string>{"queued:UNAVAILABLE"}));
  delete r;
}

}  // namespace
}  // namespace kiln::server
