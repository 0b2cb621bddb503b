// TrainStream (server/train_stream.h): the rule a TrainSteps call follows. The
// thread that ended a step (the device's) starts the next one and does no
// gRPC work: the answer's write, the next read and the call's end are handed
// to a gRPC thread, which then takes them in order; an answer keeps its step
// until written, so its metrics and report are taken there too.
#include "server/train_stream.h"

#include <gtest/gtest.h>

#include "kiln/v1/service.pb.h"

namespace kiln::server {
namespace {

struct FakeStep {
  explicit FakeStep(int64_t step, int* released) : released(released) { r.set_step(step); }
  const v1::TrainStepResponse& response() const { return r; }
  void ReleaseRun() { ++*released; }
  void Account() { ++accounted; }
  v1::TrainStepResponse r;
  int* released;
  int accounted = 0;
};

using Stream = TrainStream<FakeStep>;
using Action = Stream::Action;
using Thread = Stream::Thread;

struct Next {
  Action action;
  FakeStep* start = nullptr;
  Stream::Answer* write = nullptr;
  absl::Status end;
};

Next Take(Stream& st, Thread thread, std::string& detail) {
  Next n{Action::kNone};
  absl::MutexLock lock(&st.mu);
  n.action = st.NextLocked(thread, n.start, n.write, n.end, detail);
  return n;
}

v1::TrainStepResponse Parse(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  v1::TrainStepResponse r;
  EXPECT_TRUE(r.ParseFromString(bytes));
  return r;
}

// Step 1 ran and ended; step 2 was read and admitted meanwhile.
void OneEndedOneWaiting(Stream& st, int* released) {
  absl::MutexLock lock(&st.mu);
  st.running = std::make_unique<FakeStep>(1, released);
  st.running_index = 1;
  st.running_outcome = absl::OkStatus();
  st.next = std::make_unique<FakeStep>(2, released);
  st.next_index = 2;
  st.received = 2;
}

TEST(TrainStream, TheThreadThatEndedAStepStartsTheNextAndHandsTheAnswerToGrpc) {
  Stream st;
  int released = 0;
  OneEndedOneWaiting(st, &released);
  std::string detail;
  Next n = Take(st, Thread::kStepEnded, detail);
  ASSERT_EQ(n.action, Action::kStart);
  ASSERT_NE(n.start, nullptr);
  EXPECT_EQ(n.start->response().step(), 2);
  EXPECT_EQ(released, 1);  // step 1's in-flight quota
  {
    absl::MutexLock lock(&st.mu);
    ASSERT_EQ(st.answers.size(), 1u);  // step 1's answer, queued, not written
    EXPECT_EQ(Parse(st.answers.front().bytes).step(), 1);
    EXPECT_EQ(st.answered, 1);
    EXPECT_EQ(st.running_index, 2);
  }
  // The write and the read of message 3 wait: not on this thread.
  n = Take(st, Thread::kStepEnded, detail);
  EXPECT_EQ(n.action, Action::kHandOff);
  {
    absl::MutexLock lock(&st.mu);
    EXPECT_FALSE(st.writing);
    EXPECT_FALSE(st.reading);
  }
  // On gRPC's thread: the answer, then the read; then nothing until an event.
  n = Take(st, Thread::kGrpc, detail);
  ASSERT_EQ(n.action, Action::kWrite);
  EXPECT_EQ(Parse(n.write->bytes).step(), 1);
  // The answer keeps its step, for the pump to account it (metrics, report)
  // on this thread before writing; nothing was accounted on the device's.
  ASSERT_NE(n.write->step, nullptr);
  EXPECT_EQ(n.write->step->response().step(), 1);
  EXPECT_EQ(n.write->step->accounted, 0);
  EXPECT_EQ(Take(st, Thread::kGrpc, detail).action, Action::kRead);
  EXPECT_EQ(Take(st, Thread::kGrpc, detail).action, Action::kNone);
  EXPECT_EQ(Take(st, Thread::kStepEnded, detail).action, Action::kNone);
  EXPECT_TRUE(detail.empty());
}

TEST(TrainStream, AFailedStepDropsTheNextAndTheEndIsHandedToGrpc) {
  Stream st;
  int released = 0;
  OneEndedOneWaiting(st, &released);
  {
    absl::MutexLock lock(&st.mu);
    st.running_outcome = absl::InvalidArgumentError("bad batch");
  }
  std::string detail;
  EXPECT_EQ(Take(st, Thread::kStepEnded, detail).action, Action::kHandOff);
  {
    absl::MutexLock lock(&st.mu);
    EXPECT_EQ(st.next, nullptr);  // never started
    EXPECT_TRUE(st.answers.empty());
    EXPECT_FALSE(st.ended);
  }
  EXPECT_EQ(released, 1);
  Next n = Take(st, Thread::kGrpc, detail);
  ASSERT_EQ(n.action, Action::kEnd);
  EXPECT_EQ(n.end.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.end.message().find("at step 1 of the stream"), std::string::npos) << n.end;
  EXPECT_EQ(detail, " steps=0");
  EXPECT_EQ(Take(st, Thread::kGrpc, detail).action, Action::kNone);  // ended
}

TEST(TrainStream, TheLastAnswerIsWrittenBeforeTheCallEnds) {
  Stream st;
  int released = 0;
  {
    absl::MutexLock lock(&st.mu);
    st.running = std::make_unique<FakeStep>(7, &released);
    st.running_index = 1;
    st.running_outcome = absl::OkStatus();
    st.reads_done = true;  // the client sent its last message
  }
  std::string detail;
  EXPECT_EQ(Take(st, Thread::kStepEnded, detail).action, Action::kHandOff);
  Next n = Take(st, Thread::kGrpc, detail);
  ASSERT_EQ(n.action, Action::kWrite);
  EXPECT_EQ(Parse(n.write->bytes).step(), 7);
  EXPECT_EQ(Take(st, Thread::kGrpc, detail).action, Action::kNone);  // the write is out
  {
    absl::MutexLock lock(&st.mu);  // OnWriteDone
    st.writing = false;
    st.answers.pop_front();
  }
  n = Take(st, Thread::kGrpc, detail);
  ASSERT_EQ(n.action, Action::kEnd);
  EXPECT_TRUE(n.end.ok()) << n.end;
  EXPECT_EQ(detail, " steps=1");
}

}  // namespace
}  // namespace kiln::server
