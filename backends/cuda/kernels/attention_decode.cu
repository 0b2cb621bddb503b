// Single-row decode attention over 16-byte vectors (kernels_attention.cc,
// "nvrtc:attention_decode16_split<n>_r<R>_<dt>"): the split half of the
// split-K pair whose combine is attention.cu's attention_combine. This file
// instantiates nothing: each (dtype, head dim, rows per block) the backend
// uses is its own module, the source followed by one
// KILN_ATTENTION_DECODE16(S, T, D, R) line (DecodeAttentionSource), so a
// prepare compiles only the variant it runs.
#include "attention_mask.cuh"
#include "attention_params.cuh"

// Decoding over 16-byte vectors (f16/bf16, D == Dv in {64, 128, 256}, 16-byte
// aligned operands, no custom mask or bias), a bandwidth kernel. A block of
// NW = 4 warps takes one (batch, kv head, key split) and R query rows that
// read that kv head (the GQA group's heads x the query rows, R in {1, 2, 4,
// 8}; more rows take several row tiles), so each K/V byte is read once for
// all of them. The split's keys are dealt to the warps KP * U at a time
// (adjacent warps read adjacent keys); inside a warp a group of G = D / 8
// lanes takes one key, each lane 8 elements: one 16-byte load of K and one of
// V per key, the loads of U steps issued before the first is used. Per step
// each lane's 8 elements of every row's dot product, log2(G) shuffles; the
// online softmax is per U keys (one rescale of o per U keys, exp2 of logits
// scaled by log2(e)). At the end the KP lane groups are merged with shuffles,
// the NW warps through shared memory, and the block writes the same (m, l,
// o) record per (row, split) as attention_split, for attention_combine.
template <typename T, int D, int R>
__device__ __forceinline__ void attention_decode16(const T* q, const T* k, const T* v,
                                                   float* part, const AttnParams& p,
                                                   k_i64 splits) {
  constexpr int G = D / 8;               // lanes per key
  constexpr int KP = 32 / G;             // keys per warp step
  constexpr int U = R >= 8 ? 2 : 4;      // steps whose loads are in flight together
  constexpr int NW = 4;                  // warps per block
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  __shared__ float sm_m[NW][R], sm_l[NW][R];
  __shared__ float sm_o[NW][R][D];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = lane / G, c = lane % G;  // this lane's key of a step, its 8 elements
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
    for (int j0 = a + warp * KP * U; j0 < z; j0 += NW * KP * U) {
      k_v16 kw[U], vw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = j0 + u * KP + slot;
        kw[u] = k_v16{0u, 0u, 0u, 0u};
        vw[u] = k_v16{0u, 0u, 0u, 0u};
        if (j < z) {
          kw[u] = k_ldraw(kb, static_cast<k_i64>(j) * D);
          vw[u] = k_ldraw(vb, static_cast<k_i64>(j) * D);
        }
      }
      float s[R][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float kf[8];
        k_unpack(k, kw[u], kf);
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
        k_unpack(v, vw[u], vf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int t = 0; t < 8; ++t) o[r][t] += s[r][u] * vf[t];
        }
      }
    }
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
    // Merge the NW warps through shared memory into the (row, split) records.
    if (slot == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < 8; ++t) sm_o[warp][r][c * 8 + t] = o[r][t];
        if (c == 0) {
          sm_m[warp][r] = m[r];
          sm_l[warp][r] = l[r];
        }
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < R * D; e += NW * 32) {
      const int r = e / D, d = e % D;
      const k_i64 inner = tile * R + r;
      if (inner >= per_kv) continue;
      float mx = -K_INF;
#pragma unroll
      for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w][r]);
      float acc = 0.0f, lsum = 0.0f;
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        const float cw = sm_m[w][r] == -K_INF ? 0.0f : exp2f(sm_m[w][r] - mx);
        acc += sm_o[w][r][d] * cw;
        lsum += sm_l[w][r] * cw;
      }
      const k_i64 i = inner % p.Sq, h = hk * group + inner / p.Sq;
      float* rec = part + (((b * p.Hq + h) * p.Sq + i) * splits + sp) * (2 + D);
      rec[2 + d] = acc;
      if (d == 0) {
        rec[0] = mx == -K_INF ? -K_INF : mx * kLn2;  // natural log units, as attention_split
        rec[1] = lsum;
      }
    }
    __syncthreads();  // the shared records are rewritten by the next item
  }
}

#define KILN_ATTENTION_DECODE16(S, T, D, R)                                                   \
  extern "C" __global__ void __launch_bounds__(128)                                           \
      kiln_attention_decode16_##S##_d##D##_r##R(const T* q, const T* k, const T* v,           \
                                                const void* extra, float* part, AttnParams p, \
                                                k_i64 splits) {                               \
    attention_decode16<T, D, R>(q, k, v, part, p, splits);                                    \
  }
