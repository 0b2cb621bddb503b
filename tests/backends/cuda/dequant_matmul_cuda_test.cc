// DequantMatMul on cuda:0 (kernels/dequant_matmul.cu) against an f64
// dequantize-then-matmul reference: every block type on the matvec path
// (decode shapes and batches up to 8, a weight as large as an LLM's layer),
// the tensor-core path (more rows, split K, f16 / bf16 activations) and the
// tiled path ([K, N] weights), weights at offsets that leave the blocks only
// 2- or 4-byte aligned (the kernels' narrower loads), bf16 activations, and a
// weight at an odd address refused with a clear status. Skips where no CUDA
// device is present (the conformance family covers the small shapes too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "backends/common/quant_blocks.h"
#include "base/half.h"
#include "tests/backends/cuda/cuda_test_backend.h"

namespace kiln::cuda {
namespace {

using backend::BufferView;
using backend::KernelSpec;

constexpr DType kBlockTypes[] = {v1::DTYPE_Q8_0, v1::DTYPE_Q4_0, v1::DTYPE_Q4_K, v1::DTYPE_Q5_K,
                                 v1::DTYPE_Q6_K};

void PutHalf(uint8_t* p, double v) {
  const uint16_t h = FloatToHalf(static_cast<float>(v));
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Random blocks decoding to about [-1, 1]: random bytes, then super-scales
// sized for each type's integer range.
std::vector<uint8_t> RandomBlocks(std::mt19937_64& rng, DType wt, int64_t elements) {
  const DTypeLayout l = LayoutOf(wt);
  const int64_t blocks = elements / l.block_elems;
  std::vector<uint8_t> w(blocks * l.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<double> u(0.5, 1.0);
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = w.data() + i * l.block_bytes;
    const double sign = (rng() & 3) == 0 ? -1 : 1;
    switch (wt) {
      case v1::DTYPE_Q8_0: PutHalf(b, sign * u(rng) / 128); break;
      case v1::DTYPE_Q4_0: PutHalf(b, sign * u(rng) / 8); break;
      case v1::DTYPE_Q4_K: PutHalf(b, u(rng) / (63 * 15)), PutHalf(b + 2, u(rng) / 126); break;
      case v1::DTYPE_Q5_K: PutHalf(b, u(rng) / (63 * 31)), PutHalf(b + 2, u(rng) / 126); break;
      default: PutHalf(b + 208, sign * u(rng) / (128 * 32)); break;
    }
  }
  return w;
}

struct Problem {
  DType wt = v1::DTYPE_Q8_0;
  DType act = v1::DTYPE_F32;
  int64_t m = 1, n = 1, k = 32;
  bool transpose_b = true;
  int64_t weight_offset = 0;  // bytes into the weight's buffer
};

std::string Name(const Problem& p) {
  return absl::StrCat(DTypeName(p.wt), "_", DTypeName(p.act), "_m", p.m, "_n", p.n, "_k", p.k,
                      p.transpose_b ? "_NK" : "_KN", "_at", p.weight_offset);
}

KernelSpec SpecOf(const Problem& p) {
  KernelSpec s;
  s.name = s.label = Name(p);
  s.op = v1::OP_DEQUANT_MATMUL;
  s.attrs.mutable_dequant_matmul()->set_transpose_b(p.transpose_b);
  s.inputs = {{p.act, {p.m, p.k}},
              {p.wt, p.transpose_b ? Dims{p.n, p.k} : Dims{p.k, p.n}}};
  s.outputs = {{p.act, {p.m, p.n}}};
  return s;
}

using testing::MakeBackend;

class CudaDequantMatMulTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeBackend();
    if (backend_ == nullptr) GTEST_SKIP() << "no CUDA device";
    dev_ = backend_->devices()[0];
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(s).value();
  }

  std::unique_ptr<backend::Buffer> Upload(const void* data, int64_t bytes, int64_t offset) {
    auto b = dev_->Allocate(offset + bytes);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(dev_->CopyToDevice(*stream_, data, {b->get(), offset, bytes}).ok());
    return std::move(b).value();
  }

