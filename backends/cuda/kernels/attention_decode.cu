// Single-row decode attention over 16-byte vectors (kernels_attention.cc,
// "nvrtc:attention_decode16_split<n>_r<R>_<dt>", and its tensor-core form for
// GQA groups, "nvrtc:attention_decode_mma_split<n>_<dt>", at the end of the
// file): split-K over the keys with
// the combine fused in (the last block of a (batch, kv head, row tile) to
// finish its split merges every split's record into the output). This file
// instantiates nothing: each (dtype, head dim, rows per block) the backend
// uses is its own module, the source followed by one
// KILN_ATTENTION_DECODE16(S, T, D, R) line (DecodeAttentionSource) or one
// KILN_ATTENTION_DECODE_MMA(S, T, D, F16) line (DecodeMmaAttentionSource), so
// a prepare compiles only the variant it runs.
#include "attention_mask.cuh"
#include "attention_params.cuh"
#include "mma.cuh"

// Decoding over 16-byte vectors (f16/bf16, D == Dv in {64, 128, 256}, 16-byte
// aligned operands, no custom mask or bias), a bandwidth kernel. A block of
// NW = 4 warps takes one (batch, kv head, key split) and R query rows that
// read that kv head (the GQA group's heads x the query rows, R in {1, 2, 4,
// 8}; more rows take several row tiles), so each K/V byte is read once for
// all of them. The split's keys are dealt to the warps KP * U at a time (a
// pass; adjacent warps read adjacent keys); inside a warp a group of G = D /
// 8 lanes takes one key, each lane 8 elements: one 16-byte piece of K and
// one of V per key.
//
// The pieces travel by cp.async into a ring of P passes per warp in shared
// memory, P - 1 passes ahead of the one computed: each lane copies its own
// pieces and reads back only those, so the ring needs cp.async.wait_group
// and no barrier, and the loads in flight hold no registers (the kernel's
// first form loaded U steps into registers and computed them before issuing
// the next: 167 registers at R = 4, 3 blocks per SM, nothing in flight
// while it computed).
//
// Per step each lane's 8 elements of every row's dot product, log2(G)
// shuffles; the online softmax is per U keys (one rescale of o per U keys,
// exp2 of logits scaled by log2(e)). At the end the KP lane groups are
// merged with shuffles, the NW warps through shared memory (the ring's
// bytes), and the block writes an (m, l, o) record per (row, split) into
// `part` ([rows][splits][2 + D] f32, m in natural-log units). With one split
// the block writes the output itself; otherwise it counts itself done in
// `counters[(b * Hkv + hk) * tiles + tile]`, and the block that brings the
// count to `splits` merges the R rows' records (in split order, so the
// result does not depend on which block is last), writes the output and
// sets the count back to 0 for the next launch (kiln_decode_counters_zero
// clears them once, when the kernel allocates them).
// KILN_DECODE_U / KILN_DECODE_P: steps per pass and passes per ring, 4 and 3
// unless the source defines them first (DecodeAttentionSource's benchmark sweep;
// on an H200 4 x 3 beat 2 x 5, 2 x 5 at 4 blocks per SM, and 1 x 8 on both
// decode cases of attention_fwd).
#ifndef KILN_DECODE_U
#define KILN_DECODE_U 4
#endif
#ifndef KILN_DECODE_P
#define KILN_DECODE_P 3
#endif
// KILN_DECODE_MINB: the blocks per SM __launch_bounds__ asks registers for (1
// unless defined first: the sweep's third figure).
#ifndef KILN_DECODE_MINB
#define KILN_DECODE_MINB 1
#endif
constexpr int K_DECODE_NW = 4;             // warps per block
constexpr int K_DECODE_P = KILN_DECODE_P;  // passes in a warp's ring (P - 1 in flight)

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned k_dec_smem_addr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
#endif
// 16 bytes global -> shared (16 zero bytes when !valid; `gmem` is read only
// when valid).
__device__ __forceinline__ void k_dec_cp16(k_v16* smem, const void* gmem, bool valid) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(k_dec_smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
#else
  *smem = valid ? *static_cast<const k_v16*>(gmem) : k_v16{0u, 0u, 0u, 0u};
#endif
}
__device__ __forceinline__ void k_dec_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void k_dec_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

