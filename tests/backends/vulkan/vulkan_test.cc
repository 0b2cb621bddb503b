// The Vulkan backend's own tests: the sub-allocator, streams and events, the
// persisted pipeline cache, the SPIR-V kernel cache, and a few kernels. The
// conformance suite covers every op family; these cover the machinery. They
// skip where no Vulkan device is present (lavapipe is enough).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_memory.h"
#include "backends/vulkan/vk_pipeline.h"
#include "backends/vulkan/vk_shader_compiler.h"
#include "backends/vulkan/vk_stream.h"
#include "base/half.h"

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

#define REQUIRE_DEVICE(var)           \
  VulkanDevice* var = SharedDevice(); \
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
  EXPECT_TRUE(
      d.CopyToHost(s, BufferView{&buf, 0, n * static_cast<int64_t>(sizeof(T))}, out.data()).ok());
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
  r.Free(*b, 200);           // hole of 200 at 100; tail of 400 at 600
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
  std::printf("%s: %s [%s] driver %s\n  identity %s\n  features %s\n", info.id.c_str(),
              info.name.c_str(), info.arch.c_str(), info.driver_version.c_str(),
              info.identity.c_str(), absl::StrJoin(info.features, " ").c_str());
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
  // Copies take any offset; kernels need views at the storage-binding alignment.
  EXPECT_TRUE(d->CopyToDevice(**s, host.data(), BufferView{buf->get(), 4, 16}).ok());
  backend::PrepareContext ctx;
  KernelSpec neg;
  neg.op = v1::OP_UNARY;
  neg.label = "neg";
  neg.attrs.mutable_unary()->set_kind(v1::UNARY_NEG);
  neg.inputs = {{v1::DTYPE_F32, {4}}};
  neg.outputs = {{v1::DTYPE_F32, {4}}};
  auto k = d->PrepareKernel(neg, ctx);
  ASSERT_TRUE(k.ok());
  const BufferView misaligned{buf->get(), 4, 16}, aligned{buf->get(), 0, 16};
  EXPECT_EQ((*k)->Launch(**s, {&misaligned, 1}, {&aligned, 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*s)->Synchronize().ok());
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
    KernelSpec spec =
        Spec(v1::OP_TRANSPOSE, {{v1::DTYPE_F32, {2, 3, 4}}}, {{v1::DTYPE_F32, {4, 2, 3}}});
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
    KernelSpec spec =
        Spec(v1::OP_SLICE, {{v1::DTYPE_F16, {2, 3, 4}}}, {{v1::DTYPE_F16, {2, 2, 2}}});
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

// ---- batching and dependencies ----

KernelSpec UnarySpec(v1::UnaryKind kind, DType dt, Dims dims) {
  KernelSpec spec = Spec(v1::OP_UNARY, {{dt, dims}}, {{dt, dims}});
  spec.attrs.mutable_unary()->set_kind(kind);
  return spec;
}

KernelSpec BinarySpec(v1::BinaryKind kind, Dims a, Dims b, Dims out) {
  KernelSpec spec =
      Spec(v1::OP_BINARY, {{v1::DTYPE_F32, a}, {v1::DTYPE_F32, b}}, {{v1::DTYPE_F32, out}});
  spec.attrs.mutable_binary()->set_kind(kind);
  return spec;
}

TEST(VulkanStreamTest, DependentLaunchesShareOneSubmissionWithBarriers) {
  REQUIRE_DEVICE(d);
  const int64_t n = 4096;
  backend::PrepareContext ctx;
  auto add = d->PrepareKernel(BinarySpec(v1::BINARY_ADD, {n}, {n}, {n}), ctx);
  ASSERT_TRUE(add.ok()) << add.status();
  auto s = d->CreateStream();
  ASSERT_TRUE(s.ok());
  auto* vs = static_cast<VulkanStream*>(s->get());
  std::vector<float> ones(n, 1.0f);
  auto x = Upload(*d, **s, ones.data(), n * 4);
  auto y = Upload(*d, **s, ones.data(), n * 4);
  ASSERT_TRUE((*s)->Synchronize().ok());
  const int64_t before = vs->submissions();
  // x = x + y, then y = x + y, ... 20 times: every launch reads the last one's output.
  const BufferView bx{x.get(), 0, n * 4}, by{y.get(), 0, n * 4};
  for (int i = 0; i < 20; ++i) {
    const BufferView in[2] = {bx, by};
    const BufferView out[1] = {i % 2 == 0 ? bx : by};
    ASSERT_TRUE((*add)->Launch(**s, in, out).ok());
  }
  ASSERT_TRUE((*s)->Synchronize().ok());
  EXPECT_EQ(vs->submissions() - before, 1);  // one command buffer for all 20
  // Fibonacci: after 20 steps x = F(21), y = F(22) with F(1) = F(2) = 1.
  std::vector<float> gx = Download<float>(*d, **s, *x, n), gy = Download<float>(*d, **s, *y, n);
  EXPECT_EQ(gx[0], 10946.0f);
  EXPECT_EQ(gy[n - 1], 17711.0f);
}

TEST(VulkanStreamTest, LongLaunchSequencesAreSubmittedInPieces) {
  REQUIRE_DEVICE(d);
  backend::PrepareContext ctx;
  auto neg = d->PrepareKernel(UnarySpec(v1::UNARY_NEG, v1::DTYPE_F32, {64}), ctx);
  ASSERT_TRUE(neg.ok());
  auto s = d->CreateStream();
  ASSERT_TRUE(s.ok());
  auto* vs = static_cast<VulkanStream*>(s->get());
  std::vector<float> v = Iota(64);
  auto x = Upload(*d, **s, v.data(), 256);
  const int64_t before = vs->submissions();
  const BufferView bx{x.get(), 0, 256};
  for (int i = 0; i < 601; ++i) ASSERT_TRUE((*neg)->Launch(**s, {&bx, 1}, {&bx, 1}).ok());
  ASSERT_TRUE((*s)->Synchronize().ok());
  EXPECT_GE(vs->submissions() - before, 3);
  std::vector<float> got = Download<float>(*d, **s, *x, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], -v[i]);
}

