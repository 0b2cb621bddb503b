// Attention forward on the tensor cores (kiln:flash_attn_fwd_{f16,bf16}),
// FlashAttention-2 style: a block of 4 warps takes 64 query rows of one
// (batch, head), each warp 16 rows; keys stream through shared memory in
// tiles of 64 (cp.async, zero-filled past the end), S = Q K^T and O += P V
// are mma.sync m16n8k16 (f16/bf16 in, f32 accumulation), the softmax is
// online in registers (no Sq x Sk buffer). Head dims 64 and 128 (D == Dv).
//
// Semantics are attention.cu's: logits = scale * q.k, then softcap, then the
// mask (causal / prefix / sliding window as a key range per row aligned to
// the end of the keys; custom boolean [B, Sk] or [B, Sq, Sk]; additive bias
// broadcast by strides); GQA reads kv head h / (Hq / Hkv); a row that sees no
// key is zero. P is rounded to the input type before P V (as every flash
// kernel does); the row sums are of the unrounded P.
//
// Grid: one block per (64-row tile, batch * head), the last row tiles first
// (under a causal mask they see the most keys). Dynamic shared memory:
// Q, K and V tiles of 64 x (D + 8) halves (the 8 pad rows apart by 16 bytes
// mod 128, so ldmatrix is conflict-free). Every pointer 16-byte aligned (the
// host checks).
struct FlashParams {
  k_i64 B, Hq, Hkv, Sq, Sk;
  k_i64 mask, prefix, window, mask_per_query;
  k_i64 bias_stride[4];
  float scale, softcap;
};

#include "attention_mask.cuh"
#include "mma.cuh"

extern __shared__ __align__(16) unsigned short k_flash_smem[];

__device__ __forceinline__ unsigned k_smem_addr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// 16 bytes global -> shared, or 16 zero bytes when !valid.
__device__ __forceinline__ void k_cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(k_smem_addr(smem)),
               "l"(gmem), "r"(n));
}
__device__ __forceinline__ void k_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void k_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The structural key range [lo, hi) of query row i.
__device__ __forceinline__ void k_key_range(const FlashParams& p, k_i64 i, k_i64& lo, k_i64& hi) {
  k_attn_key_range(p.mask, p.prefix, p.window, p.Sq, p.Sk, i, lo, hi);
}

// rows x D halves of `src` from row `row0` into `dst` (row stride D + 8);
// rows at or past `limit` are zeros.
template <int D>
__device__ __forceinline__ void k_flash_load(unsigned short* dst, const unsigned short* src,
                                             k_i64 row0, k_i64 limit) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  for (int c = threadIdx.x; c < 64 * kChunks; c += 128) {
    const int r = c / kChunks, ch = c % kChunks;
    const k_i64 gr = row0 + r;
    const bool valid = gr < limit;
    k_cp_async16(dst + r * (D + 8) + ch * 8, valid ? src + gr * D + ch * 8 : src, valid);
  }
}

