// The shared-memory registry (server/shm_regions.h) in process, under
// concurrent use: client threads connect to its socket, register, use and
// unregister memfd regions while other threads (kilnd's gRPC handlers in
// the daemon) hand out tickets, look regions up, read and write their bytes
// and read the usage counters; the registry's own thread serves the socket
// throughout. The quota is never exceeded, a region held by a "run" stays
// mapped after its connection unregisters it, every count returns to zero,
// and the registry can be destroyed with connections still open. These run in
// kiln_server_test and under ThreadSanitizer in kiln_tsan_test (make
// test-tsan), where they check shm_regions.cc's locking between the socket
// thread and its callers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "kiln/v1/shm.pb.h"
#include "server/shm_regions.h"

namespace kiln::server {
namespace {

constexpr int kShmClients = 4;
constexpr int64_t kShmRegionBytes = 4096;

v1::TenantQuota ShmQuota(int regions, int64_t bytes) {
  v1::TenantQuota q;
  q.set_max_sessions(4);
  q.set_max_param_bytes(1000);
  q.set_max_in_flight(4);
  q.set_max_request_bytes(1 << 20);
  q.set_max_device_memory_bytes(2000);
  q.set_max_queue(16);
  q.set_max_concurrent_compiles(1);
  q.set_max_shm_regions(regions);
  q.set_max_shm_bytes(bytes);
  return q;
}

// A client of the registry's socket, speaking kiln/v1/shm.proto by hand (the
// C++ client's ShmConnection gets its ticket over gRPC; here the test is the
// gRPC handler).
class RawShmClient {
 public:
  explicit RawShmClient(const std::string& socket_name) {
    sockaddr_un addr;
    std::memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (socket_name[0] == '@') {
      std::memcpy(addr.sun_path + 1, socket_name.data() + 1, socket_name.size() - 1);
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_name.size());
    } else {
      std::memcpy(addr.sun_path, socket_name.data(), socket_name.size());
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_name.size() + 1);
    }
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawShmClient() { Close(); }
  RawShmClient(const RawShmClient&) = delete;
  RawShmClient& operator=(const RawShmClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sends `m` (with `fd` attached when >= 0) and returns kilnd's answer; code
  // -1 when the socket failed or closed.
  v1::ShmServerMessage Call(const v1::ShmClientMessage& m, int fd = -1) {
    v1::ShmServerMessage answer;
    answer.set_code(-1);
    const std::string bytes = m.SerializeAsString();
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* h = CMSG_FIRSTHDR(&msg);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(h), &fd, sizeof(int));
    }
    if (::sendmsg(fd_, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) return answer;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1) return answer;
    char buffer[4096];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0 || !answer.ParseFromArray(buffer, static_cast<int>(n))) answer.set_code(-1);
    return answer;
  }

  bool SendRaw(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  v1::ShmServerMessage Hello(const std::string& ticket) {
    v1::ShmClientMessage m;
    m.set_ticket(ticket);
    return Call(m);
  }
  v1::ShmServerMessage Register(const std::string& id, int fd) {
    v1::ShmClientMessage m;
    m.mutable_register_region()->set_region_id(id);
    return Call(m, fd);
  }
  v1::ShmServerMessage Unregister(const std::string& id) {
    v1::ShmClientMessage m;
    m.set_unregister_region(id);
    return Call(m);
  }

 private:
  int fd_ = -1;
};

// A sealed memfd of `bytes`, mapped here too; unmapped and closed at the end.
class SealedMemfd {
 public:
  explicit SealedMemfd(int64_t bytes) : bytes_(bytes) {
    fd_ = ::memfd_create("kiln-shm-registry-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0 || ::ftruncate(fd_, bytes) != 0 || ::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      return;
    }
    void* p =
        ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p != MAP_FAILED) data_ = static_cast<char*>(p);
  }
  ~SealedMemfd() {
    if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(bytes_));
    if (fd_ >= 0) ::close(fd_);
  }
  SealedMemfd(const SealedMemfd&) = delete;
  SealedMemfd& operator=(const SealedMemfd&) = delete;

  int fd() const { return fd_; }
  char* data() const { return data_; }

 private:
  const int64_t bytes_;
  int fd_ = -1;
  char* data_ = nullptr;
};

