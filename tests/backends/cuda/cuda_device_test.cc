// The CUDA backend on a real GPU (the GPU machine): device discovery, copies
// through pinned staging, events, bounded waits that turn a hung kernel into
// a device fault, the kernel cache (a warm start compiles nothing), and
// cuBLASLt matmuls with every epilogue path against a double reference.
// Every test skips cleanly where no CUDA device is present.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"
#include "backends/capture.h"
#include "backends/host_memory.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/cudnn_api.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/prepare_cache.h"
#include "base/half.h"
#include "tests/backends/cuda/cuda_test_backend.h"

namespace kiln::cuda {
namespace {

using backend::BufferView;
using backend::KernelSpec;

using testing::MakeBackend;

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
  // The keys that start with `prefix` ("cudnn-plan-", "cublaslt-algo-").
  std::vector<std::string> Keys(const std::string& prefix) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [key, value] : entries_) {
      if (absl::StartsWith(key, prefix)) out.push_back(key);
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> entries_ ABSL_GUARDED_BY(mu_);
};

struct AttnCase;

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeBackend();
    if (backend_ == nullptr) GTEST_SKIP() << "no CUDA device";
    dev_ = backend_->devices()[0];
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(s).value();
  }

  std::unique_ptr<backend::Buffer> Upload(const void* data, int64_t bytes) {
    auto b = dev_->Allocate(bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(dev_->CopyToDevice(*stream_, data, {b->get(), 0, bytes}).ok());
    return std::move(b).value();
  }
  std::vector<char> Download(backend::Buffer& b, int64_t bytes, int64_t offset = 0) {
    std::vector<char> out(bytes);
    EXPECT_TRUE(dev_->CopyToHost(*stream_, {&b, offset, bytes}, out.data()).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());
    return out;
  }

  // Replaces the fixture's backend with one whose device uses no cuDNN
  // (KILN_CUDNN=0 while it is created): tests of Kiln's own kernels.
  void UseKilnKernelsOnly() {
    stream_.reset();
    backend_.reset();
    setenv("KILN_CUDNN", "0", 1);
    backend_ = MakeBackend();
    unsetenv("KILN_CUDNN");
    ASSERT_NE(backend_, nullptr);
    dev_ = backend_->devices()[0];
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(s).value();
  }
  void CheckAttention(const AttnCase& c, int seed);

  std::unique_ptr<backend::Backend> backend_;
  backend::Device* dev_ = nullptr;
  std::unique_ptr<backend::Stream> stream_;
};

TEST_F(CudaDeviceTest, DiscoveryAndProfile) {
  const backend::DeviceInfo& info = dev_->info();
  EXPECT_EQ(info.id, "cuda:0");
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_EQ(info.kind, backend::DeviceKind::kGpu);
  EXPECT_EQ(info.arch.rfind("sm_", 0), 0u) << info.arch;
  EXPECT_GT(info.memory_bytes, int64_t{1} << 30);
  EXPECT_GT(info.profile.peak_gflops_f32, 0);
  EXPECT_GT(info.profile.bandwidth_gbps, 0);
  EXPECT_NE(info.identity.find("uuid="), std::string::npos);
  std::printf("%s: %s %s, %s, %.0f GiB, nominal %.0f GFLOP/s f32, %.0f GB/s\n", info.id.c_str(),
              info.name.c_str(), info.arch.c_str(), info.driver_version.c_str(),
              info.memory_bytes / double(1 << 30), info.profile.peak_gflops_f32,
              info.profile.bandwidth_gbps);
}

TEST_F(CudaDeviceTest, CopiesRoundTripThroughStaging) {
  for (int64_t bytes : {int64_t{1}, int64_t{4096} + 3, int64_t{3} << 20, int64_t{80} << 20}) {
    std::vector<char> data(bytes);
    for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 7 + bytes);
    auto buf = Upload(data.data(), bytes);
    // The caller may reuse its memory at once.
    std::fill(data.begin(), data.end(), 0);
    std::vector<char> got = Download(*buf, bytes);
    for (int64_t i = 0; i < bytes; i += std::max<int64_t>(1, bytes / 4099)) {
      ASSERT_EQ(got[i], static_cast<char>(i * 7 + bytes)) << bytes << " bytes, at " << i;
    }
  }
}

