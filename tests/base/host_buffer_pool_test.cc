// HostBufferPool (base/host_buffer_pool.h): a large buffer given back is handed
// out again for the same size (its pages already faulted in), never for
// another size, and the pool keeps at most its limit, freeing the oldest first;
// HostTensor's large buffers go through it.
#include "base/host_buffer_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/host_tensor.h"

namespace kiln {
namespace {

constexpr size_t kPoolMiB = size_t{1} << 20;

TEST(HostBufferPool, AReleasedBufferServesTheSameSizeAgain) {
  HostBufferPool pool(64 * kPoolMiB);
  void* a = pool.Allocate(5 * kPoolMiB + 3);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  std::memset(a, 7, HostBufferPool::Rounded(5 * kPoolMiB + 3));  // the whole rounded size is ours
  EXPECT_TRUE(pool.Release(a));
  EXPECT_EQ(pool.kept_bytes(), 6 * kPoolMiB);
  void* other = pool.Allocate(8 * kPoolMiB);  // another size: a fresh buffer
  EXPECT_NE(other, a);
  EXPECT_EQ(pool.kept_bytes(), 6 * kPoolMiB);
  void* again = pool.Allocate(5 * kPoolMiB + 100);  // rounds to the same 6 MiB
  EXPECT_EQ(again, a);
  EXPECT_EQ(pool.kept_bytes(), 0u);
  EXPECT_TRUE(pool.Release(again));
  EXPECT_TRUE(pool.Release(other));
  EXPECT_EQ(pool.kept_bytes(), 14 * kPoolMiB);
}

TEST(HostBufferPool, KeepsAtMostItsLimitOldestFreedFirst) {
  HostBufferPool pool(20 * kPoolMiB);
  void* a = pool.Allocate(8 * kPoolMiB);
  void* b = pool.Allocate(8 * kPoolMiB);
  void* c = pool.Allocate(8 * kPoolMiB);
  EXPECT_TRUE(pool.Release(a));
  EXPECT_TRUE(pool.Release(b));
  EXPECT_EQ(pool.kept_bytes(), 16 * kPoolMiB);
  EXPECT_TRUE(pool.Release(c));  // a goes to make room
  EXPECT_EQ(pool.kept_bytes(), 16 * kPoolMiB);
  void* x = pool.Allocate(8 * kPoolMiB);
  void* y = pool.Allocate(8 * kPoolMiB);
  EXPECT_TRUE((x == b && y == c) || (x == c && y == b));
  void* big = pool.Allocate(32 * kPoolMiB);  // above the limit: never kept
  EXPECT_TRUE(pool.Release(big));
  EXPECT_EQ(pool.kept_bytes(), 0u);
  EXPECT_TRUE(pool.Release(x));
  EXPECT_TRUE(pool.Release(y));
}

TEST(HostBufferPool, ReleaseTakesBackOnlyItsOwnBuffers) {
  HostBufferPool pool(64 * kPoolMiB);
  void* foreign = std::malloc(16);
  EXPECT_FALSE(pool.Release(foreign));  // none out: the fast path
  void* a = pool.Allocate(4 * kPoolMiB);
  EXPECT_FALSE(pool.Release(foreign));  // one out, not this one
  std::free(foreign);
  EXPECT_TRUE(pool.Release(a));
  EXPECT_FALSE(pool.Release(a));  // kept now, not out: a second release is refused
  EXPECT_EQ(pool.kept_bytes(), 4 * kPoolMiB);
}

TEST(HostBufferPool, ALimitOfZeroKeepsNothing) {
  HostBufferPool pool(0);
  void* a = pool.Allocate(4 * kPoolMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(pool.Release(a));
  EXPECT_EQ(pool.kept_bytes(), 0u);
}

TEST(HostBufferPool, LargeHostTensorsReuseTheirBuffers) {
  if (std::getenv("KILN_HOST_BUFFER_POOL_BYTES") != nullptr)
    GTEST_SKIP() << "pool set from the environment";
  void* first = nullptr;
  {
    auto t = HostTensor::CreateUninitialized(v1::DTYPE_F32, {1024, 1536});  // 6 MiB
    ASSERT_TRUE(t.ok()) << t.status();
    first = t->data();
    std::memset(t->data(), 1, static_cast<size_t>(t->num_bytes()));
  }
  auto again = HostTensor::Create(v1::DTYPE_F32, {1536, 1024});  // same bytes, zero-filled
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(again->data_as<float>()[12345], 0.0f);
  auto small = HostTensor::Create(v1::DTYPE_F32, {16});  // below kMinBytes: plain malloc
  ASSERT_TRUE(small.ok());
  EXPECT_NE(small->data(), first);
}

}  // namespace
}  // namespace kiln
