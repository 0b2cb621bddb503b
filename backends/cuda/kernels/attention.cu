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
// pair attention_split / attention_combine below (attention_decode.cu's
// attention_decode16 in place of attention_split for 16-byte operands).
#include "attention_mask.cuh"
#include "attention_params.cuh"

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