// The device worker's staging region: registered host memory is copied to
// and from directly (DMA on the stream, no staging); a copy that straddles
// the range's end stages as before; overlapping registrations are refused.
TEST_F(CudaDeviceTest, RegisteredHostMemoryCopiesDirectly) {
  const int64_t bytes = int64_t{8} << 20;
  void* mem = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  char* host = static_cast<char*>(mem);
  auto* registrar = dynamic_cast<backend::HostMemoryRegistrar*>(dev_);
  ASSERT_NE(registrar, nullptr);
  {
    auto reg = registrar->RegisterHostMemory(host, bytes / 2);
    ASSERT_TRUE(reg.ok()) << reg.status();
    auto again = registrar->RegisterHostMemory(host + 4096, 4096);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
    const int64_t n = (int64_t{3} << 20) + 5;  // inside the registered half
    for (int64_t i = 0; i < n; ++i) host[i] = static_cast<char>(i * 13 + 1);
    auto buf = dev_->Allocate(n);
    ASSERT_TRUE(buf.ok()) << buf.status();
    ASSERT_TRUE(dev_->CopyToDevice(*stream_, host, {buf->get(), 0, n}).ok());
    // Into the registered range at another offset, and across its end.
    char* back = host + (bytes / 2) - 4096;
    ASSERT_TRUE(dev_->CopyToHost(*stream_, {buf->get(), 0, 4096}, back).ok());
    ASSERT_TRUE(dev_->CopyToHost(*stream_, {buf->get(), 0, n}, host + bytes / 2 - 100).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    // The second copy's destination starts 100 bytes before the first one's
    // end and, later in stream order, overwrites those 100 bytes.
    const char* straddle = host + bytes / 2 - 100;
    for (int64_t i = 0; i < 4096 - 100; ++i) {
      ASSERT_EQ(back[i], static_cast<char>(i * 13 + 1)) << i;
    }
    for (int64_t i = 0; i < n; i += 997) {
      ASSERT_EQ(straddle[i], static_cast<char>(i * 13 + 1)) << i;
    }
    // Registered sources: the bytes are read by the time the sync passes.
    ASSERT_TRUE(dev_->CopyToDevice(*stream_, host + 64, {buf->get(), 0, 4096}).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    std::vector<char> got = Download(**buf, 4096);
    for (int64_t i = 0; i < 4096; ++i) ASSERT_EQ(got[i], static_cast<char>((i + 64) * 13 + 1)) << i;
  }
  // Unregistered again: the same range can be registered anew.
  auto reg = registrar->RegisterHostMemory(host, bytes);
  EXPECT_TRUE(reg.ok()) << reg.status();
  if (reg.ok()) reg->reset();
  ::munmap(mem, static_cast<size_t>(bytes));
}

TEST_F(CudaDeviceTest, OverlappingDeviceCopy) {
  std::vector<int32_t> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = i;
  auto buf = Upload(v.data(), 4000);
  ASSERT_TRUE(dev_->CopyOnDevice(*stream_, {buf.get(), 0, 3600}, {buf.get(), 400, 3600}).ok());
  std::vector<char> got = Download(*buf, 4000);
  const auto* g = reinterpret_cast<const int32_t*>(got.data());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(g[i], i);
  for (int i = 100; i < 1000; ++i) ASSERT_EQ(g[i], i - 100) << i;
}

TEST_F(CudaDeviceTest, BadViewsAndForeignObjectsAreErrors) {
  auto buf = dev_->Allocate(64);
  ASSERT_TRUE(buf.ok());
  char host[128] = {};
  EXPECT_EQ(dev_->CopyToDevice(*stream_, host, {buf->get(), 32, 64}).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(dev_->Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
  std::unique_ptr<backend::Backend> other = MakeBackend();
  auto foreign = other->devices()[0]->CreateStream();
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(dev_->CopyToDevice(**foreign, host, {buf->get(), 0, 8}).code(),
            absl::StatusCode::kInvalidArgument);
  auto ev = (*foreign)->Record();
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(stream_->Wait(**ev).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status huge = dev_->Allocate(int64_t{1} << 52).status();
  EXPECT_TRUE(huge.code() == absl::StatusCode::kResourceExhausted ||
              huge.code() == absl::StatusCode::kInvalidArgument)
      << huge;
  EXPECT_NE(huge.message().find("cuda:0"), absl::string_view::npos) << huge;
}

TEST_F(CudaDeviceTest, EventsTimeAndOrderStreams) {
  auto second = dev_->CreateStream();
  ASSERT_TRUE(second.ok());
  std::vector<float> v(1 << 20, 2.0f);
  auto buf = Upload(v.data(), 4 << 20);
  auto e0 = stream_->Record();
  ASSERT_TRUE(e0.ok());
  auto other = dev_->Allocate(4 << 20);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(
      dev_->CopyOnDevice(*stream_, {buf.get(), 0, 4 << 20}, {other->get(), 0, 4 << 20}).ok());
  auto e1 = stream_->Record();
  ASSERT_TRUE(e1.ok());
  ASSERT_TRUE((*second)->Wait(**e1).ok());
  std::vector<float> got(1 << 20);
  ASSERT_TRUE(dev_->CopyToHost(**second, {other->get(), 0, 4 << 20}, got.data()).ok());
  ASSERT_TRUE((*second)->Synchronize().ok());
  EXPECT_EQ(got[12345], 2.0f);
  ASSERT_TRUE(stream_->Synchronize().ok());
  auto us = (*e1)->MicrosSince(**e0);
  ASSERT_TRUE(us.ok()) << us.status();
  EXPECT_GE(*us, 0.0);
}

// A kernel that spins far past the wait's bound: the wait returns a device
// fault naming cuda:0 and the stream stays failed; the device itself is not
// marked (slow is not broken: the engine decides what to restart).
TEST_F(CudaDeviceTest, HungKernelIsADeviceFault) {
  auto* d = dynamic_cast<CudaDevice*>(dev_);
  ASSERT_NE(d, nullptr);
  backend::PrepareContext ctx;
  const std::string src =
      "extern \"C\" __global__ void spin(long long cycles) {\n"
      "  const long long t0 = clock64();\n  while (clock64() - t0 < cycles) {}\n}\n";
  auto fn = LoadFunction(*d, "spin", src, "spin", ctx);
  ASSERT_TRUE(fn.ok()) << fn.status();
  auto* s = dynamic_cast<CudaStream*>(stream_.get());
  long long cycles = 2'000'000'000;  // ~1 s at 2 GHz
  void* args[] = {&cycles};
  ASSERT_TRUE(LaunchKernel(*s, fn->fn, 1, 1, 1, 32, 0, args).ok());
  const absl::Status st = stream_->SynchronizeFor(absl::Milliseconds(20));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(backend::FaultedDevice(st), "cuda:0") << st;
  EXPECT_EQ(stream_->Synchronize().code(), absl::StatusCode::kUnavailable) << "not sticky";
  EXPECT_TRUE(dev_->Allocate(16).ok());
  auto fresh = dev_->CreateStream();
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE((*fresh)->Synchronize().ok());
}

KernelSpec SoftmaxSpec(int64_t rows, int64_t n) {
  KernelSpec s;
  s.name = s.label = "softmax";
  s.op = v1::OP_SOFTMAX;
  s.attrs.mutable_softmax();
  s.inputs = {{v1::DTYPE_F32, {rows, n}}};
  s.outputs = {{v1::DTYPE_F32, {rows, n}}};
  return s;
}

TEST_F(CudaDeviceTest, WarmStartCompilesNothing) {
  MemoryBinaryCache cache;
  backend::PrepareContext cold;
  cold.binaries = &cache;
  ASSERT_TRUE(dev_->PrepareKernel(SoftmaxSpec(3, 50), cold).ok());
  EXPECT_GE(cold.kernel_cache_misses, 1);
  EXPECT_GE(cache.size(), 1u);
  // A new backend (as a restarted worker or kilnd would make) with the same cache.
  std::unique_ptr<backend::Backend> warm_backend = MakeBackend();
  backend::PrepareContext warm;
  warm.binaries = &cache;
  auto k = warm_backend->devices()[0]->PrepareKernel(SoftmaxSpec(3, 50), warm);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(warm.kernel_cache_misses, 0);
  EXPECT_GE(warm.kernel_cache_hits, 1);
  // A corrupt entry is recompiled, not trusted.
  for (int i = 0; i < 1; ++i) {
    MemoryBinaryCache bad;
    backend::PrepareContext c;
    c.binaries = &bad;
    const std::string key =
        CubinCacheKey(KernelSource("softmax.cu"), dynamic_cast<CudaDevice*>(dev_)->caps().arch);
    bad.Store(key, std::string(200, 'x'));
    std::unique_ptr<backend::Backend> fresh = MakeBackend();
    ASSERT_TRUE(fresh->devices()[0]->PrepareKernel(SoftmaxSpec(3, 50), c).ok());
    EXPECT_EQ(c.kernel_cache_misses, 1);
  }
}

// ---- matmuls against a double reference ----

struct MatMulCase {
  std::string name;
  DType dtype;
  Dims a, b;
  bool ta = false, tb = false, bias = false, residual = false;
  v1::UnaryKind act = v1::UNARY_KIND_UNSPECIFIED;
};

double Act(v1::UnaryKind k, double x) {
  switch (k) {
    case v1::UNARY_RELU:
      return x > 0 ? x : 0;
    case v1::UNARY_GELU:
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case v1::UNARY_GELU_TANH:
      return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case v1::UNARY_SILU:
      return x / (1 + std::exp(-x));
    default:
      return x;
  }
}

std::vector<char> Encode(DType dt, const std::vector<double>& v) {
  const int64_t es = ElementSize(dt);
  std::vector<char> out(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == v1::DTYPE_F32) {
      const float f = static_cast<float>(v[i]);
      std::memcpy(&out[i * 4], &f, 4);
    } else {
      const uint16_t h = dt == v1::DTYPE_F16 ? FloatToHalf(static_cast<float>(v[i]))
                                             : FloatToBf16(static_cast<float>(v[i]));
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

double Decode(DType dt, const char* p) {
  if (dt == v1::DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dt == v1::DTYPE_F16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

// Rounds `v` as the dtype stores it (so the reference sees the operands the device sees).
std::vector<double> Random(DType dt, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  const std::vector<char> enc = Encode(dt, v);
  for (int64_t i = 0; i < n; ++i) v[i] = Decode(dt, &enc[i * ElementSize(dt)]);
  return v;
}

int64_t Count(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

TEST_F(CudaDeviceTest, MatMulEpiloguesAndBroadcastBatches) {
  const MatMulCase cases[] = {
      {"plain_f32", v1::DTYPE_F32, {64, 96}, {96, 80}},
      {"ta_tb_f32", v1::DTYPE_F32, {96, 64}, {80, 96}, true, true},
      {"batched_shared_w", v1::DTYPE_F32, {3, 5, 33, 40}, {40, 24}},
      {"broadcast_two_runs", v1::DTYPE_F32, {2, 1, 17, 12}, {1, 3, 12, 9}},
      {"bias_gelu_erf",
       v1::DTYPE_F32,
       {20, 48},
       {48, 64},
       false,
       false,
       true,
       false,
       v1::UNARY_GELU},
      {"bias_gelu_tanh_f32",
       v1::DTYPE_F32,
       {20, 48},
       {48, 64},
       false,
       false,
       true,
       false,
       v1::UNARY_GELU_TANH},
      {"bias_gelu_tanh_lt_bf16",
       v1::DTYPE_BF16,
       {20, 48},
       {48, 64},
       false,
       false,
       true,
       false,
       v1::UNARY_GELU_TANH},
      {"bias_relu_residual",
       v1::DTYPE_F32,
       {4, 20, 48},
       {48, 64},
       false,
       false,
       true,
       true,
       v1::UNARY_RELU},
      {"bias_residual_lt", v1::DTYPE_F32, {20, 48}, {64, 48}, false, true, true, true},
      {"empty_result", v1::DTYPE_F32, {4, 5}, {5, 0}},
      {"silu_bf16",
       v1::DTYPE_BF16,
       {2, 30, 64},
       {2, 64, 40},
       false,
       false,
       false,
       false,
       v1::UNARY_SILU},
      {"bias_f16", v1::DTYPE_F16, {128, 256}, {256, 128}, false, false, true},
      {"matvec_f32", v1::DTYPE_F32, {1, 300}, {300, 7}},
  };
  for (const MatMulCase& c : cases) {
    SCOPED_TRACE(c.name);
    KernelSpec spec;
    spec.name = spec.label = c.name;
    const bool fused = c.bias || c.residual || c.act != v1::UNARY_KIND_UNSPECIFIED;
    spec.op = fused ? v1::OP_FUSED_MATMUL : v1::OP_MATMUL;
    if (fused) {
      auto* f = spec.attrs.mutable_fused_matmul();
      f->set_transpose_a(c.ta), f->set_transpose_b(c.tb), f->set_has_bias(c.bias);
      f->set_has_residual(c.residual), f->set_activation(c.act);
    } else {
      spec.attrs.mutable_matmul()->set_transpose_a(c.ta);
      spec.attrs.mutable_matmul()->set_transpose_b(c.tb);
    }
    const size_t ra = c.a.size(), rb = c.b.size();
    const int64_t M = c.ta ? c.a[ra - 1] : c.a[ra - 2], K = c.ta ? c.a[ra - 2] : c.a[ra - 1];
    const int64_t N = c.tb ? c.b[rb - 2] : c.b[rb - 1];
    const size_t r = std::max(ra, rb) - 2;
    Dims batch(r, 1), ad(r, 1), bd(r, 1);
    std::copy(c.a.begin(), c.a.end() - 2, ad.begin() + (r - (ra - 2)));
    std::copy(c.b.begin(), c.b.end() - 2, bd.begin() + (r - (rb - 2)));
    for (size_t i = 0; i < r; ++i) batch[i] = std::max(ad[i], bd[i]);
    Dims out = batch;
    out.push_back(M);
    out.push_back(N);
    spec.inputs = {{c.dtype, c.a}, {c.dtype, c.b}};
    if (c.bias) spec.inputs.push_back({c.dtype, {N}});
    if (c.residual) spec.inputs.push_back({c.dtype, out});
    spec.outputs = {{c.dtype, out}};
    ASSERT_TRUE(dev_->Supports(spec).native) << dev_->Supports(spec).reason;
    backend::PrepareContext ctx;
    auto kernel = dev_->PrepareKernel(spec, ctx);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    std::vector<std::vector<double>> values;
    std::vector<std::unique_ptr<backend::Buffer>> bufs;
    std::vector<BufferView> ins;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      values.push_back(Random(c.dtype, spec.inputs[i].num_elements(), 17 * i + 3));
      const std::vector<char> enc = Encode(c.dtype, values.back());
      bufs.push_back(Upload(enc.data(), static_cast<int64_t>(enc.size())));
      ins.push_back({bufs.back().get(), 0, static_cast<int64_t>(enc.size())});
    }
    auto obuf = dev_->Allocate(spec.outputs[0].num_bytes());
    ASSERT_TRUE(obuf.ok());
    const BufferView ov{obuf->get(), 0, spec.outputs[0].num_bytes()};
    ASSERT_TRUE((*kernel)->Launch(*stream_, ins, {&ov, 1}).ok());
    std::vector<char> got = Download(**obuf, ov.bytes);
    // Reference.
    const int64_t nb = Count(batch);
    double max_err = 0, max_ref = 0;
    for (int64_t bi = 0; bi < nb; ++bi) {
      int64_t rem = bi, aoff = 0, boff = 0, as = M * K, bs = K * N;
      for (size_t d = r; d-- > 0;) {
        const int64_t ci = rem % batch[d];
        rem /= batch[d];
        aoff += (ad[d] == 1 ? 0 : ci) * as;
        boff += (bd[d] == 1 ? 0 : ci) * bs;
        as *= ad[d];
        bs *= bd[d];
      }
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double av = values[0][aoff + (c.ta ? k * M + m : m * K + k)];
            const double bv = values[1][boff + (c.tb ? n * K + k : k * N + n)];
            acc += av * bv;
          }
          if (c.bias) acc += values[2][n];
          acc = Act(c.act, acc);
          const int64_t o = (bi * M + m) * N + n;
          if (c.residual) acc += values.back()[o];
          const double g = Decode(c.dtype, &got[o * ElementSize(c.dtype)]);
          max_err = std::max(max_err, std::fabs(g - acc));
          max_ref = std::max(max_ref, std::fabs(acc));
        }
      }
    }
    const double tol = c.dtype == v1::DTYPE_F32 ? 1e-5 : 2e-2;
    EXPECT_LE(max_err, tol * std::max(1.0, max_ref)) << (*kernel)->implementation();
    // cuBLASLt's GELU epilogue is ~5e-5 relative off tanh-GELU (the H100's
    // conformance run caught 4 of 561 f32 elements beyond 4e-6): an exact f32
    // product finishes GeluTanh in the NVRTC epilogue, 16-bit ones in cuBLASLt's.
    if (c.act == v1::UNARY_GELU_TANH) {
      const std::string impl = (*kernel)->implementation();
      EXPECT_EQ(impl.find("(nvrtc epilogue)") != std::string::npos, c.dtype == v1::DTYPE_F32) << impl;
    }
  }
}

// ---- TF32 (CompileOptions.allow_tf32 -> MatMulAttrs.allow_tf32) ----

// An f32 product whose attrs allow TF32 runs on cuBLASLt's FAST_TF32 compute
// type: within the TF32 bound of the f64 reference (each operand rounded to
// 10 mantissa bits: |err| <= 2^-9 sum_k |a_k b_k|, plus f32 accumulation),
// and visibly less exact than the same product without the attribute (so
// the attribute reached cuBLASLt); MatMul and FusedMatMul alike.
TEST_F(CudaDeviceTest, Tf32OnlyWhenTheAttrsAllowIt) {
  const int64_t M = 256, K = 512, N = 192;
  const std::vector<double> a = Random(v1::DTYPE_F32, M * K, 5),
                            b = Random(v1::DTYPE_F32, K * N, 6);
  const std::vector<char> ea = Encode(v1::DTYPE_F32, a), eb = Encode(v1::DTYPE_F32, b);
  auto abuf = Upload(ea.data(), static_cast<int64_t>(ea.size()));
  auto bbuf = Upload(eb.data(), static_cast<int64_t>(eb.size()));
  auto obuf = dev_->Allocate(M * N * 4);
  ASSERT_TRUE(obuf.ok());
  const BufferView ins[] = {{abuf.get(), 0, M * K * 4}, {bbuf.get(), 0, K * N * 4}};
  const BufferView ov{obuf->get(), 0, M * N * 4};
  struct Result {
    double max_err = 0, max_over_bound = 0;
  };
  auto run = [&](bool fused, bool tf32, std::string* impl) {
    KernelSpec spec;
    spec.name = spec.label = "tf32";
    spec.inputs = {{v1::DTYPE_F32, {M, K}}, {v1::DTYPE_F32, {K, N}}};
    spec.outputs = {{v1::DTYPE_F32, {M, N}}};
    spec.op = fused ? v1::OP_FUSED_MATMUL : v1::OP_MATMUL;
    if (fused) {
      spec.attrs.mutable_fused_matmul()->set_activation(v1::UNARY_RELU);
      spec.attrs.mutable_fused_matmul()->set_allow_tf32(tf32);
    } else {
      spec.attrs.mutable_matmul()->set_allow_tf32(tf32);
    }
    Result r;
    backend::PrepareContext ctx;
    auto kernel = dev_->PrepareKernel(spec, ctx);
    EXPECT_TRUE(kernel.ok()) << kernel.status();
    if (!kernel.ok()) return r;
    *impl = (*kernel)->implementation();
    EXPECT_TRUE((*kernel)->Launch(*stream_, ins, {&ov, 1}).ok());
    const std::vector<char> got = Download(**obuf, ov.bytes);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc += a[m * K + k] * b[k * N + n];
          mag += std::fabs(a[m * K + k] * b[k * N + n]);
        }
        if (fused) acc = Act(v1::UNARY_RELU, acc);
        const double err = std::fabs(Decode(v1::DTYPE_F32, &got[(m * N + n) * 4]) - acc);
        r.max_err = std::max(r.max_err, err);
        r.max_over_bound = std::max(r.max_over_bound, err / (std::ldexp(mag, -9) + 1e-5));
      }
    }
    return r;
  };
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "FusedMatMul" : "MatMul");
    std::string impl_f32, impl_tf32;
    const Result exact = run(fused, false, &impl_f32);
    const Result tf32 = run(fused, true, &impl_tf32);
    EXPECT_EQ(impl_f32.rfind("cublasLt:gemm_f32", 0), 0u) << impl_f32;
    EXPECT_EQ(impl_tf32.rfind("cublasLt:gemm_tf32", 0), 0u) << impl_tf32;
    EXPECT_LE(exact.max_err, 1e-4);
    EXPECT_LE(tf32.max_over_bound, 1.0) << "max abs err " << tf32.max_err;
    EXPECT_GT(tf32.max_err, 1e-4) << "TF32 products should not be f32-exact";
    std::printf("cuda:0 tf32 %s: max abs err %.3g (f32: %.3g)\n", fused ? "fused" : "plain",
                tf32.max_err, exact.max_err);
  }
}

// ---- vectorized kernels: 16-byte aligned launches and misaligned ones ----

// LayerNorm (scale, bias), RmsNorm, Softmax and GELU on rows that vectorize,
// launched once on aligned views and once on views 2 elements into their
// buffers (not 16-byte aligned: the scalar kernels run); both must match
// the f64 reference. Rows of 264 (1 or 2 vectors per thread) and of 16392
// (8 vectors per thread, 288 / 544 threads: the 1024-thread launch bound).
TEST_F(CudaDeviceTest, VectorizedKernelsMatchAlignedOrNot) {
  const int64_t rows = 7;
  for (const auto& [dt, n] : std::vector<std::pair<DType, int64_t>>{{v1::DTYPE_BF16, 264},
                                                                    {v1::DTYPE_F32, 264},
                                                                    {v1::DTYPE_BF16, 16392},
                                                                    {v1::DTYPE_F32, 16392}}) {
    for (const char* op : {"layer_norm", "rms_norm", "softmax", "gelu"}) {
      SCOPED_TRACE(absl::StrCat(op, " ", DTypeName(dt), " n=", n));
      KernelSpec s;
      s.name = s.label = op;
      s.inputs = {{dt, {rows, n}}};
      s.outputs = {{dt, {rows, n}}};
      if (std::string(op) == "layer_norm") {
        s.op = v1::OP_LAYER_NORM;
        s.attrs.mutable_layer_norm();
        s.inputs.push_back({dt, {n}});
        s.inputs.push_back({dt, {n}});
      } else if (std::string(op) == "rms_norm") {
        s.op = v1::OP_RMS_NORM;
        s.attrs.mutable_rms_norm();
        s.inputs.push_back({dt, {n}});
      } else if (std::string(op) == "softmax") {
        s.op = v1::OP_SOFTMAX;
        s.attrs.mutable_softmax();
      } else {
        s.op = v1::OP_UNARY;
        s.attrs.mutable_unary()->set_kind(v1::UNARY_GELU);
      }
      backend::PrepareContext ctx;
      auto k = dev_->PrepareKernel(s, ctx);
      ASSERT_TRUE(k.ok()) << k.status();
      if (s.op != v1::OP_UNARY) {
        EXPECT_NE((*k)->implementation().find("_vec"), std::string::npos) << (*k)->implementation();
      }
      const int64_t es = ElementSize(dt);
      std::vector<std::vector<double>> vals;
      for (size_t i = 0; i < s.inputs.size(); ++i) {
        vals.push_back(Random(dt, Count(s.inputs[i].dims), 100 + i));
        if (i > 0) {
          for (double& v : vals.back()) v = Decode(dt, Encode(dt, {1 + 0.5 * v}).data());
        } else {
          for (double& v : vals.back()) v = Decode(dt, Encode(dt, {3 * v + 0.5}).data());
        }
      }
      // The f64 reference.
      std::vector<double> want(rows * n);
      for (int64_t r = 0; r < rows; ++r) {
        const double* x = vals[0].data() + r * n;
        double mean = 0, sq = 0, mx = -INFINITY, se = 0;
        for (int64_t j = 0; j < n; ++j) mean += x[j], mx = std::max(mx, x[j]);
        mean /= n;
        if (s.op == v1::OP_RMS_NORM) mean = 0;
        for (int64_t j = 0; j < n; ++j)
          sq += (x[j] - mean) * (x[j] - mean), se += std::exp(x[j] - mx);
        const double rstd = 1 / std::sqrt(sq / n + (s.op == v1::OP_RMS_NORM ? 1e-6 : 1e-5));
        for (int64_t j = 0; j < n; ++j) {
          double& w = want[r * n + j];
          if (s.op == v1::OP_LAYER_NORM) w = (x[j] - mean) * rstd * vals[1][j] + vals[2][j];
          if (s.op == v1::OP_RMS_NORM) w = x[j] * rstd * vals[1][j];
          if (s.op == v1::OP_SOFTMAX) w = std::exp(x[j] - mx) / se;
          if (s.op == v1::OP_UNARY) w = Act(v1::UNARY_GELU, x[j]);
        }
      }
      for (int64_t shift : {int64_t{0}, 2 * es}) {
        SCOPED_TRACE(absl::StrCat("offset ", shift));
        std::vector<std::unique_ptr<backend::Buffer>> bufs;
        std::vector<backend::BufferView> ins;
        for (size_t i = 0; i < s.inputs.size(); ++i) {
          std::vector<char> bytes(shift, 0);
          const std::vector<char> enc = Encode(dt, vals[i]);
          bytes.insert(bytes.end(), enc.begin(), enc.end());
          bufs.push_back(Upload(bytes.data(), static_cast<int64_t>(bytes.size())));
          ins.push_back({bufs.back().get(), shift, static_cast<int64_t>(enc.size())});
        }
        const int64_t out_bytes = rows * n * es;
        auto out = dev_->Allocate(out_bytes + shift);
        ASSERT_TRUE(out.ok()) << out.status();
        const std::vector<backend::BufferView> outs = {{out->get(), shift, out_bytes}};
        ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
        const std::vector<char> got = Download(**out, out_bytes, shift);
        const double tol = dt == v1::DTYPE_BF16 ? 1.0 / 128 : 1e-5;
        for (int64_t e = 0; e < rows * n; ++e) {
          const double g = Decode(dt, &got[e * es]);
          ASSERT_NEAR(g, want[e], tol * (1 + std::fabs(want[e]))) << "element " << e;
        }
      }
    }
  }
}


// GroupNorm with fewer rows (N * groups) than twice the SMs, each longer than
// a chunk: the split path (partial statistics per chunk, then combine and normalize),
// 16-byte loads when aligned and element loads when not, against an f64
// reference; the channel changes inside a vector (spatial 513), the last
// chunk is partial and x has a large mean. KILN_GROUP_NORM_SPLIT=0 gives the
// row kernel the same answer.
TEST_F(CudaDeviceTest, GroupNormSplitPathMatchesAReference) {
  const int64_t groups = 2;
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    for (const Dims& dims : {Dims{1, 16, 19, 27}, Dims{2, 4, 9, 1001}}) {
      const int64_t c = dims[1], count = Count(dims), rows = dims[0] * groups;
      const int64_t n = count / rows, spatial = n / (c / groups);
      KernelSpec s;
      s.name = s.label = "group_norm";
      s.op = v1::OP_GROUP_NORM;
      s.attrs.mutable_group_norm()->set_groups(groups);
      s.inputs = {{dt, dims}, {dt, {c}}, {dt, {c}}};
      s.outputs = {{dt, dims}};
      std::vector<std::vector<double>> vals = {Random(dt, count, 7), Random(dt, c, 8),
                                               Random(dt, c, 9)};
      for (double& v : vals[0]) v = Decode(dt, Encode(dt, {40 + 2 * v}).data());
      for (double& v : vals[1]) v = Decode(dt, Encode(dt, {1 + 0.5 * v}).data());
      std::vector<double> want(count);
      for (int64_t r = 0; r < rows; ++r) {
        const double* x = vals[0].data() + r * n;
        double mean = 0, sq = 0;
        for (int64_t j = 0; j < n; ++j) mean += x[j];
        mean /= n;
        for (int64_t j = 0; j < n; ++j) sq += (x[j] - mean) * (x[j] - mean);
        const double rstd = 1 / std::sqrt(sq / n + 1e-5);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ch = r % groups * (c / groups) + j / spatial;
          want[r * n + j] = (x[j] - mean) * rstd * vals[1][ch] + vals[2][ch];
        }
      }
      for (const char* force : {"", "0"}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dt), " ", dims[3], " KILN_GROUP_NORM_SPLIT=", force));
        if (*force) {
          setenv("KILN_GROUP_NORM_SPLIT", force, 1);
        } else {
          unsetenv("KILN_GROUP_NORM_SPLIT");
        }
        backend::PrepareContext ctx;
        auto k = dev_->PrepareKernel(s, ctx);
        unsetenv("KILN_GROUP_NORM_SPLIT");
        ASSERT_TRUE(k.ok()) << k.status();
        EXPECT_EQ((*k)->implementation().find("group_norm_split") != std::string::npos, !*force)
            << (*k)->implementation();
        const int64_t es = ElementSize(dt);
        for (int64_t shift : {int64_t{0}, 2 * es}) {  // 16-byte aligned or not
          SCOPED_TRACE(absl::StrCat("offset ", shift));
          std::vector<std::unique_ptr<backend::Buffer>> bufs;
          std::vector<backend::BufferView> ins;
          for (const auto& v : vals) {
            std::vector<char> bytes(shift, 0);
            const std::vector<char> enc = Encode(dt, v);
            bytes.insert(bytes.end(), enc.begin(), enc.end());
            bufs.push_back(Upload(bytes.data(), static_cast<int64_t>(bytes.size())));
            ins.push_back({bufs.back().get(), shift, static_cast<int64_t>(enc.size())});
          }
          auto out = dev_->Allocate(count * es + shift);
          ASSERT_TRUE(out.ok()) << out.status();
          const std::vector<backend::BufferView> outs = {{out->get(), shift, count * es}};
          ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
          const std::vector<char> got = Download(**out, count * es, shift);
          const double tol = dt == v1::DTYPE_BF16 ? 1.0 / 128 : 1e-5;
          for (int64_t e = 0; e < count; ++e) {
            ASSERT_NEAR(Decode(dt, &got[e * es]), want[e], tol * (1 + std::fabs(want[e])))
                << "element " << e;
          }
        }
      }
    }
  }
}

