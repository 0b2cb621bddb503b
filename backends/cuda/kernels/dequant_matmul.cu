// DequantMatMul: y[m, n] = sum_k x[m, k] * W(k, n), W a GGUF block-quantized
// weight (backends/common/quant_blocks.h has the layouts) stored [N, K]
// (trans_b, GGUF's linear layer) or [K, N], the blocks along the stored rows;
// x and y f32, f16 or bf16; f32 accumulation. The dequantization is fused:
// each 32-element quant group is decoded in registers straight from the
// blocks (16-byte loads where the address allows, narrower where a block
// size leaves it 4- or 2-byte aligned) and the f32 weights are never stored.
// - kiln_dequant_matvec_m<MR>_<w>_<x>: [N, K] and small M (decoding, small
//   batches): a block of warps per 2 weight rows, splitting K; 16-byte
//   loads of the blocks and of x; each weight decoded once in registers
//   (about two instructions, no int-to-float conversion) for up to MR rows
//   of x (MR = 1, 4, 8). "The matvec kernel" below has the details.
// - kiln_dequant_matmul_<w>_<x>: any M and either layout: 32 x 64 tiles of
//   y, K staged 32 at a time; the weight tile is decoded into shared memory
//   once per block (one quant group per weight row for [N, K], BN / 32
//   groups per K row for [K, N]) and multiplied with FMA.
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

// ---- The matvec kernel ([N, K] weights, up to DQ_MR rows of x per pass) ----
// A block of DQ_MV_WARPS warps takes DQ_MV_R consecutive weight rows; its
// warps split the row's blocks (K) and combine through shared memory, so
// even a 4096-row weight puts thousands of warps in flight. Within a warp,
// LPB lanes share a block (dq_mv<WT>) and each lane decodes NRUN runs of 16
// weights from 16-byte pieces of it: a warp's loads cover consecutive bytes
// of the row, 16 bytes per lane (one uint4 where the blocks are 16-byte
// aligned, five words and a funnel shift where not). The decoded weights of
// the DQ_MV_R rows stay in registers for every row of x, and each run of 16
// activations (four float4) for every weight row.
//
// Decoding costs about two instructions per weight, never an int-to-float
// conversion (a quarter-rate instruction that capped the previous kernel):
// a 4, 5 or 6-bit code c becomes the float 1 + c / 2^bits by placing it in
// the mantissa (one PRMT per weight, a shift and mask per 4 weights), and
// the run's sum of w x = s (c - o) x is recovered from S_f = sum f x and
// S_x = sum x as a S_f + b S_x (a = s 2^bits, b = -(s 2^bits + s o), or
// with q4_k's minimum). Both sums are f32 over 16 terms and their scales
// exact powers of two times the block scale, so the result keeps the f32
// error of a plain dot (the cancellation a S_f + b S_x costs at most a few
// ulps of sum |w x|). q8_0's signed bytes are exact as 2^23 + (c + 128)
// minus 2^23 + 128 (a PRMT and an FADD).
#define DQ_MV_WARPS 4
#define DQ_MV_R 2

template <int WT> struct dq_mv;  // LPB lanes per block, NRUN runs of 16 per lane
template <> struct dq_mv<DQ_Q8_0> { static constexpr int LPB = 2, NRUN = 1; static constexpr bool SX = false; };
template <> struct dq_mv<DQ_Q4_0> { static constexpr int LPB = 1, NRUN = 2; static constexpr bool SX = true; };
template <> struct dq_mv<DQ_Q4_K> { static constexpr int LPB = 8, NRUN = 2; static constexpr bool SX = true; };
template <> struct dq_mv<DQ_Q5_K> { static constexpr int LPB = 8, NRUN = 2; static constexpr bool SX = true; };
template <> struct dq_mv<DQ_Q6_K> { static constexpr int LPB = 8, NRUN = 2; static constexpr bool SX = true; };

