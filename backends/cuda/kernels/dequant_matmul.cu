// DequantMatMul: y[m, n] = sum_k x[m, k] * W(k, n), W a GGUF block-quantized
// weight (backends/common/quant_blocks.h has the layouts) stored [N, K]
// (trans_b, GGUF's linear layer) or [K, N], the blocks along the stored rows;
// x and y f32, f16 or bf16; f32 accumulation. The dequantization is fused:
// each 32-element quant group is decoded in registers straight from the
// blocks (16-byte loads where the address allows, narrower where a block
// size leaves it 4- or 2-byte aligned) and the f32 weights are never stored.
// - kiln_dequant_matvec_<w>_<x>: [N, K] and up to DQ_ROWS rows of x
//   (decoding, small batches): a warp per weight row, 8 quant groups per
//   step with 4 lanes per group and 8 weights per lane (the warp's loads of
//   blocks and activations contiguous), each weight decoded once in
//   registers and multiplied into every row of x, then a warp reduction.
// - kiln_dequant_matmul_<w>_<x>: any M and either layout: 32 x 64 tiles of
//   y, K staged 32 at a time; the weight tile is decoded into shared memory
//   once per block (one quant group per weight row for [N, K], BN / 32
//   groups per K row for [K, N]) and multiplied with FMA.
#define DQ_ROWS 8

// Block types, as the host numbers them (kernels_dequant_matmul.cc).
#define DQ_Q8_0 0
#define DQ_Q4_0 1
#define DQ_Q4_K 2
#define DQ_Q5_K 3
#define DQ_Q6_K 4

template <int WT> struct dq_traits;
template <> struct dq_traits<DQ_Q8_0> { static constexpr int elems = 32, bytes = 34; };
template <> struct dq_traits<DQ_Q4_0> { static constexpr int elems = 32, bytes = 18; };
template <> struct dq_traits<DQ_Q4_K> { static constexpr int elems = 256, bytes = 144; };
template <> struct dq_traits<DQ_Q5_K> { static constexpr int elems = 256, bytes = 176; };
template <> struct dq_traits<DQ_Q6_K> { static constexpr int elems = 256, bytes = 210; };