// Attention on every path (tensor-core flash for f16/bf16 head dims 64 and
// 128, split-K decoding, the row kernel) against an f64 reference of the
// inputs as stored: every mask kind, GQA, custom scale, softcap, a
// broadcast bias, and sizes that are not multiples of the 64-row tiles.
struct AttnCase {
  DType dt;
  int64_t B, Hq, Hkv, Sq, Sk, D;
  v1::MaskKind mask;
  double softcap = 0;
  const char* path;  // a substring of the implementation name
};

TEST_F(CudaDeviceTest, AttentionPathsMatchAReference) {
  UseKilnKernelsOnly();
  const AttnCase cases[] = {
      {v1::DTYPE_BF16, 2, 4, 2, 100, 150, 64, v1::MASK_NONE, 0, "flash_attn_fwd_bf16"},
      {v1::DTYPE_BF16, 2, 4, 2, 130, 130, 128, v1::MASK_CAUSAL, 0, "flash_attn_fwd_bf16"},
      {v1::DTYPE_F16, 1, 4, 4, 70, 200, 128, v1::MASK_CAUSAL, 0, "flash_attn_fwd_f16"},
      {v1::DTYPE_F16, 2, 2, 1, 64, 64, 64, v1::MASK_SLIDING_WINDOW, 0, "flash_attn_fwd_f16"},
      {v1::DTYPE_BF16, 1, 2, 2, 90, 90, 64, v1::MASK_PREFIX, 30, "flash_attn_fwd_bf16"},
      {v1::DTYPE_BF16, 2, 4, 1, 33, 77, 128, v1::MASK_CUSTOM, 0, "flash_attn_fwd_bf16"},
      {v1::DTYPE_F16, 2, 4, 2, 65, 129, 64, v1::MASK_BIAS, 0, "flash_attn_fwd_f16"},
      // Decoding with two or more query rows per kv head: the tensor-core
      // kernel (rows padded to tiles of 8): head dims 64 / 256, MQA, causal
      // over a few query rows, sliding window, softcap, key counts off every
      // pass size. Each runs again on the 16-byte kernel below.
      {v1::DTYPE_BF16, 2, 8, 2, 1, 1000, 128, v1::MASK_NONE, 0, "decode_mma_split"},
      {v1::DTYPE_F16, 2, 4, 1, 4, 777, 64, v1::MASK_CAUSAL, 0, "decode_mma_split"},
      {v1::DTYPE_BF16, 1, 4, 2, 1, 301, 256, v1::MASK_NONE, 20, "decode_mma_split"},
      {v1::DTYPE_BF16, 3, 8, 8, 2, 4100, 128, v1::MASK_SLIDING_WINDOW, 0, "decode_mma_split"},
      {v1::DTYPE_F16, 1, 32, 8, 1, 8192, 128, v1::MASK_NONE, 0, "decode_mma_split"},
      // Row tiles: a GQA group of 8 (8 rows), 2 heads x 3 causal rows (6 of
      // 8), 4 heads x 4 rows (two tiles of 8), a prefix mask, softcap with
      // GQA, one kv head of 2 rows at D 256; then a group of 5 (3 padding
      // rows), a group of 16 (two tiles) under a causal mask, a group of 8 at
      // D 256 in a sliding window.
      {v1::DTYPE_BF16, 2, 16, 2, 1, 2000, 128, v1::MASK_NONE, 0, "decode_mma_split"},
      {v1::DTYPE_F16, 1, 4, 2, 3, 999, 64, v1::MASK_CAUSAL, 0, "decode_mma_split"},
      {v1::DTYPE_BF16, 1, 8, 2, 4, 1500, 128, v1::MASK_CAUSAL, 0, "decode_mma_split"},
      {v1::DTYPE_F16, 2, 4, 4, 2, 513, 128, v1::MASK_PREFIX, 0, "decode_mma_split"},
      {v1::DTYPE_BF16, 1, 8, 2, 1, 3000, 64, v1::MASK_NONE, 15, "decode_mma_split"},
      {v1::DTYPE_F16, 1, 2, 1, 1, 700, 256, v1::MASK_CAUSAL, 0, "decode_mma_split"},
      {v1::DTYPE_F16, 2, 40, 8, 1, 1200, 128, v1::MASK_NONE, 0, "decode_mma_split"},
      {v1::DTYPE_BF16, 1, 32, 2, 1, 2500, 128, v1::MASK_CAUSAL, 0, "decode_mma_split"},
      {v1::DTYPE_F16, 1, 16, 2, 1, 900, 256, v1::MASK_SLIDING_WINDOW, 0, "decode_mma_split"},
      // One query row per kv head (MHA decoding): the 16-byte kernel, one row per block.
      {v1::DTYPE_BF16, 1, 4, 4, 1, 3000, 128, v1::MASK_NONE, 0, "decode16_split"},
      // 1024 blocks per split, more than a GPU of up to 204 SMs holds at 5
      // per SM: one split, the block writes the output itself (no combine).
      {v1::DTYPE_BF16, 128, 8, 8, 1, 256, 64, v1::MASK_NONE, 0, "decode16_split1_"},
      {v1::DTYPE_F32, 1, 4, 4, 2, 700, 80, v1::MASK_CAUSAL, 0, "decode_split"},
      {v1::DTYPE_F16, 2, 4, 4, 1, 600, 64, v1::MASK_CUSTOM, 0, "decode_split"},
      {v1::DTYPE_BF16, 1, 2, 2, 40, 40, 96, v1::MASK_CAUSAL, 0, "attention_rows"},
      // f32 at head dims 64 and 128: the tiled SIMT kernel, every mask kind,
      // softcap, GQA, ragged tiles (Sq not a multiple of 32, Sk of 64).
      {v1::DTYPE_F32, 2, 4, 2, 100, 150, 64, v1::MASK_NONE, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 2, 4, 4, 130, 130, 128, v1::MASK_CAUSAL, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 1, 4, 2, 70, 200, 64, v1::MASK_CAUSAL, 5, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 2, 2, 1, 64, 64, 64, v1::MASK_SLIDING_WINDOW, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 1, 2, 2, 90, 90, 128, v1::MASK_PREFIX, 30, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 2, 4, 1, 33, 77, 64, v1::MASK_CUSTOM, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 2, 4, 2, 65, 129, 64, v1::MASK_BIAS, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 8, 12, 12, 128, 128, 64, v1::MASK_NONE, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F32, 1, 2, 2, 40, 40, 96, v1::MASK_CAUSAL, 0, "attention_rows_f32"},
  };
  int seed = 500;
  for (const AttnCase& c : cases) {
    CheckAttention(c, seed);
    seed += 8;
  }
  // The tensor-core kernel's shapes on the 16-byte kernel (KILN_DECODE_MMA=0):
  // row tiles of 2, 4 and 8 rows, several tiles per kv head.
  setenv("KILN_DECODE_MMA", "0", 1);
  for (AttnCase c : cases) {
    if (std::string_view(c.path) != "decode_mma_split") continue;
    c.path = "decode16_split";
    CheckAttention(c, seed);
    seed += 8;
  }
  // And the 16-byte kernel's one-row shapes on the tensor-core kernel
  // (KILN_DECODE_MMA=1: 7 padding rows per tile; one split of 1,024 items).
  setenv("KILN_DECODE_MMA", "1", 1);
  for (AttnCase c : cases) {
    if (!absl::StartsWith(c.path, "decode16_split")) continue;
    c.path = "decode_mma_split";
    CheckAttention(c, seed);
    seed += 8;
  }
  unsetenv("KILN_DECODE_MMA");
}

