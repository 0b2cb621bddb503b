// The tiled f32 attention kernel (backends/cuda/kernels/attention_tiled.cu)
// compiled for the host and run as CUDA would run it: a block is 128 threads
// meeting at __syncthreads (a barrier), shuffles go through a warp's exchange
// buffer, the block's dynamic shared memory is one buffer. No GPU needed, so
// the kernel's indexing, tiling, masks and online softmax are checked here
// against an f64 reference on every build; the GPU test
// (CudaDeviceTest.AttentionPathsMatchAReference) checks the compiled kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::cuda::host_emulation {
namespace {

// The CUDA the kernel uses, for the host.
typedef long long k_i64;
#define K_INF INFINITY
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
struct alignas(16) float4 {
  float x, y, z, w;
};
struct Dim3 {
  unsigned x = 0;
};
thread_local Dim3 threadIdx, blockIdx;
thread_local float* block_smem = nullptr;
thread_local std::barrier<>* block_barrier = nullptr;
thread_local std::barrier<>* warp_barrier = nullptr;
thread_local float* warp_exchange = nullptr;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const unsigned lane = threadIdx.x & 31;
  warp_exchange[lane] = v;
  warp_barrier->arrive_and_wait();
  const float r = warp_exchange[lane ^ static_cast<unsigned>(lane_mask)];
  warp_barrier->arrive_and_wait();
  return r;
}
inline float k_load(const float* p, k_i64 i) { return p[i]; }
inline void k_store(float* p, k_i64 i, float v) { p[i] = v; }
#define K_TILED_SMEM block_smem
// Its `#pragma unroll` lines are CUDA's (tests/CMakeLists.txt: -Wno-unknown-pragmas).
#include "backends/cuda/kernels/attention_tiled.cu"

struct Shape {
  int mask;  // v1::MaskKind numbers
  k_i64 prefix, window;
  float softcap;
  k_i64 B, Hq, Hkv, Sq, Sk;
  int D;
  int custom_rank;  // 2 or 3 for a custom mask
};

