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
// The tensor-core kernel's PTX, for the host (DQ_HOST: dequant_matmul.cu
// then takes these instead of its asm). mma.sync m16n8k16 as PTX lays out
// its fragments: lane (g, t) = (lane / 4, lane % 4) holds A rows g and g + 8,
// columns 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9 (2, 3), B column g,
// rows 2t, 2t + 1 and 2t + 8, 2t + 9, and D rows g, g + 8, columns 2t, 2t + 1.
// The products are exact; the sum is f64 then added to C (the tensor cores
// keep more than f32 inside one instruction).
#define DQ_HOST 1
struct MmaExchange {
  unsigned a[32][4];
  unsigned b[32][2];
};
thread_local MmaExchange* mma_exchange = nullptr;
inline double Bf16Half(unsigned word, int half) {
  return Bf16ToFloat(static_cast<uint16_t>(word >> (16 * half)));
}
inline void dq_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  const unsigned lane = threadIdx.x & 31;
  for (int i = 0; i < 4; ++i) mma_exchange->a[lane][i] = a[i];
  mma_exchange->b[lane][0] = b0;
  mma_exchange->b[lane][1] = b1;
  warp_barrier->arrive_and_wait();
  auto A = [](int r, int k) {
    return Bf16Half(mma_exchange->a[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k & 1);
  };
  auto B = [](int k, int n) {
    return Bf16Half(mma_exchange->b[n * 4 + (k % 8) / 2][k >= 8], k & 1);
  };
  const int g = static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3);
  float d[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, n);
    d[e] = static_cast<float>(double{c[e]} + sum);
  }
  warp_barrier->arrive_and_wait();
  for (int e = 0; e < 4; ++e) c[e] = d[e];
}
inline unsigned dq_bf16x2_less128(unsigned v) {
  const uint16_t lo = FloatToBf16(Bf16ToFloat(static_cast<uint16_t>(v)) - 128.0f);
  const uint16_t hi = FloatToBf16(Bf16ToFloat(static_cast<uint16_t>(v >> 16)) - 128.0f);
  return lo | (static_cast<unsigned>(hi) << 16);
}
inline unsigned dq_pack_bf16x2(float lo, float hi) {
  return FloatToBf16(lo) | (static_cast<unsigned>(FloatToBf16(hi)) << 16);
}
inline float dq_shfl_xor(float v, int o) {
  const unsigned lane = threadIdx.x & 31;
  warp_exchange[lane] = v;
  warp_barrier->arrive_and_wait();
  const float r = warp_exchange[lane ^ static_cast<unsigned>(o)];
  warp_barrier->arrive_and_wait();
  return r;
}
// Its `#pragma unroll` lines are CUDA's (tests/CMakeLists.txt: -Wno-unknown-pragmas).
#include "backends/cuda/kernels/dequant_matmul.cu"

using Entry = void (*)(const void* x, const k_u8* w, void* y, k_i64 M, k_i64 N, k_i64 K,
                       k_i64 row_bytes);

// Runs `body` as CUDA runs a grid of `threads`-thread blocks: the blocks one
// after another (the kernel's __shared__ arrays are static buffers), each
// block's threads at once.
template <typename Body>
void RunGrid(unsigned gx, unsigned gy, unsigned gz, int threads, const Body& body) {
  for (unsigned bz = 0; bz < gz; ++bz) {
    for (unsigned by = 0; by < gy; ++by) {
      for (unsigned bx = 0; bx < gx; ++bx) {
        std::barrier<> block(threads);
        const int warps = (threads + 31) / 32;
        std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
        std::vector<std::vector<float>> exchange(warps, std::vector<float>(32));
        std::vector<MmaExchange> mma(warps);
        for (int i = 0; i < warps; ++i) {
          warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32, threads - 32 * i)));
        }
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            threadIdx = {static_cast<unsigned>(t), 0, 0};
            blockIdx = {bx, by, bz};
            blockDim = {static_cast<unsigned>(threads), 1, 1};
            gridDim = {gx, gy, gz};
            block_barrier = &block;
            warp_barrier = warp_barriers[t / 32].get();
            warp_exchange = exchange[t / 32].data();
            mma_exchange = &mma[t / 32];
            body();
          });
        }
        for (std::thread& t : pool) t.join();
      }
    }
  }
}

