// The attention mask semantics every CUDA attention kernel shares
// (attention.cu, flash_attention.cu, attention_tiled.cu), included with
// `#include "attention_mask.cuh"` (KernelSource splices it in): the mask kinds
// as graph.proto numbers them (append-only; kernels_attention.cc checks) and
// the structural key range of a query row.
#define K_MASK_CAUSAL 1
#define K_MASK_PREFIX 2
#define K_MASK_SLIDING_WINDOW 4
#define K_MASK_CUSTOM 5
#define K_MASK_BIAS 6

// The keys [lo, hi) query row i (of Sq) may see among Sk under a structural
// mask (causal, prefix, sliding window), aligned to the end of the keys as
// the CPU kernel does; every key for the other kinds (a custom mask or a
// bias is applied per element).
__device__ __forceinline__ void k_attn_key_range(k_i64 mask, k_i64 prefix, k_i64 window,
                                                 k_i64 Sq, k_i64 Sk, k_i64 i, k_i64& lo,
                                                 k_i64& hi) {
  const k_i64 pos = i + (Sk - Sq);
  lo = 0;
  hi = Sk;
  if (mask == K_MASK_CAUSAL) hi = pos + 1;
  if (mask == K_MASK_PREFIX) hi = pos + 1 > prefix ? pos + 1 : prefix;
  if (mask == K_MASK_SLIDING_WINDOW) {
    hi = pos + 1;
    lo = pos - window + 1;
  }
  lo = lo < 0 ? 0 : (lo > Sk ? Sk : lo);
  hi = hi < lo ? lo : (hi > Sk ? Sk : hi);
}

// Whether key `key` of query row `row` survives a custom boolean mask
// ([B, Sk], or [B, Sq, Sk] when per_query).
__device__ __forceinline__ bool k_attn_custom_keeps(const void* mask, bool per_query, k_i64 Sq,
                                                    k_i64 Sk, k_i64 b, k_i64 row, k_i64 key) {
  const unsigned char* mk = static_cast<const unsigned char*>(mask);
  return mk[(per_query ? (b * Sq + row) * Sk : b * Sk) + key] != 0;
}

// The additive bias of (b, h, row, key), broadcast through `stride` (0 on a
// broadcast dim), in f32.
template <typename T>
__device__ __forceinline__ float k_attn_bias(const void* bias, const k_i64 (&stride)[4], k_i64 b,
                                             k_i64 h, k_i64 row, k_i64 key) {
  return k_load(static_cast<const T*>(bias),
                b * stride[0] + h * stride[1] + row * stride[2] + key * stride[3]);
}
