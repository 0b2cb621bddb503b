// The tensor-core decode kernel (backends/cuda/kernels/attention_decode.cu,
// attention_decode_mma) compiled for the host and run as CUDA would run it:
// a block is 128 threads meeting at __syncthreads (a barrier), a warp's
// shuffles, ldmatrix, movmatrix and mma.sync go through the warp's exchange
// buffers with the fragment layouts PTX documents, cp.async is a plain copy,
// blocks run one after another over the kernel's item loop (the dynamic
// shared memory is one buffer), so the split combine's last block is the
// last in order. The kernel's fragment indexing (S^T = K Q^T, the softmax on
// the accumulator's pairs, P^T turned into the B operand by movmatrix,
// O^T += V^T P^T, the warps' merge) is checked against an f64 reference on
// every build, without a GPU: GQA groups of 2 to 16 rows (padding rows, two
// row tiles), every structural mask, softcap, head dims 64 / 128 / 256, one
// split and several, f16 and bf16. CudaDeviceTest.AttentionPathsMatchAReference
// checks the compiled kernel on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/half.h"

namespace kiln::cuda::decode_mma_host_emulation {

// The CUDA and common.cuh the kernel uses, for the host.
typedef long long k_i64;
typedef unsigned long long k_u64;
struct k_f16 {
  unsigned short bits;
};
struct k_bf16 {
  unsigned short bits;
};
struct alignas(16) k_v16 {
  unsigned x, y, z, w;
};
#define K_INF INFINITY
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Dim3 threadIdx, blockIdx, blockDim, gridDim;
// A warp's exchange buffers (one per warp of the running block).
struct WarpExchange {
  std::unique_ptr<std::barrier<>> barrier;
  float f[32];
  unsigned w[32][4];
  const void* ptr[32];
};
thread_local std::barrier<>* block_barrier = nullptr;
thread_local WarpExchange* warp = nullptr;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __syncwarp() { warp->barrier->arrive_and_wait(); }
inline void __threadfence() {}
inline int atomicAdd(int* p, int v) {  // blocks run one at a time; one thread per block adds
  const int old = *p;
  *p = old + v;
  return old;
}
inline float __ldcg(const float* p) { return *p; }
template <typename T>
T min(T a, T b) {
  return a < b ? a : b;
}
template <typename T>
T max(T a, T b) {
  return a > b ? a : b;
}
inline unsigned Lane() { return threadIdx.x & 31; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  warp->f[Lane()] = v;
  __syncwarp();
  const float r = warp->f[Lane() ^ static_cast<unsigned>(o)];
  __syncwarp();
  return r;
}
inline void k_store(k_f16* p, k_i64 i, float v) { p[i].bits = FloatToHalf(v); }
inline void k_store(k_bf16* p, k_i64 i, float v) { p[i].bits = FloatToBf16(v); }

// mma.cuh for the host (K_MMA_HOST). ldmatrix: lanes 8q..8q+7 address the
// rows of matrix q; lane (g, t) = (lane / 4, lane % 4) gets row g, columns
// 2t and 2t + 1 of each (low half first), or with .trans row 2t and 2t + 1
// of column g. movmatrix.trans: the same layout in and out.
#define K_MMA_HOST 1
inline unsigned short Half(const void* row, int col) {
  return static_cast<const unsigned short*>(row)[col];
}
inline unsigned Pair(unsigned short lo, unsigned short hi) {
  return lo | (static_cast<unsigned>(hi) << 16);
}
inline void LoadMatrix(unsigned (&r)[4], const void* p, bool trans) {
  const unsigned lane = Lane();
  warp->ptr[lane] = p;
  __syncwarp();
  const int g = static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3);
  for (int q = 0; q < 4; ++q) {
    if (trans) {
      r[q] = Pair(Half(warp->ptr[q * 8 + 2 * t], g), Half(warp->ptr[q * 8 + 2 * t + 1], g));
    } else {
      r[q] = Pair(Half(warp->ptr[q * 8 + g], 2 * t), Half(warp->ptr[q * 8 + g], 2 * t + 1));
    }
  }
  __syncwarp();
}
inline void k_ldmatrix_x4(unsigned (&r)[4], const void* p) { LoadMatrix(r, p, false); }
inline void k_ldmatrix_x4_trans(unsigned (&r)[4], const void* p) { LoadMatrix(r, p, true); }
inline unsigned k_movmatrix_trans(unsigned x) {
  const unsigned lane = Lane();
  warp->w[lane][0] = x;
  __syncwarp();
  // M[r][c] is lane (4 r + c / 2)'s half c % 2.
  auto m = [](int r, int c) {
    return static_cast<unsigned short>(warp->w[r * 4 + c / 2][0] >> (16 * (c & 1)));
  };
  const int g = static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3);
  const unsigned out = Pair(m(2 * t, g), m(2 * t + 1, g));
  __syncwarp();
  return out;
}
// mma.sync m16n8k16: lane (g, t) holds A rows g and g + 8, columns 2t, 2t + 1
// (registers 0, 1) and 2t + 8, 2t + 9 (2, 3), B column g, rows 2t, 2t + 1
// and 2t + 8, 2t + 9, and C rows g, g + 8, columns 2t, 2t + 1. The products
// are exact, summed in f64, then added to C.
template <bool IsF16>
inline double HalfValue(unsigned word, int half) {
  const unsigned short h = static_cast<unsigned short>(word >> (16 * half));
  return IsF16 ? HalfToFloat(h) : Bf16ToFloat(h);
}
template <bool IsF16>
inline void k_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const unsigned lane = Lane();
  for (int i = 0; i < 4; ++i) warp->w[lane][i] = a[i];
  __syncwarp();
  unsigned av[32][4], bv[32][2];
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) av[l][i] = warp->w[l][i];
  }
  __syncwarp();
  warp->w[lane][0] = b0;
  warp->w[lane][1] = b1;
  __syncwarp();
  for (int l = 0; l < 32; ++l) bv[l][0] = warp->w[l][0], bv[l][1] = warp->w[l][1];
  __syncwarp();
  auto A = [&](int r, int k) {
    return HalfValue<IsF16>(av[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k & 1);
  };
  auto B = [&](int k, int n) { return HalfValue<IsF16>(bv[n * 4 + (k % 8) / 2][k >= 8], k & 1); };
  const int g = static_cast<int>(lane >> 2), t = static_cast<int>(lane & 3);
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, n);
    c[e] = static_cast<float>(double{c[e]} + sum);
  }
}
template <bool IsF16>
inline unsigned k_pack2(float lo, float hi) {
  if (IsF16) return Pair(FloatToHalf(lo), FloatToHalf(hi));
  return Pair(FloatToBf16(lo), FloatToBf16(hi));
}