  // Runs p on the device and compares with the f64 reference: each output
  // within 1e-5 (f32) or 2^-8 (f16/bf16 storage) of sum_k |x w|, the scale
  // of its rounding error.
  void Check(const Problem& p) {
    SCOPED_TRACE(Name(p));
    std::mt19937_64 rng(std::hash<std::string>()(Name(p)));
    const std::vector<uint8_t> w = RandomBlocks(rng, p.wt, p.n * p.k);
    std::vector<double> wd(p.n * p.k);
    quant::DequantizeBlocks(p.wt, w.data(), p.n * p.k / LayoutOf(p.wt).block_elems, wd.data());
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> x(p.m * p.k);
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = u(rng);
      if (p.act == v1::DTYPE_BF16) x16[i] = FloatToBf16(x[i]), x[i] = Bf16ToFloat(x16[i]);
      if (p.act == v1::DTYPE_F16) x16[i] = FloatToHalf(x[i]), x[i] = HalfToFloat(x16[i]);
    }
    const KernelSpec spec = SpecOf(p);
    ASSERT_TRUE(dev_->Supports(spec).native) << dev_->Supports(spec).reason;
    backend::PrepareContext ctx;
    auto kernel = dev_->PrepareKernel(spec, ctx);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    const int64_t esize = p.act == v1::DTYPE_F32 ? 4 : 2;
    auto xb = Upload(p.act == v1::DTYPE_F32 ? static_cast<const void*>(x.data()) : x16.data(),
                     p.m * p.k * esize, 0);
    auto wb = Upload(w.data(), static_cast<int64_t>(w.size()), p.weight_offset);
    auto yb = dev_->Allocate(p.m * p.n * esize);
    ASSERT_TRUE(yb.ok());
    const BufferView in[] = {{xb.get(), 0, p.m * p.k * esize},
                             {wb.get(), p.weight_offset, static_cast<int64_t>(w.size())}};
    const BufferView out[] = {{yb->get(), 0, p.m * p.n * esize}};
    ASSERT_TRUE((*kernel)->Launch(*stream_, in, out).ok());
    std::vector<char> y(p.m * p.n * esize);
    ASSERT_TRUE(dev_->CopyToHost(*stream_, out[0], y.data()).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    const double rel = p.act == v1::DTYPE_F32 ? 1e-5 : 1.0 / 256;
    int bad = 0;
    for (int64_t r = 0; r < p.m; ++r) {
      for (int64_t c = 0; c < p.n; ++c) {
        double ref = 0, scale = 0;
        for (int64_t j = 0; j < p.k; ++j) {
          const double wv = p.transpose_b ? wd[c * p.k + j] : wd[j * p.n + c];
          ref += double{x[r * p.k + j]} * wv;
          scale += std::fabs(double{x[r * p.k + j]} * wv);
        }
        float got;
        if (p.act == v1::DTYPE_F32) {
          std::memcpy(&got, y.data() + 4 * (r * p.n + c), 4);
        } else {
          uint16_t h;
          std::memcpy(&h, y.data() + 2 * (r * p.n + c), 2);
          got = p.act == v1::DTYPE_BF16 ? Bf16ToFloat(h) : HalfToFloat(h);
        }
        if (!(std::fabs(got - ref) <= rel * scale + 1e-30) && ++bad <= 5) {
          ADD_FAILURE() << "y[" << r << ", " << c << "] = " << got << ", want " << ref
                        << " (sum |x w| " << scale << ")";
        }
      }
    }
    EXPECT_EQ(bad, 0);
    std::printf("%s: %s\n", Name(p).c_str(), (*kernel)->implementation().c_str());
  }

