// HostCopier (base/host_copy.h): large copies split over helper threads copy
// every byte exactly once, at any alignment, with concurrent callers sharing
// the helpers; small copies and a one-thread copier are one memcpy.
#include "base/host_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace kiln {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

std::vector<uint8_t> Pattern(int64_t n, uint32_t seed) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(HostCopier, PiecesFollowTheThreadsAndTheMinimumPiece) {
  EXPECT_EQ(HostCopier::PiecesFor(64 * kMiB, 1), 1);
  EXPECT_EQ(HostCopier::PiecesFor(HostCopier::kMinSplitBytes - 1, 8), 1);
  EXPECT_EQ(HostCopier::PiecesFor(HostCopier::kMinSplitBytes, 8), 2);
  EXPECT_EQ(HostCopier::PiecesFor(3 * kMiB, 8), 3);  // none under 1 MiB
  EXPECT_EQ(HostCopier::PiecesFor(25 * kMiB, 8), 25);
  EXPECT_EQ(HostCopier::PiecesFor(64 * kMiB, 8), 32);  // 4 per thread at most
  EXPECT_EQ(HostCopier::PiecesFor(int64_t{1} << 40, 2), 8);
}

TEST(HostCopier, CopiesEveryByteAtAnyOffset) {
  HostCopier copier(4);
  EXPECT_EQ(copier.threads(), 4);
  const int64_t n = 9 * kMiB + 37;
  const std::vector<uint8_t> src = Pattern(n + 64, 1);
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{4095}, HostCopier::kMinSplitBytes - 1,
                        HostCopier::kMinSplitBytes, 5 * kMiB + 3, n}) {
    for (int shift : {0, 1, 7, 63}) {
      std::vector<uint8_t> dst(static_cast<size_t>(n + 128), 0xAB);
      copier.Copy(dst.data() + 64 - shift, src.data() + shift, bytes);
      ASSERT_EQ(
          std::memcmp(dst.data() + 64 - shift, src.data() + shift, static_cast<size_t>(bytes)), 0)
          << bytes << " bytes, shift " << shift;
      // Nothing written outside the destination.
      for (int64_t i = 0; i < 64 - shift; ++i) ASSERT_EQ(dst[static_cast<size_t>(i)], 0xAB);
      for (int64_t i = 64 - shift + bytes; i < n + 128; ++i)
        ASSERT_EQ(dst[static_cast<size_t>(i)], 0xAB);
    }
  }
}

TEST(HostCopier, ConcurrentCallersShareTheHelpers) {
  HostCopier copier(3);
  constexpr int kCallers = 4;
  std::vector<std::thread> callers;
  std::vector<int> failures(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      const int64_t n = (3 + c) * kMiB + c * 101;
      const std::vector<uint8_t> src = Pattern(n, static_cast<uint32_t>(c + 10));
      std::vector<uint8_t> dst(static_cast<size_t>(n));
      for (int round = 0; round < 20; ++round) {
        std::memset(dst.data(), 0, dst.size());
        copier.Copy(dst.data(), src.data(), n);
        if (dst != src) ++failures[c];
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(failures[c], 0) << "caller " << c;
}

TEST(HostCopier, OneThreadIsAPlainCopy) {
  HostCopier copier(1);
  EXPECT_EQ(copier.threads(), 1);
  const std::vector<uint8_t> src = Pattern(4 * kMiB, 2);
  std::vector<uint8_t> dst(src.size());
  copier.Copy(dst.data(), src.data(), static_cast<int64_t>(src.size()));
  EXPECT_EQ(dst, src);
}

TEST(HostCopier, TheDefaultCopierCopies) {
  EXPECT_GE(HostCopier::Default().threads(), 1);
  const std::vector<uint8_t> src = Pattern(6 * kMiB + 5, 3);
  std::vector<uint8_t> dst(src.size());
  HostCopy(dst.data(), src.data(), static_cast<int64_t>(src.size()));
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace kiln