// The kiln_vulkan_test hang: streams created, used and destroyed back to back
// (as every RunSpec does). With submissions that waited on their own stream's
// semaphore, lavapipe 22.3's queue thread wrote the destroyed semaphore's
// memory and, once it was reused, blocked forever (vk_stream.h). Under
// valgrind (the kiln_vulkan_stream_churn_memcheck test) the old pattern shows
// invalid writes from the queue thread within a few iterations; here every
// wait is bounded, so a hang fails instead of stalling the suite.
TEST(VulkanStreamTest, StreamChurnWithQueuedWorkAndEvents) {
  REQUIRE_DEVICE(d);
  const int iterations = std::getenv("KILN_VK_CHURN") ? std::atoi(std::getenv("KILN_VK_CHURN")) : 200;
  std::vector<int32_t> host(256);
  for (int i = 0; i < iterations; ++i) {
    auto s = d->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    std::iota(host.begin(), host.end(), i);
    auto a = d->Allocate(1024);
    auto b = d->Allocate(1024);
    ASSERT_TRUE(a.ok() && b.ok());
    // Two submissions at least (Record flushes), then a read-back.
    ASSERT_TRUE(d->CopyToDevice(**s, host.data(), {a->get(), 0, 1024}).ok());
    auto e0 = (*s)->Record();
    ASSERT_TRUE(e0.ok()) << e0.status();
    ASSERT_TRUE(d->CopyOnDevice(**s, {a->get(), 0, 1024}, {b->get(), 0, 1024}).ok());
    auto e1 = (*s)->Record();
    ASSERT_TRUE(e1.ok()) << e1.status();
    std::vector<int32_t> back(256, -1);
    ASSERT_TRUE(d->CopyToHost(**s, {b->get(), 0, 1024}, back.data()).ok());
    const absl::Status synced = (*s)->SynchronizeFor(absl::Seconds(30));
    ASSERT_TRUE(synced.ok()) << "iteration " << i << ": " << synced;
    ASSERT_EQ(back, host) << "iteration " << i;
  }
}