  std::unique_ptr<backend::Backend> backend_;
  backend::Device* dev_ = nullptr;
  std::unique_ptr<backend::Stream> stream_;
};

// Sets KILN_DEQUANT_MMA for one test: "1" (the default, kernels_dequant_matmul.cc's
// MmaByDefault, made explicit so a user's environment cannot change what the test
// checks) or "0" (the tensor-core kernel off).
class ScopedMmaDefault {
 public:
  explicit ScopedMmaDefault(const char* value = "1") { setenv("KILN_DEQUANT_MMA", value, 1); }
  ~ScopedMmaDefault() { unsetenv("KILN_DEQUANT_MMA"); }
  ScopedMmaDefault(const ScopedMmaDefault&) = delete;
  ScopedMmaDefault& operator=(const ScopedMmaDefault&) = delete;
};

// Forces KILN_DEQUANT_PATH (a kernel the default would not pick) for one test.
class ScopedDequantPath {
 public:
  explicit ScopedDequantPath(const char* path) { setenv("KILN_DEQUANT_PATH", path, 1); }
  ~ScopedDequantPath() { unsetenv("KILN_DEQUANT_PATH"); }
  ScopedDequantPath(const ScopedDequantPath&) = delete;
  ScopedDequantPath& operator=(const ScopedDequantPath&) = delete;
};

TEST_F(CudaDequantMatMulTest, MatVecEveryBlockType) {
  for (DType wt : kBlockTypes) {
    Check({wt, v1::DTYPE_F32, 1, 1031, 1024, true, 0});
    Check({wt, v1::DTYPE_F32, 3, 257, 512, true, 0});
  }
  // An LLM layer's shape (4096 x 4096), decode.
  Check({v1::DTYPE_Q4_K, v1::DTYPE_F32, 1, 4096, 4096, true, 0});
  Check({v1::DTYPE_Q8_0, v1::DTYPE_F32, 1, 4096, 4096, true, 0});
}

// Batches up to 8 rows on the matvec kernel (q4_k / q8_0 with f32
// activations take it only up to 2 by default; forced here): the instances for 1, 4 and 8 rows
// of x per pass, an odd row count (the block's second weight row past N) and
// K that leaves some of a block's warps without a quant block.
TEST_F(CudaDequantMatMulTest, MatVecBatchesAndPasses) {
  ScopedDequantPath matvec("matvec");
  for (DType wt : kBlockTypes) {
    for (int64_t m : {2, 4, 5, 8}) Check({wt, v1::DTYPE_F32, m, 67, 512, true, 0});
    Check({wt, v1::DTYPE_F32, 2, 33, 256, true, 0});
    Check({wt, v1::DTYPE_BF16, 5, 33, 768, true, 0});
  }
  // A decode batch of a 14336 x 4096 layer (the bench's shape).
  Check({v1::DTYPE_Q4_K, v1::DTYPE_F32, 8, 14336, 4096, true, 0});
}

// The tensor-core kernel's one-tile instance (mma_n1; the default for q4_k /
// q8_0 with f32 activations at 3..8 rows, forced here for the rest): every
// block type, f32 / bf16, a decode batch of a 14336 x 4096 layer.
TEST_F(CudaDequantMatMulTest, SmallBatchesOnTheTensorCores) {
  ScopedDequantPath mma("mma");
  for (DType wt : kBlockTypes) {
    for (int64_t m : {3, 5, 8}) Check({wt, v1::DTYPE_F32, m, 67, 512, true, 0});
    Check({wt, v1::DTYPE_BF16, 4, 130, 768, true, 0});
  }
  Check({v1::DTYPE_Q4_K, v1::DTYPE_F32, 8, 14336, 4096, true, 0});
}

// More rows take the tensor-core kernel (sm_80+): the 2, 4 and 8-tile
// instances, rows of x and weight rows ending inside a tile, K of half a
// kstep more (q8_0, q4_0), f16 and bf16 activations, and shapes whose
// tiles are too few for the device, so K is split (the partials summed by
// the reduction kernel).

TEST_F(CudaDequantMatMulTest, TensorCoresEveryBlockType) {
  ScopedMmaDefault mma;
  for (DType wt : kBlockTypes) {
    for (int64_t m : {9, 16, 17, 32, 33, 64, 100}) Check({wt, v1::DTYPE_F32, m, 67, 512, true, 0});
    Check({wt, v1::DTYPE_F32, 13, 300, 1024, true, 0});
    Check({wt, v1::DTYPE_BF16, 24, 130, 768, true, 0});
    Check({wt, v1::DTYPE_F16, 40, 130, 768, true, 0});
    Check({wt, v1::DTYPE_F32, 16, 96, 4096, true, 0});  // split K
  }
  Check({v1::DTYPE_Q8_0, v1::DTYPE_F32, 12, 50, 96, true, 0});
  Check({v1::DTYPE_Q4_0, v1::DTYPE_F32, 12, 50, 1056, true, 0});
  // A batch of 33 of a 14336 x 4096 layer (the 8-tile instance; the f64
  // reference's 2G products take a few seconds) and of 16 of a 4096 x 4096
  // one (the bench's shapes).
  Check({v1::DTYPE_Q4_K, v1::DTYPE_F32, 33, 14336, 4096, true, 0});
  Check({v1::DTYPE_Q8_0, v1::DTYPE_F32, 16, 4096, 4096, true, 0});
}

// KILN_DEQUANT_MMA=0 turns the tensor-core kernel off: batches keep the
// matvec kernel up to 32 rows and the tiled one above.
TEST_F(CudaDequantMatMulTest, PathByBatchWithTheTensorCoresOff) {
  ScopedMmaDefault off("0");
  for (const auto& [m, path] : std::vector<std::pair<int64_t, std::string>>{
           {1, "matvec_r8_m1"}, {8, "matvec_m8"}, {9, "matvec_m8"}, {32, "matvec_m8"},
           {33, "matmul"}}) {
    const Problem p{v1::DTYPE_Q4_K, v1::DTYPE_F32, m, 64, 256, true, 0};
    backend::PrepareContext ctx;
    auto kernel = dev_->PrepareKernel(SpecOf(p), ctx);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_EQ((*kernel)->implementation(), absl::StrCat("nvrtc:dequant_", path, "_q4_k_f32",
                                                        path == "matmul" ? "_nk_32x64" : ""));
  }
}

TEST_F(CudaDequantMatMulTest, PathByBatch) {
  unsetenv("KILN_DEQUANT_MMA");  // the default: tensor cores past 2 rows
  for (const auto& [m, path] : std::vector<std::pair<int64_t, std::string>>{
           {1, "matvec_r8_m1"}, {2, "matvec_m4"}, {3, "mma_n1"}, {8, "mma_n1"},
           {9, "mma_n2"}, {32, "mma_n4"}, {33, "mma_n8"}, {300, "mma_n8"}}) {
    const Problem p{v1::DTYPE_Q4_K, v1::DTYPE_F32, m, 64, 256, true, 0};
    backend::PrepareContext ctx;
    auto kernel = dev_->PrepareKernel(SpecOf(p), ctx);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_EQ((*kernel)->implementation(),
              absl::StrCat("nvrtc:dequant_", path, "_q4_k_f32"));
  }
  // [K, N] weights: the tiled kernel at any batch.
  const Problem kn{v1::DTYPE_Q4_K, v1::DTYPE_F32, 40, 256, 64, false, 0};
  backend::PrepareContext ctx;
  auto kernel = dev_->PrepareKernel(SpecOf(kn), ctx);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->implementation(), "nvrtc:dequant_matmul_q4_k_f32_kn_32x64");
  // Few tiles, long K: split.
  const Problem few{v1::DTYPE_Q4_K, v1::DTYPE_F32, 16, 64, 4096, true, 0};
  kernel = dev_->PrepareKernel(SpecOf(few), ctx);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_NE((*kernel)->implementation().find("nvrtc:dequant_mma_n2_q4_k_f32_split"),
            std::string::npos)
      << (*kernel)->implementation();  // One row of x, other block types: 4 weight rows per block.
  const Problem q8{v1::DTYPE_Q8_0, v1::DTYPE_F32, 1, 64, 256, true, 0};
  kernel = dev_->PrepareKernel(SpecOf(q8), ctx);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->implementation(), "nvrtc:dequant_matvec_r4_m1_q8_0_f32");
  // Block types and activations not timed on a GPU keep 2 rows per block
  // and the matvec kernel up to 8 rows; bf16 at 64 rows keeps the tensor cores
  // (the lt path is opt-in).
  for (const auto& [wt, act, m, impl] :
       std::vector<std::tuple<DType, DType, int64_t, std::string>>{
           {v1::DTYPE_Q6_K, v1::DTYPE_F32, 1, "nvrtc:dequant_matvec_m1_q6_k_f32"},
           {v1::DTYPE_Q5_K, v1::DTYPE_F32, 5, "nvrtc:dequant_matvec_m8_q5_k_f32"},
           {v1::DTYPE_Q4_K, v1::DTYPE_BF16, 8, "nvrtc:dequant_matvec_m8_q4_k_bf16"},
           {v1::DTYPE_Q4_K, v1::DTYPE_BF16, 64, "nvrtc:dequant_mma_n8_q4_k_bf16"}}) {
    const Problem p{wt, act, m, 64, 256, true, 0};
    kernel = dev_->PrepareKernel(SpecOf(p), ctx);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_EQ((*kernel)->implementation(), impl);
  }
}