// Runs the kernel's grid block by block, each block as 128 threads.
void Launch(const Shape& c, const float* q, const float* k, const float* v, const void* extra,
            float* out, const TiledParams& p) {
  const k_i64 blocks = (c.Sq + 31) / 32 * c.B * c.Hq;
  const size_t smem = 32 * (c.D + 4) + 2 * 64 * (c.D + 4) + 32 * 68;
  for (k_i64 bid = 0; bid < blocks; ++bid) {
    std::vector<float> shared(smem);
    std::barrier<> block(128);
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (int w = 0; w < 4; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
    std::vector<float> exchange(128);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 128; ++t) {
      threads.emplace_back([&, t] {
        threadIdx.x = t;
        blockIdx.x = static_cast<unsigned>(bid);
        block_smem = shared.data();
        block_barrier = &block;
        warp_barrier = warps[t / 32].get();
        warp_exchange = exchange.data() + (t / 32) * 32;
        if (c.D == 64) {
          kiln_attention_tiled_f32_d64(q, k, v, extra, out, p);
        } else {
          kiln_attention_tiled_f32_d128(q, k, v, extra, out, p);
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
}

TEST(AttentionTiledHost, EveryMaskKindMatchesAReference) {
  const Shape shapes[] = {
      {0, 0, 0, 0, 2, 4, 2, 40, 70, 64, 0},     // none, GQA, ragged tiles
      {1, 0, 0, 0, 2, 4, 2, 40, 70, 64, 0},     // causal, Sq < Sk
      {1, 0, 0, 0, 1, 1, 1, 130, 65, 64, 0},    // causal, Sq > Sk: early rows see nothing
      {4, 0, 17, 0, 1, 2, 1, 70, 70, 128, 0},   // sliding window, MQA, D 128
      {2, 20, 0, 30, 1, 2, 2, 33, 90, 64, 0},   // prefix, softcap
      {5, 0, 0, 0, 2, 2, 1, 17, 77, 64, 3},     // custom [B, Sq, Sk]
      {5, 0, 0, 0, 2, 2, 2, 17, 77, 64, 2},     // custom [B, Sk]
      {6, 0, 0, 5, 2, 4, 2, 35, 129, 128, 0},   // bias [Hq, Sq, Sk] broadcast over B, softcap
  };
  for (const Shape& c : shapes) {
    SCOPED_TRACE(absl::StrCat("mask ", c.mask, " D", c.D, " B", c.B, " Hq", c.Hq, " Hkv", c.Hkv,
                              " Sq", c.Sq, " Sk", c.Sk));
    std::mt19937 rng(static_cast<unsigned>(c.mask * 7 + c.D + c.Sq));
    std::uniform_real_distribution<float> u(-1, 1);
    auto random = [&](k_i64 n, float scale) {
      std::vector<float> r(static_cast<size_t>(n));
      for (float& x : r) x = scale * u(rng);
      return r;
    };
    const int D = c.D;
    const auto q = random(c.B * c.Hq * c.Sq * D, 4), k = random(c.B * c.Hkv * c.Sk * D, 1),
               v = random(c.B * c.Hkv * c.Sk * D, 1);
    TiledParams p{};
    p.B = c.B, p.Hq = c.Hq, p.Hkv = c.Hkv, p.Sq = c.Sq, p.Sk = c.Sk;
    p.mask = c.mask, p.prefix = c.prefix, p.window = c.window;
    p.scale = 0.3f, p.softcap = c.softcap;
    std::vector<unsigned char> custom;
    std::vector<float> bias;
    const void* extra = nullptr;
    if (c.mask == 5) {
      p.mask_per_query = c.custom_rank == 3;
      custom.resize(static_cast<size_t>(p.mask_per_query ? c.B * c.Sq * c.Sk : c.B * c.Sk));
      for (auto& m : custom) m = rng() % 4 != 0;
      custom[0] = 0;
      extra = custom.data();
    }
    if (c.mask == 6) {
      bias = random(c.Hq * c.Sq * c.Sk, 2);
      p.bias_stride[1] = c.Sq * c.Sk, p.bias_stride[2] = c.Sk, p.bias_stride[3] = 1;
      extra = bias.data();
    }
    auto dense = [](k_i64 H, k_i64 S, k_i64 d, k_i64 (&s)[3]) {
      s[2] = d, s[1] = S * d, s[0] = H * S * d;
    };
    dense(c.Hq, c.Sq, D, p.q_stride);
    dense(c.Hkv, c.Sk, D, p.k_stride);
    dense(c.Hkv, c.Sk, D, p.v_stride);
    dense(c.Hq, c.Sq, D, p.o_stride);
    std::vector<float> out(static_cast<size_t>(c.B * c.Hq * c.Sq * D), -7.0f);
    Launch(c, q.data(), k.data(), v.data(), extra, out.data(), p);

    for (k_i64 b = 0; b < c.B; ++b) {
      for (k_i64 h = 0; h < c.Hq; ++h) {
        const k_i64 hk = h / (c.Hq / c.Hkv);
        for (k_i64 i = 0; i < c.Sq; ++i) {
          const k_i64 pos = i + c.Sk - c.Sq;
          k_i64 lo = 0, hi = c.Sk;
          if (c.mask == 1) hi = pos + 1;
          if (c.mask == 2) hi = std::max<k_i64>(pos + 1, c.prefix);
          if (c.mask == 4) hi = pos + 1, lo = pos - c.window + 1;
          lo = std::clamp<k_i64>(lo, 0, c.Sk);
          hi = std::clamp<k_i64>(hi, lo, c.Sk);
          std::vector<double> logits;
          std::vector<k_i64> keys;
          for (k_i64 j = lo; j < hi; ++j) {
            double dot = 0;
            for (int d = 0; d < D; ++d) {
              dot += double{q[((b * c.Hq + h) * c.Sq + i) * D + d]} *
                     k[((b * c.Hkv + hk) * c.Sk + j) * D + d];
            }
            double x = 0.3 * dot;
            if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
            if (c.mask == 5 && !custom[(p.mask_per_query ? (b * c.Sq + i) * c.Sk : b * c.Sk) + j]) {
              continue;
            }
            if (c.mask == 6) x += bias[(h * c.Sq + i) * c.Sk + j];
            logits.push_back(x);
            keys.push_back(j);
          }
          double mx = -INFINITY, sum = 0;
          for (double x : logits) mx = std::max(mx, x);
          for (double& x : logits) sum += (x = std::exp(x - mx));
          for (int d = 0; d < D; ++d) {
            double want = 0;
            for (size_t t = 0; t < keys.size(); ++t) {
              want += logits[t] * v[((b * c.Hkv + hk) * c.Sk + keys[t]) * D + d];
            }
            want = sum > 0 ? want / sum : 0;
            ASSERT_NEAR(out[((b * c.Hq + h) * c.Sq + i) * D + d], want, 1e-5)
                << "b " << b << " h " << h << " row " << i << " d " << d;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::cuda::host_emulation