// 16 bytes at p (at least 2-byte aligned: every block size is even).
__device__ __forceinline__ uint4 dq_ld16(const k_u8* p) {
  const k_u64 a = reinterpret_cast<k_u64>(p);
  if ((a & 15u) == 0) return *reinterpret_cast<const uint4*>(p);
  if ((a & 3u) == 0) {
    const unsigned* q = reinterpret_cast<const unsigned*>(p);
    return make_uint4(q[0], q[1], q[2], q[3]);
  }
  const unsigned short* s = reinterpret_cast<const unsigned short*>(p);
  return make_uint4(s[0] | (unsigned(s[1]) << 16), s[2] | (unsigned(s[3]) << 16),
                    s[4] | (unsigned(s[5]) << 16), s[6] | (unsigned(s[7]) << 16));
}
// 32 bytes at p as 8 words.
__device__ __forceinline__ void dq_ld32(const k_u8* p, unsigned q[8]) {
  const uint4 a = dq_ld16(p), b = dq_ld16(p + 16);
  q[0] = a.x, q[1] = a.y, q[2] = a.z, q[3] = a.w, q[4] = b.x, q[5] = b.y, q[6] = b.z, q[7] = b.w;
}
__device__ __forceinline__ unsigned dq_u16(const k_u8* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
// Byte t of the words q.
__device__ __forceinline__ unsigned dq_byte(const unsigned* q, int t) {
  return (q[t >> 2] >> (8 * (t & 3))) & 0xffu;
}
__device__ __forceinline__ int dq_i8(unsigned b) { return static_cast<int>(b << 24) >> 24; }

// The 32 weights of quant group g (0 .. elems / 32 - 1) of the block at b.
template <int WT>
__device__ __forceinline__ void dq_group(const k_u8* b, int g, float v[32]) {
  if (WT == DQ_Q8_0) {
    const float d = k_f16_to_f32(dq_u16(b));
    unsigned q[8];
    dq_ld32(b + 2, q);
#pragma unroll
    for (int t = 0; t < 32; ++t) v[t] = d * static_cast<float>(dq_i8(dq_byte(q, t)));
  } else if (WT == DQ_Q4_0) {
    const float d = k_f16_to_f32(dq_u16(b));
    const uint4 a = dq_ld16(b + 2);
    const unsigned q[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      const unsigned c = dq_byte(q, t);
      v[t] = d * static_cast<float>(static_cast<int>(c & 15u) - 8);
      v[t + 16] = d * static_cast<float>(static_cast<int>(c >> 4) - 8);
    }
  } else if (WT == DQ_Q4_K || WT == DQ_Q5_K) {
    const uint4 h4 = dq_ld16(b);  // d, dmin, scales[12]
    const unsigned h[4] = {h4.x, h4.y, h4.z, h4.w};
    const unsigned* sc = h + 1;
    unsigned s, m;
    if (g < 4) {
      s = dq_byte(sc, g) & 63u;
      m = dq_byte(sc, g + 4) & 63u;
    } else {
      s = (dq_byte(sc, g + 4) & 15u) | ((dq_byte(sc, g - 4) >> 6) << 4);
      m = (dq_byte(sc, g + 4) >> 4) | ((dq_byte(sc, g) >> 6) << 4);
    }
    const float dg = k_f16_to_f32(h[0] & 0xffffu) * static_cast<float>(s);
    const float mg = k_f16_to_f32(h[0] >> 16) * static_cast<float>(m);
    unsigned q[8];
    dq_ld32(b + (WT == DQ_Q4_K ? 16 : 48) + 32 * (g >> 1), q);
    const int shift = 4 * (g & 1);
    unsigned qh[8];
    if (WT == DQ_Q5_K) dq_ld32(b + 16, qh);
#pragma unroll
    for (int t = 0; t < 32; ++t) {
      unsigned c = (dq_byte(q, t) >> shift) & 15u;
      if (WT == DQ_Q5_K) c |= ((dq_byte(qh, t) >> g) & 1u) << 4;
      v[t] = dg * static_cast<float>(c) - mg;
    }
  } else {  // q6_k: group g is elements 32g .. 32g + 31, half g / 4, quarter g % 4
    const int half = g >> 2, j = g & 3;
    const float d = k_f16_to_f32(dq_u16(b + 208));
    const unsigned sw = dq_u16(b + 192 + 2 * g);  // scales[2g], scales[2g + 1]
    const float s0 = d * static_cast<float>(dq_i8(sw & 0xffu));
    const float s1 = d * static_cast<float>(dq_i8(sw >> 8));
    unsigned ql[8], qh[8];
    dq_ld32(b + 64 * half + 32 * (j & 1), ql);
    dq_ld32(b + 128 + 32 * half, qh);
    const int lshift = 4 * (j >> 1), hshift = 2 * j;
#pragma unroll
    for (int t = 0; t < 32; ++t) {
      const int q = static_cast<int>(((dq_byte(ql, t) >> lshift) & 15u) |
                                     (((dq_byte(qh, t) >> hshift) & 3u) << 4)) - 32;
      v[t] = (t < 16 ? s0 : s1) * static_cast<float>(q);
    }
  }
}

// 8 bytes at p (at least 2-byte aligned) as two little-endian words.
__device__ __forceinline__ uint2 dq_ld8(const k_u8* p) {
  const k_u64 a = reinterpret_cast<k_u64>(p);
  if ((a & 7u) == 0) return *reinterpret_cast<const uint2*>(p);
  if ((a & 3u) == 0) {
    const unsigned* q = reinterpret_cast<const unsigned*>(p);
    return make_uint2(q[0], q[1]);
  }
  const unsigned short* s = reinterpret_cast<const unsigned short*>(p);
  return make_uint2(s[0] | (unsigned(s[1]) << 16), s[2] | (unsigned(s[3]) << 16));
}
// Byte t (0..7) of the 8 bytes in u.
__device__ __forceinline__ unsigned dq_byte8(uint2 u, int t) {
  return ((t < 4 ? u.x : u.y) >> (8 * (t & 3))) & 0xffu;
}

// Weights e0 .. e0 + 7 (e0 in {0, 8, 16, 24}) of quant group g of the block
// at b: the matvec kernel's share of a group per lane, so that the lanes of
// a warp read consecutive bytes of the blocks and consecutive activations.
template <int WT>
__device__ __forceinline__ void dq_part8(const k_u8* b, int g, int e0, float v[8]) {
  if (WT == DQ_Q8_0) {
    const float d = k_f16_to_f32(dq_u16(b));
    const uint2 q = dq_ld8(b + 2 + e0);
#pragma unroll
    for (int t = 0; t < 8; ++t) v[t] = d * static_cast<float>(dq_i8(dq_byte8(q, t)));
  } else if (WT == DQ_Q4_0) {
    const float d = k_f16_to_f32(dq_u16(b));
    const uint2 q = dq_ld8(b + 2 + (e0 & 15));
    const int shift = e0 < 16 ? 0 : 4;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      v[t] = d * static_cast<float>(static_cast<int>((dq_byte8(q, t) >> shift) & 15u) - 8);
    }
  } else if (WT == DQ_Q4_K || WT == DQ_Q5_K) {
    const k_u8* sc = b + 4;
    unsigned s, m;
    if (g < 4) {
      s = sc[g] & 63u;
      m = sc[g + 4] & 63u;
    } else {
      s = (sc[g + 4] & 15u) | ((sc[g - 4] >> 6) << 4);
      m = (sc[g + 4] >> 4) | ((sc[g] >> 6) << 4);
    }
    const float dg = k_f16_to_f32(dq_u16(b)) * static_cast<float>(s);
    const float mg = k_f16_to_f32(dq_u16(b + 2)) * static_cast<float>(m);
    const uint2 q = dq_ld8(b + (WT == DQ_Q4_K ? 16 : 48) + 32 * (g >> 1) + e0);
    const int shift = 4 * (g & 1);
    uint2 qh = make_uint2(0u, 0u);
    if (WT == DQ_Q5_K) qh = dq_ld8(b + 16 + e0);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      unsigned c = (dq_byte8(q, t) >> shift) & 15u;
      if (WT == DQ_Q5_K) c |= ((dq_byte8(qh, t) >> g) & 1u) << 4;
      v[t] = dg * static_cast<float>(c) - mg;
    }
  } else {  // q6_k
    const int half = g >> 2, j = g & 3;
    const float s = k_f16_to_f32(dq_u16(b + 208)) *
                    static_cast<float>(static_cast<signed char>(b[192 + 2 * g + (e0 >> 4)]));
    const uint2 ql = dq_ld8(b + 64 * half + 32 * (j & 1) + e0);
    const uint2 qh = dq_ld8(b + 128 + 32 * half + e0);
    const int lshift = 4 * (j >> 1), hshift = 2 * j;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int q = static_cast<int>(((dq_byte8(ql, t) >> lshift) & 15u) |
                                     (((dq_byte8(qh, t) >> hshift) & 3u) << 4)) - 32;
      v[t] = s * static_cast<float>(q);
    }
  }
}