// A wait that times out is a device fault: UNAVAILABLE naming the device, and
// the stream stays failed; the device itself keeps serving other streams.
TEST(VulkanStreamTest, TimedOutWaitIsADeviceFault) {
  REQUIRE_DEVICE(d);
  auto made = d->CreateStream();
  ASSERT_TRUE(made.ok());
  auto vs = AsVulkanStream(**made, *d);
  ASSERT_TRUE(vs.ok());
  // Enough work that a 1 us wait cannot see it finish (256 MiB of fills).
  const int64_t bytes = int64_t{64} << 20;
  auto buf = d->Allocate(bytes);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto binding = d->ResolveTransfer({buf->get(), 0, bytes}, bytes, "buffer");
  ASSERT_TRUE(binding.ok()) << binding.status();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*vs)->Fill(*binding, bytes, i).ok());
  const absl::Status s = (*made)->SynchronizeFor(absl::Microseconds(1));
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), d->info().id)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "device fault")) << s;
  // Sticky: the stream does not pretend to recover.
  EXPECT_EQ((*made)->Synchronize().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*made)->Record().status().code(), absl::StatusCode::kUnavailable);
  made->reset();  // leaks what the device may still use; must not hang or crash
  // The fills may still be writing it: keep its memory out of the pool.
  (void)buf->release();
  // Other streams on the device are unaffected.
  auto other = d->CreateStream();
  ASSERT_TRUE(other.ok());
  std::vector<int32_t> host(64, 5), back(64, 0);
  auto small = Upload(*d, **other, host.data(), 256);
  ASSERT_TRUE(d->CopyToHost(**other, {small.get(), 0, 256}, back.data()).ok());
  ASSERT_TRUE((*other)->SynchronizeFor(absl::Seconds(60)).ok());
  EXPECT_EQ(back, host);
}

TEST(VulkanStreamTest, RejectsAnotherBackendsStream) {
  REQUIRE_DEVICE(d);
  backend::Device* cpu = nullptr;
  std::unique_ptr<backend::Backend> cpu_backend;
  for (const auto& reg : backend::RegisteredBackends()) {
    if (reg.name == "cpu") cpu_backend = std::move(reg.factory({})).value();
  }
  if (cpu_backend == nullptr) GTEST_SKIP() << "no cpu backend linked";
  cpu = cpu_backend->devices()[0];
  auto foreign = cpu->CreateStream();
  ASSERT_TRUE(foreign.ok());
  backend::PrepareContext ctx;
  auto k = d->PrepareKernel(UnarySpec(v1::UNARY_NEG, v1::DTYPE_F32, {4}), ctx);
  ASSERT_TRUE(k.ok());
  auto buf = d->Allocate(16);
  ASSERT_TRUE(buf.ok());
  const BufferView v{buf->get(), 0, 16};
  EXPECT_EQ((*k)->Launch(**foreign, {&v, 1}, {&v, 1}).code(), absl::StatusCode::kInvalidArgument);
}

// ---- claims ----