// 16 bytes at p as 4 little-endian words: one uint4 load where `al16` (a
// kernel-wide fact: the caller checks the base and the strides), else p is
// 2-byte aligned: the aligned words around it, funnel-shifted (branch-free,
// so lanes whose blocks differ in alignment do not diverge; the fifth word
// is read only where the 16 bytes reach into it).
__device__ __forceinline__ void dq_ld16w(const k_u8* p, unsigned q[4], bool al16) {
  if (al16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
    return;
  }
  const k_u64 a = reinterpret_cast<k_u64>(p);
  const unsigned* base = reinterpret_cast<const unsigned*>(a & ~static_cast<k_u64>(3));
  const unsigned sh = static_cast<unsigned>(a & 3u) * 8u;  // 0 or 16
  unsigned v[5];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __ldg(base + i);
  v[4] = __ldg(base + (sh != 0 ? 4 : 3));
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// Byte t (0..3) of each word of `b` (each byte 0x80 | code << shift) as the
// float 0x3F800000 | byte << 16: 1 + code / 2^(7 - shift).
__device__ __forceinline__ void dq_mant16(const unsigned b[4], float f[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[4 * i + 0] = __uint_as_float(__byte_perm(b[i], 0x3F000000u, 0x7054u));
    f[4 * i + 1] = __uint_as_float(__byte_perm(b[i], 0x3F000000u, 0x7154u));
    f[4 * i + 2] = __uint_as_float(__byte_perm(b[i], 0x3F000000u, 0x7254u));
    f[4 * i + 3] = __uint_as_float(__byte_perm(b[i], 0x3F000000u, 0x7354u));
  }
}
// 16 packed nibbles (the low ones, or the high ones where `hi`) as 1 + c / 16.
__device__ __forceinline__ void dq_nib16(const unsigned q[4], int hi, float f[16]) {
  unsigned b[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b[i] = ((hi ? q[i] >> 1 : q[i] << 3) & 0x78787878u) | 0x80808080u;
  }
  dq_mant16(b, f);
}

// q4_k / q5_k's 6-bit scale and minimum of group g (scales at sc, 12 bytes
// in 3 words): bytes g & 3 of the three words, shifted alike (g may vary by
// lane: no indexed register array, which would live in local memory, and no
// branch, which would split a warp whose lanes hold groups below and above 4).
__device__ __forceinline__ void dq_scale_min_k4(const unsigned sc[3], int g, unsigned& s,
                                                unsigned& m) {
  const unsigned sh = 8u * static_cast<unsigned>(g & 3);
  const unsigned a = sc[0] >> sh, b = sc[1] >> sh, c = sc[2] >> sh;  // bytes j, j + 4, j + 8
  const unsigned s_hi = (c & 15u) | ((a >> 2) & 0x30u);
  const unsigned m_hi = ((c >> 4) & 15u) | ((b >> 2) & 0x30u);
  s = g < 4 ? a & 63u : s_hi;
  m = g < 4 ? b & 63u : m_hi;
}
// A small unsigned integer (< 2^23) as a float, exactly: placed in the
// mantissa of 2^23 and 2^23 taken off (two full-rate instructions, not the
// quarter-rate int-to-float conversion).
__device__ __forceinline__ float dq_u2f(unsigned v) {
  return __uint_as_float(0x4B000000u | v) - 8388608.0f;
}

// Lane `sub`'s share of the block at b: NRUN runs of 16 weights as f (see
// above), each run's w x sum being a[r] S_f + c[r] S_x.
template <int WT>
__device__ __forceinline__ void dq_unit(const k_u8* b, int sub, bool al16, float f[][16],
                                        float a[], float c[]) {
  if (WT == DQ_Q8_0) {  // lanes 0, 1: weights 0..15, 16..31
    const float d = k_f16_to_f32(dq_u16(b));
    unsigned q[4];
    dq_ld16w(b + 2 + 16 * sub, q, false);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned u = q[i] ^ 0x80808080u;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        f[0][4 * i + t] =
            __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650u | static_cast<unsigned>(t))) -
            8388736.0f;
      }
    }
    a[0] = d, c[0] = 0.0f;
  } else if (WT == DQ_Q4_0) {  // one lane: low nibbles 0..15, high 16..31
    const float d = k_f16_to_f32(dq_u16(b));
    unsigned q[4];
    dq_ld16w(b + 2, q, false);
    dq_nib16(q, 0, f[0]);
    dq_nib16(q, 1, f[1]);
    a[0] = a[1] = 16.0f * d;
    c[0] = c[1] = -24.0f * d;
  } else if (WT == DQ_Q4_K || WT == DQ_Q5_K) {
    // Lane sub: quant bytes 16 sub .. 16 sub + 15, groups 2 (sub / 2) (low
    // nibbles) and 2 (sub / 2) + 1 (high), elements 16 (sub % 2) + 0..15.
    unsigned h[4], q[4];
    dq_ld16w(b, h, al16);  // d, dmin, scales[12]
    dq_ld16w(b + (WT == DQ_Q4_K ? 16 : 48) + 16 * sub, q, al16);
    unsigned qh[4];
    if (WT == DQ_Q5_K) dq_ld16w(b + 16 + 16 * (sub & 1), qh, al16);
    const float d = k_f16_to_f32(static_cast<unsigned short>(h[0] & 0xffffu));
    const float dmin = k_f16_to_f32(static_cast<unsigned short>(h[0] >> 16));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int g = 2 * (sub >> 1) + r;
      unsigned s, m;
      dq_scale_min_k4(h + 1, g, s, m);
      const float dg = d * dq_u2f(s), mg = dmin * dq_u2f(m);
      if (WT == DQ_Q4_K) {
        dq_nib16(q, r, f[r]);
        a[r] = 16.0f * dg;
        c[r] = -(16.0f * dg + mg);
      } else {  // c = nibble | bit g of qh << 4, as 1 + c / 32
        unsigned bb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          bb[i] = (((q[i] >> (4 * r)) & 0x0F0F0F0Fu) << 2) | (((qh[i] >> g) & 0x01010101u) << 6) |
                  0x80808080u;
        }
        dq_mant16(bb, f[r]);
        a[r] = 32.0f * dg;
        c[r] = -(32.0f * dg + mg);
      }
    }
  } else {  // q6_k
    // Lane sub: ql bytes 64 half + 16 (sub % 4), half = sub / 4: the low
    // nibbles are group ga = 4 half + jj, the high ones ga + 2, elements
    // t0 + 0..15 of each (jj = (sub / 2) % 2, t0 = 16 (sub % 2)).
    const int half = sub >> 2, jj = (sub >> 1) & 1, t0 = 16 * (sub & 1);
    unsigned ql[4], qh[4];
    dq_ld16w(b + 64 * half + 32 * jj + t0, ql, false);
    dq_ld16w(b + 128 + 32 * half + t0, qh, false);
    const float d = k_f16_to_f32(dq_u16(b + 208));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int g = 4 * half + jj + 2 * r, hshift = 2 * (jj + 2 * r);
      unsigned bb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        bb[i] = (((ql[i] >> (4 * r)) & 0x0F0F0F0Fu) << 1) |
                (((qh[i] >> hshift) & 0x03030303u) << 5) | 0x80808080u;
      }
      dq_mant16(bb, f[r]);
      const float s = d * static_cast<float>(static_cast<signed char>(b[192 + 2 * g + (sub & 1)]));
      a[r] = 64.0f * s;
      c[r] = -96.0f * s;
    }
  }
}

