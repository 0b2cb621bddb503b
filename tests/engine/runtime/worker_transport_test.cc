// The host side of the device-worker transport (runtime/worker_client.h): how
// an upload is cut into pieces that are sent as soon as they are staged, and
// that the pieces land where they belong. The worker here serves cpu:0 (the
// transport is the same for every backend; the CUDA worker's DMA from its
// registered staging region is CudaDeviceTest.RegisteredHostMemoryCopiesDirectly).
// The host arena (base/host_arena.h, res8): copies whose host side lies in an
// arena block cross by reference, their blocks held until the answer that
// passes them, or until a crashed worker is gone.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <thread>
#include <vector>

#include "base/host_arena.h"
#include "engine/runtime/worker_client.h"

namespace kiln::runtime::worker {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::string TestWorker() {
  const char* env = std::getenv("KILN_FAULT_WORKER");
  return env != nullptr && *env != '\0' ? env : KILN_FAULT_WORKER_PATH;
}

std::vector<uint8_t> Pattern(int64_t n, uint32_t seed) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 7;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(WorkerTransport, UploadPiecesCoverTheCopyInOrder) {
  EXPECT_TRUE(UploadPieces(0, 4 * kMiB).empty());
  auto one = UploadPieces(10 * kMiB, 0);  // 0: never cut
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].offset, 0);
  EXPECT_EQ(one[0].bytes, 10 * kMiB);
  EXPECT_EQ(UploadPieces(4 * kMiB, 4 * kMiB).size(), 1u);
  auto cut = UploadPieces(9 * kMiB + 5, 4 * kMiB);
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut[0].offset, 0);
  EXPECT_EQ(cut[1].offset, 4 * kMiB);
  EXPECT_EQ(cut[2].offset, 8 * kMiB);
  EXPECT_EQ(cut[2].bytes, kMiB + 5);
  int64_t at = 0;
  for (const UploadPiece& p : UploadPieces(25 * kMiB + 3, 4 * kMiB)) {
    EXPECT_EQ(p.offset, at);
    EXPECT_GT(p.bytes, 0);
    at += p.bytes;
  }
  EXPECT_EQ(at, 25 * kMiB + 3);
}

class WorkerTransportRoundTrip : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    WorkerOptions o;
    o.binary = TestWorker();
    o.backend = "cpu";
    o.backend_options.cpu_threads = 1;
    o.staging_bytes = 256 * kMiB;
    o.upload_piece_bytes = GetParam();
    auto b = StartIsolatedBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_FALSE(b->devices.empty());
    backend_ = std::move(b).value();
  }
  backend::Device& device() { return *backend_.devices[0]; }
  IsolatedBackend backend_;
};

// A copy in pieces reaches the device whole, at an offset into the buffer,
// and the caller may reuse its source as soon as CopyToDevice returns.
TEST_P(WorkerTransportRoundTrip, PiecesLandWhereTheyBelong) {
  const int64_t n = 9 * kMiB + 13, at = 4096 + 64;
  auto buf = device().Allocate(n + at);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto stream = device().CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<uint8_t> src = Pattern(n, 1);
  const std::vector<uint8_t> want = src;
  ASSERT_TRUE(device().CopyToDevice(**stream, src.data(), {buf->get(), at, n}).ok());
  std::memset(src.data(), 0, src.size());  // the source is the caller's again
  std::vector<uint8_t> back(static_cast<size_t>(n), 0xEE);
  ASSERT_TRUE(device().CopyToHost(**stream, {buf->get(), at, n}, back.data()).ok());
  ASSERT_TRUE((*stream)->SynchronizeFor(absl::Seconds(60)).ok());
  EXPECT_EQ(back, want);
}

// Two streams upload and read back at once: each stream's pieces stay its own.
TEST_P(WorkerTransportRoundTrip, ConcurrentStreamsKeepTheirOwnPieces) {
  constexpr int kStreams = 3;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kStreams);
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      const int64_t n = (5 + t) * kMiB + 7 * t;
      auto buf = device().Allocate(n);
      auto stream = device().CreateStream();
      if (!buf.ok() || !stream.ok()) {
        errors[t] = "allocate or stream failed";
        return;
      }
      for (int round = 0; round < 4; ++round) {
        const std::vector<uint8_t> src = Pattern(n, static_cast<uint32_t>(100 * t + round));
        std::vector<uint8_t> back(static_cast<size_t>(n), 0);
        absl::Status s = device().CopyToDevice(**stream, src.data(), {buf->get(), 0, n});
        if (s.ok()) s = device().CopyToHost(**stream, {buf->get(), 0, n}, back.data());
        if (s.ok()) s = (*stream)->SynchronizeFor(absl::Seconds(60));
        if (!s.ok()) {
          errors[t] = s.ToString();
          return;
        }
        if (back != src) {
          errors[t] = "round " + std::to_string(round) + " read back other bytes";
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kStreams; ++t) EXPECT_EQ(errors[t], "") << "stream " << t;
}