TEST(VulkanClaimTest, UnsupportedSpecsSayWhy) {
  REQUIRE_DEVICE(d);
  const backend::Claim f64 = d->Supports(UnarySpec(v1::UNARY_EXP, v1::DTYPE_F64, {4}));
  EXPECT_FALSE(f64.native);
  EXPECT_NE(f64.reason.find("f64"), std::string::npos) << f64.reason;
  const backend::Claim conv = d->Supports(Spec(v1::OP_CONV, {}, {}));
  EXPECT_FALSE(conv.native);
  EXPECT_NE(conv.reason.find("OP_CONV"), std::string::npos) << conv.reason;
  backend::PrepareContext ctx;
  auto k = d->PrepareKernel(UnarySpec(v1::UNARY_EXP, v1::DTYPE_F64, {4}), ctx);
  EXPECT_EQ(k.status().code(), absl::StatusCode::kUnimplemented);
  // A tensor past maxStorageBufferRange cannot be bound.
  const int64_t huge = static_cast<int64_t>(d->caps().max_storage_buffer_range / 4 + 1);
  EXPECT_FALSE(d->Supports(UnarySpec(v1::UNARY_NEG, v1::DTYPE_F32, {huge})).native);
}

// ---- the persisted pipeline cache ----

TEST(VulkanPipelineCacheTest, PersistsAcrossBackendsAndRejectsForeignFiles) {
  if (SharedDevice() == nullptr) GTEST_SKIP() << "no Vulkan device available";
  TempDir dir;
  std::string path;
  KernelSpec softmax = Spec(v1::OP_SOFTMAX, {{v1::DTYPE_F32, {3, 5}}}, {{v1::DTYPE_F32, {3, 5}}});
  {
    auto b = MakeVulkan(dir.path());
    ASSERT_TRUE(b.ok());
    auto* d = static_cast<VulkanDevice*>((*b)->devices()[0]);
    EXPECT_EQ(d->pipelines().cache_state(), PipelineManager::CacheState::kAbsent);
    path = d->pipelines().cache_path();
    EXPECT_NE(path.find(dir.path()), std::string::npos);
    auto got = RunSpec(*d, softmax, {Bytes(Iota(15))});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_GE(d->pipelines().pipelines_created(), 1);
  }  // destroying the backend writes the cache
  ASSERT_TRUE(std::filesystem::exists(path));
  const auto size = std::filesystem::file_size(path);
  EXPECT_GT(size, 56u);
  {
    auto b = MakeVulkan(dir.path());
    ASSERT_TRUE(b.ok());
    auto* d = static_cast<VulkanDevice*>((*b)->devices()[0]);
    EXPECT_EQ(d->pipelines().cache_state(), PipelineManager::CacheState::kLoaded);
  }
  // A file written by another device (another pipelineCacheUUID) is ignored.
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    DeviceCaps other = SharedDevice()->caps();
    other.pipeline_cache_uuid[0] ^= 0xff;
    const std::string payload = bytes.substr(56);
    std::string forged = PipelineManager::CacheHeader(other, payload.size(), 0) + payload;
    // Keep the checksum right so only the device check can reject it.
    std::memcpy(forged.data() + 48, bytes.data() + 48, 8);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << forged;
  }
  {
    auto b = MakeVulkan(dir.path());
    ASSERT_TRUE(b.ok());
    auto* d = static_cast<VulkanDevice*>((*b)->devices()[0]);
    EXPECT_EQ(d->pipelines().cache_state(), PipelineManager::CacheState::kRejected);
    auto got = RunSpec(*d, softmax, {Bytes(Iota(15))});  // still works, cache rebuilt
    ASSERT_TRUE(got.ok()) << got.status();
  }
  // A truncated file is ignored too.
  std::filesystem::resize_file(path, 40);
  {
    auto b = MakeVulkan(dir.path());
    ASSERT_TRUE(b.ok());
    auto* d = static_cast<VulkanDevice*>((*b)->devices()[0]);
    EXPECT_EQ(d->pipelines().cache_state(), PipelineManager::CacheState::kRejected);
  }
}

// ---- the SPIR-V kernel cache ----

