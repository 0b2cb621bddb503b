// The report store under concurrent writers and readers: each tenant keeps
// exactly its last `per_tenant` reports, oldest first, within its byte budget,
// and a reader never sees a torn or foreign report. Runs in kiln_server_test and
// under ThreadSanitizer in kiln_tsan_test (make test-tsan).
#include "server/reports.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::server {
namespace {

v1::DispatchReport Report(const std::string& tenant, int i) {
  v1::DispatchReport r;
  r.set_request_id(absl::StrCat(tenant, "-", i));
  return r;
}

TEST(ReportStore, ConcurrentWritersAndReadersKeepTheLastReports) {
  constexpr int kWriters = 4, kPerWriter = 2000, kKept = 16;
  ReportStore store(kKept, int64_t{1} << 20);
  std::atomic<int> writers_done = 0, foreign = 0;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      const std::string tenant = absl::StrCat("t", w);
      for (int i = 0; i < kPerWriter; ++i) store.Add(tenant, Report(tenant, i));
      ++writers_done;
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const std::string tenant = absl::StrCat("t", r);
      while (writers_done.load() < kWriters) {
        for (const v1::DispatchReport& report : store.Last(tenant, 0)) {
          if (!report.request_id().starts_with(tenant + "-")) ++foreign;
        }
        (void)store.Find(tenant, absl::StrCat(tenant, "-", kPerWriter - 1));
        (void)store.Bytes(tenant);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(foreign.load(), 0);
  for (int w = 0; w < kWriters; ++w) {
    const std::string tenant = absl::StrCat("t", w);
    const std::vector<v1::DispatchReport> last = store.Last(tenant, 0);
    ASSERT_EQ(last.size(), static_cast<size_t>(kKept));
    int64_t bytes = 0;
    for (int i = 0; i < kKept; ++i) {
      EXPECT_EQ(last[i].request_id(), absl::StrCat(tenant, "-", kPerWriter - kKept + i));
      bytes += static_cast<int64_t>(last[i].ByteSizeLong());
    }
    EXPECT_EQ(store.Bytes(tenant), bytes);
    EXPECT_TRUE(store.Find(tenant, absl::StrCat(tenant, "-", kPerWriter - 1)).has_value());
    EXPECT_FALSE(store.Find(tenant, absl::StrCat(tenant, "-", 0)).has_value());
  }
}

}  // namespace
}  // namespace kiln::server