template <int D, int R>
struct KDecodeShape {
  enum {
    G = D / 8,                                     // lanes per key
    KP = 32 / G,                                   // keys per warp step
    U = KILN_DECODE_U,                             // steps per pass (one softmax rescale per pass)
    RING = K_DECODE_NW * K_DECODE_P * U * 2 * 32,  // k_v16 pieces in the rings
    MERGE = (K_DECODE_NW * R * D + 2 * K_DECODE_NW * R + 3) / 4,  // f32 merge area, in k_v16
    SMEM = RING > MERGE ? RING : MERGE,
  };
};

// The end of a block's item, shared by the decode kernels: the NW warps'
// (o, m, l) for the tile's R rows are in shared memory (sm_o [NW][R][D],
// sm_m and sm_l [NW][R], m in log2 units) and every thread is past a barrier
// since they were written. They are merged into the output (one split) or
// into the (row, split) record, and the block that finishes a row tile's last
// split combines the records. `last_block` is a word of the shared bytes,
// written only after every thread's reads of the merge area.
template <typename T, int D, int R>
__device__ __forceinline__ void k_dec_finish(const float* sm_o, const float* sm_m,
                                             const float* sm_l, int& last_block, float* part,
                                             T* out, int* counters, const AttnParams& p,
                                             k_i64 splits, k_i64 bk, k_i64 sp, k_i64 tile,
                                             k_i64 tiles) {
  constexpr int NW = K_DECODE_NW;
  constexpr float kLn2 = 0.6931471805599453f;
  const k_i64 group = p.Hq / p.Hkv, per_kv = group * p.Sq;
  const k_i64 hk = bk % p.Hkv, b = bk / p.Hkv;
  for (int e = threadIdx.x; e < R * D; e += NW * 32) {
    const int r = e / D, d = e % D;
    const k_i64 inner = tile * R + r;
    if (inner >= per_kv) continue;
    float mx = -K_INF;
#pragma unroll
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w * R + r]);
    float acc = 0.0f, lsum = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float mw = sm_m[w * R + r];
      const float cw = mw == -K_INF ? 0.0f : exp2f(mw - mx);
      acc += sm_o[(w * R + r) * D + d] * cw;
      lsum += sm_l[w * R + r] * cw;
    }
    const k_i64 i = inner % p.Sq, h = hk * group + inner / p.Sq;
    const k_i64 row = (b * p.Hq + h) * p.Sq + i;
    if (splits == 1) {
      k_store(out + row * D, d, lsum > 0.0f ? acc / lsum : 0.0f);
      continue;
    }
    float* rec = part + (row * splits + sp) * (2 + D);
    rec[2 + d] = acc;
    if (d == 0) {
      rec[0] = mx == -K_INF ? -K_INF : mx * kLn2;  // natural log units, as attention_split
      rec[1] = lsum;
    }
  }
  if (splits > 1) {
    // Publish this split's records, then count it; the last split's block combines.
    __threadfence();
    __syncthreads();
    int* count = counters + bk * tiles + tile;
    if (threadIdx.x == 0) last_block = atomicAdd(count, 1) == static_cast<int>(splits) - 1;
    __syncthreads();
    if (last_block) {
      __threadfence();
      for (int e = threadIdx.x; e < R * D; e += NW * 32) {
        const int r = e / D, d = e % D;
        const k_i64 inner = tile * R + r;
        if (inner >= per_kv) continue;
        const k_i64 i = inner % p.Sq, h = hk * group + inner / p.Sq;
        const k_i64 row = (b * p.Hq + h) * p.Sq + i;
        const float* recs = part + row * splits * (2 + D);
        // attention_combine's arithmetic, in split order.
        float mx = -K_INF;
        for (k_i64 s2 = 0; s2 < splits; ++s2) mx = fmaxf(mx, __ldcg(recs + s2 * (2 + D)));
        float lsum = 0.0f, acc = 0.0f;
        if (mx != -K_INF) {
          for (k_i64 s2 = 0; s2 < splits; ++s2) {
            const float* rec = recs + s2 * (2 + D);
            const float ms = __ldcg(rec);
            if (ms == -K_INF) continue;
            const float cs = expf(ms - mx);
            lsum += __ldcg(rec + 1) * cs;
            acc += __ldcg(rec + 2 + d) * cs;
          }
        }
        k_store(out + row * D, d, lsum > 0.0f ? acc / lsum : 0.0f);
      }
      if (threadIdx.x == 0) *count = 0;  // ready for the next launch
    }
  }
}

