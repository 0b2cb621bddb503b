// The DequantMatMul matvec kernel (backends/cuda/kernels/dequant_matmul.cu,
// kiln_dequant_matvec_m<MR>_<w>_<x>) compiled for the host and run as CUDA
// would run it: a block is 128 threads meeting at __syncthreads (a barrier),
// a warp's sum goes through the warp's exchange buffer, blocks run one after
// another (the kernel's __shared__ array is one static buffer). Its
// bit-level decoding (codes placed in float mantissas with PRMT, funnel
// shifts of words for 2-byte aligned blocks) is checked here against the f64
// dequantize-then-matmul reference on every build, for every block type,
// each instance (1, 4 and 8 rows of x per pass) and several passes, weights
// 16-, 4- and 2-byte aligned, x aligned and not, f32 and bf16 activations.
// No GPU needed; CudaDequantMatMulTest checks the compiled kernel on one.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/common/quant_blocks.h"
#include "base/dtype.h"
#include "base/half.h"

namespace kiln::cuda::dequant_host_emulation {
namespace {

// The CUDA and common.cuh the kernel uses, for the host.
typedef long long k_i64;
typedef unsigned long long k_u64;
typedef unsigned char k_u8;
struct k_f16 {
  unsigned short bits;
};
struct k_bf16 {
  unsigned short bits;
};
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
#define __shared__ static
struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Dim3 threadIdx, blockIdx, blockDim, gridDim;
thread_local std::barrier<>* block_barrier = nullptr;
thread_local std::barrier<>* warp_barrier = nullptr;
thread_local float* warp_exchange = nullptr;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }
// PTX prmt's default mode: result byte i is byte s[4i + 3 : 4i] of y:x.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (uint64_t{y} << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return static_cast<unsigned>(((uint64_t{hi} << 32) | lo) >> (shift & 31));
}
inline float k_f16_to_f32(unsigned short h) { return HalfToFloat(h); }
inline float k_load(const float* p, k_i64 i) { return p[i]; }
inline float k_load(const k_f16* p, k_i64 i) { return HalfToFloat(p[i].bits); }
inline float k_load(const k_bf16* p, k_i64 i) { return Bf16ToFloat(p[i].bits); }
inline void k_store(float* p, k_i64 i, float v) { p[i] = v; }
inline void k_store(k_f16* p, k_i64 i, float v) { p[i].bits = FloatToHalf(v); }
inline void k_store(k_bf16* p, k_i64 i, float v) { p[i].bits = FloatToBf16(v); }
// Every lane gets the warp's sum (in lane order: not the butterfly's, which
// only reorders f32 additions).
inline float k_warp_sum(float v) {
  const unsigned lane = threadIdx.x & 31;
  warp_exchange[lane] = v;
  warp_barrier->arrive_and_wait();
  float s = 0.0f;
  for (int i = 0; i < 32; ++i) s += warp_exchange[i];
  warp_barrier->arrive_and_wait();
  return s;
}
// Its `#pragma unroll` lines are CUDA's (tests/CMakeLists.txt: -Wno-unknown-pragmas).
#include "backends/cuda/kernels/dequant_matmul.cu"

using Entry = void (*)(const void* x, const k_u8* w, void* y, k_i64 M, k_i64 N, k_i64 K,
                       k_i64 row_bytes);

// Runs a matvec entry point over the grid the host launches (a block of
// DQ_MV_WARPS warps per DQ_MV_R weight rows).
void Launch(Entry fn, const void* x, const k_u8* w, void* y, k_i64 m, k_i64 n, k_i64 k,
            k_i64 row_bytes) {
  constexpr int kThreads = DQ_MV_WARPS * 32;
  const unsigned grid = static_cast<unsigned>((n + DQ_MV_R - 1) / DQ_MV_R);
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> block(kThreads);
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::vector<float>> exchange(DQ_MV_WARPS, std::vector<float>(32));
    for (int i = 0; i < DQ_MV_WARPS; ++i) warps.push_back(std::make_unique<std::barrier<>>(32));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        threadIdx.x = t;
        blockIdx.x = b;
        blockDim.x = kThreads;
        gridDim.x = grid;
        block_barrier = &block;
        warp_barrier = warps[t / 32].get();
        warp_exchange = exchange[t / 32].data();
        fn(x, w, y, m, n, k, row_bytes);
      });
    }
    for (std::thread& t : threads) t.join();
  }
}

