// Attention, flash-style: one warp per query row, keys streamed with an
// online softmax (no Sq x Sk buffer). q [B, Hq, Sq, D], k [B, Hkv, Sk, D],
// v [B, Hkv, Sk, Dv], out [B, Hq, Sq, Dv]; query head h reads kv head
// h / (Hq / Hkv) (GQA, MQA). Logits = scale * q.k, then softcap, then the
// mask: structural (causal, prefix, sliding window: a key range per row,
// aligned to the end of the keys as the CPU does), a custom boolean [B, Sk]
// or [B, Sq, Sk], or an additive bias broadcast to [B, Hq, Sq, Sk]. A row
// that sees no key is zero. D, Dv <= 256 (8 per lane). Math in f32.
// f16/bf16 with D == Dv in {64, 128} run flash_attention.cu's tensor-core
// kernel instead; few query rows over many keys (decoding) run the split-K
// pair attention_split / attention_combine below (attention_decode16 in
// place of attention_split for 16-byte operands).
struct AttnParams {
  k_i64 B, Hq, Hkv, Sq, Sk, D, Dv;
  k_i64 mask;  // v1::MaskKind (append-only, so the numbers below are stable)
  k_i64 prefix, window, mask_per_query;
  k_i64 bias_stride[4];
  float scale, softcap;
};

#include "attention_mask.cuh"

// The structural key range [lo, hi) of query row i.
__device__ __forceinline__ void attn_key_range(const AttnParams& p, k_i64 i, k_i64& lo,
                                               k_i64& hi) {
  k_attn_key_range(p.mask, p.prefix, p.window, p.Sq, p.Sk, i, lo, hi);
}

// One warp folds keys [lo, hi) of row r into (m, l, o) (o: 8 values per
// lane, element lane + 32 t), with the online softmax.
template <typename T>
__device__ void attention_keys(const T* q, const T* k, const T* v, const void* extra,
                               const AttnParams& p, k_i64 r, k_i64 lo, k_i64 hi, float& m,
                               float& l, float (&o)[8]) {
  const int lane = threadIdx.x & 31;
  const k_i64 group = p.Hkv > 0 ? p.Hq / p.Hkv : 1;
  const k_i64 i = r % p.Sq, h = (r / p.Sq) % p.Hq, b = r / (p.Sq * p.Hq);
  const k_i64 hk = h / group;
  float qv[8];
  const T* qrow = q + r * p.D;
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const k_i64 x = lane + 32 * t;
    qv[t] = x < p.D ? k_load(qrow, x) : 0.0f;
    o[t] = 0.0f;
  }
  const T* kbase = k + (b * p.Hkv + hk) * p.Sk * p.D;
  const T* vbase = v + (b * p.Hkv + hk) * p.Sk * p.Dv;
  m = -K_INF;
  l = 0.0f;
  for (k_i64 j = lo; j < hi; ++j) {
    float part = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const k_i64 x = lane + 32 * t;
      if (x < p.D) part += qv[t] * k_load(kbase + j * p.D, x);
    }
    float s = k_warp_sum(part) * p.scale;
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    if (p.mask == K_MASK_CUSTOM) {
      if (!k_attn_custom_keeps(extra, p.mask_per_query != 0, p.Sq, p.Sk, b, i, j)) continue;
    } else if (p.mask == K_MASK_BIAS) {
      s += k_attn_bias<T>(extra, p.bias_stride, b, h, i, j);
    }
    if (s == -K_INF) continue;
    const float m_new = fmaxf(m, s);
    const float corr = m == -K_INF ? 0.0f : expf(m - m_new);
    const float e = expf(s - m_new);
    l = l * corr + e;
    m = m_new;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const k_i64 x = lane + 32 * t;
      if (x < p.Dv) o[t] = o[t] * corr + e * k_load(vbase + j * p.Dv, x);
    }
  }
}

template <typename T>
__device__ void attention_rows(const T* q, const T* k, const T* v, const void* extra, T* out,
                               const AttnParams& p) {
  const int lane = threadIdx.x & 31;
  const k_i64 warps = static_cast<k_i64>(gridDim.x) * (blockDim.x >> 5);
  const k_i64 rows = p.B * p.Hq * p.Sq;
  for (k_i64 r = static_cast<k_i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    k_i64 lo, hi;
    attn_key_range(p, r % p.Sq, lo, hi);
    float m, l, o[8];
    attention_keys(q, k, v, extra, p, r, lo, hi, m, l, o);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* orow = out + r * p.Dv;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const k_i64 x = lane + 32 * t;
      if (x < p.Dv) k_store(orow, x, o[t] * inv);
    }
  }
}

