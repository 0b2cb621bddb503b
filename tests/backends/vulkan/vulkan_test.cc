// The Vulkan backend's own tests: the sub-allocator, streams and events, the
// persisted pipeline cache, the SPIR-V kernel cache, and a few kernels. The
// conformance suite covers every op family; these cover the machinery. They
// skip where no Vulkan device is present (lavapipe is enough).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_memory.h"
#include "backends/vulkan/vk_pipeline.h"
#include "backends/vulkan/vk_shader_compiler.h"
#include "backends/vulkan/vk_stream.h"
#include "engine/base/half.h"

namespace kiln::vulkan {
namespace {

using backend::BufferView;
using backend::KernelSpec;
using backend::TensorDesc;

absl::StatusOr<std::unique_ptr<backend::Backend>> MakeVulkan(const std::string& cache_dir = "") {
  for (const auto& reg : backend::RegisteredBackends()) {
    if (reg.name != "vulkan") continue;
    backend::BackendOptions options;
    options.cache_dir = cache_dir;
    return reg.factory(options);
  }
  return absl::NotFoundError("the vulkan backend is not registered");
}

// One backend for the tests that do not care about caches.
backend::Backend* Shared() {
  static backend::Backend* b = [] {
    auto made = MakeVulkan();
    return made.ok() ? made->release() : nullptr;
  }();
  return b;
}

VulkanDevice* SharedDevice() {
  backend::Backend* b = Shared();
  if (b == nullptr || b->devices().empty()) return nullptr;
  return static_cast<VulkanDevice*>(b->devices()[0]);
}

#define REQUIRE_DEVICE(var)                                        \
  VulkanDevice* var = SharedDevice();                              \
  if (var == nullptr) GTEST_SKIP() << "no Vulkan device available"

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            absl::StrCat("kiln_vk_test_", getpid(), "_", counter_++);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// A device buffer filled from `host`.
std::unique_ptr<backend::Buffer> Upload(backend::Device& d, backend::Stream& s, const void* host,
                                        int64_t bytes) {
  auto buf = d.Allocate(bytes);
  EXPECT_TRUE(buf.ok()) << buf.status();
  EXPECT_TRUE(d.CopyToDevice(s, host, BufferView{buf->get(), 0, bytes}).ok());
  return std::move(buf).value();
}

template <typename T>
std::vector<T> Download(backend::Device& d, backend::Stream& s, backend::Buffer& buf, int64_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(d.CopyToHost(s, BufferView{&buf, 0, n * static_cast<int64_t>(sizeof(T))},
                           out.data())
                  .ok());
  EXPECT_TRUE(s.Synchronize().ok());
  return out;
}

// Runs `spec` on host inputs (raw bytes) and returns the outputs' bytes.
absl::StatusOr<std::vector<std::string>> RunSpec(backend::Device& d, const KernelSpec& spec,
                                             const std::vector<std::string>& inputs,
                                             backend::PrepareContext* ctx = nullptr) {
  backend::PrepareContext local;
  auto kernel = d.PrepareKernel(spec, ctx ? *ctx : local);
  if (!kernel.ok()) return kernel.status();
  auto stream = d.CreateStream();
  if (!stream.ok()) return stream.status();
  std::vector<std::unique_ptr<backend::Buffer>> keep;
  std::vector<BufferView> ins, outs;
  for (const std::string& bytes : inputs) {
    keep.push_back(Upload(d, **stream, bytes.data(), static_cast<int64_t>(bytes.size())));
    ins.push_back({keep.back().get(), 0, static_cast<int64_t>(bytes.size())});
  }
  for (const TensorDesc& t : spec.outputs) {
    auto buf = d.Allocate(t.num_bytes());
    if (!buf.ok()) return buf.status();
    keep.push_back(std::move(buf).value());
    outs.push_back({keep.back().get(), 0, t.num_bytes()});
  }
  if (auto s = (*kernel)->Launch(**stream, ins, outs); !s.ok()) return s;
  if (auto s = (*stream)->Synchronize(); !s.ok()) return s;
  std::vector<std::string> results;
  for (const BufferView& v : outs) {
    std::string bytes(v.bytes, '\0');
    if (auto s = d.CopyToHost(**stream, v, bytes.data()); !s.ok()) return s;
    results.push_back(std::move(bytes));
  }
  if (auto s = (*stream)->Synchronize(); !s.ok()) return s;
  return results;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

std::vector<float> Iota(int64_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale;
  return v;
}

// ---- the sub-allocator's free list (no device needed) ----

TEST(RangeAllocatorTest, BestFitAndCoalescing) {
  RangeAllocator r(1000);
  auto a = r.Allocate(100), b = r.Allocate(200), c = r.Allocate(300);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 100u);
  EXPECT_EQ(*c, 300u);
  EXPECT_EQ(r.free_bytes(), 400u);
  r.Free(*b, 200);  // hole of 200 at 100; tail of 400 at 600
  auto d = r.Allocate(150);  // best fit: the 200 hole, not the 400 tail
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 100u);
  r.Free(*d, 150);
  r.Free(*a, 100);
  r.Free(*c, 300);
  EXPECT_TRUE(r.all_free());
  EXPECT_EQ(r.free_ranges(), 1u);  // everything merged back
  EXPECT_FALSE(r.Allocate(1001));
  EXPECT_EQ(*r.Allocate(1000), 0u);
}

TEST(RangeAllocatorTest, RandomAllocFreeKeepsInvariants) {
  RangeAllocator r(1 << 20);
  std::mt19937 rng(7);
  std::map<uint64_t, uint64_t> live;
  uint64_t used = 0;
  for (int i = 0; i < 4000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t size = 16 * (1 + rng() % 64);
      if (auto off = r.Allocate(size)) {
        // No overlap with any live range.
        auto next = live.lower_bound(*off);
        if (next != live.end()) {
          EXPECT_LE(*off + size, next->first);
        }
        if (next != live.begin()) {
          EXPECT_LE(std::prev(next)->first + std::prev(next)->second, *off);
        }
        live[*off] = size;
        used += size;
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      r.Free(it->first, it->second);
      used -= it->second;
      live.erase(it);
    }
    ASSERT_EQ(r.free_bytes(), (1u << 20) - used);
  }
  for (auto [off, size] : live) r.Free(off, size);
  EXPECT_TRUE(r.all_free());
  EXPECT_EQ(r.free_ranges(), 1u);
}

// ---- device and memory ----

TEST(VulkanDeviceTest, ReportsInfoAndFeatures) {
  REQUIRE_DEVICE(d);
  const backend::DeviceInfo& info = d->info();
  EXPECT_EQ(info.id, "vulkan:0");
  EXPECT_EQ(info.backend, "vulkan");
  EXPECT_FALSE(info.name.empty());
  EXPECT_FALSE(info.driver_version.empty());
  EXPECT_NE(info.identity.find("device-uuid="), std::string::npos);
  EXPECT_NE(info.identity.find("cache-uuid="), std::string::npos);
  EXPECT_GT(info.memory_bytes, 0);
  EXPECT_FALSE(info.host_memory);
  EXPECT_FALSE(info.profile.calibrated);
  EXPECT_GT(info.profile.peak_gflops_f32, 0);
  EXPECT_NE(std::find(info.features.begin(), info.features.end(), "timeline_semaphore"),
            info.features.end());
}

TEST(VulkanMemoryTest, SmallBuffersShareBlocks) {
  REQUIRE_DEVICE(d);
  const int64_t before_in_use = d->memory_in_use();
  const MemoryPool::Stats before = d->device_pool().stats();
  std::vector<std::unique_ptr<backend::Buffer>> bufs;
  int64_t total = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t n = 100 + (i % 7) * 300;
    auto b = d->Allocate(n);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->host_ptr(), nullptr);
    EXPECT_EQ((*b)->size(), n);
    total += n;
    bufs.push_back(std::move(b).value());
  }
  EXPECT_EQ(d->memory_in_use() - before_in_use, total);
  const MemoryPool::Stats during = d->device_pool().stats();
  EXPECT_EQ(during.allocations - before.allocations, 2000);
  // ~2.6 MB of small buffers fit in a block or two, not 2000 driver allocations.
  EXPECT_LE(during.blocks - before.blocks, 2);
  // Free every other buffer, then allocate the same sizes again: the holes are reused.
  for (size_t i = 0; i < bufs.size(); i += 2) bufs[i].reset();
  const int64_t reserved = d->device_pool().stats().reserved_bytes;
  for (size_t i = 0; i < bufs.size(); i += 2) {
    auto b = d->Allocate(100 + (i % 7) * 300);
    ASSERT_TRUE(b.ok());
    bufs[i] = std::move(b).value();
  }
  EXPECT_EQ(d->device_pool().stats().reserved_bytes, reserved);
  bufs.clear();
  EXPECT_EQ(d->memory_in_use(), before_in_use);
  EXPECT_EQ(d->device_pool().stats().allocations, before.allocations);
  EXPECT_EQ(d->device_pool().stats().used_bytes, before.used_bytes);
}

