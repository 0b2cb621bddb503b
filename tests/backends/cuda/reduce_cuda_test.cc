// Column reductions on the CUDA backend (backends/cuda/reduce_plan.h,
// kernels/reduce.cu): the plan that sends few outputs over a long reduced
// dim (a bias or norm-scale gradient) to the split kernel; its entry points
// compiled by NVRTC (no GPU needed); and, on a GPU, every kind and float
// dtype through both column paths against an f64 reference, NaN kept by
// max and min. The device cases skip where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/backend.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/nvrtc_compiler.h"
#include "backends/cuda/reduce_plan.h"
#include "base/half.h"
#include "tests/backends/cuda/cuda_test_backend.h"

namespace kiln::cuda {
namespace {

using backend::BufferView;
using backend::KernelSpec;

TEST(ColumnReducePlan, FewOutputsOverALongDimSplit) {
  // The char GPT's bias gradient at batch 256 on an H100 (132 SMs).
  ColumnReducePlan p = PlanColumnReduce(1, 16384, 64, 132);
  EXPECT_TRUE(p.split);
  EXPECT_EQ(p.tiles, 2);
  EXPECT_EQ(p.splits, 256);  // 4 blocks per SM wanted: 264, capped at 16384 / 64 rows
  EXPECT_EQ(p.partial_bytes, 64 * 256 * 4);
  // A weight gradient summed over a batch of 256: [256, 4096] -> [4096].
  p = PlanColumnReduce(1, 256, 4096, 132);
  EXPECT_TRUE(p.split);
  EXPECT_EQ(p.tiles, 128);
  EXPECT_EQ(p.splits, 4);
  // Short slices are not split further: one split, no partials.
  p = PlanColumnReduce(4, 100, 4096, 132);
  EXPECT_TRUE(p.split);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.partial_bytes, 0);
}

TEST(ColumnReducePlan, ManyOutputsOrAShortDimKeepOneThreadPerOutput) {
  EXPECT_FALSE(PlanColumnReduce(1, 4096, 132 * 2048, 132).split);  // fills the GPU as is
  EXPECT_FALSE(PlanColumnReduce(64, 8, 64, 132).split);            // 8 rows: nothing to split
  EXPECT_FALSE(PlanColumnReduce(50000, 32, 2, 132).split);         // narrow columns, many rows
  EXPECT_TRUE(PlanColumnReduce(1, 16384, 4, 132).split);           // narrow but very few
}

TEST(ReduceCudaNvrtc, SplitEntryPointsCompile) {
  if (absl::Status s = LoadNvrtc(); !s.ok()) GTEST_SKIP() << s;
  absl::StatusOr<std::string> cubin = CompileCubin("reduce.cu", KernelSource("reduce.cu"), "sm_90");
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  for (const char* dt : {"f32", "f16", "bf16"}) {
    for (const char* fn : {"kiln_reduce_cols_split_", "kiln_reduce_cols_finish_"}) {
      const std::string entry = absl::StrCat(fn, dt);
      EXPECT_NE(cubin->find(entry + '\0'), std::string::npos) << entry;
    }
  }
}

class ReduceCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = testing::MakeBackend();
    if (backend_ == nullptr) GTEST_SKIP() << "no CUDA device";
    dev_ = backend_->devices()[0];
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(s).value();
  }

  std::unique_ptr<backend::Backend> backend_;
  backend::Device* dev_ = nullptr;
  std::unique_ptr<backend::Stream> stream_;
};

struct ReduceCase {
  DType dt;
  Dims in;
  std::vector<int64_t> axes;
  v1::ReduceKind kind;
  bool nan = false;  // a NaN in the first output's column (max / min keep it)
  int path = -1;     // 1: the split kernel, 0: one thread per output, -1: either
};