// Prepares `c` on dev_, runs it twice and checks the result against an f64
// reference of the inputs as stored; `seed` seeds the inputs.
void CudaDeviceTest::CheckAttention(const AttnCase& c, int seed) {
  SCOPED_TRACE(absl::StrCat(DTypeName(c.dt), " B", c.B, " Hq", c.Hq, " Hkv", c.Hkv, " Sq", c.Sq,
                            " Sk", c.Sk, " D", c.D, " ", v1::MaskKind_Name(c.mask)));
  KernelSpec s;
  s.name = s.label = "attn";
  s.op = v1::OP_ATTENTION;
  auto* a = s.attrs.mutable_attention();
  a->set_mask(c.mask);
  a->set_scale(0.3);
  if (c.softcap > 0) a->set_softcap(c.softcap);
  if (c.mask == v1::MASK_SLIDING_WINDOW) a->set_window(17);
  if (c.mask == v1::MASK_PREFIX) a->set_prefix(20);
  s.inputs = {{c.dt, {c.B, c.Hq, c.Sq, c.D}},
              {c.dt, {c.B, c.Hkv, c.Sk, c.D}},
              {c.dt, {c.B, c.Hkv, c.Sk, c.D}}};
  const bool per_query = c.Sq > 1;
  if (c.mask == v1::MASK_CUSTOM) {
    s.inputs.push_back(per_query ? backend::TensorDesc{v1::DTYPE_BOOL, {c.B, c.Sq, c.Sk}}
                                 : backend::TensorDesc{v1::DTYPE_BOOL, {c.B, c.Sk}});
  }
  if (c.mask == v1::MASK_BIAS) s.inputs.push_back({c.dt, {c.Hq, c.Sq, c.Sk}});
  s.outputs = {{c.dt, {c.B, c.Hq, c.Sq, c.D}}};
  ASSERT_TRUE(dev_->Supports(s).native) << dev_->Supports(s).reason;
  backend::PrepareContext ctx;
  auto k = dev_->PrepareKernel(s, ctx);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_NE((*k)->implementation().find(c.path), std::string::npos) << (*k)->implementation();

  std::vector<std::vector<double>> vals;
  std::vector<std::unique_ptr<backend::Buffer>> bufs;
  std::vector<backend::BufferView> ins;
  std::vector<unsigned char> custom;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const int64_t n = Count(s.inputs[i].dims);
    if (s.inputs[i].dtype == v1::DTYPE_BOOL) {
      std::mt19937_64 rng(seed++);
      custom.resize(n);
      for (auto& m : custom) m = (rng() % 4) != 0;
      custom[0] = 0;
      bufs.push_back(Upload(custom.data(), n));
      ins.push_back({bufs.back().get(), 0, n});
      vals.emplace_back();
      continue;
    }
    vals.push_back(Random(c.dt, n, seed++));
    if (i == 0) {  // spread the logits
      for (double& v : vals.back()) v = Decode(c.dt, Encode(c.dt, {4 * v}).data());
    }
    const std::vector<char> enc = Encode(c.dt, vals.back());
    bufs.push_back(Upload(enc.data(), static_cast<int64_t>(enc.size())));
    ins.push_back({bufs.back().get(), 0, static_cast<int64_t>(enc.size())});
  }
  const int64_t es = ElementSize(c.dt);
  const int64_t out_n = c.B * c.Hq * c.Sq * c.D;
  auto out = dev_->Allocate(out_n * es);
  ASSERT_TRUE(out.ok());
  const std::vector<backend::BufferView> outs = {{out->get(), 0, out_n * es}};
  // Twice: the split path's partials (and the 16-byte kernel's split
  // counters, which each launch must leave at zero) are the kernel's own and
  // reused. The second launch writes over all-ones bytes (NaN in every float
  // type), so an output the second launch did not write fails; both are checked.
  ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
  const std::vector<char> first = Download(**out, out_n * es);
  const std::vector<char> poison(out_n * es, static_cast<char>(0xff));
  std::unique_ptr<backend::Buffer> out2 = Upload(poison.data(), out_n * es);
  const std::vector<backend::BufferView> outs2 = {{out2.get(), 0, out_n * es}};
  ASSERT_TRUE((*k)->Launch(*stream_, ins, outs2).ok());
  const std::vector<char> got = Download(*out2, out_n * es);
  EXPECT_EQ(got, first) << "the second launch differs from the first";

  const int64_t group = c.Hq / c.Hkv;
  const double tol = c.dt == v1::DTYPE_F32 ? 1e-5 : c.dt == v1::DTYPE_F16 ? 4e-3 : 2e-2;
  double worst = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < c.Sq; ++i) {
        const int64_t pos = i + c.Sk - c.Sq;
        int64_t lo = 0, hi = c.Sk;
        if (c.mask == v1::MASK_CAUSAL) hi = pos + 1;
        if (c.mask == v1::MASK_PREFIX) hi = std::max<int64_t>(pos + 1, 20);
        if (c.mask == v1::MASK_SLIDING_WINDOW) hi = pos + 1, lo = pos - 17 + 1;
        lo = std::clamp<int64_t>(lo, 0, c.Sk);
        hi = std::clamp<int64_t>(hi, lo, c.Sk);
        std::vector<double> logits;
        std::vector<int64_t> keys;
        for (int64_t j = lo; j < hi; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            dot += vals[0][((b * c.Hq + h) * c.Sq + i) * c.D + d] *
                   vals[1][((b * c.Hkv + hk) * c.Sk + j) * c.D + d];
          }
          double x = 0.3 * dot;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          if (c.mask == v1::MASK_CUSTOM &&
              custom[(per_query ? (b * c.Sq + i) * c.Sk : b * c.Sk) + j] == 0) {
            continue;
          }
          if (c.mask == v1::MASK_BIAS) x += vals[3][(h * c.Sq + i) * c.Sk + j];
          logits.push_back(x);
          keys.push_back(j);
        }
        double mx = -INFINITY, sum = 0;
        for (double x : logits) mx = std::max(mx, x);
        for (double& x : logits) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < c.D; ++d) {
          double want = 0;
          for (size_t t = 0; t < keys.size(); ++t) {
            want += logits[t] * vals[2][((b * c.Hkv + hk) * c.Sk + keys[t]) * c.D + d];
          }
          want = sum > 0 ? want / sum : 0;
          const int64_t at = ((b * c.Hq + h) * c.Sq + i) * c.D + d;
          const double g = Decode(c.dt, &got[at * es]);
          worst = std::max(worst, std::fabs(g - want));
          ASSERT_NEAR(g, want, tol) << "b " << b << " h " << h << " row " << i << " d " << d;
        }
      }
    }
  }
  std::printf("%-28s max |error| %.2e\n", (*k)->implementation().c_str(), worst);
}