INSTANTIATE_TEST_SUITE_P(PieceBytes, WorkerTransportRoundTrip,
                         ::testing::Values(int64_t{0}, kMiB, 4 * kMiB),
                         [](const ::testing::TestParamInfo<int64_t>& i) {
                           return i.param == 0 ? std::string("OnePiece")
                                               : std::to_string(i.param / kMiB) + "MiB";
                         });

class WorkerTransportArena : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = HostArena::Create(64 * kMiB);
    ASSERT_TRUE(a.ok()) << a.status();
    arena_ = std::move(a).value();
    WorkerOptions o;
    o.binary = TestWorker();
    o.backend = "cpu";
    o.backend_options.cpu_threads = 1;
    o.staging_bytes = 256 * kMiB;
    o.host_arena = arena_.get();
    auto b = StartIsolatedBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_FALSE(b->devices.empty());
    backend_ = std::move(b).value();
  }
  void TearDown() override {
    backend_.devices.clear();  // the workers go before the arena they map
  }
  backend::Device& device() { return *backend_.devices[0]; }
  std::unique_ptr<HostArena> arena_;
  IsolatedBackend backend_;
};

// In and out through arena blocks (at an offset into one, as a view of a
// caller's tensor would be): the bytes arrive, and both copies went by
// reference. The blocks are free again once the caller releases them, and the
// next allocation of that size gets the same memory back.
TEST_F(WorkerTransportArena, CopiesByReferenceCarryTheBytes) {
  const int64_t n = 9 * kMiB + 13, at = 4096 + 64;
  auto buf = device().Allocate(n);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto stream = device().CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  char* in = static_cast<char*>(arena_->Allocate(n + at));
  char* out = static_cast<char*>(arena_->Allocate(n));
  ASSERT_NE(in, nullptr);
  ASSERT_NE(out, nullptr);
  const std::vector<uint8_t> want = Pattern(n, 3);
  std::memcpy(in + at, want.data(), want.size());
  std::memset(out, 0xEE, static_cast<size_t>(n));
  const HostArena::Stats before = arena_->stats();
  ASSERT_TRUE(device().CopyToDevice(**stream, in + at, {buf->get(), 0, n}).ok());
  ASSERT_TRUE(device().CopyToHost(**stream, {buf->get(), 0, n}, out).ok());
  ASSERT_TRUE((*stream)->SynchronizeFor(absl::Seconds(60)).ok());
  EXPECT_EQ(std::memcmp(out, want.data(), want.size()), 0);
  const HostArena::Stats after = arena_->stats();
  EXPECT_EQ(after.direct_copies - before.direct_copies, 2);
  EXPECT_EQ(after.direct_bytes - before.direct_bytes, 2 * n);
  // Reuse: released after the answer, the blocks are free at once.
  EXPECT_TRUE(arena_->Release(in));
  EXPECT_TRUE(arena_->Release(out));
  EXPECT_EQ(arena_->stats().in_use_bytes, 0);
  void* again = arena_->Allocate(n + at);
  EXPECT_EQ(again, in);
  EXPECT_TRUE(arena_->Release(again));
}

