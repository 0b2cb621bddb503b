// attention.cu's parameter block and the structural key range of a query
// row, shared with attention_decode.cu: a kernel source says
// `#include "attention_mask.cuh"` and then `#include "attention_params.cuh"`
// (KernelSource splices both in; this header relies on the first).
struct AttnParams {
  k_i64 B, Hq, Hkv, Sq, Sk, D, Dv;
  k_i64 mask;  // v1::MaskKind (append-only, so the numbers below are stable)
  k_i64 prefix, window, mask_per_query;
  k_i64 bias_stride[4];
  float scale, softcap;
};

// The structural key range [lo, hi) of query row i.
__device__ __forceinline__ void attn_key_range(const AttnParams& p, k_i64 i, k_i64& lo,
                                               k_i64& hi) {
  k_attn_key_range(p.mask, p.prefix, p.window, p.Sq, p.Sk, i, lo, hi);
}