TEST(ShmRegistry, ConcurrentClientsRegisterUseAndUnregister) {
  // Room for each client's region plus the one of its last connection that
  // the socket thread may not have unregistered yet (closes are asynchronous).
  constexpr int kQuotaRegions = 3 * kShmClients;
  Tenant alice("alice", ShmQuota(kQuotaRegions, kQuotaRegions * kShmRegionBytes), 1.0);
  Tenant bob("bob", ShmQuota(2, 2 * kShmRegionBytes), 1.0);
  auto registry = ShmRegistry::Create(v1::ServerConfig());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ShmRegistry& reg = **registry;

  std::atomic<bool> done = false;
  std::atomic<int64_t> most_regions = 0, most_bytes = 0, bob_found = 0;
  // Readers: the usage counters and another tenant's lookups, all the while.
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        const ShmUsage::Counts c = reg.Usage("alice");
        int64_t seen = most_regions.load();
        while (c.regions > seen && !most_regions.compare_exchange_weak(seen, c.regions)) {
        }
        seen = most_bytes.load();
        while (c.bytes > seen && !most_bytes.compare_exchange_weak(seen, c.bytes)) {
        }
        for (const auto& [tenant, counts] : reg.UsageByTenant()) {
          EXPECT_GE(counts.regions, 0) << tenant;
        }
        for (int i = 0; i < kShmClients; ++i) {
          if (reg.Find(bob, absl::StrCat("r", i, "-0")).ok()) ++bob_found;
        }
        std::this_thread::yield();
      }
    });
  }

  std::atomic<int> failures = 0;
  std::vector<std::thread> clients;
  for (int t = 0; t < kShmClients; ++t) {
    clients.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        // The gRPC handler's part: a ticket for this tenant.
        const v1::ConnectSharedMemoryResponse ticket = reg.NewTicket(alice);
        RawShmClient client(ticket.socket());
        const v1::ShmServerMessage hello =
            client.connected() ? client.Hello(ticket.ticket()) : v1::ShmServerMessage();
        if (!client.connected() || hello.code() != 0) {
          ADD_FAILURE() << "r" << t << "-" << round << ": connected " << client.connected() << ", "
                        << hello.ShortDebugString();
          ++failures;
          return;
        }
        SealedMemfd file(kShmRegionBytes);
        if (file.data() == nullptr) {
          ++failures;
          return;
        }
        const std::string id = absl::StrCat("r", t, "-", round);
        const v1::ShmServerMessage registered = client.Register(id, file.fd());
        if (registered.code() != 0 || registered.bytes() != kShmRegionBytes) {
          ADD_FAILURE() << id << ": " << registered.ShortDebugString();
          ++failures;
          return;
        }
        // A run's part: find the region, write through kilnd's mapping, read
        // it back through the client's.
        auto region = reg.Find(alice, id);
        if (!region.ok()) {
          ADD_FAILURE() << region.status();
          ++failures;
          return;
        }
        auto bytes = (*region)->Slice(0, kShmRegionBytes, "test");
        if (!bytes.ok()) {
          ADD_FAILURE() << bytes.status();
          ++failures;
          return;
        }
        std::memset(*bytes, 'a' + t, kShmRegionBytes);
        EXPECT_EQ(file.data()[kShmRegionBytes - 1], 'a' + t);
        // Unregistered while the run holds it: still mapped, still counted.
        if (round % 2 == 0) {
          EXPECT_EQ(client.Unregister(id).code(), 0);
        } else {
          client.Close();  // the connection's close unregisters it
        }
        (*bytes)[0] = 'z';
        EXPECT_EQ(file.data()[0], 'z');
        region->reset();  // the run ends: now unmapped
      }
    });
  }
  for (std::thread& c : clients) c.join();
  done = true;
  for (std::thread& r : readers) r.join();

  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(bob_found.load(), 0);
  EXPECT_GE(most_regions.load(), 1);
  EXPECT_LE(most_regions.load(), kQuotaRegions);
  EXPECT_LE(most_bytes.load(), kQuotaRegions * kShmRegionBytes);
  // The last closes are served by the socket thread: wait for them.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (reg.Usage("alice").regions != 0 && absl::Now() < until)
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(reg.Usage("alice").regions, 0);
  EXPECT_EQ(reg.Usage("alice").bytes, 0);
}