TEST(VulkanMemoryTest, LargeBufferGetsDedicatedBlockReleasedOnFree) {
  REQUIRE_DEVICE(d);
  const MemoryPool::Stats before = d->device_pool().stats();
  const int64_t big = static_cast<int64_t>(d->device_pool().block_size());  // > half a block
  {
    auto b = d->Allocate(big);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(d->device_pool().stats().blocks, before.blocks + 1);
  }
  EXPECT_EQ(d->device_pool().stats().blocks, before.blocks);
  EXPECT_EQ(d->device_pool().stats().reserved_bytes, before.reserved_bytes);
}

TEST(VulkanMemoryTest, RejectsForeignAndOutOfRangeViews) {
  REQUIRE_DEVICE(d);
  auto s = d->CreateStream();
  ASSERT_TRUE(s.ok());
  auto buf = d->Allocate(64);
  ASSERT_TRUE(buf.ok());
  std::vector<char> host(128);
  EXPECT_EQ(d->CopyToDevice(**s, host.data(), BufferView{buf->get(), 0, 128}).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(d->CopyToDevice(**s, host.data(), BufferView{buf->get(), 4, 16}).code(),
            absl::StatusCode::kInvalidArgument);  // not at a binding alignment
}

// ---- streams ----

TEST(VulkanStreamTest, CopiesRoundTripIdleAndQueued) {
  REQUIRE_DEVICE(d);
  auto s = d->CreateStream();
  ASSERT_TRUE(s.ok());
  const int64_t n = 100000;
  std::vector<float> host = Iota(n, 0.5f);
  auto a = Upload(*d, **s, host.data(), n * 4);
  auto b = d->Allocate(n * 4);
  auto c = d->Allocate(n * 4);
  ASSERT_TRUE(b.ok() && c.ok());
  // Queued work: copy a->b, then b->c, then read c (staging + completion path).
  ASSERT_TRUE(d->CopyOnDevice(**s, {a.get(), 0, n * 4}, {b->get(), 0, n * 4}).ok());
  ASSERT_TRUE(d->CopyOnDevice(**s, {b->get(), 0, n * 4}, {c->get(), 0, n * 4}).ok());
  std::vector<float> back(n, -1.0f);
  ASSERT_TRUE(d->CopyToHost(**s, {c->get(), 0, n * 4}, back.data()).ok());
  // Host data written after an upload was enqueued must not leak into it.
  std::vector<float> other(n, 7.0f);
  ASSERT_TRUE(d->CopyToDevice(**s, other.data(), {a.get(), 0, n * 4}).ok());
  std::fill(other.begin(), other.end(), 9.0f);
  ASSERT_TRUE((*s)->Synchronize().ok());
  EXPECT_EQ(back, host);
  EXPECT_EQ(Download<float>(*d, **s, *a, n), std::vector<float>(n, 7.0f));
}

TEST(VulkanStreamTest, OverlappingCopyOnDevice) {
  REQUIRE_DEVICE(d);
  auto s = d->CreateStream();
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> host(1024);
  std::iota(host.begin(), host.end(), 0);
  auto a = Upload(*d, **s, host.data(), 4096);
  ASSERT_TRUE(d->CopyOnDevice(**s, {a.get(), 0, 2048}, {a.get(), 1024, 2048}).ok());
  std::vector<int32_t> got = Download<int32_t>(*d, **s, *a, 1024);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(got[i], i);
  for (int i = 256; i < 768; ++i) ASSERT_EQ(got[i], i - 256) << i;
}

TEST(VulkanStreamTest, EventsMeasureQueuedWork) {
  REQUIRE_DEVICE(d);
  auto s = d->CreateStream();
  ASSERT_TRUE(s.ok());
  const int64_t n = 1 << 20;
  std::vector<float> host = Iota(n);
  auto a = Upload(*d, **s, host.data(), n * 4);
  auto b = d->Allocate(n * 4);
  ASSERT_TRUE(b.ok());
  auto e0 = (*s)->Record();
  ASSERT_TRUE(e0.ok()) << e0.status();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(d->CopyOnDevice(**s, {a.get(), 0, n * 4}, {b->get(), 0, n * 4}).ok());
  }
  auto e1 = (*s)->Record();
  ASSERT_TRUE(e1.ok());
  ASSERT_TRUE((*s)->Synchronize().ok());
  auto us = (*e1)->MicrosSince(**e0);
  ASSERT_TRUE(us.ok()) << us.status();
  EXPECT_GE(*us, 0.0);
  EXPECT_LT(*us, 60e6);
  auto other = d->CreateStream();
  ASSERT_TRUE(other.ok());
  auto e2 = (*other)->Record();
  ASSERT_TRUE(e2.ok());
  ASSERT_TRUE((*other)->Synchronize().ok());
  EXPECT_FALSE((*e2)->MicrosSince(**e0).ok());  // different streams
}