// cuDNN's fused attention (cudnn:sdpa_fwd_<dt>, where the device found
// cuDNN) against the same f64 reference: no mask and causal (aligned to the
// end of the keys when Sq < Sk), GQA and MQA, S not a multiple of 64 or 128,
// head dims 64, 96 and 128; the cases cuDNN cannot express (other masks,
// softcap, f32, head dims not multiples of 8) run Kiln's kernels; a second kernel of
// the same shape reuses the device's cached plan; a captured CUDA graph of
// the cuDNN launch replays to the same output.
TEST_F(CudaDeviceTest, CudnnAttentionMatchesAReference) {
  auto* cuda = dynamic_cast<CudaDevice*>(dev_);
  ASSERT_NE(cuda, nullptr);
  if (cuda->cudnn_version() == 0) GTEST_SKIP() << "no cuDNN: " << cuda->cudnn_missing();
  const std::string feature = absl::StrCat("cudnn-", CudnnVersionText(cuda->cudnn_version()));
  const auto& features = dev_->info().features;
  EXPECT_NE(std::find(features.begin(), features.end(), feature), features.end()) << feature;
  std::printf("%s: %s\n", dev_->info().id.c_str(), feature.c_str());
  const AttnCase cases[] = {
      {v1::DTYPE_BF16, 2, 4, 2, 100, 150, 64, v1::MASK_NONE, 0, "cudnn:sdpa_fwd_bf16"},
      {v1::DTYPE_BF16, 2, 4, 4, 130, 130, 128, v1::MASK_CAUSAL, 0, "cudnn:sdpa_fwd_bf16"},
      {v1::DTYPE_F16, 1, 4, 4, 70, 200, 128, v1::MASK_CAUSAL, 0, "cudnn:sdpa_fwd_f16"},
      {v1::DTYPE_F16, 2, 8, 1, 65, 129, 64, v1::MASK_NONE, 0, "cudnn:sdpa_fwd_f16"},
      {v1::DTYPE_BF16, 1, 2, 2, 40, 40, 96, v1::MASK_CAUSAL, 0, "cudnn:sdpa_fwd_bf16"},
      {v1::DTYPE_BF16, 2, 4, 2, 256, 256, 128, v1::MASK_CAUSAL, 0, "cudnn:sdpa_fwd_bf16"},
      // Decoding (cuDNN too), then Kiln's kernels: masks and softcap cuDNN is
      // not given, f32, a head dim that is not a multiple of 8.
      {v1::DTYPE_F16, 2, 2, 1, 64, 64, 64, v1::MASK_SLIDING_WINDOW, 0, "flash_attn_fwd_f16"},
      {v1::DTYPE_BF16, 1, 2, 2, 90, 90, 64, v1::MASK_CAUSAL, 30, "flash_attn_fwd_bf16"},
      {v1::DTYPE_F16, 2, 4, 2, 65, 129, 64, v1::MASK_BIAS, 0, "flash_attn_fwd_f16"},
      // Decoding: the path EstimateDecodeCost expects faster, Kiln's split
      // kernel over few heads, cuDNN's one launch on a short cache of many.
      {v1::DTYPE_BF16, 2, 8, 2, 1, 1000, 128, v1::MASK_NONE, 0, "decode_mma_split"},
      {v1::DTYPE_BF16, 8, 32, 8, 1, 256, 128, v1::MASK_NONE, 0, "cudnn:sdpa_fwd_bf16"},
      {v1::DTYPE_F32, 2, 4, 2, 100, 150, 64, v1::MASK_NONE, 0, "flash_attn_simt_f32"},
      {v1::DTYPE_F16, 2, 4, 2, 64, 64, 60, v1::MASK_NONE, 0, "attention_rows_f16"},
  };
  auto cudnn = cuda->cudnn_context();
  ASSERT_TRUE(cudnn.ok()) << cudnn.status();
  int seed = 900;
  for (const AttnCase& c : cases) {
    if (absl::StartsWith(c.path, "cudnn:")) {
      // The plan on its own first: cuDNN's reason when it refuses the graph.
      SdpaShape shape;
      shape.dtype = c.dt;
      shape.B = c.B, shape.Hq = c.Hq, shape.Hkv = c.Hkv, shape.Sq = c.Sq, shape.Sk = c.Sk;
      shape.D = shape.Dv = c.D;
      shape.mask = c.mask;
      auto plan = (*cudnn)->SdpaPlan(shape);
      EXPECT_TRUE(plan.ok()) << CudnnSdpaKey(shape, cuda->cudnn_version()) << ": "
                             << plan.status();
      if (plan.ok()) {
        std::printf("cudnn plan %s: engine %lld, workspace %lld bytes\n",
                    CudnnSdpaKey(shape, cuda->cudnn_version()).c_str(),
                    static_cast<long long>((*plan)->engine()),
                    static_cast<long long>((*plan)->workspace_bytes()));
      }
    }
    CheckAttention(c, seed);
    seed += 8;
  }

  // The plan cache: the same shape again builds nothing new.
  const int64_t built = (*cudnn)->plans_built();
  EXPECT_GE(built, 7);
  KernelSpec s;
  s.name = s.label = "attn";
  s.op = v1::OP_ATTENTION;
  s.attrs.mutable_attention()->set_mask(v1::MASK_CAUSAL);
  s.attrs.mutable_attention()->set_scale(0.3);
  const int64_t B = 2, H = 4, S = 130, D = 128;
  s.inputs = {{v1::DTYPE_BF16, {B, H, S, D}}, {v1::DTYPE_BF16, {B, H, S, D}},
              {v1::DTYPE_BF16, {B, H, S, D}}};
  s.outputs = {{v1::DTYPE_BF16, {B, H, S, D}}};
  backend::PrepareContext ctx;
  auto k = dev_->PrepareKernel(s, ctx);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ((*k)->implementation(), "cudnn:sdpa_fwd_bf16");
  EXPECT_EQ((*cudnn)->plans_built(), built);

  // Under stream capture: the replay writes what a direct launch wrote.
  const int64_t n = B * H * S * D;
  std::vector<std::unique_ptr<backend::Buffer>> bufs;
  std::vector<BufferView> ins;
  for (int i = 0; i < 3; ++i) {
    const std::vector<char> enc = Encode(v1::DTYPE_BF16, Random(v1::DTYPE_BF16, n, seed++));
    bufs.push_back(Upload(enc.data(), n * 2));
    ins.push_back({bufs.back().get(), 0, n * 2});
  }
  auto direct = dev_->Allocate(n * 2);
  auto replayed = dev_->Allocate(n * 2);
  ASSERT_TRUE(direct.ok() && replayed.ok());
  const std::vector<BufferView> to_direct = {{direct->get(), 0, n * 2}},
                                to_replayed = {{replayed->get(), 0, n * 2}};
  ASSERT_TRUE((*k)->Launch(*stream_, ins, to_direct).ok());
  auto* capture = dynamic_cast<backend::CapturingStream*>(stream_.get());
  ASSERT_NE(capture, nullptr);
  ASSERT_TRUE(stream_->Synchronize().ok());
  ASSERT_TRUE(capture->BeginCapture().ok());
  const absl::Status launched = (*k)->Launch(*stream_, ins, to_replayed);
  auto work = capture->EndCapture();
  ASSERT_TRUE(launched.ok()) << launched;
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE((*work)->Replay(*stream_).ok());
  EXPECT_EQ(Download(**direct, n * 2), Download(**replayed, n * 2));
}