class MemoryBinaryCache final : public backend::KernelBinaryCache {
 public:
  std::optional<std::string> Lookup(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }
  void Store(const std::string& key, std::string_view binary) override {
    absl::MutexLock lock(&mu_);
    entries_[key] = std::string(binary);
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return entries_.size();
  }
  void CorruptAll() {
    absl::MutexLock lock(&mu_);
    for (auto& [k, v] : entries_) v = "not spir-v";
  }
  std::string AnyKey() {
    absl::MutexLock lock(&mu_);
    return entries_.empty() ? "" : entries_.begin()->first;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> entries_;
};

TEST(VulkanKernelCacheTest, SecondPrepareHitsAndOtherDevicesReuseBinaries) {
  if (SharedDevice() == nullptr) GTEST_SKIP() << "no Vulkan device available";
  MemoryBinaryCache cache;
  KernelSpec gelu = UnarySpec(v1::UNARY_GELU, v1::DTYPE_F32, {3, 7});
  {
    auto b = MakeVulkan();
    ASSERT_TRUE(b.ok());
    backend::Device* d = (*b)->devices()[0];
    backend::PrepareContext first;
    first.binaries = &cache;
    auto k1 = d->PrepareKernel(gelu, first);
    ASSERT_TRUE(k1.ok()) << k1.status();
    EXPECT_EQ(first.kernel_cache_misses, 1);
    EXPECT_EQ(first.kernel_cache_hits, 0);
    EXPECT_EQ(cache.size(), 1u);
    EXPECT_EQ(cache.AnyKey().rfind("vk-spirv-", 0), 0u);
    EXPECT_EQ((*k1)->implementation(), "spirv:unary_gelu_f32");
    backend::PrepareContext second;
    second.binaries = &cache;
    auto k2 = d->PrepareKernel(gelu, second);
    ASSERT_TRUE(k2.ok());
    EXPECT_EQ(second.kernel_cache_hits, 1);
    EXPECT_EQ(second.kernel_cache_misses, 0);
    // Another shape is another kernel.
    backend::PrepareContext third;
    third.binaries = &cache;
    ASSERT_TRUE(d->PrepareKernel(UnarySpec(v1::UNARY_GELU, v1::DTYPE_F32, {5}), third).ok());
    EXPECT_EQ(third.kernel_cache_misses, 1);
    EXPECT_EQ(cache.size(), 2u);
  }
  {
    // A fresh backend (empty memo) finds the binary in the engine's cache.
    auto b = MakeVulkan();
    ASSERT_TRUE(b.ok());
    backend::PrepareContext ctx;
    ctx.binaries = &cache;
    auto k = (*b)->devices()[0]->PrepareKernel(gelu, ctx);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(ctx.kernel_cache_hits, 1);
    EXPECT_EQ(ctx.kernel_cache_misses, 0);
    auto got = RunSpec(*(*b)->devices()[0], gelu, {Bytes(Iota(21, 0.1f))});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NEAR(Values<float>((*got)[0])[10], 0.841344746f, 1e-6f);  // gelu(1.0)
  }
  {
    // A corrupt entry is recompiled and overwritten, never trusted.
    cache.CorruptAll();
    auto b = MakeVulkan();
    ASSERT_TRUE(b.ok());
    backend::PrepareContext ctx;
    ctx.binaries = &cache;
    ASSERT_TRUE((*b)->devices()[0]->PrepareKernel(gelu, ctx).ok());
    EXPECT_EQ(ctx.kernel_cache_misses, 1);
    backend::PrepareContext again;
    again.binaries = &cache;
    auto b2 = MakeVulkan();
    ASSERT_TRUE(b2.ok());
    ASSERT_TRUE((*b2)->devices()[0]->PrepareKernel(gelu, again).ok());
    EXPECT_EQ(again.kernel_cache_hits, 1);
  }
}

TEST(VulkanKernelCacheTest, KeyCoversSourceAndDevice) {
  REQUIRE_DEVICE(d);
  ShaderCompiler& c = d->shaders();
  const std::string k1 = c.CacheKey("void main() {}");
  EXPECT_EQ(k1, c.CacheKey("void main() {}"));
  EXPECT_NE(k1, c.CacheKey("void main() { }"));
  EXPECT_EQ(k1.size(), std::string("vk-spirv-").size() + 64);
  auto other = ShaderCompiler::Create("another device");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(k1, (*other)->CacheKey("void main() {}"));
}

// ---- a few kernels end to end (the conformance suite covers every family) ----

TEST(VulkanKernelTest, MatMulSoftmaxNorm) {
  REQUIRE_DEVICE(d);
  const int64_t m = 33, k = 47, n = 65;
  std::vector<float> a(m * k), b(k * n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  KernelSpec mm = Spec(v1::OP_MATMUL, {{v1::DTYPE_F32, {m, k}}, {v1::DTYPE_F32, {k, n}}},
                       {{v1::DTYPE_F32, {m, n}}});
  auto got = RunSpec(*d, mm, {Bytes(a), Bytes(b)});
  ASSERT_TRUE(got.ok()) << got.status();
  const auto c = Values<float>((*got)[0]);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += double(a[i * k + p]) * b[p * n + j];
      ASSERT_NEAR(c[i * n + j], want, 2e-5) << i << "," << j;
    }
  }
  KernelSpec sm = Spec(v1::OP_SOFTMAX, {{v1::DTYPE_F32, {m, k}}}, {{v1::DTYPE_F32, {m, k}}});
  got = RunSpec(*d, sm, {Bytes(a)});
  ASSERT_TRUE(got.ok()) << got.status();
  const auto p = Values<float>((*got)[0]);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[i * k + j];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  KernelSpec ln = Spec(v1::OP_LAYER_NORM, {{v1::DTYPE_F32, {m, k}}}, {{v1::DTYPE_F32, {m, k}}});
  got = RunSpec(*d, ln, {Bytes(a)});
  ASSERT_TRUE(got.ok()) << got.status();
  const auto y = Values<float>((*got)[0]);
  double mean = 0, sq = 0;
  for (int64_t j = 0; j < k; ++j) mean += y[j];
  for (int64_t j = 0; j < k; ++j) sq += y[j] * y[j];
  EXPECT_NEAR(mean / k, 0.0, 1e-5);
  EXPECT_NEAR(sq / k, 1.0, 1e-3);  // epsilon makes it slightly below 1
}