// Runs a matvec entry point over the grid the host launches (a block of
// DQ_MV_WARPS warps per `rows` weight rows).
void Launch(Entry fn, int rows, const void* x, const k_u8* w, void* y, k_i64 m, k_i64 n,
            k_i64 k, k_i64 row_bytes) {
  RunGrid(static_cast<unsigned>((n + rows - 1) / rows), 1, 1, DQ_MV_WARPS * 32,
          [&] { fn(x, w, y, m, n, k, row_bytes); });
}

template <typename T, int MR, int WT, int R>
void EntryFor(const void* x, const k_u8* w, void* y, k_i64 M, k_i64 N, k_i64 K, k_i64 rb) {
  dequant_matvec<WT, MR, T, R>(static_cast<const T*>(x), w, static_cast<T*>(y), M, N, K, rb);
}

struct Case {
  DType wt;
  int wt_code;  // dequant_matmul.cu's DQ_*
  int64_t m, n, k;
  int64_t weight_offset;  // bytes past a 16-byte boundary
  int64_t x_offset;       // elements past a 16-byte boundary
  bool bf16;
  int mma_splits = 0;  // > 0: the tensor-core kernel with this many shares of K
  bool f16 = false;    // f16 activations (the tensor-core kernel's cases)
  int rows = DQ_MV_R;  // the matvec kernel's weight rows per block (2, 4, 8)
  int prefetch = DQ_MMA_PF;  // the tensor-core kernel's ksteps loaded ahead (1, 2)
};

std::string Name(const Case& c) {
  return absl::StrCat(DTypeName(c.wt), c.bf16 ? "_bf16" : (c.f16 ? "_f16" : "_f32"), "_m", c.m,
                      "_n", c.n, "_k", c.k, "_w+", c.weight_offset, "_x+", c.x_offset,
                      c.mma_splits > 0 ? absl::StrCat("_mma_split", c.mma_splits) : "",
                      c.rows != DQ_MV_R ? absl::StrCat("_r", c.rows) : "",
                      c.prefetch != DQ_MMA_PF ? absl::StrCat("_pf", c.prefetch) : "");
}