// The choices a prepare asks cuDNN and cuBLASLt for (an execution plan, a
// matmul algorithm) are kept in the kernel cache beside cubins
// (prepare_cache.h): a new backend with the same cache (a restarted worker, a
// new kilnd) loads them and asks neither library again, and its kernels
// write what the first backend's wrote; an entry that is damaged (another
// key's, garbage, an algorithm cuBLASLt refuses) is asked again and
// overwritten.
TEST_F(CudaDeviceTest, WarmStartReusesCudnnPlansAndMatmulAlgorithms) {
  const bool with_cudnn = dynamic_cast<CudaDevice*>(dev_)->cudnn_version() != 0;
  KernelSpec attn;
  attn.name = attn.label = "attn";
  attn.op = v1::OP_ATTENTION;
  attn.attrs.mutable_attention()->set_mask(v1::MASK_CAUSAL);
  attn.attrs.mutable_attention()->set_scale(0.125);
  const int64_t B = 1, H = 2, S = 136, D = 64;
  attn.inputs = {{v1::DTYPE_BF16, {B, H, S, D}}, {v1::DTYPE_BF16, {B, H, S, D}},
                 {v1::DTYPE_BF16, {B, H, S, D}}};
  attn.outputs = {{v1::DTYPE_BF16, {B, H, S, D}}};
  KernelSpec mm;
  mm.name = mm.label = "mm";
  mm.op = v1::OP_FUSED_MATMUL;
  mm.attrs.mutable_fused_matmul()->set_has_bias(true);
  mm.attrs.mutable_fused_matmul()->set_activation(v1::UNARY_GELU_TANH);
  const int64_t M = 72, K = 136, N = 200;  // a shape no other test asks for
  mm.inputs = {{v1::DTYPE_BF16, {M, K}}, {v1::DTYPE_BF16, {K, N}}, {v1::DTYPE_BF16, {N}}};
  mm.outputs = {{v1::DTYPE_BF16, {M, N}}};

  // Runs `k` on fixed inputs of `spec` and returns its result's bytes.
  auto run = [&](backend::Device& dev, backend::Kernel& k, const KernelSpec& spec) {
    auto stream = dev.CreateStream();
    EXPECT_TRUE(stream.ok()) << stream.status();
    std::vector<std::unique_ptr<backend::Buffer>> bufs;
    std::vector<BufferView> ins;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      const int64_t n = spec.inputs[i].num_elements();
      const std::vector<char> enc = Encode(v1::DTYPE_BF16, Random(v1::DTYPE_BF16, n, 40 + i));
      auto b = dev.Allocate(n * 2);
      EXPECT_TRUE(b.ok());
      EXPECT_TRUE(dev.CopyToDevice(**stream, enc.data(), {b->get(), 0, n * 2}).ok());
      ins.push_back({b->get(), 0, n * 2});
      bufs.push_back(std::move(b).value());
    }
    const int64_t out_bytes = spec.outputs[0].num_elements() * 2;
    auto out = dev.Allocate(out_bytes);
    EXPECT_TRUE(out.ok());
    const std::vector<BufferView> outs = {{out->get(), 0, out_bytes}};
    EXPECT_TRUE(k.Launch(**stream, ins, outs).ok());
    std::vector<char> bytes(out_bytes);
    EXPECT_TRUE(dev.CopyToHost(**stream, outs[0], bytes.data()).ok());
    EXPECT_TRUE((*stream)->Synchronize().ok());
    return bytes;
  };

  MemoryBinaryCache cache;
  std::vector<char> cold_attn, cold_mm;
  {
    std::unique_ptr<backend::Backend> cold_backend = MakeBackend();
    backend::Device& dev = *cold_backend->devices()[0];
    backend::PrepareContext cold;
    cold.binaries = &cache;
    auto ka = dev.PrepareKernel(attn, cold);
    ASSERT_TRUE(ka.ok()) << ka.status();
    auto km = dev.PrepareKernel(mm, cold);
    ASSERT_TRUE(km.ok()) << km.status();
    EXPECT_GE(cold.kernel_cache_misses, 1);
    EXPECT_EQ(cache.Keys("cublaslt-algo-").size(), 1u);
    if (with_cudnn) {
      EXPECT_EQ((*ka)->implementation(), "cudnn:sdpa_fwd_bf16");
      EXPECT_EQ(cache.Keys("cudnn-plan-").size(), 1u) << "cuDNN serialized no plan";
    }
    cold_attn = run(dev, **ka, attn);
    cold_mm = run(dev, **km, mm);
  }
  {
    std::unique_ptr<backend::Backend> warm_backend = MakeBackend();
    auto& dev = *dynamic_cast<CudaDevice*>(warm_backend->devices()[0]);
    backend::PrepareContext warm;
    warm.binaries = &cache;
    auto ka = dev.PrepareKernel(attn, warm);
    ASSERT_TRUE(ka.ok()) << ka.status();
    auto km = dev.PrepareKernel(mm, warm);
    ASSERT_TRUE(km.ok()) << km.status();
    EXPECT_EQ(warm.kernel_cache_misses, 0);
    EXPECT_GE(warm.kernel_cache_hits, 2);
    if (with_cudnn) {
      auto cudnn = dev.cudnn_context();
      ASSERT_TRUE(cudnn.ok());
      EXPECT_EQ((*cudnn)->plans_built(), 0);
      EXPECT_EQ((*cudnn)->plans_loaded(), 1);
    }
    EXPECT_EQ(run(dev, **ka, attn), cold_attn);
    EXPECT_EQ(run(dev, **km, mm), cold_mm);
  }
  // Damaged entries: each one replaced by another key's entry (a file under
  // the wrong name), by garbage, and by a well-formed entry whose payload the
  // library refuses (an algorithm of all ones, a plan of "{}").
  const std::vector<std::string> keys = [&] {
    std::vector<std::string> k = cache.Keys("cublaslt-algo-"), p = cache.Keys("cudnn-plan-");
    k.insert(k.end(), p.begin(), p.end());
    return k;
  }();
  auto kind_of = [](const std::string& key) { return key.substr(0, key.rfind('-')); };
  for (int damage = 0; damage < 3; ++damage) {
    MemoryBinaryCache bad;  // the cubins as they were, the other entries damaged
    for (const std::string& key : cache.Keys("cuda-cubin-")) bad.Store(key, *cache.Lookup(key));
    for (const std::string& key : keys) {
      const std::string kind = kind_of(key);
      const std::optional<std::string> good = DecodePrepareEntry(kind, key, *cache.Lookup(key));
      ASSERT_TRUE(good.has_value()) << key;
      const std::string other = key.substr(0, key.size() - 1) + (key.back() == '0' ? "1" : "0");
      const std::string refused = kind == "cudnn-plan"
                                      ? std::string("{}")
                                      : std::string(sizeof(cublasLtMatmulAlgo_t), '\xff');
      bad.Store(key, damage == 0   ? EncodePrepareEntry(kind, other, *good)
                     : damage == 1 ? std::string(300, 'x')
                                   : EncodePrepareEntry(kind, key, refused));
    }
    std::unique_ptr<backend::Backend> fresh = MakeBackend();
    backend::Device& dev = *fresh->devices()[0];
    backend::PrepareContext c;
    c.binaries = &bad;
    auto ka = dev.PrepareKernel(attn, c);
    ASSERT_TRUE(ka.ok()) << ka.status();
    auto km = dev.PrepareKernel(mm, c);
    ASSERT_TRUE(km.ok()) << km.status();
    EXPECT_EQ(c.kernel_cache_misses, static_cast<int>(keys.size())) << "damage " << damage;
    for (const std::string& key : keys) {  // overwritten with a good entry
      const std::optional<std::string> now = bad.Lookup(key);
      ASSERT_TRUE(now.has_value());
      const std::optional<std::string> payload = DecodePrepareEntry(kind_of(key), key, *now);
      ASSERT_TRUE(payload.has_value()) << "damage " << damage << ": " << key;
      EXPECT_NE(*payload, "{}");
      if (kind_of(key) == "cublaslt-algo") {
        EXPECT_EQ(payload->size(), sizeof(cublasLtMatmulAlgo_t));
      }
    }
    EXPECT_EQ(run(dev, **ka, attn), cold_attn);
    EXPECT_EQ(run(dev, **km, mm), cold_mm);
  }
}