TEST(VulkanKernelTest, MatVecWithEpilogueUsesSubgroups) {
  REQUIRE_DEVICE(d);
  if (!d->caps().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  // Decoding: x [2, 1, K] @ W^T (W [N, K]) + bias, then gelu.
  const int64_t k = 300, n = 40;
  std::vector<float> x(2 * k), w(n * k), bias(n);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng) * 0.1f;
  for (float& v : bias) v = u(rng);
  KernelSpec spec =
      Spec(v1::OP_FUSED_MATMUL,
           {{v1::DTYPE_F32, {2, 1, k}}, {v1::DTYPE_F32, {n, k}}, {v1::DTYPE_F32, {n}}},
           {{v1::DTYPE_F32, {2, 1, n}}});
  auto* f = spec.attrs.mutable_fused_matmul();
  f->set_transpose_b(true);
  f->set_has_bias(true);
  f->set_activation(v1::UNARY_GELU);
  backend::PrepareContext ctx;
  auto kernel = d->PrepareKernel(spec, ctx);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->implementation(), "spirv:matvec_f32+bias+UNARY_GELU");
  auto got = RunSpec(*d, spec, {Bytes(x), Bytes(w), Bytes(bias)});
  ASSERT_TRUE(got.ok()) << got.status();
  const auto y = Values<float>((*got)[0]);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = bias[j];
      for (int64_t p = 0; p < k; ++p) dot += double(x[b * k + p]) * w[j * k + p];
      const double want = 0.5 * dot * std::erfc(-dot / std::sqrt(2.0));
      EXPECT_NEAR(y[b * n + j], want, 1e-5) << b << "," << j;
    }
  }
}