// Where run r of lane sub's share starts within its block (elements).
template <int WT>
__device__ __forceinline__ int dq_xoff(int sub, int r) {
  if (WT == DQ_Q8_0) return 16 * sub;
  if (WT == DQ_Q4_0) return 16 * r;
  if (WT == DQ_Q4_K || WT == DQ_Q5_K) return 64 * (sub >> 1) + 32 * r + 16 * (sub & 1);
  return 32 * (4 * (sub >> 2) + ((sub >> 1) & 1) + 2 * r) + 16 * (sub & 1);  // q6_k
}

// 16 activations at p as f32: four float4 (eight-halves uint4 pairs for
// f16 / bf16) where x's base is 16-byte aligned (`al`: every run then is).
__device__ __forceinline__ void dq_ldx16(const float* p, float v[16], bool al) {
  if (al) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p) + i);
      v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < 16; ++t) v[t] = p[t];
}
template <typename T>
__device__ __forceinline__ void dq_ldx16(const T* p, float v[16], bool al) {
  if (al) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(p) + i);
      const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const T lo = {static_cast<unsigned short>(w[j] & 0xffffu)};
        const T hi = {static_cast<unsigned short>(w[j] >> 16)};
        v[8 * i + 2 * j] = k_load(&lo, 0);
        v[8 * i + 2 * j + 1] = k_load(&hi, 0);
      }
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < 16; ++t) v[t] = k_load(p, t);
}

// One lane's partial sums for DQ_MV_R weight rows from n0 and up to MR rows
// of x from m0 (acc[r][m]), over the blocks b = first, first + stride, ...
// of the rows: the kernel's arithmetic, separate from its reductions so
// that a host build can replay it lane by lane.
template <int WT, int MR, typename T, int R>
__device__ __forceinline__ void dq_mv_lane(const T* x, const k_u8* const rows[R], k_i64 M,
                                           k_i64 K, k_i64 m0, int sub, int first, int stride,
                                           bool al16, bool xal, float acc[R][MR]) {
  constexpr int NRUN = dq_mv<WT>::NRUN, BE = dq_traits<WT>::elems, BB = dq_traits<WT>::bytes;
  const int nb = static_cast<int>(K / BE);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = 0.0f;
  if (MR == 1) {
    // One row of x: its runs loaded once, then the weight rows decoded one
    // at a time (R rows' decoded weights never live at once, so R = 4 or 8
    // rows per block keep the registers of R = 2). The same sums in the same
    // order as below.
    for (int b = first; b < nb; b += stride) {
      float xv[NRUN][16], sx[NRUN];
#pragma unroll
      for (int run = 0; run < NRUN; ++run) {
        dq_ldx16(x + m0 * K + static_cast<k_i64>(b) * BE + dq_xoff<WT>(sub, run), xv[run], xal);
        sx[run] = 0.0f;
        if (dq_mv<WT>::SX) {
#pragma unroll
          for (int t = 0; t < 16; ++t) sx[run] += xv[run][t];
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float f[NRUN][16], a[NRUN], c[NRUN];
        dq_unit<WT>(rows[r] + static_cast<k_i64>(b) * BB, sub, al16, f, a, c);
#pragma unroll
        for (int run = 0; run < NRUN; ++run) {
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int t = 0; t < 16; t += 2) {
            s0 = fmaf(f[run][t], xv[run][t], s0);
            s1 = fmaf(f[run][t + 1], xv[run][t + 1], s1);
          }
          acc[r][0] += dq_mv<WT>::SX ? fmaf(a[run], s0 + s1, c[run] * sx[run]) : a[run] * (s0 + s1);
        }
      }
    }
    return;
  }
  for (int b = first; b < nb; b += stride) {
    float f[R][NRUN][16], a[R][NRUN], c[R][NRUN];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      dq_unit<WT>(rows[r] + static_cast<k_i64>(b) * BB, sub, al16, f[r], a[r], c[r]);
    }
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      if (m0 + m >= M) break;  // uniform across the block
#pragma unroll
      for (int run = 0; run < NRUN; ++run) {
        float xv[16];
        dq_ldx16(x + (m0 + m) * K + static_cast<k_i64>(b) * BE + dq_xoff<WT>(sub, run), xv, xal);
        float sx = 0.0f;
        if (dq_mv<WT>::SX) {
#pragma unroll
          for (int t = 0; t < 16; ++t) sx += xv[t];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int t = 0; t < 16; t += 2) {
            s0 = fmaf(f[r][run][t], xv[t], s0);
            s1 = fmaf(f[r][run][t + 1], xv[t + 1], s1);
          }
          acc[r][m] += dq_mv<WT>::SX ? fmaf(a[r][run], s0 + s1, c[r][run] * sx)
                                     : a[r][run] * (s0 + s1);
        }
      }
    }
  }
}