// The lt path (KILN_DEQUANT_PATH=lt: the weight dequantized into an f16 /
// bf16 workspace, then a cuBLASLt GEMM): every block type, both activation
// types, a batch of 64 of a 4096 x 4096 layer; f32 activations keep the
// tensor-core kernel (a 16-bit workspace would miss their tolerance).
TEST_F(CudaDequantMatMulTest, DequantizeThenCublasLt) {
  ScopedDequantPath lt("lt");
  for (DType wt : kBlockTypes) {
    Check({wt, v1::DTYPE_BF16, 40, 130, 768, true, 0});
    Check({wt, v1::DTYPE_F16, 129, 64, 512, true, 0});
  }
  Check({v1::DTYPE_Q4_K, v1::DTYPE_BF16, 64, 4096, 4096, true, 0});
  for (const auto& [act, impl] : std::vector<std::pair<DType, std::string>>{
           {v1::DTYPE_BF16, "nvrtc:dequant_to_q8_0_bf16+cublasLt"},
           {v1::DTYPE_F32, "nvrtc:dequant_mma_n8_q8_0_f32"}}) {
    const Problem p{v1::DTYPE_Q8_0, act, 64, 128, 256, true, 0};
    backend::PrepareContext ctx;
    auto kernel = dev_->PrepareKernel(SpecOf(p), ctx);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_EQ((*kernel)->implementation(), impl);
  }
}

