// The host side of the device-worker transport (runtime/worker_client.h): how
// an upload is cut into pieces that are sent as soon as they are staged, and
// that the pieces land where they belong. The worker here serves cpu:0 (the
// transport is the same for every backend; the CUDA worker's DMA from its
// registered staging region is CudaDeviceTest.RegisteredHostMemoryCopiesDirectly).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace kiln::runtime::worker