template <int WT, int MR, typename T, int R = DQ_MV_R>
__device__ void dequant_matvec(const T* x, const k_u8* w, T* y, k_i64 M, k_i64 N, k_i64 K,
                               k_i64 row_bytes) {
  constexpr int LPB = dq_mv<WT>::LPB, BPS = 32 / LPB;  // blocks per warp step
  __shared__ float part[DQ_MV_WARPS][R][MR];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const k_i64 n0 = static_cast<k_i64>(blockIdx.x) * R;
  const bool al16 = ((reinterpret_cast<k_u64>(w) | static_cast<k_u64>(row_bytes)) & 15u) == 0;
  const bool xal = (reinterpret_cast<k_u64>(x) & 15u) == 0 && K % 8 == 0;
  const k_u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + (n0 + r < N ? n0 + r : N - 1) * row_bytes;
  for (k_i64 m0 = 0; m0 < M; m0 += MR) {
    float acc[R][MR];
    dq_mv_lane<WT, MR, T, R>(x, rows, M, K, m0, lane & (LPB - 1), warp * BPS + lane / LPB,
                             DQ_MV_WARPS * BPS, al16, xal, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        const float v = k_warp_sum(acc[r][m]);
        if (lane == 0) part[warp][r][m] = v;
      }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < R * MR) {
      const int r = t / MR, m = t % MR;
      if (n0 + r < N && m0 + m < M) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < DQ_MV_WARPS; ++i) s += part[i][r][m];
        k_store(y, (m0 + m) * N + n0 + r, s);
      }
    }
    __syncthreads();
  }
}
// ---- The tensor-core kernel ([N, K] weights, M > 8; sm_80 and newer) ----
// kiln_dequant_mma_n<NT>_<w>_<x>: a block of DQ_MMA_WARPS warps takes
// DQ_MMA_ROWS weight rows (16 per warp) and MT = 8 NT rows of x; blockIdx.z
// takes a share of K (partial sums to `part`, [splits, M, N] f32, summed by
// kiln_dequant_mma_reduce_<x>) when the tiles alone do not fill the device.
// mma.sync m16n8k16 (bf16 in, f32 accumulation) with the warp's 16 weight
// rows as A and 8 rows of x as B, per n8 tile of x.
//
// A is the quantized codes themselves, exact in bf16 (< 128 for the 4/5/6-bit
// types: the byte 0x43 | code is the bf16 128 + code, less 128 by one bf16x2
// FMA; q8_0's signed bytes through f32, exactly), and the block scales are
// applied in f32 per scale group (32 elements; 16 for q6_k): for each group
// the mma sums T = sum code x, and y += a T + c S_x with S_x = sum x over the
// group (a the group's scale, c its offset: q4_k's minimum, -8 d for q4_0,
// -32 s for q6_k, 0 for q8_0). f32 activations go in as two bf16 halves,
// x = hi + lo (|x - hi - lo| <= 2^-18 |x|), each through the mma (two per
// chunk), and S_x is the sum of the same hi + lo, so the offset cancels
// exactly what the mma saw; f16 activations split exactly; bf16 go in once.
//
// The k order inside a 64-element step ("kstep") is the blocks' byte order,
// not k's: lane (g, t) of the warp decodes 4 codes per chunk of 16 of weight
// rows g and g + 8 from consecutive bytes (dq_mma_fetch), and x is staged in
// shared memory with the same permutation (dq_mma_xoff), in the mma's B
// fragment order, hi and lo, double-buffered: one barrier per kstep. Every
// chunk of 16 lies in one scale group.
#define DQ_MMA_WARPS 4
#define DQ_MMA_ROWS (16 * DQ_MMA_WARPS)
// How many ksteps ahead each lane loads its weights: 2 (the default) or 1
// (the host defines it for a benchmark's comparison, a module of its own).
#ifndef DQ_MMA_PF
#define DQ_MMA_PF 2
#endif

#if defined(DQ_HOST) || __CUDA_ARCH__ >= 800
#if !defined(DQ_HOST)
// C += A B, m16n8k16, bf16 operands, f32 accumulation.
__device__ __forceinline__ void dq_mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Each bf16 half of v less 128 (exact for 128 + c, 0 <= c < 128).
__device__ __forceinline__ unsigned dq_bf16x2_less128(unsigned v) {
  unsigned r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
  return r;
}
// lo and hi rounded to bf16, lo in the low half.
__device__ __forceinline__ unsigned dq_pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float dq_shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
#endif

template <int WT> struct dq_mma_t;  // NG scale groups per kstep, SX: needs S_x
template <> struct dq_mma_t<DQ_Q8_0> { static constexpr int NG = 2; static constexpr bool SX = false; };
template <> struct dq_mma_t<DQ_Q4_0> { static constexpr int NG = 2; static constexpr bool SX = true; };
template <> struct dq_mma_t<DQ_Q4_K> { static constexpr int NG = 2; static constexpr bool SX = true; };
template <> struct dq_mma_t<DQ_Q5_K> { static constexpr int NG = 2; static constexpr bool SX = true; };
template <> struct dq_mma_t<DQ_Q6_K> { static constexpr int NG = 4; static constexpr bool SX = true; };

template <typename T> struct dq_hilo { static constexpr bool value = true; };
template <> struct dq_hilo<k_bf16> { static constexpr bool value = false; };

// Where kstep s starts in k, and where lane column t's 4 consecutive
// elements of chunk j (0..3) lie after it.
template <int WT>
__device__ __forceinline__ k_i64 dq_mma_kbase(int s) {
  if (WT == DQ_Q6_K) return 256 * static_cast<k_i64>(s >> 2) + 128 * ((s >> 1) & 1) + 32 * (s & 1);
  return 64 * static_cast<k_i64>(s);
}
template <int WT>
__device__ __forceinline__ int dq_mma_xoff(int j, int t) {
  if (WT == DQ_Q4_0) return 32 * (j >> 1) + 16 * (j & 1) + 4 * t;
  if (WT == DQ_Q6_K) return 64 * (j >> 1) + 16 * (j & 1) + 4 * t;
  return 32 * (j >> 1) + 8 * t + 4 * (j & 1);  // q8_0, q4_k, q5_k
}

// A 2-byte aligned word.
__device__ __forceinline__ unsigned dq_ld4u(const k_u8* p) {
  return dq_u16(p) | (dq_u16(p + 2) << 16);
}
// 8 bytes as 2 words: one load where `al` (8-byte aligned), else 2-byte words.
__device__ __forceinline__ void dq_ld8w(const k_u8* p, unsigned q[2], bool al) {
  if (al) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    q[0] = v.x, q[1] = v.y;
    return;
  }
  q[0] = dq_ld4u(p), q[1] = dq_ld4u(p + 4);
}

