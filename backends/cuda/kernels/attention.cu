// Attention, flash-style: one warp per query row, keys streamed with an
// online softmax (no Sq x Sk buffer). q [B, Hq, Sq, D], k [B, Hkv, Sk, D],
// v [B, Hkv, Sk, Dv], out [B, Hq, Sq, Dv]; query head h reads kv head
// h / (Hq / Hkv) (GQA, MQA). Logits = scale * q.k, then softcap, then the
// mask: structural (causal, prefix, sliding window: a key range per row,
// aligned to the end of the keys as the CPU does), a custom boolean [B, Sk]
// or [B, Sq, Sk], or an additive bias broadcast to [B, Hq, Sq, Sk]. A row
// that sees no key is zero. D, Dv <= 256 (8 per lane). Math in f32.
struct AttnParams {
  k_i64 B, Hq, Hkv, Sq, Sk, D, Dv;
  k_i64 mask;  // v1::MaskKind (append-only, so the numbers below are stable)
  k_i64 prefix, window, mask_per_query;
  k_i64 bias_stride[4];
  float scale, softcap;
};

#define K_MASK_CAUSAL 1
#define K_MASK_PREFIX 2
#define K_MASK_SLIDING_WINDOW 4
#define K_MASK_CUSTOM 5
#define K_MASK_BIAS 6

template <typename T>
__device__ void attention_rows(const T* q, const T* k, const T* v, const void* extra, T* out,
                               const AttnParams& p) {
  const int lane = threadIdx.x & 31;
  const k_i64 warps = static_cast<k_i64>(gridDim.x) * (blockDim.x >> 5);
  const k_i64 rows = p.B * p.Hq * p.Sq;
  const k_i64 group = p.Hkv > 0 ? p.Hq / p.Hkv : 1;
  for (k_i64 r = static_cast<k_i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const k_i64 i = r % p.Sq, h = (r / p.Sq) % p.Hq, b = r / (p.Sq * p.Hq);
    const k_i64 hk = h / group;
    // Keys [lo, hi) this row may see under the structural masks.
    const k_i64 pos = i + (p.Sk - p.Sq);
    k_i64 lo = 0, hi = p.Sk;
    if (p.mask == K_MASK_CAUSAL) hi = pos + 1;
    if (p.mask == K_MASK_PREFIX) hi = pos + 1 > p.prefix ? pos + 1 : p.prefix;
    if (p.mask == K_MASK_SLIDING_WINDOW) {
      hi = pos + 1;
      lo = pos - p.window + 1;
    }
    lo = lo < 0 ? 0 : (lo > p.Sk ? p.Sk : lo);
    hi = hi < lo ? lo : (hi > p.Sk ? p.Sk : hi);
    float qv[8], o[8];
    const T* qrow = q + r * p.D;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const k_i64 x = lane + 32 * t;
      qv[t] = x < p.D ? k_load(qrow, x) : 0.0f;
      o[t] = 0.0f;
    }
    const T* kbase = k + (b * p.Hkv + hk) * p.Sk * p.D;
    const T* vbase = v + (b * p.Hkv + hk) * p.Sk * p.Dv;
    float m = -K_INF, l = 0.0f;
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
        const unsigned char* mk = static_cast<const unsigned char*>(extra);
        const k_i64 at = (p.mask_per_query ? (b * p.Sq + i) * p.Sk : b * p.Sk) + j;
        if (mk[at] == 0) continue;
      } else if (p.mask == K_MASK_BIAS) {
        const T* bias = static_cast<const T*>(extra);
        s += k_load(bias, b * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] +
                              j * p.bias_stride[3]);
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