// A tenant at its connection limit that closes a connection and opens the
// next at once is not refused while kilnd has still to notice the close (the
// connection's thread may not have run yet: ctest -j2 on the 2-core VM saw
// ConcurrentClientsRegisterUseAndUnregister refused with "12 shared-memory
// connections open" for clients that each had one). Connections still open
// do count.
TEST(ShmRegistry, AClosedConnectionDoesNotCountAgainstTheNext) {
  Tenant carol("carol", ShmQuota(1, kShmRegionBytes), 1.0);
  auto registry = ShmRegistry::Create(v1::ServerConfig());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ShmRegistry& reg = **registry;
  for (int i = 0; i < 200; ++i) {
    const v1::ConnectSharedMemoryResponse ticket = reg.NewTicket(carol);
    RawShmClient client(ticket.socket());
    ASSERT_TRUE(client.connected());
    const v1::ShmServerMessage hello = client.Hello(ticket.ticket());
    ASSERT_EQ(hello.code(), 0) << "connection " << i << ": " << hello.ShortDebugString();
    if (i == 0) {
      // The limit holds for a connection that is still open.
      const v1::ConnectSharedMemoryResponse second = reg.NewTicket(carol);
      RawShmClient other(second.socket());
      const v1::ShmServerMessage refused = other.Hello(second.ticket());
      EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
          << refused.ShortDebugString();
    }
  }  // each client closes at the end of its iteration
}

TEST(ShmRegistry, QuotaHoldsAcrossConnectionsRegisteringAtOnce) {
  // Two regions allowed, four connections racing to register one each: two
  // win, two get RESOURCE_EXHAUSTED (or the connection cap, which is
  // max_shm_regions).
  Tenant carol("carol", ShmQuota(2, 2 * kShmRegionBytes), 1.0);
  auto registry = ShmRegistry::Create(v1::ServerConfig());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ShmRegistry& reg = **registry;
  std::atomic<int> registered = 0, refused = 0;
  std::vector<std::unique_ptr<RawShmClient>> kept(kShmClients);
  std::vector<std::unique_ptr<SealedMemfd>> files(kShmClients);
  std::atomic<bool> go = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < kShmClients; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      const v1::ConnectSharedMemoryResponse ticket = reg.NewTicket(carol);
      kept[t] = std::make_unique<RawShmClient>(ticket.socket());
      files[t] = std::make_unique<SealedMemfd>(kShmRegionBytes);
      const v1::ShmServerMessage hello = kept[t]->Hello(ticket.ticket());
      if (hello.code() != 0) {
        EXPECT_EQ(hello.code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
            << hello.ShortDebugString();
        ++refused;
        return;
      }
      const v1::ShmServerMessage r = kept[t]->Register(absl::StrCat("c", t), files[t]->fd());
      if (r.code() == 0) {
        ++registered;
      } else {
        EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kResourceExhausted))
            << r.ShortDebugString();
        ++refused;
      }
    });
  }
  go = true;
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(registered.load(), 2);
  EXPECT_EQ(refused.load(), kShmClients - 2);
  EXPECT_EQ(reg.Usage("carol").regions, 2);
  // Destroyed with its connections still open: they close, their regions go.
  registry->reset();
  for (auto& c : kept) c.reset();
}


// Runs on the socket (SetRunner): the runner gets the ticket's tenant and the
// message; its answer may come from another thread; one connection's run in
// flight holds up no other connection; a client that hangs up has its run
// cancelled; StopRuns cancels what is in flight and waits for it.
class FakeRun final : public ShmRunCall {
 public:
  explicit FakeRun(ShmRunRequest r) : r_(std::move(r)) {}
  void Cancel() override {
    cancelled_.store(true);
    Answer(absl::CancelledError("cancelled"));
  }
  void Answer(const absl::Status& s) {
    if (answered_.exchange(true)) return;
    v1::ShmServerMessage a;
    a.set_code(static_cast<int>(s.code()));
    a.set_message(s.ok() ? std::string(r_.run) : std::string(s.message()));
    a.set_request_id(r_.request_id.empty() ? "fake" : r_.request_id);
    r_.answer(std::move(a));
  }
  bool cancelled() const { return cancelled_.load(); }