// Lane column t's raw words of kstep s of the row at `row` (nb blocks).
template <int WT>
__device__ __forceinline__ void dq_mma_fetch(const k_u8* row, int s, int t, int nb, bool al16,
                                             unsigned r[8]) {
  if (WT == DQ_Q4_K || WT == DQ_Q5_K) {
    const k_u8* b = row + static_cast<k_i64>(s >> 2) * dq_traits<WT>::bytes;
    dq_ld16w(b, r, al16);  // d, dmin, scales[12]
    dq_ld8w(b + (WT == DQ_Q4_K ? 16 : 48) + 32 * (s & 3) + 8 * t, r + 4, al16);
    if (WT == DQ_Q5_K) dq_ld8w(b + 16 + 8 * t, r + 6, al16);
  } else if (WT == DQ_Q6_K) {
    const k_u8* b = row + static_cast<k_i64>(s >> 2) * 210;
    const int h = (s >> 1) & 1, a = s & 1;
    r[0] = dq_ld4u(b + 64 * h + 32 * a + 4 * t);
    r[1] = dq_ld4u(b + 64 * h + 32 * a + 16 + 4 * t);
    r[2] = dq_ld4u(b + 128 + 32 * h + 4 * t);
    r[3] = dq_ld4u(b + 128 + 32 * h + 16 + 4 * t);
    r[4] = dq_u16(b + 192 + 8 * h + 2 * a);      // scales of chunks 0, 1
    r[5] = dq_u16(b + 192 + 8 * h + 4 + 2 * a);  // chunks 2, 3
    r[6] = dq_u16(b + 208);
  } else {  // q8_0, q4_0: blocks 2s and 2s + 1 (absent past K: zeros)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int blk = 2 * s + e;
      const k_u8* b = row + static_cast<k_i64>(blk) * dq_traits<WT>::bytes;
      const bool in = blk < nb;
      if (WT == DQ_Q8_0) {
        r[3 * e] = in ? dq_u16(b) : 0u;
        r[3 * e + 1] = in ? dq_ld4u(b + 2 + 8 * t) : 0u;
        r[3 * e + 2] = in ? dq_ld4u(b + 6 + 8 * t) : 0u;
      } else {
        r[2 * e] = in ? dq_u16(b) : 0u;
        r[2 * e + 1] = in ? dq_ld4u(b + 2 + 4 * t) : 0u;
      }
    }
  }
}

// The raw words as each chunk's 4 codes (a byte each; q8_0's signed) and
// each scale group's a and c (y += a sum(code x) + c sum(x)).
template <int WT>
__device__ __forceinline__ void dq_mma_decode(const unsigned r[8], int s, unsigned cw[4],
                                              float sa[4], float sc[4]) {
  constexpr unsigned M4 = 0x0F0F0F0Fu;
  if (WT == DQ_Q4_K || WT == DQ_Q5_K) {
    const int i = s & 3;
    cw[0] = r[4] & M4, cw[1] = r[5] & M4, cw[2] = (r[4] >> 4) & M4, cw[3] = (r[5] >> 4) & M4;
    if (WT == DQ_Q5_K) {
      cw[0] |= ((r[6] >> (2 * i)) & 0x01010101u) << 4;
      cw[1] |= ((r[7] >> (2 * i)) & 0x01010101u) << 4;
      cw[2] |= ((r[6] >> (2 * i + 1)) & 0x01010101u) << 4;
      cw[3] |= ((r[7] >> (2 * i + 1)) & 0x01010101u) << 4;
    }
    const float d = k_f16_to_f32(static_cast<unsigned short>(r[0] & 0xffffu));
    const float dmin = k_f16_to_f32(static_cast<unsigned short>(r[0] >> 16));
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      unsigned sv, mv;
      dq_scale_min_k4(r + 1, 2 * i + e, sv, mv);
      sa[e] = d * dq_u2f(sv);
      sc[e] = -dmin * dq_u2f(mv);
    }
  } else if (WT == DQ_Q6_K) {
    const int a = s & 1;
    cw[0] = (r[0] & M4) | (((r[2] >> (2 * a)) & 0x03030303u) << 4);
    cw[1] = (r[1] & M4) | (((r[3] >> (2 * a)) & 0x03030303u) << 4);
    cw[2] = ((r[0] >> 4) & M4) | (((r[2] >> (2 * a + 4)) & 0x03030303u) << 4);
    cw[3] = ((r[1] >> 4) & M4) | (((r[3] >> (2 * a + 4)) & 0x03030303u) << 4);
    const float d = k_f16_to_f32(static_cast<unsigned short>(r[6]));
    sa[0] = d * static_cast<float>(dq_i8(r[4] & 0xffu));
    sa[1] = d * static_cast<float>(dq_i8(r[4] >> 8));
    sa[2] = d * static_cast<float>(dq_i8(r[5] & 0xffu));
    sa[3] = d * static_cast<float>(dq_i8(r[5] >> 8));
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[e] = -32.0f * sa[e];
  } else if (WT == DQ_Q8_0) {
    cw[0] = r[1], cw[1] = r[2], cw[2] = r[4], cw[3] = r[5];
    sa[0] = k_f16_to_f32(static_cast<unsigned short>(r[0]));
    sa[1] = k_f16_to_f32(static_cast<unsigned short>(r[3]));
    sc[0] = sc[1] = 0.0f;
  } else {  // q4_0: low nibbles then high, per block
    cw[0] = r[1] & M4, cw[1] = (r[1] >> 4) & M4, cw[2] = r[3] & M4, cw[3] = (r[3] >> 4) & M4;
    sa[0] = k_f16_to_f32(static_cast<unsigned short>(r[0]));
    sa[1] = k_f16_to_f32(static_cast<unsigned short>(r[2]));
    sc[0] = -8.0f * sa[0], sc[1] = -8.0f * sa[1];
  }
}

