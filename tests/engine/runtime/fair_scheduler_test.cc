// The per-device scheduler: slots, the inline rule, weighted fair queuing by
// device time, priority and arrival inside a tenant, bounded queues,
// deadlines and cancellation before start.
#include "engine/runtime/fair_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kiln::runtime {
namespace {

std::unique_ptr<FairScheduler> Make(int slots, int64_t max_queued = 4096) {
  auto s = FairScheduler::Create({"test:0", slots, max_queued});
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

// A job that blocks until `gate` is notified, reporting `micros` of device time.
FairJob Blocking(const std::string& tenant, absl::Notification& gate, double micros = 10,
                   std::atomic<int>* started = nullptr) {
  FairJob j;
  j.tenant = {tenant, 1, 1024};
  j.cost_micros = micros;
  j.run = [&gate, micros, started](absl::Duration) {
    if (started) ++*started;
    gate.WaitForNotification();
    return micros;
  };
  j.drop = [](absl::Status) {};
  return j;
}

TEST(FairScheduler, RejectsZeroSlots) {
  EXPECT_EQ(FairScheduler::Create({"test:0", 0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FairScheduler, SlotsBoundConcurrentRuns) {
  absl::Notification gate;  // outlives the scheduler, whose jobs wait on it
  auto s = Make(2);
  std::atomic<int> started = 0;
  std::vector<absl::Notification> done(3);
  for (int i = 0; i < 3; ++i) {
    FairJob j = Blocking("a", gate, 10, &started);
    j.finish = [&done, i] { done[i].Notify(); };
    ASSERT_TRUE(s->Submit(std::move(j)).ok());
  }
  while (started.load() < 2) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(started.load(), 2);  // the third waits for a slot
  EXPECT_EQ(s->stats().running, 2);
  EXPECT_EQ(s->stats().queued, 1);
  gate.Notify();
  for (auto& d : done) d.WaitForNotification();
  const FairSchedulerStats st = s->stats();
  EXPECT_EQ(st.runs, 3);
  EXPECT_EQ(st.running, 0);
  EXPECT_DOUBLE_EQ(st.tenant_device_micros.at("a"), 30);
}

TEST(FairScheduler, InlineOnlyWhenASlotIsFreeAndNothingWaits) {
  absl::Notification gate, held;  // outlive the scheduler, whose job waits on them
  auto s = Make(1);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  FairJob j;
  j.tenant = {"a", 1, 10};
  j.run = [&](absl::Duration) {
    ran_on = std::this_thread::get_id();
    return 1.0;
  };
  j.drop = [](absl::Status) {};
  ASSERT_TRUE(s->TryRunInline(j));
  EXPECT_EQ(ran_on, caller);
  EXPECT_EQ(s->stats().inline_runs, 1);

  FairJob holder = Blocking("a", gate);
  holder.run = [&](absl::Duration) {
    held.Notify();
    gate.WaitForNotification();
    return 1.0;
  };
  ASSERT_TRUE(s->Submit(std::move(holder)).ok());
  held.WaitForNotification();
  FairJob other;
  other.tenant = {"a", 1, 10};
  other.run = [](absl::Duration) { return 1.0; };
  other.drop = [](absl::Status) {};
  EXPECT_FALSE(s->TryRunInline(other));  // the only slot is held
  EXPECT_TRUE(static_cast<bool>(other.run));  // untouched
  gate.Notify();
}

// Two tenants, weights 1 and 3, a backlog of equal runs: while both have work
// waiting, the device time splits 1:3.
TEST(FairScheduler, WeightedFairShareOfDeviceTime) {
  absl::Notification gate;  // outlives the scheduler, whose jobs wait on it
  auto s = Make(1);
  FairJob first = Blocking("warm", gate);
  ASSERT_TRUE(s->Submit(std::move(first)).ok());  // holds the slot while the queues fill
  std::mutex order_mu;
  std::vector<std::string> order;
  auto job = [&](const std::string& tenant, double weight, double estimate, double used) {
    FairJob j;
    j.tenant = {tenant, weight, 1024};
    j.cost_micros = estimate;
    j.run = [&, tenant, used](absl::Duration) {
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(tenant);
      return used;
    };
    j.drop = [](absl::Status) {};
    return j;
  };
  // Tenant b's estimates are wrong by 4x: the correction to measured time
  // keeps the split by device time, not by estimate.
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(s->Submit(job("a", 1, 100, 100)).ok());
    ASSERT_TRUE(s->Submit(job("b", 3, 25, 100)).ok());
  }
  gate.Notify();
  while (s->stats().runs < 401) absl::SleepFor(absl::Milliseconds(1));
  // Count the first 200 runs (both tenants still backlogged throughout).
  int a = 0, b = 0;
  for (int i = 0; i < 200; ++i) (order[i] == "a" ? a : b)++;
  const double share_b = static_cast<double>(b) / (a + b);
  EXPECT_NEAR(share_b, 0.75, 0.075) << "a=" << a << " b=" << b;
}

TEST(FairScheduler, PriorityThenArrivalInsideATenant) {
  absl::Notification gate;  // outlives the scheduler, whose jobs wait on it
  auto s = Make(1);
  ASSERT_TRUE(s->Submit(Blocking("t", gate)).ok());
  std::vector<int> order;
  std::mutex mu;
  for (int i = 0; i < 6; ++i) {
    FairJob j;
    j.tenant = {"t", 1, 100};
    j.priority = i % 2;  // odd ones first
    j.run = [&, i](absl::Duration) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      return 1.0;
    };
    j.drop = [](absl::Status) {};
    ASSERT_TRUE(s->Submit(std::move(j)).ok());
  }
  gate.Notify();
  while (s->stats().runs < 7) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(order, (std::vector<int>{1, 3, 5, 0, 2, 4}));
}

TEST(FairScheduler, BoundedQueuesRejectAtOnce) {
  absl::Notification gate;  // outlives the scheduler, whose jobs wait on it
  auto s = Make(1, /*max_queued=*/3);
  ASSERT_TRUE(s->Submit(Blocking("a", gate)).ok());
  while (s->stats().running < 1) absl::SleepFor(absl::Milliseconds(1));
  FairJob j1 = Blocking("a", gate);
  j1.tenant.max_queue = 1;
  ASSERT_TRUE(s->Submit(std::move(j1)).ok());
  FairJob j2 = Blocking("a", gate);
  j2.tenant.max_queue = 1;
  auto full = s->Submit(std::move(j2));
  ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("max_queue = 1"), std::string::npos) << full.status();
  ASSERT_TRUE(s->Submit(Blocking("b", gate)).ok());
  ASSERT_TRUE(s->Submit(Blocking("c", gate)).ok());
  auto device_full = s->Submit(Blocking("d", gate));
  ASSERT_EQ(device_full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(device_full.status().message().find("test:0"), std::string::npos);
  EXPECT_EQ(s->stats().rejected, 2);
  gate.Notify();
}

TEST(FairScheduler, DeadlinePassedInQueueIsDroppedAndCancelDrops) {
  absl::Notification gate;  // outlives the scheduler, whose jobs wait on it
  auto s = Make(1);
  ASSERT_TRUE(s->Submit(Blocking("a", gate)).ok());
  absl::Status late_why, cancelled_why;
  absl::Notification late_done, cancelled_done;
  bool late_ran = false;
  FairJob late;
  late.tenant = {"a", 1, 10};
  late.deadline = absl::Now() + absl::Milliseconds(5);
  late.run = [&](absl::Duration) {
    late_ran = true;
    return 1.0;
  };
  late.drop = [&](absl::Status why) { late_why = why; };
  late.finish = [&] { late_done.Notify(); };
  ASSERT_TRUE(s->Submit(std::move(late)).ok());
  FairJob victim;
  victim.tenant = {"a", 1, 10};
  victim.run = [](absl::Duration) { return 1.0; };
  victim.drop = [&](absl::Status why) { cancelled_why = why; };
  victim.finish = [&] { cancelled_done.Notify(); };
  auto ticket = s->Submit(std::move(victim));
  ASSERT_TRUE(ticket.ok());
  EXPECT_TRUE(s->Cancel(*ticket));
  EXPECT_FALSE(s->Cancel(*ticket));
  cancelled_done.WaitForNotification();
  EXPECT_EQ(cancelled_why.code(), absl::StatusCode::kCancelled);
  absl::SleepFor(absl::Milliseconds(20));
  gate.Notify();
  late_done.WaitForNotification();
  EXPECT_FALSE(late_ran);
  EXPECT_EQ(late_why.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s->stats().dropped, 2);
}

TEST(FairScheduler, DestructorDropsQueuedJobsUnavailable) {
  absl::Status why;
  {
    absl::Notification gate;
    auto s = Make(1);
    ASSERT_TRUE(s->Submit(Blocking("a", gate)).ok());
    FairJob j;
    j.tenant = {"a", 1, 10};
    j.run = [](absl::Duration) { return 1.0; };
    j.drop = [&](absl::Status w) { why = w; };
    ASSERT_TRUE(s->Submit(std::move(j)).ok());
    while (s->stats().running < 1) absl::SleepFor(absl::Milliseconds(1));
    std::thread release([&] {
      absl::SleepFor(absl::Milliseconds(20));
      gate.Notify();
    });
    s.reset();
    release.join();
  }
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kiln::runtime
