// Attention forward without tensor cores (nvrtc:flash_attn_simt_f32), for
// f32 at head dims D == Dv in {64, 128}: FlashAttention style on the SIMT
// units. A block of 128 threads takes 32 query rows of one (batch, head);
// keys stream through shared memory in tiles of 64; S = Q K^T and O += P V
// are register-tiled (a thread computes 4 rows x 4 keys of S and 4 rows x
// D/16 columns of O from 16-byte shared loads); the softmax is online (no
// Sq x Sk buffer). Whole key tiles outside every row's structural range are
// skipped, the last query tiles (which see the most keys under a causal mask)
// launched first.
//
// Semantics are attention.cu's: logits = scale * q.k, then softcap, then the
// mask (attention_mask.cuh); GQA reads kv head h / (Hq / Hkv); a row that
// sees no key is zero.
//
// Layout: q, k, v and out are addressed through strides (elements) of
// batch, head and row, with the head dim contiguous: [B, H, S, D] and
// [B, S, H, D] (the layout projections produce, read without a transpose)
// are both served. No alignment is required of the pointers (global loads
// are scalar and coalesced along D; the 16-byte loads are from shared memory).
//
// Dynamic shared memory (f32): Q 32 x (D + 4), K and V 64 x (D + 4), P 32 x 68.
#include "attention_mask.cuh"

struct TiledParams {
  k_i64 B, Hq, Hkv, Sq, Sk;
  k_i64 mask, prefix, window, mask_per_query;
  k_i64 bias_stride[4];
  // Element strides of batch, head and row (the head dim is contiguous).
  k_i64 q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  float scale, softcap;
};

// The block's dynamic shared memory (a host emulation of the kernel, in
// tests/backends/cuda/attention_tiled_host_test.cc, gives its own).
#ifndef K_TILED_SMEM
extern __shared__ __align__(16) float k_tiled_smem[];
#define K_TILED_SMEM k_tiled_smem
#endif