// sum_t v[t] * x[t] over 8 activations: 16-byte loads where x is so aligned.
__device__ __forceinline__ float dq_dot8(const float* x, const float v[8]) {
  if ((reinterpret_cast<k_u64>(x) & 15u) == 0) {
    const float4 a = reinterpret_cast<const float4*>(x)[0], b = reinterpret_cast<const float4*>(x)[1];
    return fmaf(v[0], a.x, fmaf(v[1], a.y, fmaf(v[2], a.z, fmaf(v[3], a.w,
           fmaf(v[4], b.x, fmaf(v[5], b.y, fmaf(v[6], b.z, v[7] * b.w)))))));
  }
  float s = 0.0f;
#pragma unroll
  for (int t = 0; t < 8; ++t) s = fmaf(v[t], x[t], s);
  return s;
}
template <typename T>  // f16 / bf16: eight 16-bit values in one 16-byte load
__device__ __forceinline__ float dq_dot8(const T* x, const float v[8]) {
  float s = 0.0f;
  if ((reinterpret_cast<k_u64>(x) & 15u) == 0) {
    const uint4 a = reinterpret_cast<const uint4*>(x)[0];
    const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const T lo = {static_cast<unsigned short>(w[j] & 0xffffu)};
      const T hi = {static_cast<unsigned short>(w[j] >> 16)};
      s = fmaf(v[2 * j], k_load(&lo, 0), s);
      s = fmaf(v[2 * j + 1], k_load(&hi, 0), s);
    }
    return s;
  }