// A chunk's 4 codes (bytes of cw) as bf16 pairs: codes 0, 1 and 2, 3.
template <int WT>
__device__ __forceinline__ void dq_mma_pairs(unsigned cw, unsigned& p01, unsigned& p23) {
  if (WT == DQ_Q8_0) {  // signed: 2^23 + (c + 128) less 2^23 + 128, exact in f32 and bf16
    const unsigned u = cw ^ 0x80808080u;
    float f[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[e] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650u | static_cast<unsigned>(e))) -
             8388736.0f;
    }
    p01 = dq_pack_bf16x2(f[0], f[1]);
    p23 = dq_pack_bf16x2(f[2], f[3]);
  } else {
    p01 = dq_bf16x2_less128(__byte_perm(cw, 0x43434343u, 0x4140u));
    p23 = dq_bf16x2_less128(__byte_perm(cw, 0x43434343u, 0x4342u));
  }
}

// 4 consecutive activations at x[off ..] (`valid` of them, the rest 0) as f32.
__device__ __forceinline__ void dq_x4(const float* x, k_i64 off, int valid, bool vec, float v[4]) {
  if (vec && valid == 4) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + off));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = e < valid ? x[off + e] : 0.0f;
}
template <typename T>
__device__ __forceinline__ void dq_x4(const T* x, k_i64 off, int valid, bool vec, float v[4]) {
  if (vec && valid == 4) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(x + off));
    const unsigned w[2] = {a.x, a.y};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const T h = {static_cast<unsigned short>(w[e >> 1] >> (16 * (e & 1)))};
      v[e] = k_load(&h, 0);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = e < valid ? k_load(x, off + e) : 0.0f;
}

template <int WT, int NT, typename T, int PF = DQ_MMA_PF>
__device__ void dequant_mma(const T* x, const k_u8* w, T* y, float* part, k_i64 M, k_i64 N,
                            k_i64 K, k_i64 row_bytes, int splits) {
  constexpr int MT = 8 * NT, NG = dq_mma_t<WT>::NG, CPG = 4 / NG, BE = dq_traits<WT>::elems;
  constexpr bool HILO = dq_hilo<T>::value, SX = dq_mma_t<WT>::SX;
  // x of a kstep in B fragment order: [n8 tile][chunk][lane] = {hi b0, hi b1,
  // lo b0, lo b1}; S_x per scale group and row of x.
  __shared__ uint4 xs[2][NT][4][32];
  __shared__ float sxs[2][NG][MT];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const k_i64 n0 = static_cast<k_i64>(blockIdx.x) * DQ_MMA_ROWS + 16 * warp;
  const k_i64 m0 = static_cast<k_i64>(blockIdx.y) * MT;
  const int nb = static_cast<int>(K / BE), steps = static_cast<int>((K + 63) / 64);
  const int z = blockIdx.z;
  const int s_begin = static_cast<int>(static_cast<k_i64>(steps) * z / splits);
  const int s_end = static_cast<int>(static_cast<k_i64>(steps) * (z + 1) / splits);
  const bool al16 = ((reinterpret_cast<k_u64>(w) | static_cast<k_u64>(row_bytes)) & 15u) == 0;
  const bool xvec = K % 4 == 0 && (reinterpret_cast<k_u64>(x) & (sizeof(T) == 4 ? 15u : 7u)) == 0;
  const k_u8* row0 = w + (n0 + g < N ? n0 + g : N - 1) * row_bytes;
  const k_u8* row1 = w + (n0 + g + 8 < N ? n0 + g + 8 : N - 1) * row_bytes;

  // Staging: unit u = tid + 128 i (i < NT) is row u / 16 of the tile, chunk
  // (u / 4) % 4, lane column u % 4: 4 activations.
  float xv[NT][4];
  auto stage_load = [&](int s) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int u = tid + 128 * i, m = u >> 4, j = (u >> 2) & 3, tt = u & 3;
      const k_i64 k = dq_mma_kbase<WT>(s) + dq_mma_xoff<WT>(j, tt);
      const k_i64 left = K - k;
      const int valid = m0 + m < M ? (left >= 4 ? 4 : (left > 0 ? static_cast<int>(left) : 0)) : 0;
      dq_x4(x, (m0 + m < M ? m0 + m : 0) * K + k, valid, xvec, xv[i]);
    }
  };
  auto stage_store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int u = tid + 128 * i, m = u >> 4, j = (u >> 2) & 3, tt = u & 3;
      const unsigned h01 = dq_pack_bf16x2(xv[i][0], xv[i][1]);
      const unsigned h23 = dq_pack_bf16x2(xv[i][2], xv[i][3]);
      float hf[4] = {__uint_as_float(h01 << 16), __uint_as_float(h01 & 0xffff0000u),
                     __uint_as_float(h23 << 16), __uint_as_float(h23 & 0xffff0000u)};
      unsigned l01 = 0, l23 = 0;
      float sum = (hf[0] + hf[1]) + (hf[2] + hf[3]);
      if (HILO) {
        l01 = dq_pack_bf16x2(xv[i][0] - hf[0], xv[i][1] - hf[1]);
        l23 = dq_pack_bf16x2(xv[i][2] - hf[2], xv[i][3] - hf[3]);
        sum = (hf[0] + __uint_as_float(l01 << 16)) + (hf[1] + __uint_as_float(l01 & 0xffff0000u)) +
              ((hf[2] + __uint_as_float(l23 << 16)) + (hf[3] + __uint_as_float(l23 & 0xffff0000u)));
      }
      xs[buf][m >> 3][j][(m & 7) * 4 + tt] = make_uint4(h01, h23, l01, l23);
      if (SX) {
        sum += dq_shfl_xor(sum, 1);
        sum += dq_shfl_xor(sum, 2);
        if (CPG == 2) sum += dq_shfl_xor(sum, 4);
        if (tt == 0 && j % CPG == 0) sxs[buf][j / CPG][m] = sum;
      }
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
  // The weights' raw words PF ksteps ahead: set a holds the even
  // ksteps of the share, set b the odd ones (where PF is 2), each
  // refilled right after it is decoded.
  unsigned ra0[8], ra1[8], rb0[8], rb1[8];
  if (s_begin < s_end) {
    stage_load(s_begin);
    stage_store(0);
    dq_mma_fetch<WT>(row0, s_begin, t, nb, al16, ra0);
    dq_mma_fetch<WT>(row1, s_begin, t, nb, al16, ra1);
  }
  if (PF == 2 && s_begin + 1 < s_end) {
    dq_mma_fetch<WT>(row0, s_begin + 1, t, nb, al16, rb0);
    dq_mma_fetch<WT>(row1, s_begin + 1, t, nb, al16, rb1);
  }
  __syncthreads();
  auto step = [&](int s, unsigned (&r0)[8], unsigned (&r1)[8]) {
    const int buf = (s - s_begin) & 1;
    unsigned cw0[4], cw1[4];
    float sa0[4], sc0[4], sa1[4], sc1[4];
    dq_mma_decode<WT>(r0, s, cw0, sa0, sc0);
    dq_mma_decode<WT>(r1, s, cw1, sa1, sc1);
    if (s + PF < s_end) {
      dq_mma_fetch<WT>(row0, s + PF, t, nb, al16, r0);
      dq_mma_fetch<WT>(row1, s + PF, t, nb, al16, r1);
    }
    const bool more = s + 1 < s_end;
    if (more) stage_load(s + 1);
    unsigned af[4][4];  // A fragments: rows g, g + 8; codes 0, 1 then 2, 3
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      dq_mma_pairs<WT>(cw0[j], af[j][0], af[j][2]);
      dq_mma_pairs<WT>(cw1[j], af[j][1], af[j][3]);
    }