template <typename T, int MR, int WT>
void EntryFor(const void* x, const k_u8* w, void* y, k_i64 M, k_i64 N, k_i64 K, k_i64 rb) {
  dequant_matvec<WT, MR, T>(static_cast<const T*>(x), w, static_cast<T*>(y), M, N, K, rb);
}

struct Case {
  DType wt;
  int wt_code;  // dequant_matmul.cu's DQ_*
  int64_t m, n, k;
  int64_t weight_offset;  // bytes past a 16-byte boundary
  int64_t x_offset;       // elements past a 16-byte boundary
  bool bf16;
};

std::string Name(const Case& c) {
  return absl::StrCat(DTypeName(c.wt), c.bf16 ? "_bf16" : "_f32", "_m", c.m, "_n", c.n, "_k", c.k,
                      "_w+", c.weight_offset, "_x+", c.x_offset);
}

void PutHalf(uint8_t* p, double v) {
  const uint16_t h = FloatToHalf(static_cast<float>(v));
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

template <int WT, typename T>
Entry Pick(int64_t m) {
  // kernels_dequant_matmul.cc's MatVecRows.
  if (m <= 1) return &EntryFor<T, 1, WT>;
  if (m <= 4) return &EntryFor<T, 4, WT>;
  return &EntryFor<T, 8, WT>;
}

template <int WT>
Entry PickFor(int64_t m, bool bf16) {
  return bf16 ? Pick<WT, k_bf16>(m) : Pick<WT, float>(m);
}

void Check(const Case& c) {
  SCOPED_TRACE(Name(c));
  const DTypeLayout l = LayoutOf(c.wt);
  const int64_t blocks = c.n * c.k / l.block_elems, row_bytes = c.k / l.block_elems * l.block_bytes;
  std::mt19937_64 rng(std::hash<std::string>()(Name(c)));
  // Random blocks decoding to about [-1, 1] (as CudaDequantMatMulTest's).
  std::vector<uint8_t> wstore(blocks * l.block_bytes + 32);
  uint8_t* w = wstore.data() + ((16 - reinterpret_cast<uintptr_t>(wstore.data()) % 16) % 16) +
               c.weight_offset;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<double> u(0.5, 1.0);
  for (int64_t i = 0; i < blocks * l.block_bytes; ++i) w[i] = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = w + i * l.block_bytes;
    const double sign = (rng() & 3) == 0 ? -1 : 1;
    switch (c.wt) {
      case v1::DTYPE_Q8_0: PutHalf(b, sign * u(rng) / 128); break;
      case v1::DTYPE_Q4_0: PutHalf(b, sign * u(rng) / 8); break;
      case v1::DTYPE_Q4_K: PutHalf(b, u(rng) / (63 * 15)), PutHalf(b + 2, u(rng) / 126); break;
      case v1::DTYPE_Q5_K: PutHalf(b, u(rng) / (63 * 31)), PutHalf(b + 2, u(rng) / 126); break;
      default: PutHalf(b + 208, sign * u(rng) / (128 * 32)); break;
    }
  }
  std::vector<double> wd(c.n * c.k);
  quant::DequantizeBlocks(c.wt, w, blocks, wd.data());
  // x at x_offset elements past a 16-byte boundary, f32 or bf16.
  std::vector<float> xf(c.m * c.k);
  std::uniform_real_distribution<float> ux(-1, 1);
  for (float& v : xf) v = c.bf16 ? Bf16ToFloat(FloatToBf16(ux(rng))) : ux(rng);
  const int64_t esize = c.bf16 ? 2 : 4;
  std::vector<float4> xstore((c.m * c.k * esize + 64) / 16 + 1);
  uint8_t* x = reinterpret_cast<uint8_t*>(xstore.data()) + c.x_offset * esize;
  for (int64_t i = 0; i < c.m * c.k; ++i) {
    if (c.bf16) {
      const uint16_t h = FloatToBf16(xf[i]);
      std::memcpy(x + 2 * i, &h, 2);
    } else {
      std::memcpy(x + 4 * i, &xf[i], 4);
    }
  }
  std::vector<float> yf(c.m * c.n, NAN);
  std::vector<uint16_t> y16(c.m * c.n, 0xffff);
  void* y = c.bf16 ? static_cast<void*>(y16.data()) : yf.data();
  Entry fn = nullptr;
  switch (c.wt_code) {
    case DQ_Q8_0: fn = PickFor<DQ_Q8_0>(c.m, c.bf16); break;
    case DQ_Q4_0: fn = PickFor<DQ_Q4_0>(c.m, c.bf16); break;
    case DQ_Q4_K: fn = PickFor<DQ_Q4_K>(c.m, c.bf16); break;
    case DQ_Q5_K: fn = PickFor<DQ_Q5_K>(c.m, c.bf16); break;
    default: fn = PickFor<DQ_Q6_K>(c.m, c.bf16); break;
  }
  Launch(fn, x, w, y, c.m, c.n, c.k, row_bytes);
  // Within 1e-5 (f32) or 2^-8 (bf16 storage) of sum_k |x w|, as the GPU test.
  const double tol = c.bf16 ? 1.0 / 256 : 1e-5;
  int bad = 0;
  double worst = 0;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < c.n; ++col) {
      double ref = 0, scale = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        ref += double{xf[r * c.k + j]} * wd[col * c.k + j];
        scale += std::fabs(double{xf[r * c.k + j]} * wd[col * c.k + j]);
      }
      const double got = c.bf16 ? Bf16ToFloat(y16[r * c.n + col]) : yf[r * c.n + col];
      const double err = std::fabs(got - ref) / scale;
      worst = std::max(worst, std::isnan(err) ? INFINITY : err);
      if (!(err <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "y[" << r << ", " << col << "] = " << got << ", want " << ref
                      << " (sum |x w| " << scale << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
  if (!c.bf16) {
    EXPECT_LT(worst, 1e-6) << "f32 error well above a plain f32 dot's";
  }
}

struct Type {
  DType wt;
  int code;
};
constexpr Type kTypes[] = {{v1::DTYPE_Q8_0, DQ_Q8_0},
                           {v1::DTYPE_Q4_0, DQ_Q4_0},
                           {v1::DTYPE_Q4_K, DQ_Q4_K},
                           {v1::DTYPE_Q5_K, DQ_Q5_K},
                           {v1::DTYPE_Q6_K, DQ_Q6_K}};

TEST(CudaDequantMatVecHostTest, EveryBlockTypeAndInstance) {
  for (const Type& t : kTypes) {
    Check({t.wt, t.code, 1, 7, 1024, 0, 0, false});   // m1; an odd row count
    Check({t.wt, t.code, 3, 5, 768, 0, 0, false});    // m4
    Check({t.wt, t.code, 11, 4, 512, 0, 0, false});   // m8, two passes
    Check({t.wt, t.code, 1, 2, 4096, 0, 0, false});   // several blocks per lane
  }
}

TEST(CudaDequantMatVecHostTest, WeightAndActivationAlignments) {
  for (const Type& t : kTypes) {
    for (int64_t offset : {2, 4, 6, 16}) Check({t.wt, t.code, 2, 3, 768, offset, 0, false});
    Check({t.wt, t.code, 2, 3, 256, 0, 1, false});  // x 4-byte aligned only
  }
}

TEST(CudaDequantMatVecHostTest, Bf16Activations) {
  for (const Type& t : kTypes) {
    Check({t.wt, t.code, 3, 3, 512, 0, 0, true});
    Check({t.wt, t.code, 1, 3, 512, 2, 3, true});  // x 2-byte aligned only
  }
}

}  // namespace
}  // namespace kiln::cuda::dequant_host_emulation