#pragma unroll
  for (int t = 0; t < 8; ++t) s = fmaf(v[t], k_load(x, t), s);
  return s;
}

// A warp per weight row; each step the warp takes 8 consecutive quant groups
// of the row, 4 lanes per group and 8 weights per lane, so a warp's loads of
// blocks and of activations are contiguous. Up to DQ_ROWS rows of x share
// each decoded weight (more rows: the weights are read again per DQ_ROWS).
template <int WT, typename T>
__device__ void dequant_matvec(const T* x, const k_u8* w, T* y, k_i64 M, k_i64 N, k_i64 K,
                               k_i64 row_bytes) {
  constexpr int GPB = dq_traits<WT>::elems / 32, BB = dq_traits<WT>::bytes;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int sub = lane >> 2, e0 = 8 * (lane & 3);
  const k_i64 groups = K / 32;
  for (k_i64 n = static_cast<k_i64>(blockIdx.x) * warps + (threadIdx.x >> 5); n < N;
       n += static_cast<k_i64>(gridDim.x) * warps) {
    const k_u8* row = w + n * row_bytes;
    for (k_i64 m0 = 0; m0 < M; m0 += DQ_ROWS) {
      const int rows = static_cast<int>(M - m0 < DQ_ROWS ? M - m0 : DQ_ROWS);
      float acc[DQ_ROWS];
#pragma unroll
      for (int r = 0; r < DQ_ROWS; ++r) acc[r] = 0.0f;
#pragma unroll 2
      for (k_i64 g = sub; g < groups; g += 8) {
        float v[8];
        dq_part8<WT>(row + (g / GPB) * BB, static_cast<int>(g % GPB), e0, v);
        const T* xg = x + m0 * K + 32 * g + e0;
#pragma unroll
        for (int r = 0; r < DQ_ROWS; ++r) {
          if (r < rows) acc[r] += dq_dot8(xg + r * K, v);
        }
      }
#pragma unroll
      for (int r = 0; r < DQ_ROWS; ++r) {
        const float s = k_warp_sum(acc[r]);
        if (lane == 0 && r < rows) k_store(y, (m0 + r) * N + n, s);
      }
    }
  }
}

#define DQ_BM 32
#define DQ_BN 64
#define DQ_BK 32
#define DQ_TM 2
#define DQ_TN 4
#define DQ_THREADS ((DQ_BM / DQ_TM) * (DQ_BN / DQ_TN))  // 256