// Decoding (few query rows, many keys): split-K. A warp per (row, split)
// folds its share of the row's keys into a partial record of (m, l,
// o[Dv]) f32 in `part` ([rows][splits][2 + Dv]); attention_combine merges a
// row's splits (rescaling each by exp(m_s - max m)) in a fixed order.
template <typename T>
__device__ void attention_split(const T* q, const T* k, const T* v, const void* extra,
                                float* part, const AttnParams& p, k_i64 splits) {
  const int lane = threadIdx.x & 31;
  const k_i64 warps = static_cast<k_i64>(gridDim.x) * (blockDim.x >> 5);
  const k_i64 items = p.B * p.Hq * p.Sq * splits;
  for (k_i64 w = static_cast<k_i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       w < items; w += warps) {
    const k_i64 r = w / splits, sp = w % splits;
    k_i64 lo, hi;
    attn_key_range(p, r % p.Sq, lo, hi);
    const k_i64 chunk = (hi - lo + splits - 1) / splits;
    const k_i64 a = lo + sp * chunk < hi ? lo + sp * chunk : hi;
    const k_i64 z = a + chunk < hi ? a + chunk : hi;
    float m, l, o[8];
    attention_keys(q, k, v, extra, p, r, a, z, m, l, o);
    float* rec = part + w * (2 + p.Dv);
    if (lane == 0) {
      rec[0] = m;
      rec[1] = l;
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const k_i64 x = lane + 32 * t;
      if (x < p.Dv) rec[2 + x] = o[t];
    }
  }
}

template <typename T>
__device__ void attention_combine(const float* part, T* out, const AttnParams& p, k_i64 splits) {
  const int lane = threadIdx.x & 31;
  const k_i64 warps = static_cast<k_i64>(gridDim.x) * (blockDim.x >> 5);
  const k_i64 rows = p.B * p.Hq * p.Sq;
  for (k_i64 r = static_cast<k_i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const float* recs = part + r * splits * (2 + p.Dv);
    float mx = -K_INF;
    for (k_i64 sp = 0; sp < splits; ++sp) mx = fmaxf(mx, recs[sp * (2 + p.Dv)]);
    float l = 0.0f, o[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) o[t] = 0.0f;
    if (mx != -K_INF) {
      for (k_i64 sp = 0; sp < splits; ++sp) {
        const float* rec = recs + sp * (2 + p.Dv);
        if (rec[0] == -K_INF) continue;
        const float c = expf(rec[0] - mx);
        l += rec[1] * c;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const k_i64 x = lane + 32 * t;
          if (x < p.Dv) o[t] += rec[2 + x] * c;
        }
      }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* orow = out + r * p.Dv;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const k_i64 x = lane + 32 * t;
      if (x < p.Dv) k_store(orow, x, o[t] * inv);
    }
  }
}

#define KILN_ATTENTION(S, T)                                                                  \
  extern "C" __global__ void kiln_attention_##S(const T* q, const T* k, const T* v,           \
                                                const void* extra, T* out, AttnParams p) {    \
    attention_rows<T>(q, k, v, extra, out, p);                                                \
  }
KILN_ATTENTION(f32, float)
KILN_ATTENTION(f16, k_f16)
KILN_ATTENTION(bf16, k_bf16)

#define KILN_ATTENTION_SPLIT(S, T)                                                            \
  extern "C" __global__ void kiln_attention_split_##S(const T* q, const T* k, const T* v,     \
                                                      const void* extra, float* part,         \
                                                      AttnParams p, k_i64 splits) {           \
    attention_split<T>(q, k, v, extra, part, p, splits);                                      \
  }                                                                                           \
  extern "C" __global__ void kiln_attention_combine_##S(const float* part, T* out,            \
                                                        AttnParams p, k_i64 splits) {         \
    attention_combine<T>(part, out, p, splits);                                               \
  }
KILN_ATTENTION_SPLIT(f32, float)
KILN_ATTENTION_SPLIT(f16, k_f16)
KILN_ATTENTION_SPLIT(bf16, k_bf16)

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
#define KILN_ATTENTION_DECODE16_ROWS(S, T, D) \
  KILN_ATTENTION_DECODE16(S, T, D, 1)         \
  KILN_ATTENTION_DECODE16(S, T, D, 2)         \
  KILN_ATTENTION_DECODE16(S, T, D, 4)         \
  KILN_ATTENTION_DECODE16(S, T, D, 8)
KILN_ATTENTION_DECODE16_ROWS(f16, k_f16, 64)
KILN_ATTENTION_DECODE16_ROWS(f16, k_f16, 128)
KILN_ATTENTION_DECODE16_ROWS(f16, k_f16, 256)
KILN_ATTENTION_DECODE16_ROWS(bf16, k_bf16, 64)
KILN_ATTENTION_DECODE16_ROWS(bf16, k_bf16, 128)
KILN_ATTENTION_DECODE16_ROWS(bf16, k_bf16, 256)