template <typename T, int D>
__device__ void attention_tiled(const T* q, const T* k, const T* v, const void* extra, T* out,
                                const TiledParams& p) {
  constexpr int BM = 32, BN = 64, NT = 128;
  constexpr int LD = D + 4, LP = BN + 4;  // row pitches: 16-byte rows, conflict-free reads
  constexpr int DC = D / 64;              // float4 column chunks of O per thread
  float* sQ = K_TILED_SMEM;
  float* sK = sQ + BM * LD;
  float* sV = sK + BN * LD;
  float* sP = sV + BN * LD;
  const int tid = threadIdx.x;
  const int rg = tid >> 4;  // rows rg * 4 .. rg * 4 + 3 of the tile
  const int cg = tid & 15;  // keys cg + 16 j of S; columns 64 c + 4 cg .. + 3 of O

  const k_i64 heads = p.B * p.Hq;
  const k_i64 tiles = (p.Sq + BM - 1) / BM;
  const k_i64 bid = blockIdx.x;
  const k_i64 mt = tiles - 1 - bid / heads;
  const k_i64 bh = bid % heads;
  const k_i64 b = bh / p.Hq, h = bh % p.Hq;
  const k_i64 hk = h / (p.Hq / p.Hkv);
  const k_i64 m0 = mt * BM;
  const T* qb = q + b * p.q_stride[0] + h * p.q_stride[1];
  const T* kb = k + b * p.k_stride[0] + hk * p.k_stride[1];
  const T* vb = v + b * p.v_stride[0] + hk * p.v_stride[1];
  T* ob = out + b * p.o_stride[0] + h * p.o_stride[1];

  // Keys any row of the tile may see (ranges grow with the row), and this
  // thread's rows' ranges; padding rows see nothing.
  const k_i64 last = (m0 + BM < p.Sq ? m0 + BM : p.Sq) - 1;
  k_i64 blk_lo, blk_hi, unused;
  k_attn_key_range(p.mask, p.prefix, p.window, p.Sq, p.Sk, m0, blk_lo, unused);
  k_attn_key_range(p.mask, p.prefix, p.window, p.Sq, p.Sk, last, unused, blk_hi);
  k_i64 lo[4], hi[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const k_i64 row = m0 + rg * 4 + i;
    k_attn_key_range(p.mask, p.prefix, p.window, p.Sq, p.Sk, row, lo[i], hi[i]);
    if (row >= p.Sq) hi[i] = lo[i];
  }

  for (int e = tid; e < BM * D; e += NT) {
    const int r = e / D, d = e % D;
    const k_i64 row = m0 + r;
    sQ[r * LD + d] = row < p.Sq ? k_load(qb, row * p.q_stride[2] + d) : 0.0f;
  }

  float acc[4][DC][4];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -K_INF;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[i][c][0] = acc[i][c][1] = acc[i][c][2] = acc[i][c][3] = 0.0f;
  }

  const k_i64 n_begin = (blk_lo / BN) * BN;
  for (k_i64 n0 = n_begin; n0 < blk_hi; n0 += BN) {
    __syncthreads();  // the last tile's readers are done (and sQ is stored)
    for (int e = tid; e < BN * D; e += NT) {
      const int r = e / D, d = e % D;
      const k_i64 key = n0 + r;
      const bool valid = key < p.Sk;
      sK[r * LD + d] = valid ? k_load(kb, key * p.k_stride[2] + d) : 0.0f;
      sV[r * LD + d] = valid ? k_load(vb, key * p.v_stride[2] + d) : 0.0f;
    }
    __syncthreads();

    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(sQ + (rg * 4 + i) * LD + d);
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = *reinterpret_cast<const float4*>(sK + (cg + 16 * j) * LD + d);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float t = s[i][j];
          t = fmaf(qv[i].x, kv[j].x, t);
          t = fmaf(qv[i].y, kv[j].y, t);
          t = fmaf(qv[i].z, kv[j].z, t);
          t = fmaf(qv[i].w, kv[j].w, t);
          s[i][j] = t;
        }
      }
    }

    // Scale, softcap, mask; then the online softmax per row (a row's 64
    // keys are spread over the 16 threads of its row group).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const k_i64 row = m0 + rg * 4 + i;
      float mx = -K_INF;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const k_i64 key = n0 + cg + 16 * j;
        float x = s[i][j] * p.scale;
        if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
        bool ok = key >= lo[i] && key < hi[i];
        if (ok && p.mask == K_MASK_CUSTOM) {
          ok = k_attn_custom_keeps(extra, p.mask_per_query != 0, p.Sq, p.Sk, b, row, key);
        } else if (ok && p.mask == K_MASK_BIAS) {
          x += k_attn_bias<T>(extra, p.bias_stride, b, h, row, key);
        }
        x = ok ? x : -K_INF;
        s[i][j] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_new = fmaxf(m[i], mx);
      const float base = m_new == -K_INF ? 0.0f : m_new;
      const float corr = expf(m[i] - base);  // 0 while the row had no key
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float e = expf(s[i][j] - base);
        sP[(rg * 4 + i) * LP + cg + 16 * j] = e;
        sum += e;
      }
      l[i] = l[i] * corr + sum;  // this thread's share; summed over the group at the end
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        acc[i][c][0] *= corr;
        acc[i][c][1] *= corr;
        acc[i][c][2] *= corr;
        acc[i][c][3] *= corr;
      }
    }
    __syncthreads();  // P is written

#pragma unroll 2
    for (int j = 0; j < BN; j += 4) {
      float4 pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = *reinterpret_cast<const float4*>(sP + (rg * 4 + i) * LP + j);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
        for (int c = 0; c < DC; ++c) {
          const float4 vv = *reinterpret_cast<const float4*>(sV + (j + jj) * LD + 64 * c + 4 * cg);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float pij = jj == 0 ? pv[i].x : jj == 1 ? pv[i].y : jj == 2 ? pv[i].z : pv[i].w;
            acc[i][c][0] = fmaf(pij, vv.x, acc[i][c][0]);
            acc[i][c][1] = fmaf(pij, vv.y, acc[i][c][1]);
            acc[i][c][2] = fmaf(pij, vv.z, acc[i][c][2]);
            acc[i][c][3] = fmaf(pij, vv.w, acc[i][c][3]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 8);
    li += __shfl_xor_sync(0xffffffffu, li, 4);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    const float inv = li > 0.0f ? 1.0f / li : 0.0f;
    const k_i64 row = m0 + rg * 4 + i;
    if (row >= p.Sq) continue;
    T* orow = ob + row * p.o_stride[2];
#pragma unroll
    for (int c = 0; c < DC; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) k_store(orow, 64 * c + 4 * cg + e, acc[i][c][e] * inv);
    }
  }
}

#define KILN_ATTENTION_TILED(S, T, D)                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                            \
      kiln_attention_tiled_##S##_d##D(const T* q, const T* k, const T* v, const void* extra,  \
                                      T* out, TiledParams p) {                                 \
    attention_tiled<T, D>(q, k, v, extra, out, p);                                             \
  }
KILN_ATTENTION_TILED(f32, float, 64)
KILN_ATTENTION_TILED(f32, float, 128)
