// The device contract suite (DESIGN.md section 5, as IREE's hal/cts): every
// promise of backends/backend.h checked on every registered device — the
// facts a device reports (kind, concurrency, alignment, cost corrections),
// memory, copies at the device's alignment, in-order streams, events, bounded
// waits and their fault status, the claim/prepare agreement, and foreign
// streams refused. A new backend passes this before the engine relies on it.
//
// KILN_CTS_GPU_ONLY (the ctest label `gpu`) restricts it to hardware GPUs,
// skipped cleanly where there is none; KILN_CTS_DEVICE=<id> to one device
// (a filter that matches no device fails).
#include <gtest/gtest.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/backend.h"
#include "engine/runtime/device_registry.h"

namespace kiln::backend {
namespace {

struct Registered {
  std::unique_ptr<runtime::DeviceRegistry> registry;
  std::vector<Device*> devices;
};

// KILN_TEST_ISOLATION=process: every backend but the CPU's in device worker
// processes (runtime/worker_client.h), the contract checked across the
// process boundary.
const Registered& All() {
  static Registered* r = [] {
    auto* out = new Registered();
    runtime::RegistryOptions ro;
    const char* iso = std::getenv("KILN_TEST_ISOLATION");
    ro.isolation = iso != nullptr && std::string(iso) == "process" ? runtime::DeviceIsolation::kProcess
                                                                   : runtime::DeviceIsolation::kThread;
    auto reg = runtime::DeviceRegistry::Create(ro);
    if (!reg.ok()) return out;  // no CPU backend: ThereIsACpuDevice fails
    out->devices = (*reg)->devices();
    out->registry = std::move(reg).value();
    return out;
  }();
  return *r;
}

// The devices this run covers (see the header comment).
std::vector<Device*> Covered() {
  std::vector<Device*> out;
  const char* only = std::getenv("KILN_CTS_DEVICE");
  const bool gpu_only = std::getenv("KILN_CTS_GPU_ONLY") != nullptr;
  for (Device* d : All().devices) {
    if (only != nullptr && d->info().id != only) continue;
    if (gpu_only && d->info().kind != DeviceKind::kGpu) continue;
    out.push_back(d);
  }
  return out;
}

#define FOR_EACH_DEVICE(d)                                                           \
  const std::vector<Device*> covered_devices = Covered();                            \
  if (std::getenv("KILN_CTS_DEVICE") != nullptr) {                                   \
    ASSERT_FALSE(covered_devices.empty())                                            \
        << "KILN_CTS_DEVICE=" << std::getenv("KILN_CTS_DEVICE") << " names no device"; \
  }                                                                                  \
  if (covered_devices.empty()) GTEST_SKIP() << "no device to cover";                 \
  for (Device * d : covered_devices)                                                 \
    if (SCOPED_TRACE(d->info().id); true)

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(DeviceContract, ThereIsACpuDevice) {
  bool cpu = false;
  for (Device* d : All().devices) cpu = cpu || d->info().backend == "cpu";
  EXPECT_TRUE(cpu) << "the CPU backend is the guaranteed fallback and must register";
}

TEST(DeviceContract, ReportsItsFacts) {
  std::set<std::string> ids;
  FOR_EACH_DEVICE(d) {
    const DeviceInfo& i = d->info();
    EXPECT_FALSE(i.id.empty());
    EXPECT_TRUE(ids.insert(i.id).second) << "duplicate id " << i.id;
    EXPECT_TRUE(absl::StartsWith(i.id, i.backend + ":")) << i.id << " / " << i.backend;
    EXPECT_FALSE(i.identity.empty());
    EXPECT_GE(i.max_concurrent_runs, 1);
    EXPECT_GE(i.buffer_alignment, 1);
    EXPECT_EQ(i.buffer_alignment & (i.buffer_alignment - 1), 0) << "not a power of two";
    EXPECT_GE(i.memory_bytes, 0);
    for (const auto& [family, eff] : i.roofline_efficiency) {
      EXPECT_TRUE(eff > 0 && eff <= 1) << family << " = " << eff;
      static const std::set<std::string> kFamilies = {"matmul", "conv",  "attention", "elementwise",
                                                      "reduce", "norm",  "shape",     "other"};
      EXPECT_TRUE(kFamilies.contains(family)) << "unknown op family " << family;
    }
    EXPECT_GT(i.profile.peak_gflops_f32, 0);
    EXPECT_GT(i.profile.bandwidth_gbps, 0);
    if (i.host_memory) {
      EXPECT_EQ(i.kind, DeviceKind::kCpu);
    }
  }
}

TEST(DeviceContract, MemoryRoundTripsAndIsAccounted) {
  FOR_EACH_DEVICE(d) {
    EXPECT_FALSE(d->Allocate(-1).ok());
    auto empty = d->Allocate(0);
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ((*empty)->size(), 0);
    const int64_t before = d->memory_in_use();
    const size_t n = 1 << 16;
    {
      auto buf = d->Allocate(static_cast<int64_t>(n));
      ASSERT_TRUE(buf.ok()) << buf.status();
      EXPECT_GE(d->memory_in_use(), before + static_cast<int64_t>(n));
      auto s = d->CreateStream();
      ASSERT_TRUE(s.ok()) << s.status();
      const std::vector<uint8_t> in = Pattern(n, 3);
      std::vector<uint8_t> out(n, 0);
      const BufferView v{buf->get(), 0, static_cast<int64_t>(n)};
      // CopyToDevice has read `src` when it returns: overwriting it at once
      // must not reach the device.
      std::vector<uint8_t> src = in;
      ASSERT_TRUE(d->CopyToDevice(**s, src.data(), v).ok());
      std::fill(src.begin(), src.end(), 0xEE);
      ASSERT_TRUE(d->CopyToHost(**s, v, out.data()).ok());
      ASSERT_TRUE((*s)->Synchronize().ok());
      EXPECT_EQ(in, out);
      if (d->info().host_memory) {
        EXPECT_NE((*buf)->host_ptr(), nullptr);
      }
    }
    EXPECT_EQ(d->memory_in_use(), before) << "freed memory is no longer counted";
  }
}

// A copy from another device's memory is either direct and right, ordered
// after the source stream's work, or refused UNIMPLEMENTED (the engine then
// stages it through host memory); it never half-works.
TEST(DeviceContract, PeerCopiesAreDirectOrRefused) {
  const std::vector<Device*> devices = Covered();
  if (devices.size() < 2) GTEST_SKIP() << "one device: no peer to copy from";
  for (Device* dst_dev : devices) {
    for (Device* src_dev : All().devices) {
      if (src_dev == dst_dev) continue;
      SCOPED_TRACE(absl::StrCat(src_dev->info().id, " -> ", dst_dev->info().id));
      const int64_t n = 4096;
      auto src = src_dev->Allocate(n);
      auto dst = dst_dev->Allocate(n);
      auto ss = src_dev->CreateStream();
      auto ds = dst_dev->CreateStream();
      ASSERT_TRUE(src.ok() && dst.ok() && ss.ok() && ds.ok());
      const std::vector<uint8_t> want = Pattern(n, 5);
      ASSERT_TRUE(src_dev->CopyToDevice(**ss, want.data(), BufferView{src->get(), 0, n}).ok());
      const absl::Status s = dst_dev->CopyFromPeer(**ds, *src_dev, **ss, BufferView{src->get(), 0, n},
                                                   BufferView{dst->get(), 0, n});
      if (s.code() == absl::StatusCode::kUnimplemented) {
        EXPECT_TRUE(absl::StrContains(s.message(), src_dev->info().id)) << s;
        EXPECT_TRUE((*ss)->Synchronize().ok());
        continue;
      }
      ASSERT_TRUE(s.ok()) << s;
      std::vector<uint8_t> got(n);
      ASSERT_TRUE(dst_dev->CopyToHost(**ds, BufferView{dst->get(), 0, n}, got.data()).ok());
      ASSERT_TRUE((*ds)->Synchronize().ok());
      ASSERT_TRUE((*ss)->Synchronize().ok());
      EXPECT_EQ(got, want);
    }
  }
}

// Copies between ranges that start on the device's buffer alignment (the
// planner's promise), queued in order on one stream: the last write wins.
TEST(DeviceContract, AlignedCopiesRunInStreamOrder) {
  FOR_EACH_DEVICE(d) {
    const int64_t a = d->info().buffer_alignment;
    const int64_t chunk = std::max<int64_t>(a, 256);
    auto buf = d->Allocate(chunk * 4);
    ASSERT_TRUE(buf.ok()) << buf.status();
    auto s = d->CreateStream();
    ASSERT_TRUE(s.ok());
    const std::vector<uint8_t> first = Pattern(chunk, 1), second = Pattern(chunk, 9);
    const BufferView c0{buf->get(), 0, chunk}, c1{buf->get(), chunk, chunk},
        c2{buf->get(), 2 * chunk, chunk}, c3{buf->get(), 3 * chunk, chunk};
    ASSERT_TRUE(d->CopyToDevice(**s, first.data(), c0).ok());
    ASSERT_TRUE(d->CopyOnDevice(**s, c0, c1).ok());   // c1 = first
    ASSERT_TRUE(d->CopyToDevice(**s, second.data(), c0).ok());
    ASSERT_TRUE(d->CopyOnDevice(**s, c0, c2).ok());   // c2 = second
    ASSERT_TRUE(d->CopyOnDevice(**s, c1, c3).ok());   // c3 = first
    std::vector<uint8_t> r1(chunk), r2(chunk), r3(chunk);
    ASSERT_TRUE(d->CopyToHost(**s, c1, r1.data()).ok());
    ASSERT_TRUE(d->CopyToHost(**s, c2, r2.data()).ok());
    ASSERT_TRUE(d->CopyToHost(**s, c3, r3.data()).ok());
    ASSERT_TRUE((*s)->Synchronize().ok());
    EXPECT_EQ(r1, first);
    EXPECT_EQ(r2, second);
    EXPECT_EQ(r3, first);
  }
}

TEST(DeviceContract, EventsMeasureForwardAndRefuseOtherStreams) {
  FOR_EACH_DEVICE(d) {
    auto s = d->CreateStream();
    auto other = d->CreateStream();
    ASSERT_TRUE(s.ok() && other.ok());
    const int64_t n = 1 << 20;
    auto buf = d->Allocate(2 * n);
    ASSERT_TRUE(buf.ok());
    auto e0 = (*s)->Record();
    ASSERT_TRUE(e0.ok()) << e0.status();
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(d->CopyOnDevice(**s, {buf->get(), 0, n}, {buf->get(), n, n}).ok());
    }
    auto e1 = (*s)->Record();
    ASSERT_TRUE(e1.ok()) << e1.status();
    auto foreign = (*other)->Record();
    ASSERT_TRUE(foreign.ok());
    ASSERT_TRUE((*s)->Synchronize().ok());
    ASSERT_TRUE((*other)->Synchronize().ok());
    auto us = (*e1)->MicrosSince(**e0);
    ASSERT_TRUE(us.ok()) << us.status();
    EXPECT_GE(*us, 0);
    EXPECT_LT(*us, 60e6);
    EXPECT_EQ((*e1)->MicrosSince(**foreign).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// A bounded wait either sees the work finish or reports a device fault naming
// the device (and stays failed); it never hangs and never says anything else.
TEST(DeviceContract, BoundedWaitsFinishOrFaultCleanly) {
  FOR_EACH_DEVICE(d) {
    auto s = d->CreateStream();
    ASSERT_TRUE(s.ok());
    const int64_t n = int64_t{32} << 20;
    auto buf = d->Allocate(2 * n);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_TRUE((*s)->SynchronizeFor(absl::Seconds(60)).ok());  // nothing queued
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(d->CopyOnDevice(**s, {buf->get(), 0, n}, {buf->get(), n, n}).ok());
    }
    const absl::Time t0 = absl::Now();
    const absl::Status st = (*s)->SynchronizeFor(absl::Microseconds(1));
    EXPECT_LT(absl::Now() - t0, absl::Seconds(30)) << "the bound was not honoured";
    if (st.ok()) continue;  // finished within it (devices that complete at enqueue)
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_EQ(FaultedDevice(st), d->info().id) << st;
    EXPECT_EQ((*s)->Synchronize().code(), absl::StatusCode::kUnavailable) << "not sticky";
    (void)buf->release();  // the device may still be writing it
  }
}

// Stream::Wait orders work across two streams of one device: B copies what A
// wrote once it waits for A's event (handed to the device with FlushWork).
// An event of another device is refused.
TEST(DeviceContract, StreamWaitOrdersAcrossStreams) {
  FOR_EACH_DEVICE(d) {
    auto a = d->CreateStream();
    auto b = d->CreateStream();
    ASSERT_TRUE(a.ok() && b.ok());
    const int64_t n = int64_t{8} << 20;
    auto x = d->Allocate(n), y = d->Allocate(n), z = d->Allocate(n);
    ASSERT_TRUE(x.ok() && y.ok() && z.ok());
    const std::vector<uint8_t> data = Pattern(static_cast<size_t>(n), 5);
    ASSERT_TRUE(d->CopyToDevice(**a, data.data(), {x->get(), 0, n}).ok());
    ASSERT_TRUE((*a)->Synchronize().ok());
    for (int i = 0; i < 3; ++i) {  // enough work on A that B would overtake it
      ASSERT_TRUE(d->CopyOnDevice(**a, {x->get(), 0, n}, {y->get(), 0, n}).ok());
    }
    auto done = (*a)->Record();
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE((*a)->FlushWork().ok());
    ASSERT_TRUE((*b)->Wait(**done).ok());
    ASSERT_TRUE(d->CopyOnDevice(**b, {y->get(), 0, n}, {z->get(), 0, n}).ok());
    std::vector<uint8_t> back(static_cast<size_t>(n));
    ASSERT_TRUE(d->CopyToHost(**b, {z->get(), 0, n}, back.data()).ok());
    ASSERT_TRUE((*b)->Synchronize().ok());
    ASSERT_TRUE((*a)->Synchronize().ok());
    EXPECT_TRUE(back == data) << "B read y before A's copies finished";
    EXPECT_TRUE((*a)->Wait(**done).ok()) << "waiting on one's own event is in order";
    // An event whose work is not yet handed to the device: ordered at once
    // where enqueued work is done (the CPU), refused with a way out elsewhere.
    ASSERT_TRUE(d->CopyOnDevice(**a, {x->get(), 0, n}, {y->get(), 0, n}).ok());
    auto pending = (*a)->Record();
    ASSERT_TRUE(pending.ok());
    const absl::Status w = (*b)->Wait(**pending);
    EXPECT_TRUE(w.ok() || (w.code() == absl::StatusCode::kFailedPrecondition &&
                           absl::StrContains(w.message(), "Flush")))
        << w;
    ASSERT_TRUE((*a)->Synchronize().ok());
    for (Device* other : All().devices) {
      if (other == d) continue;
      auto os = other->CreateStream();
      ASSERT_TRUE(os.ok());
      auto oe = (*os)->Record();
      ASSERT_TRUE(oe.ok());
      EXPECT_EQ((*b)->Wait(**oe).code(), absl::StatusCode::kInvalidArgument) << other->info().id;
    }
  }
}

TEST(DeviceContract, ClaimsAndPreparedKernelsAgree) {
  KernelSpec neg;
  neg.name = "cts_neg";
  neg.label = "kernel cts_neg";
  neg.op = v1::OP_UNARY;
  neg.attrs.mutable_unary()->set_kind(v1::UNARY_NEG);
  neg.inputs = {{v1::DTYPE_F32, {8}}};
  neg.outputs = {{v1::DTYPE_F32, {8}}};
  FOR_EACH_DEVICE(d) {
    const Claim claim = d->Supports(neg);
    PrepareContext ctx;
    auto k = d->PrepareKernel(neg, ctx);
    if (!claim.native) {
      EXPECT_FALSE(claim.reason.empty()) << "a refusal says why";
      ASSERT_FALSE(k.ok());
      EXPECT_EQ(k.status().code(), absl::StatusCode::kUnimplemented) << k.status();
      continue;
    }
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_FALSE((*k)->implementation().empty());
    auto s = d->CreateStream();
    auto in = d->Allocate(32);
    auto out = d->Allocate(32);
    ASSERT_TRUE(s.ok() && in.ok() && out.ok());
    std::vector<float> x(8), y(8, 0);
    std::iota(x.begin(), x.end(), 1.0f);
    const BufferView vi{in->get(), 0, 32}, vo{out->get(), 0, 32};
    ASSERT_TRUE(d->CopyToDevice(**s, x.data(), vi).ok());
    ASSERT_TRUE((*k)->Launch(**s, {&vi, 1}, {&vo, 1}).ok());
    ASSERT_TRUE(d->CopyToHost(**s, vo, y.data()).ok());
    ASSERT_TRUE((*s)->Synchronize().ok());
    for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], -x[i]);
    // Another device's stream is refused, not used.
    for (Device* other : All().devices) {
      if (other == d) continue;
      auto foreign = other->CreateStream();
      ASSERT_TRUE(foreign.ok());
      EXPECT_FALSE((*k)->Launch(**foreign, {&vi, 1}, {&vo, 1}).ok())
          << "launched on " << other->info().id << "'s stream";
    }
  }
}

}  // namespace
}  // namespace kiln::backend