int64_t Count(const Dims& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

void Store(DType dt, std::vector<char>& bytes, int64_t i, double v) {
  if (dt == v1::DTYPE_F32) {
    const float f = static_cast<float>(v);
    std::memcpy(&bytes[i * 4], &f, 4);
    return;
  }
  const uint16_t h =
      dt == v1::DTYPE_F16 ? FloatToHalf(static_cast<float>(v)) : FloatToBf16(static_cast<float>(v));
  std::memcpy(&bytes[i * 2], &h, 2);
}

double Load(DType dt, const std::vector<char>& bytes, int64_t i) {
  if (dt == v1::DTYPE_F32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &bytes[i * 2], 2);
  return dt == v1::DTYPE_F16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

TEST_F(ReduceCudaTest, ColumnPathsMatchAnF64Reference) {
  const ReduceCase cases[] = {
      {v1::DTYPE_F32, {16384, 64}, {0}, v1::REDUCE_SUM, false, 1},  // bias gradient
      {v1::DTYPE_F32, {256, 64, 64}, {0, 1}, v1::REDUCE_MEAN},      // norm-scale gradient shape
      {v1::DTYPE_F32, {256, 64, 256}, {0}, v1::REDUCE_SUM},         // [.., K, N] over a batch
      {v1::DTYPE_F32, {3, 5000, 40}, {1}, v1::REDUCE_MAX, true},    // outer 3, ragged tile, NaN
      {v1::DTYPE_F32, {2, 3000, 7}, {1}, v1::REDUCE_MIN, true},
      {v1::DTYPE_F32, {1000, 33}, {0}, v1::REDUCE_PROD},
      {v1::DTYPE_F16, {4096, 96}, {0}, v1::REDUCE_SUM},
      {v1::DTYPE_BF16, {2, 2048, 64}, {0, 1}, v1::REDUCE_MEAN},
      {v1::DTYPE_F32, {64, 4096}, {0}, v1::REDUCE_SUM},             // short: one split
      {v1::DTYPE_F32, {8, 300000}, {0}, v1::REDUCE_SUM, false, 0},  // many outputs: plain
  };
  std::mt19937_64 rng(19);
  for (const ReduceCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dt), " ", v1::ReduceKind_Name(c.kind), " in [",
                              absl::StrJoin(c.in, ", "), "]"));
    // [outer, r, inner] of the reduced block (the cases' axes are contiguous).
    int64_t outer = 1, r = 1, inner = 1;
    for (int64_t k = 0; k < static_cast<int64_t>(c.in.size()); ++k) {
      const bool red = std::find(c.axes.begin(), c.axes.end(), k) != c.axes.end();
      if (red) {
        r *= c.in[k];
      } else {
        (k < c.axes.front() ? outer : inner) *= c.in[k];
      }
    }
    const int64_t es = ElementSize(c.dt), n = Count(c.in);
    std::vector<char> src(n * es);
    std::vector<double> x(n);
    // PROD: values near 1 so the product stays finite; else [-1, 1].
    std::uniform_real_distribution<double> u(c.kind == v1::REDUCE_PROD ? 0.999 : -1.0,
                                             c.kind == v1::REDUCE_PROD ? 1.001 : 1.0);
    for (int64_t i = 0; i < n; ++i) {
      Store(c.dt, src, i, u(rng));
      x[i] = Load(c.dt, src, i);  // the stored (rounded) value is the reference's input
    }
    if (c.nan) {
      Store(c.dt, src, 17 * inner, std::numeric_limits<double>::quiet_NaN());
      x[17 * inner] = std::numeric_limits<double>::quiet_NaN();
    }
    KernelSpec s;
    s.name = s.label = "reduce";
    s.op = v1::OP_REDUCE;
    s.attrs.mutable_reduce()->set_kind(c.kind);
    for (int64_t a : c.axes) s.attrs.mutable_reduce()->add_axes(a);
    s.inputs = {{c.dt, c.in}};
    Dims out_dims;
    for (int64_t k = 0; k < static_cast<int64_t>(c.in.size()); ++k) {
      if (std::find(c.axes.begin(), c.axes.end(), k) == c.axes.end()) out_dims.push_back(c.in[k]);
    }
    s.outputs = {{c.dt, out_dims}};
    ASSERT_TRUE(dev_->Supports(s).native) << dev_->Supports(s).reason;
    backend::PrepareContext ctx;
    auto k = dev_->PrepareKernel(s, ctx);
    ASSERT_TRUE(k.ok()) << k.status();
    const bool split = (*k)->implementation().find("_cols_split") != std::string::npos;
    if (c.path >= 0) {
      EXPECT_EQ(split, c.path == 1) << (*k)->implementation();
    }
    auto in = dev_->Allocate(n * es);
    ASSERT_TRUE(in.ok());
    ASSERT_TRUE(dev_->CopyToDevice(*stream_, src.data(), {in->get(), 0, n * es}).ok());
    const int64_t out_bytes = outer * inner * es;
    auto out = dev_->Allocate(out_bytes);
    ASSERT_TRUE(out.ok());
    const std::vector<BufferView> ins = {{in->get(), 0, n * es}},
                                  outs = {{out->get(), 0, out_bytes}};
    ASSERT_TRUE((*k)->Launch(*stream_, ins, outs).ok());
    std::vector<char> got(out_bytes);
    ASSERT_TRUE(dev_->CopyToHost(*stream_, {out->get(), 0, out_bytes}, got.data()).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    // f32 accumulation over r terms of |x| <= 1, then the storage rounding.
    const double store_rel = c.dt == v1::DTYPE_BF16  ? 1.0 / 128
                             : c.dt == v1::DTYPE_F16 ? 1.0 / 1024
                                                     : 0;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t col = 0; col < inner; ++col) {
        double acc = c.kind == v1::REDUCE_PROD  ? 1
                     : c.kind == v1::REDUCE_MAX ? -INFINITY
                     : c.kind == v1::REDUCE_MIN ? INFINITY
                                                : 0;
        double abs_sum = 0;
        bool nan = false;
        for (int64_t j = 0; j < r; ++j) {
          const double v = x[(o * r + j) * inner + col];
          nan |= std::isnan(v);
          abs_sum += std::abs(v);
          switch (c.kind) {
            case v1::REDUCE_MAX:
              acc = std::max(acc, v);
              break;
            case v1::REDUCE_MIN:
              acc = std::min(acc, v);
              break;
            case v1::REDUCE_PROD:
              acc *= v;
              break;
            default:
              acc += v;
          }
        }
        if (c.kind == v1::REDUCE_MEAN)
          acc /= static_cast<double>(r), abs_sum /= static_cast<double>(r);
        const double g = Load(c.dt, got, o * inner + col);
        const std::string at = absl::StrCat("output [", o, ", ", col, "]");
        if (nan && (c.kind == v1::REDUCE_MAX || c.kind == v1::REDUCE_MIN)) {
          ASSERT_TRUE(std::isnan(g)) << at;
          continue;
        }
        const double tol =
            (c.kind == v1::REDUCE_PROD ? 1e-4 : 2e-6 * abs_sum) + store_rel * std::abs(acc) + 1e-6;
        ASSERT_NEAR(g, acc, tol) << at;
      }
    }
  }
}

}  // namespace
}  // namespace kiln::cuda
