// The absl::Mutex annotations of a TSan build (absl_tsan_annotations.cc): data
// handed between threads through each annotated primitive. Without the
// interposer TSan reports each of these as a data race (Debian's Abseil is not
// instrumented); with it they run clean, so a report here means an entry point
// lost its annotation.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace {

TEST(AbslTsanAnnotations, MutexLockGuardsData) {
  absl::Mutex mu;
  long n = 0;
  auto work = [&] {
    for (int i = 0; i < 10000; ++i) {
      absl::MutexLock lock(&mu);
      ++n;
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(n, 20000);
}

TEST(AbslTsanAnnotations, ReaderLockSeesWriterData) {
  absl::Mutex mu;
  std::vector<int> data;
  std::thread writer([&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      data.push_back(i);
    }
  });
  size_t seen = 0;
  while (seen < 1000) {
    absl::ReaderMutexLock lock(&mu);
    seen = data.size();
  }
  writer.join();
}

TEST(AbslTsanAnnotations, LockWhenAwaitAndCondVar) {
  absl::Mutex mu;
  absl::CondVar cv;
  int stage = 0;
  std::string payload;
  std::thread other([&] {
    absl::MutexLock lock(&mu);
    payload = "one";
    stage = 1;
    mu.Await(absl::Condition(+[](int* s) { return *s == 2; }, &stage));
    payload += " three";
    stage = 3;
    cv.Signal();
  });
  {
    mu.LockWhen(absl::Condition(+[](int* s) { return *s == 1; }, &stage));
    payload += " two";
    stage = 2;
    while (stage != 3) cv.WaitWithTimeout(&mu, absl::Seconds(10));
    mu.Unlock();
  }
  other.join();
  EXPECT_EQ(payload, "one two three");
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(+[](int* s) { return *s == 3; }, &stage),
                                  absl::Seconds(1)));
}

TEST(AbslTsanAnnotations, NotificationAndBlockingCounterPublish) {
  std::vector<int> results(4);
  absl::BlockingCounter counter(4);
  absl::Notification ready;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      ready.WaitForNotification();
      results[i] = i * i;
      counter.DecrementCount();
    });
  }
  results.assign(4, -1);
  ready.Notify();
  counter.Wait();
  EXPECT_EQ(results, (std::vector<int>{0, 1, 4, 9}));
  for (auto& t : threads) t.join();
  absl::Notification late;
  int value = 0;
  std::thread setter([&] {
    value = 7;
    late.Notify();
  });
  ASSERT_TRUE(late.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(value, 7);
  setter.join();
}

}  // namespace
