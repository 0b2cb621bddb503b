// The worker's shared staging region (engine/runtime/worker_protocol.h): first
// fit with coalescing, and pages freed above the resident mark going back to
// the kernel so a burst of large copies does not stay resident.
#include <sys/stat.h>

#include <cstring>

#include "engine/runtime/worker_protocol.h"
#include "gtest/gtest.h"

namespace kiln::runtime::worker {
namespace {

int64_t ResidentBytes(const ShmRegion& r) {
  struct stat st {};
  EXPECT_EQ(::fstat(r.fd(), &st), 0);
  return static_cast<int64_t>(st.st_blocks) * 512;
}

TEST(ShmRegion, FreedPagesAboveTheResidentMarkReturnToTheKernel) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  absl::StatusOr<std::unique_ptr<ShmRegion>> r = ShmRegion::Create(64 * kMiB, 4 * kMiB);
  ASSERT_TRUE(r.ok()) << r.status();
  ShmRegion& shm = **r;
  std::optional<int64_t> low = shm.Allocate(4 * kMiB);
  std::optional<int64_t> high = shm.Allocate(32 * kMiB);
  ASSERT_TRUE(low && high);
  EXPECT_EQ(*low, 0);
  EXPECT_EQ(*high, 4 * kMiB);
  std::memset(shm.at(*low), 1, 4 * kMiB);
  std::memset(shm.at(*high), 2, 32 * kMiB);
  EXPECT_GE(ResidentBytes(shm), 36 * kMiB);
  shm.Free(*high);
  // The 32 MiB above the mark are gone; the 4 MiB below stay.
  EXPECT_LT(ResidentBytes(shm), 5 * kMiB);
  EXPECT_EQ(shm.at(*low)[4 * kMiB - 1], 1);
  shm.Free(*low);
  EXPECT_GE(ResidentBytes(shm), 4 * kMiB);
  // Coalesced: the whole region is one free range again.
  std::optional<int64_t> all = shm.Allocate(64 * kMiB);
  ASSERT_TRUE(all);
  EXPECT_EQ(*all, 0);
  EXPECT_EQ(shm.at(8 * kMiB)[0], 0);  // punched pages read back as zeros
  EXPECT_FALSE(shm.Allocate(1));
}

}  // namespace
}  // namespace kiln::runtime::worker