// The f16 cooperative-matrix kernel's tiling (staging, double buffering, tile
// order, edges, transposes, batches, epilogue) through its emulation, which
// runs without cooperative matrices (on a device that has them, the real
// kernel runs). Tiles that fit lavapipe's 32 KiB of shared memory.
TEST(VulkanKernelTest, CoopMatMulTilingEmulated) {
  REQUIRE_DEVICE(d);
  if (!d->caps().storage16 || !d->caps().vulkan_memory_model) GTEST_SKIP() << "no f16 storage";
  struct Case {
    int64_t batch, m, n, k;
    bool ta, tb, bias, residual;
    v1::UnaryKind act;
    bool b_batched;
  };
  const Case cases[] = {
      {1, 80, 144, 48, false, false, true, true, v1::UNARY_GELU_TANH, false},
      {3, 48, 32, 64, true, true, false, false, v1::UNARY_KIND_UNSPECIFIED, true},
      {2, 64, 48, 16, true, false, true, false, v1::UNARY_RELU, false},
      {1, 16, 208, 80, false, true, false, true, v1::UNARY_KIND_UNSPECIFIED, false},
  };
  const char* tiles[] = {"32x32x32x2x2x1", "64x128x32x2x2x8", "128x64x32x2x4x2x2x1",
                         "64x64x16x2x2x3", "64x64x64x2x2x8x1x1"};
  setenv("KILN_VULKAN_COOP_EMULATE", "1", 1);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  auto f16 = [&](int64_t count) {
    std::vector<uint16_t> v(count);
    for (uint16_t& x : v) x = FloatToHalf(u(rng));
    return v;
  };
  for (const char* tile : tiles) {
    setenv("KILN_VULKAN_COOP_TILE", tile, 1);
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(tile, " batch ", c.batch, " ", c.m, "x", c.n, "x", c.k,
                                c.ta ? " ta" : "", c.tb ? " tb" : ""));
      const Dims a_dims = c.ta ? Dims{c.batch, c.k, c.m} : Dims{c.batch, c.m, c.k};
      Dims b_dims = c.tb ? Dims{c.n, c.k} : Dims{c.k, c.n};
      if (c.b_batched) b_dims.insert(b_dims.begin(), c.batch);
      const std::vector<uint16_t> a = f16(c.batch * c.m * c.k);
      const std::vector<uint16_t> b = f16((c.b_batched ? c.batch : 1) * c.k * c.n);
      const std::vector<uint16_t> bias = f16(c.n), res = f16(c.batch * c.m * c.n);
      std::vector<TensorDesc> inputs = {{v1::DTYPE_F16, a_dims}, {v1::DTYPE_F16, b_dims}};
      std::vector<std::string> bytes = {Bytes(a), Bytes(b)};
      if (c.bias) inputs.push_back({v1::DTYPE_F16, {c.n}}), bytes.push_back(Bytes(bias));
      if (c.residual) {
        inputs.push_back({v1::DTYPE_F16, {c.batch, c.m, c.n}});
        bytes.push_back(Bytes(res));
      }
      KernelSpec spec = Spec(v1::OP_FUSED_MATMUL, inputs, {{v1::DTYPE_F16, {c.batch, c.m, c.n}}});
      auto* f = spec.attrs.mutable_fused_matmul();
      f->set_transpose_a(c.ta);
      f->set_transpose_b(c.tb);
      f->set_has_bias(c.bias);
      f->set_has_residual(c.residual);
      f->set_activation(c.act);
      backend::PrepareContext ctx;
      auto kernel = d->PrepareKernel(spec, ctx);
      ASSERT_TRUE(kernel.ok()) << kernel.status();
      const std::string bm_bn(tile, std::strchr(std::strchr(tile, 'x') + 1, 'x'));
      // The emulation here; the real kernel on a device with cooperative matrices.
      const std::string impl = (*kernel)->implementation();
      EXPECT_TRUE(
          absl::StartsWith(impl, absl::StrCat("spirv:matmul_coopmat_emulated_f16_", bm_bn)) ||
          absl::StartsWith(impl, absl::StrCat("spirv:matmul_coopmat_f16_", bm_bn)))
          << impl;
      auto got = RunSpec(*d, spec, bytes, &ctx);
      ASSERT_TRUE(got.ok()) << got.status();
      const auto y = Values<uint16_t>((*got)[0]);
      for (int64_t bi = 0; bi < c.batch; ++bi) {
        const int64_t ao = bi * c.m * c.k, bo = c.b_batched ? bi * c.k * c.n : 0;
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < c.n; ++j) {
            double v = 0;
            for (int64_t p = 0; p < c.k; ++p) {
              v += double(HalfToFloat(a[ao + (c.ta ? p * c.m + i : i * c.k + p)])) *
                   HalfToFloat(b[bo + (c.tb ? j * c.k + p : p * c.n + j)]);
            }
            const int64_t at = (bi * c.m + i) * c.n + j;
            if (c.bias) v += HalfToFloat(bias[j]);
            if (c.act == v1::UNARY_RELU) v = std::max(v, 0.0);
            if (c.act == v1::UNARY_GELU_TANH) {
              v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
            }
            if (c.residual) v += HalfToFloat(res[at]);
            ASSERT_NEAR(HalfToFloat(y[at]), v, 2e-3 * (1 + std::fabs(v)) + 1e-3)
                << "batch " << bi << " at " << i << "," << j;
          }
        }
      }
    }
  }
  unsetenv("KILN_VULKAN_COOP_TILE");
  unsetenv("KILN_VULKAN_COOP_EMULATE");
}

