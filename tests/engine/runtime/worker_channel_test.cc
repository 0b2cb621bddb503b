// The device-worker socket (engine/runtime/worker_protocol.h, Channel): a
// Receive that polls before it sleeps (issue 8, bert8) reads a frame sent
// while it polls and one sent after its poll ended alike, and reports the
// end of the stream as a blocking one does.
#include <sys/socket.h>

#include <thread>

#include "absl/time/clock.h"
#include "engine/runtime/worker_protocol.h"
#include "gtest/gtest.h"

namespace kiln::runtime::worker::channel_test {

namespace wp = v1::worker;

struct Pair {
  std::unique_ptr<Channel> a, b;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = std::make_unique<Channel>(fds[0]);
    b = std::make_unique<Channel>(fds[1]);
  }
};

wp::Request Numbered(uint64_t id) {
  wp::Request r;
  r.set_id(id);
  r.set_allocate(static_cast<int64_t>(id) * 64);
  return r;
}

TEST(WorkerChannel, PollingReceiveReadsFramesSentDuringAndAfterThePoll) {
  Pair p;
  // Sent before: found by the first poll at once.
  ASSERT_TRUE(p.a->Send(Numbered(1)).ok());
  wp::Request got;
  ASSERT_TRUE(p.b->Receive(&got, absl::Seconds(5)).ok());
  EXPECT_EQ(got.id(), 1u);
  EXPECT_EQ(got.allocate(), 64);
  // Sent while the receiver polls (a 5 s poll; the frame comes after 20 ms).
  std::thread during([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(p.a->Send(Numbered(2)).ok());
  });
  ASSERT_TRUE(p.b->Receive(&got, absl::Seconds(5)).ok());
  during.join();
  EXPECT_EQ(got.id(), 2u);
  // Sent after a short poll ended: the receive sleeps in the kernel for it.
  std::thread after([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(p.a->Send(Numbered(3)).ok());
  });
  ASSERT_TRUE(p.b->Receive(&got, absl::Microseconds(100)).ok());
  after.join();
  EXPECT_EQ(got.id(), 3u);
  EXPECT_EQ(got.allocate(), 192);
}

TEST(WorkerChannel, PollingReceiveReportsTheEndOfTheStream) {
  Pair p;
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    p.a->Shutdown();
  });
  wp::Request got;
  const absl::Status s = p.b->Receive(&got, absl::Seconds(5));
  closer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace kiln::runtime::worker::channel_test