template <typename T, int D, int R>
__device__ __forceinline__ void attention_decode16(const T* q, const T* k, const T* v, float* part,
                                                   T* out, int* counters, const AttnParams& p,
                                                   k_i64 splits) {
  using S = KDecodeShape<D, R>;
  constexpr int G = S::G, KP = S::KP, U = S::U, NW = K_DECODE_NW, P = K_DECODE_P;
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ k_v16 smem[S::SMEM];
  // Whether this block combines: in the shared bytes' first word, written
  // once every thread is past its reads of the merge area (a barrier).
  int& last_block = *reinterpret_cast<int*>(smem);
  // After the loop the ring's bytes hold the warps' merge: o, then m, then l.
  float* sm_o = reinterpret_cast<float*>(smem);  // [NW][R][D]
  float* sm_m = sm_o + NW * R * D;               // [NW][R]
  float* sm_l = sm_m + NW * R;                   // [NW][R]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = lane / G, c = lane % G;  // this lane's key of a step, its 8 elements
  k_v16* ring = smem + warp * (P * U * 2 * 32);  // [P][U][K, V][32 lanes]
  const k_i64 group = p.Hq / p.Hkv;
  const k_i64 per_kv = group * p.Sq;  // rows that read one kv head
  const k_i64 tiles = (per_kv + R - 1) / R;
  const k_i64 items = p.B * p.Hkv * splits * tiles;
  for (k_i64 item = blockIdx.x; item < items; item += gridDim.x) {
    // item = ((b * Hkv + hk) * splits + sp) * tiles + tile
    const k_i64 tile = item % tiles, sp = (item / tiles) % splits, bk = item / (tiles * splits);
    const k_i64 hk = bk % p.Hkv, b = bk / p.Hkv;
    int lo[R], hi[R];
    int ulo = 0x7fffffff, uhi = 0;
    float qv[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const k_i64 inner = tile * R + r;
      lo[r] = hi[r] = 0;
#pragma unroll
      for (int t = 0; t < 8; ++t) qv[r][t] = 0.0f;
      if (inner < per_kv) {
        const k_i64 i = inner % p.Sq, h = hk * group + inner / p.Sq;
        k_i64 l64, h64;
        attn_key_range(p, i, l64, h64);
        lo[r] = static_cast<int>(l64);
        hi[r] = static_cast<int>(h64);
        ulo = min(ulo, lo[r]);
        uhi = max(uhi, hi[r]);
        k_ldv(q + ((b * p.Hq + h) * p.Sq + i) * D, c * 8, qv[r]);
#pragma unroll
        for (int t = 0; t < 8; ++t) qv[r][t] *= p.scale;
      }
    }
    if (uhi < ulo) uhi = ulo;
    const k_i64 span = uhi - ulo, chunk = (span + splits - 1) / splits;
    const int a = ulo + static_cast<int>(min(sp * chunk, span));
    const int z = ulo + static_cast<int>(min(sp * chunk + chunk, span));
    const T* kb = k + bk * p.Sk * D + c * 8;
    const T* vb = v + bk * p.Sk * D + c * 8;
    float m[R], l[R], o[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      m[r] = -K_INF;
      l[r] = 0.0f;
#pragma unroll
      for (int t = 0; t < 8; ++t) o[r][t] = 0.0f;
    }
    // This warp's passes: pass n's keys start at a + (warp + n * NW) * KP * U.
    const int first = a + warp * KP * U;
    const int passes = first < z ? (z - first + NW * KP * U - 1) / (NW * KP * U) : 0;
    auto issue = [&](int n) {
      k_v16* dst = ring + (n % P) * (U * 2 * 32);
      const int j0 = first + n * NW * KP * U;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = j0 + u * KP + slot;
        const bool in = j < z;
        const k_i64 off = in ? static_cast<k_i64>(j) * D : 0;
        k_dec_cp16(dst + (2 * u) * 32 + lane, kb + off, in);
        k_dec_cp16(dst + (2 * u + 1) * 32 + lane, vb + off, in);
      }
    };
    // Every iteration commits one group (empty past the last pass), so
    // waiting for all but the newest P - 1 groups means pass n has landed.
#pragma unroll
    for (int n = 0; n < P - 1; ++n) {
      if (n < passes) issue(n);
      k_dec_commit();
    }
    for (int n = 0; n < passes; ++n) {
      if (n + P - 1 < passes) issue(n + P - 1);
      k_dec_commit();
      k_dec_wait<P - 1>();
      const k_v16* src = ring + (n % P) * (U * 2 * 32);
      const int j0 = first + n * NW * KP * U;
      float s[R][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float kf[8];
        k_unpack(k, src[(2 * u) * 32 + lane], kf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float dot = 0.0f;
#pragma unroll
          for (int t = 0; t < 8; ++t) dot += qv[r][t] * kf[t];
          // Every lane shuffles; the G lanes of a key end with its whole dot product.
#pragma unroll
          for (int off = G / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
          s[r][u] = dot;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float mloc = -K_INF;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int j = j0 + u * KP + slot;
          float x = s[r][u];
          if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
          x *= kLog2e;
          if (j >= z || j < lo[r] || j >= hi[r]) x = -K_INF;
          s[r][u] = x;
          mloc = fmaxf(mloc, x);
        }
        const float m_new = fmaxf(m[r], mloc);
        if (m_new == -K_INF) {
#pragma unroll
          for (int u = 0; u < U; ++u) s[r][u] = 0.0f;
          continue;
        }
        const float corr = exp2f(m[r] - m_new);  // 0 while m is -inf
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          s[r][u] = exp2f(s[r][u] - m_new);
          sum += s[r][u];
        }
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
#pragma unroll
        for (int t = 0; t < 8; ++t) o[r][t] *= corr;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float vf[8];
        k_unpack(v, src[(2 * u + 1) * 32 + lane], vf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int t = 0; t < 8; ++t) o[r][t] += s[r][u] * vf[t];
        }
      }
    }
    k_dec_wait<0>();
    // Merge the KP lane groups (lanes c of every group hold the same elements).
