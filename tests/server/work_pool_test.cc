// kilnd's work pool: every posted task runs (also one posted by a task the
// pool runs while it shuts down), and one account never takes every thread.
#include "server/work_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kiln::server {
namespace {

TEST(WorkPool, TasksPostedWhileShuttingDownStillRun) {
  std::atomic<bool> second = false;
  absl::Notification gate, holding;
  std::thread release;  // joined after the pool: it must not outlive `gate`
  {
    WorkPool pool(1);
    pool.Post([&] {
      holding.Notify();
      gate.WaitForNotification();
    });
    holding.WaitForNotification();
    // Queued behind the holder: dropped to the destructor, which runs it; it
    // posts its next step into a pool that is shutting down.
    pool.Post([&] { pool.Post([&] { second = true; }); });
    release = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(20));
      gate.Notify();
    });
  }
  release.join();
  EXPECT_TRUE(second.load());
}

TEST(WorkPool, OneAccountLeavesAThreadForOthers) {
  // Declared before the pool, whose tasks use them until its destructor joins.
  absl::Notification gate;
  std::atomic<int> big_running = 0;
  absl::Notification big_started;
  absl::Notification small_done;
  WorkPool pool(2);  // max_per_tenant = 1
  for (int i = 0; i < 2; ++i) {
    pool.Post("big/compile", 1e6, 0, [&] {
      if (++big_running == 1) big_started.Notify();
      gate.WaitForNotification();
    });
  }
  // The first big task holds a thread before the small one arrives (else the
  // count below could be read before that thread got to its increment).
  if (!big_started.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    gate.Notify();
    FAIL() << "no big task started";
  }
  pool.Post("small/compile", 1, 0, [&] { small_done.Notify(); });
  EXPECT_TRUE(small_done.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the small task waited behind the big account";
  EXPECT_EQ(big_running.load(), 1);
  gate.Notify();
}

}  // namespace
}  // namespace kiln::server