// ---- data movement kernels ----

KernelSpec Spec(v1::OpKind op, std::vector<TensorDesc> in, std::vector<TensorDesc> out) {
  KernelSpec spec;
  spec.name = v1::OpKind_Name(op);
  spec.label = absl::StrCat("node 1 \"t\" (", spec.name, ")");
  spec.op = op;
  spec.inputs = std::move(in);
  spec.outputs = std::move(out);
  return spec;
}

TEST(VulkanKernelTest, TransposeSliceConcat) {
  REQUIRE_DEVICE(d);
  const std::vector<float> x = Iota(2 * 3 * 4);
  {
    KernelSpec spec = Spec(v1::OP_TRANSPOSE, {{v1::DTYPE_F32, {2, 3, 4}}}, {{v1::DTYPE_F32, {4, 2, 3}}});
    for (int p : {2, 0, 1}) spec.attrs.mutable_transpose()->add_perm(p);
    auto got = RunSpec(*d, spec, {Bytes(x)});
    ASSERT_TRUE(got.ok()) << got.status();
    const auto y = Values<float>((*got)[0]);
    for (int i = 0; i < 4; ++i)
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 3; ++b) EXPECT_EQ(y[(i * 2 + a) * 3 + b], x[(a * 3 + b) * 4 + i]);
  }
  {
    // x[:, 1:, ::2] on f16 (2-byte elements).
    std::vector<uint16_t> h(24);
    for (int i = 0; i < 24; ++i) h[i] = FloatToHalf(static_cast<float>(i));
    KernelSpec spec = Spec(v1::OP_SLICE, {{v1::DTYPE_F16, {2, 3, 4}}}, {{v1::DTYPE_F16, {2, 2, 2}}});
    auto* a = spec.attrs.mutable_slice();
    for (int64_t v : {0, 1, 0}) a->add_start(v);
    for (int64_t v : {2, 3, 4}) a->add_stop(v);
    for (int64_t v : {1, 1, 2}) a->add_step(v);
    auto got = RunSpec(*d, spec, {Bytes(h)});
    ASSERT_TRUE(got.ok()) << got.status();
    const auto y = Values<uint16_t>((*got)[0]);
    std::vector<float> want = {4, 6, 8, 10, 16, 18, 20, 22};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(HalfToFloat(y[i]), want[i]);
  }
  {
    // concat([2,1] i64, [2,2] i64, axis 1) — 8-byte elements.
    std::vector<int64_t> a = {1, 2}, b = {3, 4, 5, 6};
    KernelSpec spec = Spec(v1::OP_CONCAT, {{v1::DTYPE_I64, {2, 1}}, {v1::DTYPE_I64, {2, 2}}},
                           {{v1::DTYPE_I64, {2, 3}}});
    spec.attrs.mutable_concat()->set_axis(1);
    auto got = RunSpec(*d, spec, {Bytes(a), Bytes(b)});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Values<int64_t>((*got)[0]), (std::vector<int64_t>{1, 3, 4, 2, 5, 6}));
  }
}

TEST(VulkanKernelTest, GatherAndOutOfRangeIndex) {
  REQUIRE_DEVICE(d);
  const std::vector<float> x = Iota(4 * 3);  // [4, 3]
  KernelSpec spec = Spec(v1::OP_GATHER, {{v1::DTYPE_F32, {4, 3}}, {v1::DTYPE_I64, {3}}},
                         {{v1::DTYPE_F32, {3, 3}}});
  spec.attrs.mutable_gather()->set_axis(0);
  auto got = RunSpec(*d, spec, {Bytes(x), Bytes(std::vector<int64_t>{3, -4, 1})});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Values<float>((*got)[0]), (std::vector<float>{9, 10, 11, 0, 1, 2, 3, 4, 5}));
  auto bad = RunSpec(*d, spec, {Bytes(x), Bytes(std::vector<int64_t>{0, 4, 1})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("gather index 4 (at position 1) is out of range [-4, 4)"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("node 1"), std::string::npos);
  auto huge = RunSpec(*d, spec, {Bytes(x), Bytes(std::vector<int64_t>{0, int64_t{1} << 40, 1})});
  EXPECT_FALSE(huge.ok());
}

}  // namespace
}  // namespace kiln::vulkan