#pragma unroll
    for (int off = G; off < 32; off <<= 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float m_o = __shfl_xor_sync(0xffffffffu, m[r], off);
        const float l_o = __shfl_xor_sync(0xffffffffu, l[r], off);
        const float mx = fmaxf(m[r], m_o);
        const float ca = m[r] == -K_INF ? 0.0f : exp2f(m[r] - mx);
        const float cb = m_o == -K_INF ? 0.0f : exp2f(m_o - mx);
        l[r] = l[r] * ca + l_o * cb;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          o[r][t] = o[r][t] * ca + __shfl_xor_sync(0xffffffffu, o[r][t], off) * cb;
        }
        m[r] = mx;
      }
    }
    // Merge the NW warps through shared memory (the rings' bytes: every warp
    // is past its loop first) into the (row, split) records.
    __syncthreads();
    if (slot == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < 8; ++t) sm_o[(warp * R + r) * D + c * 8 + t] = o[r][t];
        if (c == 0) {
          sm_m[warp * R + r] = m[r];
          sm_l[warp * R + r] = l[r];
        }
      }
    }
    __syncthreads();
    k_dec_finish<T, D, R>(sm_o, sm_m, sm_l, last_block, part, out, counters, p, splits, bk, sp,
                          tile, tiles);
    __syncthreads();  // the shared bytes are rewritten by the next item
  }
}