#pragma unroll
    for (int gr = 0; gr < NG; ++gr) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int jj = 0; jj < CPG; ++jj) {
          const uint4 b = xs[buf][nt][gr * CPG + jj][lane];
          dq_mma(c, af[gr * CPG + jj], b.x, b.y);
          if (HILO) dq_mma(c, af[gr * CPG + jj], b.z, b.w);
        }
        float sx0 = 0.0f, sx1 = 0.0f;
        if (SX) sx0 = sxs[buf][gr][8 * nt + 2 * t], sx1 = sxs[buf][gr][8 * nt + 2 * t + 1];
        // c: D[g][2t], D[g][2t + 1], D[g + 8][2t], D[g + 8][2t + 1].
        acc[nt][0] += fmaf(sa0[gr], c[0], sc0[gr] * sx0);
        acc[nt][1] += fmaf(sa0[gr], c[1], sc0[gr] * sx1);
        acc[nt][2] += fmaf(sa1[gr], c[2], sc1[gr] * sx0);
        acc[nt][3] += fmaf(sa1[gr], c[3], sc1[gr] * sx1);
      }
    }
    if (more) stage_store(buf ^ 1);
    __syncthreads();
  };
  if (PF == 2) {
    for (int s = s_begin; s < s_end; s += 2) {
      step(s, ra0, ra1);
      if (s + 1 < s_end) step(s + 1, rb0, rb1);
    }
  } else {
    for (int s = s_begin; s < s_end; ++s) step(s, ra0, ra1);
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const k_i64 n = n0 + g + 8 * (e >> 1), m = m0 + 8 * nt + 2 * t + (e & 1);
      if (n < N && m < M) {
        if (splits == 1) {
          k_store(y, m * N + n, acc[nt][e]);
        } else {
          part[(static_cast<k_i64>(z) * M + m) * N + n] = acc[nt][e];
        }
      }
    }
  }
}
#endif  // DQ_HOST || __CUDA_ARCH__ >= 800

// The split-K partials [splits, M, N] summed into y.
template <typename T>
__device__ void dequant_mma_reduce(const float* part, T* y, k_i64 MN, int splits) {
  for (k_i64 i = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < MN;
       i += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int z = 0; z < splits; ++z) s += part[z * MN + i];
    k_store(y, i, s);
  }
}