// Its `#pragma unroll` lines are CUDA's (tests/CMakeLists.txt: -Wno-unknown-pragmas).
#include "backends/cuda/kernels/attention_decode.cu"

// The block's dynamic shared memory (the largest ring the cases use).
alignas(16) unsigned short k_dec_mma_smem[256 * 1024 / 2];

// Runs `body` as CUDA runs a grid of `blocks` 128-thread blocks, one block
// after another.
template <typename Body>
void RunGrid(unsigned blocks, const Body& body) {
  for (unsigned bx = 0; bx < blocks; ++bx) {
    std::barrier<> block(128);
    std::vector<WarpExchange> warps(4);
    for (WarpExchange& w : warps) w.barrier = std::make_unique<std::barrier<>>(32);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < 128; ++t) {
      pool.emplace_back([&, t] {
        threadIdx = {t, 0, 0};
        blockIdx = {bx, 0, 0};
        blockDim = {128, 1, 1};
        gridDim = {blocks, 1, 1};
        block_barrier = &block;
        warp = &warps[t / 32];
        body();
      });
    }
    for (std::thread& th : pool) th.join();
  }
}

struct DecodeCase {
  bool f16;
  int64_t B, Hq, Hkv, Sq, Sk, D;
  int64_t mask;  // K_MASK_*, or 0
  float softcap;
  int64_t splits;
  unsigned grid;  // blocks (fewer than the items: the blocks loop)
};

std::string Name(const DecodeCase& c) {
  return absl::StrCat(c.f16 ? "f16" : "bf16", "_B", c.B, "_Hq", c.Hq, "_Hkv", c.Hkv, "_Sq", c.Sq,
                      "_Sk", c.Sk, "_D", c.D, "_mask", c.mask, "_cap", c.softcap, "_split",
                      c.splits);
}

template <typename T, int D, bool IsF16>
void Run(const DecodeCase& c, const std::vector<unsigned short>& q,
         const std::vector<unsigned short>& k, const std::vector<unsigned short>& v,
         std::vector<unsigned short>& out, const AttnParams& p) {
  const int64_t tiles = (p.Hq / p.Hkv * p.Sq + 7) / 8;
  std::vector<float> part(static_cast<size_t>(p.B * p.Hq * p.Sq * c.splits * (2 + D)), NAN);
  std::vector<int> counters(static_cast<size_t>(p.B * p.Hkv * tiles), 0);
  RunGrid(c.grid, [&] {
    attention_decode_mma<T, D, IsF16>(
        reinterpret_cast<const T*>(q.data()), reinterpret_cast<const T*>(k.data()),
        reinterpret_cast<const T*>(v.data()), part.data(), reinterpret_cast<T*>(out.data()),
        counters.data(), p, c.splits);
  });
  // Every launch leaves the counters at zero for the next.
  for (int n : counters) EXPECT_EQ(n, 0);
}