 private:
  ShmRunRequest r_;
  std::atomic<bool> cancelled_ = false;
  std::atomic<bool> answered_ = false;
};

// Training steps on the socket: only when the runner takes them (the ticket's
// train_steps says so; otherwise UNIMPLEMENTED with a request id, and the
// runner is not called), handed to the runner marked train_step with the
// TrainStepRequest's bytes; a run is not marked.
TEST(ShmRegistry, TrainStepsOnlyWhenTheRunnerTakesThem) {
  Tenant erin("erin", ShmQuota(4, 4 * kShmRegionBytes), 1.0);
  auto registry = ShmRegistry::Create(v1::ServerConfig());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ShmRegistry& reg = **registry;
  std::atomic<int> calls = 0;
  std::atomic<bool> last_was_step = false;
  auto runner = [&](ShmRunRequest r) -> std::shared_ptr<ShmRunCall> {
    ++calls;
    last_was_step.store(r.train_step);
    auto run = std::make_shared<FakeRun>(std::move(r));
    run->Answer(absl::OkStatus());  // echoes the message's bytes
    return nullptr;
  };
  auto message = [](bool step, const std::string& bytes) {
    v1::ShmClientMessage m;
    if (step) {
      m.set_train_step(bytes);
    } else {
      m.set_run(bytes);
    }
    return m;
  };
  reg.SetRunner(runner);
  v1::ConnectSharedMemoryResponse ticket = reg.NewTicket(erin);
  EXPECT_GT(ticket.max_run_message_bytes(), 0);
  EXPECT_FALSE(ticket.train_steps());
  {
    RawShmClient c(ticket.socket());
    ASSERT_EQ(c.Hello(ticket.ticket()).code(), 0);
    v1::ShmServerMessage a = c.Call(message(true, "step"));
    EXPECT_EQ(a.code(), static_cast<int>(absl::StatusCode::kUnimplemented)) << a.message();
    EXPECT_NE(a.message().find("no training steps"), std::string::npos) << a.message();
    EXPECT_FALSE(a.request_id().empty());
    EXPECT_EQ(calls.load(), 0);
    a = c.Call(message(false, "run"));
    EXPECT_EQ(a.code(), 0) << a.message();
    EXPECT_EQ(calls.load(), 1);
  }
  reg.SetRunner(runner, /*train_steps=*/true);
  ticket = reg.NewTicket(erin);
  EXPECT_TRUE(ticket.train_steps());
  RawShmClient c(ticket.socket());
  ASSERT_EQ(c.Hello(ticket.ticket()).code(), 0);
  v1::ShmServerMessage a = c.Call(message(true, "the step"));
  EXPECT_EQ(a.code(), 0) << a.message();
  EXPECT_EQ(a.message(), "the step");
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(last_was_step.load());
  a = c.Call(message(false, "a run"));
  EXPECT_EQ(a.message(), "a run");
  EXPECT_FALSE(last_was_step.load());
  reg.StopRuns();
  EXPECT_FALSE(reg.NewTicket(erin).train_steps());
}