// The weight [N, K] (`row_bytes` per row) decoded into T [N, K] (f16 or
// bf16, rounded to nearest even): the workspace a cuBLASLt GEMM reads for
// long batches (kernels_dequant_matmul.cc's lt path). A thread per 32-element
// quant group, its 64 bytes written as four 16-byte stores (K is whole
// blocks, so every group starts 64-byte aligned in `out`).
template <int WT, typename T>
__device__ void dequant_to(const k_u8* w, T* out, k_i64 N, k_i64 K, k_i64 row_bytes) {
  constexpr int BE = dq_traits<WT>::elems, BB = dq_traits<WT>::bytes, GPB = BE / 32;
  const k_i64 per_row = K / 32, groups = N * per_row;
  for (k_i64 i = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 n = i / per_row, g = i % per_row;
    float v[32];
    dq_group<WT>(w + n * row_bytes + (g / GPB) * BB, static_cast<int>(g % GPB), v);
    T h[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) k_store(h, e, v[e]);
    uint4* o = reinterpret_cast<uint4*>(out + n * K + 32 * g);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      unsigned u[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        u[e] = static_cast<unsigned>(h[8 * q + 2 * e].bits) |
               (static_cast<unsigned>(h[8 * q + 2 * e + 1].bits) << 16);
      }
      o[q] = make_uint4(u[0], u[1], u[2], u[3]);
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

// kiln_dequant_matvec_m<MR>_<w>_<x>: DQ_MV_WARPS * 32 threads, a block per
// DQ_MV_R weight rows; M rows of x MR at a time (the host picks the least
// MR >= M of 1, 4 and 8, or 8).
#define KILN_DEQUANT_MV(WN, WT, S, T, MR)                                                        \
  extern "C" __global__ void __launch_bounds__(DQ_MV_WARPS * 32)                                 \
      kiln_dequant_matvec_m##MR##_##WN##_##S(const T* x, const k_u8* w, T* y, k_i64 M, k_i64 N,  \
                                            k_i64 K, k_i64 row_bytes) {                          \
    dequant_matvec<WT, MR, T>(x, w, y, M, N, K, row_bytes);                                      \
  }
// kiln_dequant_matvec_r<R>_m<MR>_<w>_<x>: the same kernel with R weight rows
// per block (4 or 8: the x runs a lane loads serve R rows, fewer blocks).
// A module of its own per instance, as the tensor-core variants below: the
// host defines DQ_MMA_ONLY and appends `KILN_DEQUANT_MVR(q4_k, DQ_Q4_K, f32,
// float, 1, 4)`.
#define KILN_DEQUANT_MVR(WN, WT, S, T, MR, R)                                                    \
  extern "C" __global__ void __launch_bounds__(DQ_MV_WARPS * 32)                                 \
      kiln_dequant_matvec_r##R##_m##MR##_##WN##_##S(const T* x, const k_u8* w, T* y, k_i64 M,    \
                                                    k_i64 N, k_i64 K, k_i64 row_bytes) {         \
    dequant_matvec<WT, MR, T, R>(x, w, y, M, N, K, row_bytes);                                   \
  }
// kiln_dequant_to_<w>_<x>: dequant_to over a grid-stride grid; a module of
// its own per (w, x) (DQ_MMA_ONLY and `KILN_DEQUANT_TO(q4_k, DQ_Q4_K, bf16,
// k_bf16)` appended).
#define KILN_DEQUANT_TO(WN, WT, S, T)                                                            \
  extern "C" __global__ void kiln_dequant_to_##WN##_##S(const k_u8* w, T* out, k_i64 N, k_i64 K, \
                                                        k_i64 row_bytes) {                       \
    dequant_to<WT, T>(w, out, N, K, row_bytes);                                                  \
  }
// kiln_dequant_mma_n<NT>_<w>_<x>: DQ_MMA_WARPS * 32 threads; grid
// (N / DQ_MMA_ROWS, M / (8 NT), splits), rounded up. Empty below sm_80 (the
// host never picks it there). Each variant is a module of its own: the host
// defines DQ_MMA_ONLY before this source (leaving out the matvec and tiled
// entry points, one module of their own) and appends
// `KILN_DEQUANT_MMA(q4_k, DQ_Q4_K, f32, float, 8)` and
// `KILN_DEQUANT_MMA_REDUCE(f32, float)`: NVRTC would compile all 45 slowly.
#if __CUDA_ARCH__ >= 800 || defined(DQ_HOST)
#define DQ_MMA_BODY(WT, NT, T) dequant_mma<WT, NT, T>(x, w, y, part, M, N, K, row_bytes, splits);
#else
#define DQ_MMA_BODY(WT, NT, T)
#endif
#define KILN_DEQUANT_MMA(WN, WT, S, T, NT)                                                       \
  extern "C" __global__ void __launch_bounds__(DQ_MMA_WARPS * 32)                                \
      kiln_dequant_mma_n##NT##_##WN##_##S(const T* x, const k_u8* w, T* y, float* part, k_i64 M, \
                                          k_i64 N, k_i64 K, k_i64 row_bytes, int splits) {       \
    DQ_MMA_BODY(WT, NT, T)                                                                       \
  }
#define KILN_DEQUANT(WN, WT, S, T)                                                               \
  KILN_DEQUANT_MV(WN, WT, S, T, 1)                                                             \
  KILN_DEQUANT_MV(WN, WT, S, T, 4)                                                             \
  KILN_DEQUANT_MV(WN, WT, S, T, 8)                                                             \
  extern "C" __global__ void __launch_bounds__(DQ_THREADS) kiln_dequant_matmul_##WN##_##S(     \
      const T* x, const k_u8* w, T* y, k_i64 M, k_i64 N, k_i64 K, k_i64 row_bytes,             \
      int trans_b) {                                                                           \
    dequant_matmul<WT, T>(x, w, y, M, N, K, row_bytes, trans_b);                               \
  }
#define KILN_DEQUANT_ALL(WN, WT) \
  KILN_DEQUANT(WN, WT, f32, float) \
  KILN_DEQUANT(WN, WT, f16, k_f16) \
  KILN_DEQUANT(WN, WT, bf16, k_bf16)
// A tensor-core variant's module (DQ_MMA_ONLY) holds that variant alone.
#ifndef DQ_MMA_ONLY
KILN_DEQUANT_ALL(q8_0, DQ_Q8_0)
KILN_DEQUANT_ALL(q4_0, DQ_Q4_0)
KILN_DEQUANT_ALL(q4_k, DQ_Q4_K)
KILN_DEQUANT_ALL(q5_k, DQ_Q5_K)
KILN_DEQUANT_ALL(q6_k, DQ_Q6_K)
#endif
#define KILN_DEQUANT_MMA_REDUCE(S, T)                                                            \
  extern "C" __global__ void kiln_dequant_mma_reduce_##S(const float* part, T* y, k_i64 MN,      \
                                                         int splits) {                          \
    dequant_mma_reduce<T>(part, y, MN, splits);                                                  \
  }
