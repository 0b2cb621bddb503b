// kilnd's metrics under concurrent events and scrapes: handler threads count
// requests, compiles and runs while the exposer's HTTP threads scrape and the
// scrape-time collector is replaced; the final scrape shows every event. Runs
// in kiln_server_test and under ThreadSanitizer in kiln_tsan_test (make
// test-tsan), where it shows metrics.cc's locking against civetweb's threads.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/server/kilnd_process.h"

namespace kiln::server {
namespace {

TEST(Metrics, ConcurrentEventsAndScrapesCountEveryEvent) {
  constexpr int kThreads = 4, kEvents = 300;
  // Declared before the metrics, whose collector counts into one of them.
  std::atomic<int> writers_done = 0, scrapes = 0, collector_calls = 0;
  auto metrics = Metrics::Create("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  Metrics& m = **metrics;
  ASSERT_GT(m.port(), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string tenant = absl::StrCat("tenant", t % 2);
      v1::DispatchReport report;
      report.mutable_placement()->set_chosen("cpu:0");
      report.set_queue_micros(10);
      report.set_run_micros(100);
      for (int i = 0; i < kEvents; ++i) {
        m.CountRequest(tenant, "Run", "OK");
        m.ObserveRequestBytes(tenant, "Run", 64 + i);
        m.ObserveCompile(tenant, "cpu:0", v1::CACHE_HIT_MEMORY, absl::Microseconds(5));
        m.ObserveRun(tenant, report);
        m.ObserveTrainStep(tenant, absl::Microseconds(50));
        if (i % 50 == 0) {
          m.SetCollector([&collector_calls, t] {
            ++collector_calls;
            return std::vector<prometheus::MetricFamily>{Metrics::Family(
                "kiln_test_gauge", "a gauge the test sets", prometheus::MetricType::Gauge,
                {{{{"writer", absl::StrCat(t)}}, 1}})};
          });
        }
      }
      ++writers_done;
    });
  }
  // At least one scrape: on a loaded host the writers may all finish before
  // this thread first runs (a `while` loop then scraped nothing and the
  // scrapes > 0 check failed although nothing was wrong), or while its first
  // scrape, begun before any request was counted, is under way: it scrapes
  // until one shows the requests.
  threads.emplace_back([&] {
    do {
      if (absl::StrContains(testing::HttpGet(m.port(), "/metrics"), "kiln_requests_total"))
        ++scrapes;
    } while (writers_done.load() < kThreads || scrapes.load() == 0);
  });
  for (std::thread& t : threads) t.join();
  const std::string last = testing::HttpGet(m.port(), "/metrics");
  for (int tenant = 0; tenant < 2; ++tenant) {
    const std::string name = absl::StrCat("tenant", tenant);
    EXPECT_EQ(testing::MetricValue(last, "kiln_requests_total",
                                   {{"tenant", name}, {"method", "Run"}, {"code", "OK"}}),
              kThreads / 2 * kEvents);
    EXPECT_EQ(testing::MetricValue(last, "kiln_run_seconds_count",
                                   {{"tenant", name}, {"device", "cpu:0"}}),
              kThreads / 2 * kEvents);
    EXPECT_EQ(testing::MetricValue(last, "kiln_train_steps_total", {{"tenant", name}}),
              kThreads / 2 * kEvents);
  }
  EXPECT_TRUE(absl::StrContains(last, "kiln_test_gauge")) << last;
  EXPECT_GT(collector_calls.load(), 0);
  EXPECT_GT(scrapes.load(), 0);
}

}  // namespace
}  // namespace kiln::server