// Decoding for GQA groups on the tensor cores (kernels_attention.cc,
// "nvrtc:attention_decode_mma_split<n>_<dt>"): f16/bf16, D == Dv in {64,
// 128, 256}, 16-byte aligned operands, no custom mask or bias. The 16-byte
// kernel above does each row's dot products on the FMA units: with R rows
// per key that is R x 8 FMA and log2(G) shuffles per lane and key for q.k,
// R x 8 more for p.v, and at R = 4 its issue rate, not DRAM, bounds it. Here
// a block of NW = 4 warps takes one (batch, kv head, key split) and a tile of
// R = 8 query rows that read that kv head (the GQA group's heads x the query
// rows, padded), and both products are mma.sync m16n8k16 with the keys and
// the head dim as M and the rows as N:
//   S^T (16 keys x 8 rows) = K (16 keys x D) Q^T (D x 8 rows), D / 16 mma;
//   O^T (D x 8 rows) += V^T (D x 16 keys) P^T (16 keys x 8 rows), D / 16 mma.
// Lane (g, t) = (lane / 4, lane % 4) holds S^T's keys g and g + 8 of rows 2t
// and 2t + 1, and O^T's columns (rows) 2t and 2t + 1 too, so the online
// softmax of a row is the lane's own (maxima over keys: shuffles across g).
// P^T packed to halves is two 8 x 8 matrices in the accumulator layout;
// movmatrix transposes each into the B operand's (row g, keys 2t, 2t + 1).
// Q^T's fragments stay in registers (row g's elements 2t, 2t + 1 and 2t + 8,
// 2t + 9 of every 16), unscaled: the logits are scaled in f32.
//
// Each warp's keys arrive by cp.async in passes of KT = 16 U keys (K rows,
// then V rows, D + 8 halves apart so ldmatrix is conflict-free) into a ring
// of P passes in dynamic shared memory, P - 1 ahead of the one computed; the
// warp's lanes read each other's pieces, so a pass is waited for with
// cp.async.wait_group and __syncwarp, and no block barrier. The end of an
// item (warp merge, records, fused combine) is k_dec_finish's. P is rounded
// to the operand type before P V (as flash_attention.cu); the row sums are of
// the unrounded P.
// KILN_DECODE_MMA_U / _P / _MINB: 16-key tiles per pass, passes per ring and
// the blocks per SM __launch_bounds__ asks for (DecodeMmaAttentionSource
// defines them for a benchmark's sweep).
#ifndef KILN_DECODE_MMA_U
#define KILN_DECODE_MMA_U 1
#endif
#ifndef KILN_DECODE_MMA_P
#define KILN_DECODE_MMA_P 3
#endif
#ifndef KILN_DECODE_MMA_MINB
#define KILN_DECODE_MMA_MINB 1
#endif

extern __shared__ __align__(16) unsigned short k_dec_mma_smem[];