TEST(VulkanKernelTest, AttentionCausalMatchesNaive) {
  REQUIRE_DEVICE(d);
  const int64_t sq = 5, sk = 9, dh = 8;
  std::vector<float> q(2 * sq * dh), kk(sk * dh), v(sk * dh);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : q) x = u(rng);
  for (float& x : kk) x = u(rng);
  for (float& x : v) x = u(rng);
  // Two query heads share one kv head (GQA); causal, bottom-right aligned.
  KernelSpec spec = Spec(v1::OP_ATTENTION,
                         {{v1::DTYPE_F32, {1, 2, sq, dh}},
                          {v1::DTYPE_F32, {1, 1, sk, dh}},
                          {v1::DTYPE_F32, {1, 1, sk, dh}}},
                         {{v1::DTYPE_F32, {1, 2, sq, dh}}});
  spec.attrs.mutable_attention()->set_mask(v1::MASK_CAUSAL);
  auto got = RunSpec(*d, spec, {Bytes(q), Bytes(kk), Bytes(v)});
  ASSERT_TRUE(got.ok()) << got.status();
  const auto o = Values<float>((*got)[0]);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < sq; ++i) {
      std::vector<double> w(sk, 0);
      double mx = -1e30, sum = 0;
      const int64_t pos = i + sk - sq;
      for (int64_t j = 0; j <= pos; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < dh; ++x) dot += q[(h * sq + i) * dh + x] * kk[j * dh + x];
        w[j] = dot / std::sqrt(double(dh));
        mx = std::max(mx, w[j]);
      }
      for (int64_t j = 0; j <= pos; ++j) sum += (w[j] = std::exp(w[j] - mx));
      for (int64_t x = 0; x < dh; ++x) {
        double acc = 0;
        for (int64_t j = 0; j <= pos; ++j) acc += w[j] * v[j * dh + x];
        EXPECT_NEAR(o[(h * sq + i) * dh + x], acc / sum, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace kiln::vulkan