void PutHalf(uint8_t* p, double v) {
  const uint16_t h = FloatToHalf(static_cast<float>(v));
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

template <int WT, typename T, int R>
Entry Pick(int64_t m) {
  // kernels_dequant_matmul.cc's MatVecRows.
  if (m <= 1) return &EntryFor<T, 1, WT, R>;
  if (m <= 4) return &EntryFor<T, 4, WT, R>;
  return &EntryFor<T, 8, WT, R>;
}

template <int WT, typename T>
Entry PickRows(int64_t m, int rows) {
  if (rows == 4) return Pick<WT, T, 4>(m);
  if (rows == 8) return Pick<WT, T, 8>(m);
  return Pick<WT, T, DQ_MV_R>(m);
}

template <int WT>
Entry PickFor(int64_t m, bool bf16, int rows) {
  return bf16 ? PickRows<WT, k_bf16>(m, rows) : PickRows<WT, float>(m, rows);
}

// The tensor-core kernel over the grid the host launches (kernels_dequant_
// matmul.cc: MmaTiles picks NT), then the split-K reduction where split.
template <int WT, int NT, typename T>
void RunMmaTiles(const Case& c, const void* x, const k_u8* w, void* y, k_i64 row_bytes) {
  const int splits = c.mma_splits;
  std::vector<float> part(static_cast<size_t>(splits) * c.m * c.n, NAN);
  RunGrid(static_cast<unsigned>((c.n + DQ_MMA_ROWS - 1) / DQ_MMA_ROWS),
          static_cast<unsigned>((c.m + 8 * NT - 1) / (8 * NT)), static_cast<unsigned>(splits),
          DQ_MMA_WARPS * 32, [&] {
            if (c.prefetch == 1) {
              dequant_mma<WT, NT, T, 1>(static_cast<const T*>(x), w, static_cast<T*>(y),
                                        part.data(), c.m, c.n, c.k, row_bytes, splits);
            } else {
              dequant_mma<WT, NT, T, 2>(static_cast<const T*>(x), w, static_cast<T*>(y),
                                        part.data(), c.m, c.n, c.k, row_bytes, splits);
            }
          });
  if (splits > 1) {
    RunGrid(1, 1, 1, 1, [&] {
      dequant_mma_reduce<T>(part.data(), static_cast<T*>(y), c.m * c.n, splits);
    });
  }
}
template <int WT, typename T>
void RunMmaAct(const Case& c, const void* x, const k_u8* w, void* y, k_i64 row_bytes) {
  if (c.m <= 8) return RunMmaTiles<WT, 1, T>(c, x, w, y, row_bytes);
  if (c.m <= 16) return RunMmaTiles<WT, 2, T>(c, x, w, y, row_bytes);
  if (c.m <= 32) return RunMmaTiles<WT, 4, T>(c, x, w, y, row_bytes);
  RunMmaTiles<WT, 8, T>(c, x, w, y, row_bytes);
}
template <int WT>
void RunMma(const Case& c, const void* x, const k_u8* w, void* y, k_i64 row_bytes) {
  if (c.bf16) return RunMmaAct<WT, k_bf16>(c, x, w, y, row_bytes);
  if (c.f16) return RunMmaAct<WT, k_f16>(c, x, w, y, row_bytes);
  RunMmaAct<WT, float>(c, x, w, y, row_bytes);
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
  for (float& v : xf) {
    v = ux(rng);
    if (c.bf16) v = Bf16ToFloat(FloatToBf16(v));
    if (c.f16) v = HalfToFloat(FloatToHalf(v));
  }
  const bool half = c.bf16 || c.f16;
  const int64_t esize = half ? 2 : 4;
  std::vector<float4> xstore((c.m * c.k * esize + 64) / 16 + 1);
  uint8_t* x = reinterpret_cast<uint8_t*>(xstore.data()) + c.x_offset * esize;
  for (int64_t i = 0; i < c.m * c.k; ++i) {
    if (half) {
      const uint16_t h = c.bf16 ? FloatToBf16(xf[i]) : FloatToHalf(xf[i]);
      std::memcpy(x + 2 * i, &h, 2);
    } else {
      std::memcpy(x + 4 * i, &xf[i], 4);
    }
  }
  std::vector<float> yf(c.m * c.n, NAN);
  std::vector<uint16_t> y16(c.m * c.n, 0xffff);
  void* y = half ? static_cast<void*>(y16.data()) : yf.data();
  if (c.mma_splits > 0) {
    switch (c.wt_code) {
      case DQ_Q8_0: RunMma<DQ_Q8_0>(c, x, w, y, row_bytes); break;
      case DQ_Q4_0: RunMma<DQ_Q4_0>(c, x, w, y, row_bytes); break;
      case DQ_Q4_K: RunMma<DQ_Q4_K>(c, x, w, y, row_bytes); break;
      case DQ_Q5_K: RunMma<DQ_Q5_K>(c, x, w, y, row_bytes); break;
      default: RunMma<DQ_Q6_K>(c, x, w, y, row_bytes); break;
    }
  } else {
    Entry fn = nullptr;
    switch (c.wt_code) {
      case DQ_Q8_0: fn = PickFor<DQ_Q8_0>(c.m, c.bf16, c.rows); break;
      case DQ_Q4_0: fn = PickFor<DQ_Q4_0>(c.m, c.bf16, c.rows); break;
      case DQ_Q4_K: fn = PickFor<DQ_Q4_K>(c.m, c.bf16, c.rows); break;
      case DQ_Q5_K: fn = PickFor<DQ_Q5_K>(c.m, c.bf16, c.rows); break;
      default: fn = PickFor<DQ_Q6_K>(c.m, c.bf16, c.rows); break;
    }
    Launch(fn, c.rows, x, w, y, c.m, c.n, c.k, row_bytes);
  }
  // Within 1e-5 (f32) or 2^-8 (bf16 / f16 storage) of sum_k |x w|, as the GPU test.
  const double tol = half ? 1.0 / 256 : 1e-5;
  int bad = 0;
  double worst = 0;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < c.n; ++col) {
      double ref = 0, scale = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        ref += double{xf[r * c.k + j]} * wd[col * c.k + j];
        scale += std::fabs(double{xf[r * c.k + j]} * wd[col * c.k + j]);
      }
      const double got = c.bf16  ? Bf16ToFloat(y16[r * c.n + col])
                         : c.f16 ? HalfToFloat(y16[r * c.n + col])
                                 : yf[r * c.n + col];
      const double err = std::fabs(got - ref) / scale;
      worst = std::max(worst, std::isnan(err) ? INFINITY : err);
      if (!(err <= tol) && ++bad <= 5) {
        ADD_FAILURE() << "y[" << r << ", " << col << "] = " << got << ", want " << ref
                      << " (sum |x w| " << scale << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
  if (!half) {
    // The tensor-core kernel's hi + lo split leaves up to 2^-18 |x| per
    // element (random in sign), a plain f32 dot a few ulps.
    EXPECT_LT(worst, c.mma_splits > 0 ? 4e-6 : 1e-6) << "f32 error well above its model";
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

// The matvec kernel with 4 and 8 weight rows per block
// (kiln_dequant_matvec_r<R>_m<MR>_<w>_<x>): row counts that end inside a
// block, one and several blocks per lane, weights 2-byte aligned, bf16,
// several rows of x.
TEST(CudaDequantMatVecHostTest, FourAndEightRowsPerBlock) {
  for (const Type& t : kTypes) {
    Check({t.wt, t.code, 1, 11, 1024, 0, 0, false, 0, false, 4});
    Check({t.wt, t.code, 1, 6, 512, 0, 3, true, 0, false, 4});
    Check({t.wt, t.code, 1, 9, 4096, 0, 0, false, 0, false, 8});
    Check({t.wt, t.code, 1, 5, 768, 6, 0, false, 0, false, 8});
    Check({t.wt, t.code, 6, 7, 512, 0, 0, false, 0, false, 4});  // m8
  }
}

// The tensor-core kernel (kiln_dequant_mma_n<NT>_<w>_<x>): every block type,
// the 2, 4 and 8-tile instances, rows of x and weight rows that end inside a
// tile, K of whole ksteps and (q8_0, q4_0) half of one, shares of K summed by
// the reduction, f32 / f16 / bf16 activations, weights only 2-byte aligned,
// x only 4-byte aligned (its scalar loads).
TEST(CudaDequantMmaHostTest, EveryBlockTypeAndInstance) {
  for (const Type& t : kTypes) {
    Check({t.wt, t.code, 9, 70, 512, 0, 0, false, 1});     // n2; a second weight tile
    Check({t.wt, t.code, 32, 64, 256, 0, 0, false, 1});    // n4
    Check({t.wt, t.code, 37, 19, 768, 0, 0, false, 2});    // n8, split
    Check({t.wt, t.code, 70, 16, 256, 0, 0, false, 1});    // two tiles of x
    Check({t.wt, t.code, 1, 70, 512, 0, 0, false, 1});     // n1: one row of x
    Check({t.wt, t.code, 8, 19, 768, 0, 0, false, 3});     // n1, split
    Check({t.wt, t.code, 3, 9, 512, 2, 1, true, 2});       // n1, bf16, w +2, x +1
    // One kstep loaded ahead (KILN_DEQUANT_MMA_PREFETCH=1), two shares.
    Check({t.wt, t.code, 12, 20, 768, 0, 0, false, 2, false, DQ_MV_R, 1});
  }
  for (DType wt : {v1::DTYPE_Q8_0, v1::DTYPE_Q4_0}) {
    const int code = wt == v1::DTYPE_Q8_0 ? DQ_Q8_0 : DQ_Q4_0;
    Check({wt, code, 12, 8, 96, 0, 0, false, 1});   // K = 1.5 ksteps
    Check({wt, code, 12, 8, 160, 0, 0, false, 3});  // split, the last share half a kstep
  }
}

TEST(CudaDequantMmaHostTest, ActivationTypesAndAlignments) {
  for (const Type& t : kTypes) {
    Check({t.wt, t.code, 16, 24, 512, 0, 0, true, 1});
    Check({t.wt, t.code, 20, 24, 512, 0, 0, false, 2, true});  // f16
    Check({t.wt, t.code, 16, 9, 512, 2, 1, false, 1});         // w +2 bytes, x +1 element
    Check({t.wt, t.code, 10, 9, 256, 6, 3, true, 1});
  }
}

}  // namespace
}  // namespace kiln::cuda::dequant_host_emulation