template <typename T, int D, bool IsF16>
__device__ __forceinline__ void attention_decode_mma(const T* q, const T* k, const T* v,
                                                     float* part, T* out, int* counters,
                                                     const AttnParams& p, k_i64 splits) {
  constexpr int NW = K_DECODE_NW, U = KILN_DECODE_MMA_U, P = KILN_DECODE_MMA_P, R = 8;
  constexpr int LD = D + 8;           // halves per key row in the ring
  constexpr int KT = 16 * U;          // keys per pass
  constexpr int STAGE = 2 * KT * LD;  // halves per pass: K rows, then V rows
  constexpr int PIECES = KT * D / 8;  // 16-byte pieces of K (and of V) per pass
  static_assert(PIECES % 32 == 0, "whole pieces per lane");
  constexpr float kLog2e = 1.4426950408889634f;
  // After the loop the shared bytes hold the warps' merge: o, then m, then l.
  void* const smem = k_dec_mma_smem;
  int& last_block = *static_cast<int*>(smem);
  float* sm_o = static_cast<float*>(smem);  // [NW][R][D]
  float* sm_m = sm_o + NW * R * D;          // [NW][R]
  float* sm_l = sm_m + NW * R;              // [NW][R]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  unsigned short* ring = static_cast<unsigned short*>(smem) + warp * (P * STAGE);
  const k_i64 group = p.Hq / p.Hkv;
  const k_i64 per_kv = group * p.Sq;  // rows that read one kv head
  const k_i64 tiles = (per_kv + R - 1) / R;
  const k_i64 items = p.B * p.Hkv * splits * tiles;
  const float qk_scale = p.scale * (p.softcap > 0.0f ? 1.0f : kLog2e);
  for (k_i64 item = blockIdx.x; item < items; item += gridDim.x) {
    const k_i64 tile = item % tiles, sp = (item / tiles) % splits, bk = item / (tiles * splits);
    const k_i64 hk = bk % p.Hkv, b = bk / p.Hkv;
    // Q^T's fragments of row g; the key ranges of rows 2t and 2t + 1; the
    // keys any row of the tile sees.
    unsigned qf[D / 16][2];
    int lo[2] = {0, 0}, hi[2] = {0, 0};
    int ulo = 0x7fffffff, uhi = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const k_i64 inner = tile * R + r;
      if (inner >= per_kv) continue;
      const k_i64 i = inner % p.Sq;
      k_i64 l64, h64;
      attn_key_range(p, i, l64, h64);
      ulo = min(ulo, static_cast<int>(l64));
      uhi = max(uhi, static_cast<int>(h64));
      if (r == 2 * t) lo[0] = static_cast<int>(l64), hi[0] = static_cast<int>(h64);
      if (r == 2 * t + 1) lo[1] = static_cast<int>(l64), hi[1] = static_cast<int>(h64);
    }
    {
      const k_i64 inner = tile * R + g;
      const bool real = inner < per_kv;
      const k_i64 i = real ? inner % p.Sq : 0, h = real ? hk * group + inner / p.Sq : 0;
      const unsigned* qr = reinterpret_cast<const unsigned*>(q + ((b * p.Hq + h) * p.Sq + i) * D);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        qf[ks][0] = real ? qr[ks * 8 + t] : 0u;
        qf[ks][1] = real ? qr[ks * 8 + 4 + t] : 0u;
      }
    }
    if (uhi < ulo) uhi = ulo;
    const k_i64 span = uhi - ulo, chunk = (span + splits - 1) / splits;
    const int a = ulo + static_cast<int>(min(sp * chunk, span));
    const int z = ulo + static_cast<int>(min(sp * chunk + chunk, span));
    const T* kb = k + bk * p.Sk * D;
    const T* vb = v + bk * p.Sk * D;
    float m[2] = {-K_INF, -K_INF}, l[2] = {0.0f, 0.0f};  // rows 2t, 2t + 1, log2 units
    float o[D / 16][4];  // O^T: dims 16 mt + g (+ 8) x rows 2t, 2t + 1
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    // This warp's passes: pass n's keys start at a + (warp + n * NW) * KT.
    const int first = a + warp * KT;
    const int passes = first < z ? (z - first + NW * KT - 1) / (NW * KT) : 0;
    auto issue = [&](int n) {
      unsigned short* dst = ring + (n % P) * STAGE;
      const int j0 = first + n * NW * KT;
#pragma unroll
      for (int i = 0; i < PIECES / 32; ++i) {
        const int e = lane + 32 * i, key = e / (D / 8), c = e % (D / 8);
        const int j = j0 + key;
        const bool in = j < z;
        const k_i64 off = in ? static_cast<k_i64>(j) * D + c * 8 : 0;
        k_dec_cp16(reinterpret_cast<k_v16*>(dst + key * LD + c * 8), kb + off, in);
        k_dec_cp16(reinterpret_cast<k_v16*>(dst + (KT + key) * LD + c * 8), vb + off, in);
      }
    };