TEST_F(CudaDequantMatMulTest, WeightsOnlyTwoOrFourByteAligned) {
  for (DType wt : kBlockTypes) {
    for (int64_t offset : {2, 4, 6}) {
      Check({wt, v1::DTYPE_F32, 1, 65, 768, true, offset});
      Check({wt, v1::DTYPE_F32, 9, 65, 768, true, offset});
    }
  }
}

// [K, N] weights (the tiled kernel at any batch).
TEST_F(CudaDequantMatMulTest, TiledEveryBlockTypeAndLayout) {
  for (DType wt : kBlockTypes) {
    const int64_t be = LayoutOf(wt).block_elems;
    Check({wt, v1::DTYPE_F32, 33, 2 * be, 300, false, 0});
    Check({wt, v1::DTYPE_F32, 1, 2 * be, 77, false, 0});
    Check({wt, v1::DTYPE_F32, 5, 3 * be, 300, false, 0});
  }
}

TEST_F(CudaDequantMatMulTest, Bf16Activations) {
  for (DType wt : kBlockTypes) {
    Check({wt, v1::DTYPE_BF16, 1, 100, 512, true, 0});
    Check({wt, v1::DTYPE_BF16, 8, 100, 512, true, 0});
  }
}

TEST_F(CudaDequantMatMulTest, OddWeightAddressIsRefused) {
  const Problem p{v1::DTYPE_Q8_0, v1::DTYPE_F32, 1, 4, 32, true, 1};
  backend::PrepareContext ctx;
  auto kernel = dev_->PrepareKernel(SpecOf(p), ctx);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  auto x = dev_->Allocate(128), w = dev_->Allocate(4 * 34 + 1), y = dev_->Allocate(16);
  ASSERT_TRUE(x.ok() && w.ok() && y.ok());
  const BufferView in[] = {{x->get(), 0, 128}, {w->get(), 1, 4 * 34}};
  const BufferView out[] = {{y->get(), 0, 16}};
  const absl::Status s = (*kernel)->Launch(*stream_, in, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("2-byte aligned"), std::string::npos) << s;
  EXPECT_TRUE(stream_->Synchronize().ok());
}

}  // namespace
}  // namespace kiln::cuda