// Host memory outside the arena, or a range that leaves its block, takes the
// staging path as before: the same bytes, nothing by reference.
TEST_F(WorkerTransportArena, OtherMemoryFallsBackToStaging) {
  const int64_t n = 5 * kMiB + 7;
  auto buf = device().Allocate(2 * n);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto stream = device().CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<uint8_t> src = Pattern(n, 5);
  const std::vector<uint8_t> want = src;
  // Two adjacent blocks: a range across their boundary belongs to neither.
  char* a = static_cast<char*>(arena_->Allocate(HostArena::kAlignment));
  char* b = static_cast<char*>(arena_->Allocate(n));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a + HostArena::kAlignment, b);
  char* across = b - 64;
  std::memcpy(across, want.data(), want.size());
  const HostArena::Stats before = arena_->stats();
  ASSERT_TRUE(device().CopyToDevice(**stream, src.data(), {buf->get(), 0, n}).ok());
  std::memset(src.data(), 0, src.size());  // staged: the source is the caller's again
  ASSERT_TRUE(device().CopyToDevice(**stream, across, {buf->get(), n, n}).ok());
  std::vector<uint8_t> back(static_cast<size_t>(2 * n), 0);
  ASSERT_TRUE(device().CopyToHost(**stream, {buf->get(), 0, 2 * n}, back.data()).ok());
  ASSERT_TRUE((*stream)->SynchronizeFor(absl::Seconds(60)).ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), back.begin()));
  EXPECT_TRUE(std::equal(want.begin(), want.end(), back.begin() + n));
  EXPECT_EQ(arena_->stats().direct_copies, before.direct_copies);
  EXPECT_TRUE(arena_->Release(a));
  EXPECT_TRUE(arena_->Release(b));
  // A freed block is not a live buffer: no copy by reference from it either.
  EXPECT_FALSE(arena_->Hold(b, 64).has_value());
}

// A block released by its owner while a copy that names it is in flight (a
// failed run's output) stays held, so nothing else gets it; when the worker
// crashes before answering, it is freed only once the worker is gone.
TEST_F(WorkerTransportArena, HeldBlocksOutliveACrashedWorker) {
  const int64_t n = 2 * kMiB;
  auto buf = device().Allocate(n);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto stream = device().CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  backend::KernelSpec spec;
  spec.name = "fault";
  spec.op = v1::OP_CUSTOM;
  spec.attrs.mutable_custom()->set_name("kiln.test.fault");
  spec.attrs.mutable_custom()->set_payload("crash");
  spec.inputs = {{v1::DTYPE_F32, {64}}};
  spec.outputs = {{v1::DTYPE_F32, {64}}};
  backend::PrepareContext ctx;
  auto crash = device().PrepareKernel(spec, ctx);
  ASSERT_TRUE(crash.ok()) << crash.status();
  auto small = device().Allocate(2 * 64 * 4);
  ASSERT_TRUE(small.ok()) << small.status();
  char* out = static_cast<char*>(arena_->Allocate(n));
  ASSERT_NE(out, nullptr);
  ASSERT_TRUE(device().CopyToHost(**stream, {buf->get(), 0, n}, out).ok());
  const backend::BufferView x{small->get(), 0, 256}, y{small->get(), 256, 256};
  ASSERT_TRUE((*crash)->Launch(**stream, {&x, 1}, {&y, 1}).ok());
  EXPECT_TRUE(arena_->Release(out));  // the owner gives up before the answer
  EXPECT_EQ(arena_->stats().in_use_bytes, n);
  void* other = arena_->Allocate(n);
  EXPECT_NE(other, out);  // held: not handed out again
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(arena_->Release(other));
  absl::Status s = (*stream)->SynchronizeFor(absl::Seconds(60));
  EXPECT_TRUE(backend::FaultedDevice(s)) << s;
  // The worker was waited for before the synchronize failed: nothing is held.
  EXPECT_EQ(arena_->stats().in_use_bytes, 0);
  // The device comes back on a fresh worker that maps the same arena.
  ASSERT_TRUE(device().Restart().ok());
  auto buf2 = device().Allocate(n);
  ASSERT_TRUE(buf2.ok()) << buf2.status();
  auto stream2 = device().CreateStream();
  ASSERT_TRUE(stream2.ok()) << stream2.status();
  char* in = static_cast<char*>(arena_->Allocate(n));
  char* back = static_cast<char*>(arena_->Allocate(n));
  const std::vector<uint8_t> want = Pattern(n, 9);
  std::memcpy(in, want.data(), want.size());
  ASSERT_TRUE(device().CopyToDevice(**stream2, in, {buf2->get(), 0, n}).ok());
  ASSERT_TRUE(device().CopyToHost(**stream2, {buf2->get(), 0, n}, back).ok());
  ASSERT_TRUE((*stream2)->SynchronizeFor(absl::Seconds(60)).ok());
  EXPECT_EQ(std::memcmp(back, want.data(), want.size()), 0);
  EXPECT_TRUE(arena_->Release(in));
  EXPECT_TRUE(arena_->Release(back));
  EXPECT_EQ(arena_->stats().in_use_bytes, 0);
}

}  // namespace
}  // namespace kiln::runtime::worker