template <int WT, typename T>
__device__ void dequant_matmul(const T* x, const k_u8* w, T* y, k_i64 M, k_i64 N, k_i64 K,
                               k_i64 row_bytes, int trans_b) {
  constexpr int BE = dq_traits<WT>::elems, BB = dq_traits<WT>::bytes;
  __shared__ float As[DQ_BK][DQ_BM + 1];
  __shared__ float Bs[DQ_BK][DQ_BN + 1];
  const int lid = threadIdx.x;
  const int tx = lid % (DQ_BN / DQ_TN), ty = lid / (DQ_BN / DQ_TN);
  const k_i64 m0 = static_cast<k_i64>(blockIdx.y) * DQ_BM, n0 = static_cast<k_i64>(blockIdx.x) * DQ_BN;
  float acc[DQ_TM][DQ_TN];
#pragma unroll
  for (int i = 0; i < DQ_TM; ++i)
#pragma unroll
    for (int j = 0; j < DQ_TN; ++j) acc[i][j] = 0.0f;
  for (k_i64 k0 = 0; k0 < K; k0 += DQ_BK) {
    for (int e = lid; e < DQ_BM * DQ_BK; e += DQ_THREADS) {
      const int mm = e / DQ_BK, kk = e % DQ_BK;
      const k_i64 m = m0 + mm, k = k0 + kk;
      As[kk][mm] = m < M && k < K ? k_load(x, m * K + k) : 0.0f;
    }
    if (trans_b) {
      // K is whole blocks: the group of k0 .. k0 + 31 is whole.
      for (int nn = lid; nn < DQ_BN; nn += DQ_THREADS) {
        const k_i64 n = n0 + nn;
        float v[32];
        if (n < N) {
          dq_group<WT>(w + n * row_bytes + (k0 / BE) * BB, static_cast<int>((k0 % BE) / 32), v);
        } else {
#pragma unroll
          for (int l = 0; l < 32; ++l) v[l] = 0.0f;
        }
#pragma unroll
        for (int l = 0; l < 32; ++l) Bs[l][nn] = v[l];
      }
    } else {
      // N is whole blocks: a group that starts below N is whole.
      for (int t = lid; t < DQ_BK * (DQ_BN / 32); t += DQ_THREADS) {
        const int kk = t / (DQ_BN / 32), c = t % (DQ_BN / 32);
        const k_i64 k = k0 + kk, n = n0 + 32 * c;
        float v[32];
        if (k < K && n < N) {
          dq_group<WT>(w + k * row_bytes + (n / BE) * BB, static_cast<int>((n % BE) / 32), v);
        } else {
#pragma unroll
          for (int l = 0; l < 32; ++l) v[l] = 0.0f;
        }
#pragma unroll
        for (int l = 0; l < 32; ++l) Bs[kk][32 * c + l] = v[l];
      }
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < DQ_BK; ++kk) {
      float ra[DQ_TM], rb[DQ_TN];
#pragma unroll
      for (int i = 0; i < DQ_TM; ++i) ra[i] = As[kk][ty + i * (DQ_BM / DQ_TM)];
#pragma unroll
      for (int j = 0; j < DQ_TN; ++j) rb[j] = Bs[kk][tx + j * (DQ_BN / DQ_TN)];
#pragma unroll
      for (int i = 0; i < DQ_TM; ++i)
#pragma unroll
        for (int j = 0; j < DQ_TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < DQ_TM; ++i) {
    const k_i64 m = m0 + ty + i * (DQ_BM / DQ_TM);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < DQ_TN; ++j) {
      const k_i64 n = n0 + tx + j * (DQ_BN / DQ_TN);
      if (n < N) k_store(y, m * N + n, acc[i][j]);
    }
  }
}

#define KILN_DEQUANT(WN, WT, S, T)                                                               \
  extern "C" __global__ void kiln_dequant_matvec_##WN##_##S(const T* x, const k_u8* w, T* y,     \
                                                           k_i64 M, k_i64 N, k_i64 K,          \
                                                           k_i64 row_bytes) {                  \
    dequant_matvec<WT, T>(x, w, y, M, N, K, row_bytes);                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(DQ_THREADS) kiln_dequant_matmul_##WN##_##S(     \
      const T* x, const k_u8* w, T* y, k_i64 M, k_i64 N, k_i64 K, k_i64 row_bytes,             \
      int trans_b) {                                                                           \
    dequant_matmul<WT, T>(x, w, y, M, N, K, row_bytes, trans_b);                               \
  }
#define KILN_DEQUANT_ALL(WN, WT) \
  KILN_DEQUANT(WN, WT, f32, float) \
  KILN_DEQUANT(WN, WT, f16, k_f16) \
  KILN_DEQUANT(WN, WT, bf16, k_bf16)
KILN_DEQUANT_ALL(q8_0, DQ_Q8_0)
KILN_DEQUANT_ALL(q4_0, DQ_Q4_0)
KILN_DEQUANT_ALL(q4_k, DQ_Q4_K)
KILN_DEQUANT_ALL(q5_k, DQ_Q5_K)
KILN_DEQUANT_ALL(q6_k, DQ_Q6_K)