template <int D, bool IsF16>
__device__ void flash_fwd(const unsigned short* q, const unsigned short* k,
                          const unsigned short* v, const void* extra, unsigned short* out,
                          const FlashParams& p) {
  constexpr int BM = 64, BN = 64, LD = D + 8;
  constexpr float kLog2e = 1.4426950408889634f;
  unsigned short* sQ = k_flash_smem;
  unsigned short* sK = sQ + BM * LD;
  unsigned short* sV = sK + BN * LD;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tig = lane & 3;

  const k_i64 heads = p.B * p.Hq;
  const k_i64 tiles = (p.Sq + BM - 1) / BM;
  const k_i64 bid = blockIdx.x;
  const k_i64 mt = tiles - 1 - bid / heads;
  const k_i64 bh = bid % heads;
  const k_i64 b = bh / p.Hq, h = bh % p.Hq;
  const k_i64 hk = h / (p.Hq / p.Hkv);
  const k_i64 m0 = mt * BM;
  const unsigned short* qb = q + bh * p.Sq * D;
  const unsigned short* kb = k + (b * p.Hkv + hk) * p.Sk * D;
  const unsigned short* vb = v + (b * p.Hkv + hk) * p.Sk * D;

  // Keys any row of the tile may see, and this thread's two rows' ranges.
  const k_i64 last = (m0 + BM < p.Sq ? m0 + BM : p.Sq) - 1;
  k_i64 blk_lo, blk_hi, unused;
  k_key_range(p, m0, blk_lo, unused);
  k_key_range(p, last, unused, blk_hi);
  const k_i64 row_a = m0 + warp * 16 + g, row_b = row_a + 8;
  k_i64 lo_a, hi_a, lo_b, hi_b;
  k_key_range(p, row_a, lo_a, hi_a);
  k_key_range(p, row_b, lo_b, hi_b);
  if (row_a >= p.Sq) hi_a = lo_a;  // padding rows see nothing (no bias / mask reads)
  if (row_b >= p.Sq) hi_b = lo_b;
  // Keys every row of this warp sees (ranges grow with the row: the warp's
  // last row has the largest lo, its first the smallest hi).
  const bool operand_free = p.mask != K_MASK_CUSTOM && p.mask != K_MASK_BIAS;
  k_i64 warp_lo, warp_hi;
  {
    const k_i64 first = m0 + warp * 16, end = first + 16 <= p.Sq ? first + 16 : p.Sq;
    k_i64 l0, h0, l1, h1;
    k_key_range(p, first, l0, h0);
    k_key_range(p, end - 1, l1, h1);
    warp_lo = l1;
    warp_hi = end > first ? h0 : warp_lo;  // a warp of padding rows only: never interior
  }

  float o[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  float m_a = -K_INF, m_b = -K_INF, l_a = 0.0f, l_b = 0.0f;
  unsigned qf[D / 16][4];

  const k_i64 n_begin = (blk_lo / BN) * BN, n_end = blk_hi;
  k_flash_load<D>(sQ, qb, m0, p.Sq);
  k_cp_commit();
  if (n_begin < n_end) k_flash_load<D>(sK, kb, n_begin, p.Sk);
  k_cp_commit();
  for (k_i64 n0 = n_begin; n0 < n_end; n0 += BN) {
    k_flash_load<D>(sV, vb, n0, p.Sk);
    k_cp_commit();
    k_cp_wait<1>();  // Q and this K tile
    __syncthreads();
    if (n0 == n_begin) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        k_ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
      }
    }
    // S = Q K^T for this warp's 16 rows and the tile's 64 keys.
    float s[BN / 8][4];
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nj = 0; nj < BN / 16; ++nj) {
        unsigned r[4];
        k_ldmatrix_x4(r, sK + (nj * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                             ((lane >> 3) & 1) * 8);
        k_mma<IsF16>(s[2 * nj], qf[kk], r[0], r[1]);
        k_mma<IsF16>(s[2 * nj + 1], qf[kk], r[2], r[3]);
      }
    }
    // Scale, softcap, mask; the tile's row maxima. A tile inside every row's
    // key range of this warp (the common case: no custom mask or bias) needs
    // no per-element test; otherwise the ranges are checked in 32-bit
    // offsets from the tile's first key.
    float mx_a = -K_INF, mx_b = -K_INF;
    const bool interior = operand_free && n0 >= warp_lo && n0 + BN <= warp_hi;
    const int la = static_cast<int>(lo_a - n0 < 0 ? 0 : (lo_a - n0 > BN ? BN : lo_a - n0));
    const int ha = static_cast<int>(hi_a - n0 < 0 ? 0 : (hi_a - n0 > BN ? BN : hi_a - n0));
    const int lb = static_cast<int>(lo_b - n0 < 0 ? 0 : (lo_b - n0 > BN ? BN : lo_b - n0));
    const int hb = static_cast<int>(hi_b - n0 < 0 ? 0 : (hi_b - n0 > BN ? BN : hi_b - n0));
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool upper = e < 2;
        float x = s[t][e] * p.scale;
        if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
        if (!interior) {
          const int kr = t * 8 + tig * 2 + (e & 1);
          bool ok = upper ? (kr >= la && kr < ha) : (kr >= lb && kr < hb);
          if (ok && !operand_free) {
            const k_i64 row = upper ? row_a : row_b;
            const k_i64 key = n0 + kr;
            if (p.mask == K_MASK_CUSTOM) {
              ok = k_attn_custom_keeps(extra, p.mask_per_query != 0, p.Sq, p.Sk, b, row, key);
            } else {
              const unsigned short* bias = static_cast<const unsigned short*>(extra);
              const unsigned short bits = bias[b * p.bias_stride[0] + h * p.bias_stride[1] +
                                               row * p.bias_stride[2] + key * p.bias_stride[3]];
              x += IsF16 ? k_f16_to_f32(bits) : k_bf16_to_f32(bits);
            }
          }
          x = ok ? x : -K_INF;
        }
        s[t][e] = x;
        if (upper) {
          mx_a = fmaxf(mx_a, x);
        } else {
          mx_b = fmaxf(mx_b, x);
        }
      }
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
    const float base_a = new_a == -K_INF ? 0.0f : new_a * kLog2e;
    const float base_b = new_b == -K_INF ? 0.0f : new_b * kLog2e;
    const float corr_a = exp2f(m_a * kLog2e - base_a), corr_b = exp2f(m_b * kLog2e - base_b);
    m_a = new_a;
    m_b = new_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) {
      s[t][0] = exp2f(s[t][0] * kLog2e - base_a);
      s[t][1] = exp2f(s[t][1] * kLog2e - base_a);
      s[t][2] = exp2f(s[t][2] * kLog2e - base_b);
      s[t][3] = exp2f(s[t][3] * kLog2e - base_b);
      sum_a += s[t][0] + s[t][1];
      sum_b += s[t][2] + s[t][3];
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      o[t][0] *= corr_a;
      o[t][1] *= corr_a;
      o[t][2] *= corr_b;
      o[t][3] *= corr_b;
    }
    __syncthreads();  // every warp is done with sK
    if (n0 + BN < n_end) k_flash_load<D>(sK, kb, n0 + BN, p.Sk);
    k_cp_commit();
    k_cp_wait<1>();  // this V tile
    __syncthreads();
    // O += P V: P's accumulator layout is the A operand's of k16 steps.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned a[4];
      a[0] = k_pack2<IsF16>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = k_pack2<IsF16>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = k_pack2<IsF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = k_pack2<IsF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dj = 0; dj < D / 16; ++dj) {
        unsigned r[4];
        k_ldmatrix_x4_trans(r, sV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                   dj * 16 + (lane >> 4) * 8);
        k_mma<IsF16>(o[2 * dj], a, r[0], r[1]);
        k_mma<IsF16>(o[2 * dj + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();  // every warp is done with sV
  }
  k_cp_wait<0>();
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f;
  const float inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
  unsigned short* ob = out + bh * p.Sq * D;
#pragma unroll
  for (int t = 0; t < D / 8; ++t) {
    const int col = t * 8 + tig * 2;
    if (row_a < p.Sq) {
      *reinterpret_cast<unsigned*>(ob + row_a * D + col) =
          k_pack2<IsF16>(o[t][0] * inv_a, o[t][1] * inv_a);
    }
    if (row_b < p.Sq) {
      *reinterpret_cast<unsigned*>(ob + row_b * D + col) =
          k_pack2<IsF16>(o[t][2] * inv_b, o[t][3] * inv_b);
    }
  }
}

#define KILN_FLASH(S, D, F16)                                                                   \
  extern "C" __global__ void __launch_bounds__(128)                                             \
      kiln_flash_attn_fwd_##S##_d##D(const unsigned short* q, const unsigned short* k,          \
                                     const unsigned short* v, const void* extra,                \
                                     unsigned short* out, FlashParams p) {                      \
    flash_fwd<D, F16>(q, k, v, extra, out, p);                                                  \
  }
KILN_FLASH(f16, 64, true)
KILN_FLASH(f16, 128, true)
KILN_FLASH(bf16, 64, false)
KILN_FLASH(bf16, 128, false)