TEST(ShmRegistry, RunsOnTheSocket) {
  Tenant dora("dora", ShmQuota(4, 4 * kShmRegionBytes), 1.0);
  auto registry = ShmRegistry::Create(v1::ServerConfig());
  ASSERT_TRUE(registry.ok()) << registry.status();
  ShmRegistry& reg = **registry;
  auto run_message = [](const std::string& run, const std::string& id = "") {
    v1::ShmClientMessage m;
    m.set_run(run);
    m.set_run_request_id(id);
    return m;
  };
  // No runner: the ticket says so, and a run is refused (UNIMPLEMENTED, with
  // a request id: the client knows a kilnd that takes runs answered).
  v1::ConnectSharedMemoryResponse ticket = reg.NewTicket(dora);
  EXPECT_EQ(ticket.max_run_message_bytes(), 0);
  {
    RawShmClient c(ticket.socket());
    ASSERT_EQ(c.Hello(ticket.ticket()).code(), 0);
    v1::ShmServerMessage a = c.Call(run_message("x"));
    EXPECT_EQ(a.code(), static_cast<int>(absl::StatusCode::kUnimplemented));
    EXPECT_FALSE(a.request_id().empty());
  }

  absl::Mutex mu;
  std::vector<std::shared_ptr<FakeRun>> started;  // answered when the test says
  reg.SetRunner([&](ShmRunRequest r) -> std::shared_ptr<ShmRunCall> {
    EXPECT_EQ(r.tenant, &dora);
    auto run = std::make_shared<FakeRun>(std::move(r));
    absl::MutexLock lock(&mu);
    started.push_back(run);
    return run;
  });
  // Answers run i from a thread of its own.
  auto answer_from_thread = [&](size_t i) {
    std::shared_ptr<FakeRun> run;
    {
      absl::MutexLock lock(&mu);
      run = started[i];
    }
    std::thread([run] { run->Answer(absl::OkStatus()); }).join();
  };
  ticket = reg.NewTicket(dora);
  EXPECT_EQ(ticket.max_run_message_bytes(), ShmRegistry::kMaxRunMessageBytes);
  RawShmClient a(ticket.socket());
  ASSERT_EQ(a.Hello(ticket.ticket()).code(), 0);
  ticket = reg.NewTicket(dora);
  RawShmClient b(ticket.socket());
  ASSERT_EQ(b.Hello(ticket.ticket()).code(), 0);

  // a's run in flight (not answered); b's runs answered meanwhile.
  std::thread a_run([&] {
    v1::ShmServerMessage got = a.Call(run_message("held", "a-1"));
    EXPECT_EQ(got.code(), 0);
    EXPECT_EQ(got.message(), "held");
    EXPECT_EQ(got.request_id(), "a-1");
  });
  auto count = [&] {
    absl::MutexLock lock(&mu);
    return started.size();
  };
  while (count() < 1) absl::SleepFor(absl::Milliseconds(1));
  for (int i = 0; i < 3; ++i) {
    std::thread answerer([&, i] {
      while (count() < static_cast<size_t>(2 + i)) absl::SleepFor(absl::Milliseconds(1));
      answer_from_thread(1 + i);
    });
    v1::ShmServerMessage got = b.Call(run_message(absl::StrCat("b", i)));
    answerer.join();
    EXPECT_EQ(got.code(), 0);
    EXPECT_EQ(got.message(), absl::StrCat("b", i));
  }
  answer_from_thread(0);
  a_run.join();

  // A client that hangs up mid-run: its run is cancelled.
  ticket = reg.NewTicket(dora);
  auto gone = std::make_unique<RawShmClient>(ticket.socket());
  ASSERT_EQ(gone->Hello(ticket.ticket()).code(), 0);
  {
    v1::ShmClientMessage m = run_message("never answered");
    const std::string bytes = m.SerializeAsString();
    ASSERT_TRUE(gone->SendRaw(bytes));
  }
  while (count() < 5) absl::SleepFor(absl::Milliseconds(1));
  gone.reset();
  std::shared_ptr<FakeRun> fifth;
  {
    absl::MutexLock lock(&mu);
    fifth = started[4];
  }
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!fifth->cancelled() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(fifth->cancelled());

  // StopRuns: a run in flight is cancelled and let go; later runs are refused.
  std::thread stuck([&] {
    v1::ShmServerMessage got = b.Call(run_message("stuck"));
    EXPECT_EQ(got.code(), static_cast<int>(absl::StatusCode::kCancelled));
  });
  while (count() < 6) absl::SleepFor(absl::Milliseconds(1));
  reg.StopRuns();
  stuck.join();
  v1::ShmServerMessage refused = b.Call(run_message("late"));
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(count(), 6u);
  EXPECT_EQ(reg.NewTicket(dora).max_run_message_bytes(), 0);
}

}  // namespace
}  // namespace kiln::server