// Transposes and slices through the strided-copy kernel, on the 16-byte
// vector path (the innermost run contiguous on both sides and every offset a
// whole number of vectors: the head transposes around attention) and off it
// (rows of 24 bytes, f32 with a permuted last dim, an odd slice start),
// byte-exact against the same permutation on the host.
TEST_F(CudaDeviceTest, StridedCopiesMatchTheHost) {
  struct Case {
    DType dt;
    Dims in;
    std::vector<int64_t> perm;  // transpose; empty: slice rows [1, 3) and columns [start, end)
    int64_t start = 0;
  };
  const Case cases[] = {
      {v1::DTYPE_BF16, {2, 5, 3, 64}, {0, 2, 1, 3}},   // vectors (128-byte rows)
      {v1::DTYPE_BF16, {2, 3, 5, 12}, {0, 2, 1, 3}},   // 24-byte rows: elements
      {v1::DTYPE_F32, {3, 7, 5}, {2, 0, 1}},           // last dim moves: elements
      {v1::DTYPE_F16, {4, 72}, {}, 8},                 // slice at 16 bytes: vectors
      {v1::DTYPE_F16, {4, 72}, {}, 3},                 // slice at 6 bytes: elements
  };
  std::mt19937_64 rng(77);
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dt), " rank ", c.in.size(), " start ", c.start));
    const int64_t es = ElementSize(c.dt), n = Count(c.in);
    std::vector<char> src(n * es);
    for (char& b : src) b = static_cast<char>(rng());
    KernelSpec s;
    s.name = s.label = "copy";
    s.inputs = {{c.dt, c.in}};
    Dims out_dims;
    std::vector<int64_t> src_index;  // element of src for each element of the output
    if (!c.perm.empty()) {
      s.op = v1::OP_TRANSPOSE;
      for (int64_t p : c.perm) {
        s.attrs.mutable_transpose()->add_perm(p);
        out_dims.push_back(c.in[p]);
      }
      const std::vector<int64_t> in_strides = RowMajorStrides(c.in);
      for (int64_t o = 0; o < n; ++o) {
        int64_t rem = o, at = 0;
        for (int k = static_cast<int>(out_dims.size()) - 1; k >= 0; --k) {
          at += (rem % out_dims[k]) * in_strides[c.perm[k]];
          rem /= out_dims[k];
        }
        src_index.push_back(at);
      }
    } else {
      s.op = v1::OP_SLICE;
      auto* a = s.attrs.mutable_slice();
      a->add_start(1), a->add_start(c.start);
      a->add_stop(3), a->add_stop(c.in[1] - 8);
      out_dims = {2, c.in[1] - 8 - c.start};
      for (int64_t r = 0; r < out_dims[0]; ++r) {
        for (int64_t col = 0; col < out_dims[1]; ++col) {
          src_index.push_back((1 + r) * c.in[1] + c.start + col);
        }
      }
    }
    s.outputs = {{c.dt, out_dims}};
    ASSERT_TRUE(dev_->Supports(s).native) << dev_->Supports(s).reason;
    backend::PrepareContext ctx;
    auto k = dev_->PrepareKernel(s, ctx);
    ASSERT_TRUE(k.ok()) << k.status();
    auto in = Upload(src.data(), n * es);
    const int64_t out_bytes = static_cast<int64_t>(src_index.size()) * es;
    auto out = dev_->Allocate(out_bytes);
    ASSERT_TRUE(out.ok());
    const std::vector<BufferView> ins = {{in.get(), 0, n * es}}, outs = {{out->get(), 0, out_bytes}};
    ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
    const std::vector<char> got = Download(**out, out_bytes);
    for (size_t e = 0; e < src_index.size(); ++e) {
      ASSERT_EQ(std::memcmp(&got[e * es], &src[src_index[e] * es], es), 0) << "element " << e;
    }
  }
}