#pragma unroll
    for (int n = 0; n < P - 1; ++n) {
      if (n < passes) issue(n);
      k_dec_commit();
    }
    for (int n = 0; n < passes; ++n) {
      if (n + P - 1 < passes) issue(n + P - 1);
      k_dec_commit();
      k_dec_wait<P - 1>();
      __syncwarp();  // every lane's pieces of pass n have landed
      const unsigned short* sK = ring + (n % P) * STAGE;
      const unsigned short* sV = sK + KT * LD;
      const int j0 = first + n * NW * KT;
      float s[U][4];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        s[u][0] = s[u][1] = s[u][2] = s[u][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          unsigned af[4];
          k_ldmatrix_x4(af, sK + (u * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 +
                                (lane >> 4) * 8);
          k_mma<IsF16>(s[u], af, qf[ks][0], qf[ks][1]);
        }
      }
      // Scale, softcap, mask (log2 units); each row's maximum over the pass.
      float mx[2] = {-K_INF, -K_INF};
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + u * 16 + g + (e >> 1) * 8, rr = e & 1;
          float x = s[u][e] * qk_scale;
          if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap) * kLog2e;
          if (j >= z || j < lo[rr] || j >= hi[rr]) x = -K_INF;
          s[u][e] = x;
          mx[rr] = fmaxf(mx[rr], x);
        }
      }
      float corr[2], base[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
          mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], off));
        }
        const float m_new = fmaxf(m[rr], mx[rr]);
        base[rr] = m_new == -K_INF ? 0.0f : m_new;
        corr[rr] = exp2f(m[rr] - base[rr]);  // 0 while m is -inf
        m[rr] = m_new;
      }
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[u][e] = exp2f(s[u][e] - base[e & 1]);
          sum[e & 1] += s[u][e];
        }
      }
      l[0] = l[0] * corr[0] + sum[0];
      l[1] = l[1] * corr[1] + sum[1];
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        o[mt][0] *= corr[0];
        o[mt][1] *= corr[1];
        o[mt][2] *= corr[0];
        o[mt][3] *= corr[1];
      }
      // O^T += V^T P^T: P^T's two 8 x 8 halves (keys 0-7 and 8-15) turned
      // into the B operand's layout.
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const unsigned b0 = k_movmatrix_trans(k_pack2<IsF16>(s[u][0], s[u][1]));
        const unsigned b1 = k_movmatrix_trans(k_pack2<IsF16>(s[u][2], s[u][3]));
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
          unsigned af[4];
          k_ldmatrix_x4_trans(af, sV + (u * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * LD +
                                      mt * 16 + ((lane >> 3) & 1) * 8);
          k_mma<IsF16>(o[mt], af, b0, b1);
        }
      }
      __syncwarp();  // every lane is done with pass n's slot before it is refilled
    }
    k_dec_wait<0>();
    // The row sums over the lanes of every g (m is the same on all of them).
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      l[0] += __shfl_xor_sync(0xffffffffu, l[0], off);
      l[1] += __shfl_xor_sync(0xffffffffu, l[1], off);
    }
    // The NW warps' records through shared memory (every warp is past its loop).
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sm_o[(warp * R + 2 * t + (e & 1)) * D + mt * 16 + g + (e >> 1) * 8] = o[mt][e];
      }
    }
    if (g == 0) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        sm_m[warp * R + 2 * t + rr] = m[rr];
        sm_l[warp * R + 2 * t + rr] = l[rr];
      }
    }
    __syncthreads();
    k_dec_finish<T, D, R>(sm_o, sm_m, sm_l, last_block, part, out, counters, p, splits, bk, sp,
                          tile, tiles);
    __syncthreads();  // the shared bytes are rewritten by the next item
  }
}

// The counters start at zero once (the kernel that owns them launches this
// when it allocates them); every decode launch leaves them at zero.
extern "C" __global__ void kiln_decode_counters_zero(int* counters, k_i64 n) {
  for (k_i64 i = blockIdx.x * static_cast<k_i64>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    counters[i] = 0;
  }
}

#define KILN_ATTENTION_DECODE16(S, T, D, R)                                                  \
  extern "C" __global__ void __launch_bounds__(128, KILN_DECODE_MINB)                        \
      kiln_attention_decode16_##S##_d##D##_r##R(const T* q, const T* k, const T* v,          \
                                                const void* extra, float* part, T* out,      \
                                                int* counters, AttnParams p, k_i64 splits) { \
    attention_decode16<T, D, R>(q, k, v, part, out, counters, p, splits);                    \
  }

#define KILN_ATTENTION_DECODE_MMA(S, T, D, F16)                                              \
  extern "C" __global__ void __launch_bounds__(128, KILN_DECODE_MMA_MINB)                    \
      kiln_attention_decode_mma_##S##_d##D(const T* q, const T* k, const T* v,               \
                                           const void* extra, float* part, T* out,           \
                                           int* counters, AttnParams p, k_i64 splits) {      \
    attention_decode_mma<T, D, F16>(q, k, v, part, out, counters, p, splits);                \
  }
