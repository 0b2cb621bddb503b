// HostArena (base/host_arena.h): first-fit blocks in a shared memfd, an
// owner's reference plus holds, neighbours merged when freed, misses counted.
// The transport's use of it is WorkerTransportArena.* (kiln_engine_test).
#include "base/host_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

// Its own namespace: CI's unity build puts this file in one translation unit
// with host_copy_test.cc, whose anonymous namespace has a kMiB too.
namespace kiln {
namespace host_arena_test {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(HostArena, BlocksAreAlignedDisjointAndReusedWhenFreed) {
  auto a = HostArena::Create(8 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  HostArena& arena = **a;
  EXPECT_EQ(arena.size(), 8 * kMiB);
  char* x = static_cast<char*>(arena.Allocate(kMiB + 1));  // rounded up to the alignment
  char* y = static_cast<char*>(arena.Allocate(3 * kMiB));
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x) % HostArena::kAlignment, 0u);
  EXPECT_EQ(y - x, kMiB + HostArena::kAlignment);
  EXPECT_TRUE(arena.Contains(x) && arena.Contains(y + 3 * kMiB - 1));
  std::memset(x, 1, kMiB + 1);
  std::memset(y, 2, 3 * kMiB);
  EXPECT_EQ(x[kMiB], 1);
  EXPECT_EQ(arena.stats().in_use_bytes, 4 * kMiB + HostArena::kAlignment);
  EXPECT_EQ(arena.stats().allocations, 2);
  // Freed out of order, the free ranges merge back into one: the whole arena fits again.
  EXPECT_TRUE(arena.Release(x));
  EXPECT_FALSE(arena.Release(x));  // not owned any more
  EXPECT_TRUE(arena.Release(y));
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
  void* all = arena.Allocate(8 * kMiB);
  EXPECT_EQ(all, x);
  EXPECT_TRUE(arena.Release(all));
  EXPECT_EQ(arena.stats().peak_bytes, 8 * kMiB);
}

TEST(HostArena, FullArenaMissesAndForeignPointersAreRefused) {
  auto a = HostArena::Create(4 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  HostArena& arena = **a;
  void* big = arena.Allocate(3 * kMiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(arena.Allocate(2 * kMiB), nullptr);  // no range that large is left
  EXPECT_EQ(arena.Allocate(5 * kMiB), nullptr);  // larger than the arena
  EXPECT_EQ(arena.stats().misses, 2);
  std::vector<char> heap(64);
  EXPECT_FALSE(arena.Release(heap.data()));
  EXPECT_FALSE(arena.Hold(heap.data(), 64).has_value());
  EXPECT_FALSE(arena.Release(static_cast<char*>(big) + 64));  // not a block's start
  EXPECT_TRUE(arena.Release(big));
}

TEST(HostArena, HeldBlockOutlivesItsOwner) {
  auto a = HostArena::Create(4 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  HostArena& arena = **a;
  char* p = static_cast<char*>(arena.Allocate(2 * kMiB));
  ASSERT_NE(p, nullptr);
  // A view inside the block is held by its block; one past its end is not.
  auto h1 = arena.Hold(p + 4096, kMiB);
  ASSERT_TRUE(h1.has_value());
  EXPECT_EQ(h1->block, p - arena.base());
  EXPECT_EQ(h1->offset, p + 4096 - arena.base());
  EXPECT_FALSE(arena.Hold(p + kMiB, 2 * kMiB).has_value());
  auto h2 = arena.Hold(p, 2 * kMiB);
  ASSERT_TRUE(h2.has_value());
  EXPECT_TRUE(arena.Release(p));
  // Held twice: neither the owner's release nor the first unhold frees it.
  EXPECT_EQ(arena.stats().in_use_bytes, 2 * kMiB);
  EXPECT_FALSE(arena.Hold(p, 64).has_value());  // no new holds on a released block
  void* q = arena.Allocate(2 * kMiB);
  EXPECT_NE(q, p);
  EXPECT_TRUE(arena.Release(q));
  arena.Unhold(h1->block);
  EXPECT_EQ(arena.stats().in_use_bytes, 2 * kMiB);
  arena.Unhold(h2->block);
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
  void* whole = arena.Allocate(4 * kMiB);
  EXPECT_EQ(whole, static_cast<void*>(arena.base()));
  EXPECT_TRUE(arena.Release(whole));
}

TEST(HostArena, CountsCopiesByReference) {
  auto a = HostArena::Create(kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  (*a)->CountDirect(100);
  (*a)->CountDirect(28);
  EXPECT_EQ((*a)->stats().direct_bytes, 128);
  EXPECT_EQ((*a)->stats().direct_copies, 2);
}

}  // namespace host_arena_test
}  // namespace kiln