// CUDA graphs on a stream: a capture runs nothing; each replay runs the
// captured launches again (an in-place add accumulates) and re-records the
// events captured inside it; a kernel with per-launch host state (gather's
// error slot) refuses to launch into a capture, which still ends, and the
// stream goes on.
TEST_F(CudaDeviceTest, CapturedGraphReplaysKernelsAndEvents) {
  const int64_t n = 1 << 16;
  KernelSpec add;
  add.name = add.label = "add";
  add.op = v1::OP_BINARY;
  add.attrs.mutable_binary()->set_kind(v1::BINARY_ADD);
  add.inputs = {{v1::DTYPE_F32, {n}}, {v1::DTYPE_F32, {n}}};
  add.outputs = {{v1::DTYPE_F32, {n}}};
  backend::PrepareContext ctx;
  auto k = dev_->PrepareKernel(add, ctx);
  ASSERT_TRUE(k.ok()) << k.status();
  auto capturable = [](const backend::Kernel& kernel) {
    const auto* c = dynamic_cast<const backend::CapturableKernel*>(&kernel);
    return c != nullptr && c->capturable();
  };
  ASSERT_TRUE(capturable(**k));
  auto* capture = dynamic_cast<backend::CapturingStream*>(stream_.get());
  ASSERT_NE(capture, nullptr);
  std::vector<float> a(n, 1.0f), b(n, 0.5f);
  auto abuf = Upload(a.data(), n * 4);
  auto bbuf = Upload(b.data(), n * 4);
  ASSERT_TRUE(stream_->Synchronize().ok());
  const backend::BufferView av{abuf.get(), 0, n * 4}, bv{bbuf.get(), 0, n * 4};
  const std::vector<backend::BufferView> ins = {av, bv}, outs = {av};

  ASSERT_TRUE(capture->BeginCapture().ok());
  auto e0 = stream_->Record();
  ASSERT_TRUE(e0.ok()) << e0.status();
  ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
  ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
  auto e1 = stream_->Record();
  ASSERT_TRUE(e1.ok()) << e1.status();
  EXPECT_FALSE(stream_->Synchronize().ok());  // not while capturing
  auto work = capture->EndCapture();
  ASSERT_TRUE(work.ok()) << work.status();
  std::vector<float> got(n);
  ASSERT_TRUE(dev_->CopyToHost(*stream_, av, got.data()).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(got[777], 1.0f);  // captured, not run
  for (int r = 0; r < 3; ++r) ASSERT_TRUE((*work)->Replay(*stream_).ok());
  ASSERT_TRUE(dev_->CopyToHost(*stream_, av, got.data()).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(got[777], 4.0f);  // 1 + 3 replays x 2 launches x 0.5
  EXPECT_EQ(got[n - 1], 4.0f);
  auto us = (*e1)->MicrosSince(**e0);
  ASSERT_TRUE(us.ok()) << us.status();
  EXPECT_GE(*us, 0.0);
  auto other = dev_->CreateStream();
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*work)->Replay(**other).ok());  // only on the capturing stream

  KernelSpec gather;
  gather.name = gather.label = "gather";
  gather.op = v1::OP_GATHER;
  gather.attrs.mutable_gather()->set_axis(0);
  gather.inputs = {{v1::DTYPE_F32, {n}}, {v1::DTYPE_I32, {4}}};
  gather.outputs = {{v1::DTYPE_F32, {4}}};
  auto g = dev_->PrepareKernel(gather, ctx);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(capturable(**g));
  std::vector<int32_t> idx = {0, 1, 2, 3};
  auto ibuf = Upload(idx.data(), 16);
  auto obuf = dev_->Allocate(16);
  ASSERT_TRUE(obuf.ok());
  ASSERT_TRUE(capture->BeginCapture().ok());
  const std::vector<backend::BufferView> gin = {av, {ibuf.get(), 0, 16}};
  const std::vector<backend::BufferView> gout = {{obuf->get(), 0, 16}};
  EXPECT_FALSE((*g)->Launch(*stream_, gin, gout).ok());
  (void)capture->EndCapture();  // ends the capture (of nothing) either way
  ASSERT_TRUE((*g)->Launch(*stream_, gin, gout).ok());  // uncaptured, it runs
  std::vector<float> four(4);
  ASSERT_TRUE(dev_->CopyToHost(*stream_, {obuf->get(), 0, 16}, four.data()).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(four[2], 4.0f);
}

}  // namespace
}  // namespace kiln::cuda