void Check(const DecodeCase& c) {
  SCOPED_TRACE(Name(c));
  std::mt19937_64 rng(std::hash<std::string>()(Name(c)));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto encode = [&](double x) { return c.f16 ? FloatToHalf(static_cast<float>(x)) : FloatToBf16(static_cast<float>(x)); };
  auto decode = [&](unsigned short h) { return c.f16 ? double{HalfToFloat(h)} : double{Bf16ToFloat(h)}; };
  auto fill = [&](int64_t n, double spread) {
    std::vector<unsigned short> h(static_cast<size_t>(n));
    for (auto& x : h) x = encode(spread * u(rng));
    return h;
  };
  const std::vector<unsigned short> q = fill(c.B * c.Hq * c.Sq * c.D, 4.0);
  const std::vector<unsigned short> k = fill(c.B * c.Hkv * c.Sk * c.D, 1.0);
  const std::vector<unsigned short> v = fill(c.B * c.Hkv * c.Sk * c.D, 1.0);
  std::vector<unsigned short> out(static_cast<size_t>(c.B * c.Hq * c.Sq * c.D), 0xffff);
  AttnParams p{};
  p.B = c.B, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Sq = c.Sq, p.Sk = c.Sk, p.D = c.D, p.Dv = c.D;
  p.mask = c.mask, p.prefix = 20, p.window = 17;
  p.scale = 0.3f, p.softcap = c.softcap;
  if (c.f16) {
    if (c.D == 64) Run<k_f16, 64, true>(c, q, k, v, out, p);
    if (c.D == 128) Run<k_f16, 128, true>(c, q, k, v, out, p);
    if (c.D == 256) Run<k_f16, 256, true>(c, q, k, v, out, p);
  } else {
    if (c.D == 64) Run<k_bf16, 64, false>(c, q, k, v, out, p);
    if (c.D == 128) Run<k_bf16, 128, false>(c, q, k, v, out, p);
    if (c.D == 256) Run<k_bf16, 256, false>(c, q, k, v, out, p);
  }
  const int64_t group = c.Hq / c.Hkv;
  const double tol = c.f16 ? 4e-3 : 2e-2;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < c.Sq; ++i) {
        const int64_t pos = i + c.Sk - c.Sq;
        int64_t lo = 0, hi = c.Sk;
        if (c.mask == K_MASK_CAUSAL) hi = pos + 1;
        if (c.mask == K_MASK_PREFIX) hi = std::max<int64_t>(pos + 1, 20);
        if (c.mask == K_MASK_SLIDING_WINDOW) hi = pos + 1, lo = pos - 17 + 1;
        lo = std::clamp<int64_t>(lo, 0, c.Sk);
        hi = std::clamp<int64_t>(hi, lo, c.Sk);
        std::vector<double> w;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = lo; j < hi; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            dot += decode(q[((b * c.Hq + h) * c.Sq + i) * c.D + d]) *
                   decode(k[((b * c.Hkv + hk) * c.Sk + j) * c.D + d]);
          }
          double x = 0.3 * dot;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          w.push_back(x);
          mx = std::max(mx, x);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < c.D; ++d) {
          double want = 0;
          for (int64_t j = lo; j < hi; ++j) {
            want += w[j - lo] * decode(v[((b * c.Hkv + hk) * c.Sk + j) * c.D + d]);
          }
          want = sum > 0 ? want / sum : 0;
          const double got = decode(out[((b * c.Hq + h) * c.Sq + i) * c.D + d]);
          ASSERT_NEAR(got, want, tol) << "b " << b << " h " << h << " row " << i << " d " << d;
        }
      }
    }
  }
}

TEST(CudaDecodeMmaHostTest, GqaGroupsMasksAndSplits) {
  const DecodeCase cases[] = {
      // A group of 4 (4 padding rows), 3 splits, 2 blocks looping over 6 items.
      {false, 1, 8, 2, 1, 300, 64, 0, 0, 3, 2},
      // 4 heads x 4 causal rows: two row tiles; f16.
      {true, 2, 4, 1, 4, 200, 64, K_MASK_CAUSAL, 0, 2, 3},
      // A group of 5, softcap, one split (the block writes the output), 5
      // passes for warp 0 (its ring of 3 wraps).
      {false, 1, 5, 1, 1, 300, 128, 0, 20, 1, 1},
      // 2 heads x 2 rows in a sliding window (17 keys: most warps see none).
      {true, 1, 2, 1, 2, 100, 64, K_MASK_SLIDING_WINDOW, 0, 2, 1},
      // A group of 2 x 3 rows under a prefix mask at D 256.
      {true, 1, 4, 2, 3, 90, 256, K_MASK_PREFIX, 0, 2, 2},
      // A group of 16 (two full tiles), keys off the 64-key pass, 4 splits.
      {false, 1, 16, 1, 1, 333, 128, 0, 0, 4, 3},
  };
  for (const DecodeCase& c : cases) Check(c);
}

#undef K_INF
#undef __device__
#undef __forceinline__
#undef __global__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#undef K_MMA_HOST

}  // namespace kiln::cuda::decode_mma_host_emulation
