// Tenants under concurrent calls: quota admission never lets more in than the
// quota from many threads at once, every acquire is released exactly once, and
// authentication and the per-tenant cache view hold up while threads share a
// registry. These run in kiln_server_test and under ThreadSanitizer in
// kiln_tsan_test (make test-tsan), where they show tenants.cc's locking.
#include "server/tenants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "kiln/v1/report.pb.h"

namespace kiln::server {
namespace {

constexpr int kThreads = 8;

v1::TenantQuota Quota(int max_in_flight) {
  v1::TenantQuota q;
  q.set_max_sessions(4);
  q.set_max_param_bytes(1000);
  q.set_max_in_flight(max_in_flight);
  q.set_max_request_bytes(1 << 20);
  q.set_max_device_memory_bytes(2000);
  q.set_max_queue(16);
  q.set_max_concurrent_compiles(1);
  return q;
}

// Runs `body(thread_index)` on kThreads threads started together.
template <typename Body>
void OnThreads(Body body) {
  std::atomic<bool> go = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      body(t);
    });
  }
  go = true;
  for (std::thread& th : threads) th.join();
}

TEST(Tenants, ConcurrentAdmissionNeverExceedsTheQuota) {
  Tenant tenant("alice", Quota(/*max_in_flight=*/3), 1.0);
  std::atomic<int> inside = 0, most = 0, admitted = 0, refused = 0;
  OnThreads([&](int) {
    for (int i = 0; i < 2000; ++i) {
      if (!tenant.AcquireRun().ok()) {
        ++refused;
        continue;
      }
      const int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      ++admitted;
      --inside;
      tenant.ReleaseRun();
    }
  });
  EXPECT_LE(most.load(), 3);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(admitted.load() + refused.load(), kThreads * 2000);
  EXPECT_EQ(tenant.usage().runs_in_flight, 0);
}

TEST(Tenants, ConcurrentSessionsAndBytesBalance) {
  Tenant tenant("bob", Quota(8), 1.0);
  std::atomic<int> sessions_over = 0, bytes_over = 0;
  OnThreads([&](int t) {
    for (int i = 0; i < 1000; ++i) {
      if (tenant.AcquireSession().ok()) {
        if (tenant.usage().sessions > 4) ++sessions_over;
        tenant.ReleaseSession();
      }
      if (tenant.AcquireBytes(100 + t, 200 + t).ok()) {
        const Tenant::Usage u = tenant.usage();
        if (u.param_bytes > 1000 || u.device_bytes > 2000) ++bytes_over;
        tenant.ReleaseBytes(100 + t, 200 + t);
      }
    }
  });
  EXPECT_EQ(sessions_over.load(), 0);
  EXPECT_EQ(bytes_over.load(), 0);
  const Tenant::Usage u = tenant.usage();
  EXPECT_EQ(u.sessions, 0);
  EXPECT_EQ(u.param_bytes, 0);
  EXPECT_EQ(u.device_bytes, 0);
}

TEST(Tenants, ConcurrentCacheViewCountsEveryOutcome) {
  Tenant tenant("carol", Quota(8), 1.0);
  std::atomic<int> known_before = 0;
  OnThreads([&](int t) {
    for (int i = 0; i < 500; ++i) {
      // Every thread notes the same 500 keys: each is new to exactly one call.
      if (tenant.NoteExecutable(absl::StrCat("key", i))) ++known_before;
      tenant.CountCacheOutcome(t % 2 ? v1::CACHE_HIT_MEMORY : v1::CACHE_MISS);
      (void)tenant.cache_counts();
    }
  });
  EXPECT_EQ(known_before.load(), (kThreads - 1) * 500);
  const Tenant::CacheCounts c = tenant.cache_counts();
  EXPECT_EQ(c.memory_hits + c.misses, kThreads * 500);
  EXPECT_EQ(c.memory_hits, kThreads / 2 * 500);
}

TEST(Tenants, ConcurrentAuthenticationMapsEachKeyToItsTenant) {
  v1::ServerConfig config;
  for (int t = 0; t < 4; ++t) {
    v1::TenantConfig* tc = config.add_tenants();
    tc->set_name(absl::StrCat("tenant", t));
    tc->add_api_key_sha256(Sha256Hex(absl::StrCat("key-", t)));
    tc->add_client_cert_subject(absl::StrCat("CN=user", t));
    *tc->mutable_quota() = Quota(4);
    tc->set_weight(1);
  }
  auto registry = TenantRegistry::Create(config);
  ASSERT_TRUE(registry.ok()) << registry.status();
  std::atomic<int> wrong = 0;
  OnThreads([&](int t) {
    for (int i = 0; i < 300; ++i) {
      const int want = (t + i) % 4;
      const std::string bearer = absl::StrCat("Bearer key-", want);
      auto by_key = (*registry)->Authenticate(bearer);
      if (!by_key.ok() || (*by_key)->name() != absl::StrCat("tenant", want)) ++wrong;
      PeerIdentity peer;
      peer.has_certificate = true;
      peer.subject = absl::StrCat("CN=user", want);
      auto by_cert = (*registry)->Authenticate(std::nullopt, peer);
      if (!by_cert.ok() || *by_cert != *by_key) ++wrong;
      if ((*registry)->Authenticate(std::string("Bearer nobody")).ok()) ++wrong;
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace kiln::server
