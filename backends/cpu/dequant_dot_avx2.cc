// AVX2 + FMA + F16C matvec of the GGUF block types (layouts in
// backends/common/quant_blocks.h): one activation row times a range of
// weight rows, each block decoded in registers (never written anywhere) and
// streamed once. The CPU backend is compiled for x86-64-v3 (CMakeLists.txt's
// KILN_CPU_ARCH), so every machine it runs on has these instructions; dq::Best()
// picks this where AVX-512 is absent (Zen 3 and older, most client CPUs).
// Several activation rows go to the portable loop (dequant_dot.cc).
//
// The k-quants (q4_k, q5_k) are written so the decode costs what a read of the
// bytes costs, not more (it was about half the read rate when each block was
// decoded to f32 first):
// - the eight 6-bit scales and mins of a super-block are unpacked together
//   from their 12 bytes with a few word operations, then widened and scaled
//   as one vector each (not eight scalar unpacks);
// - the min term needs no per-weight work: sum_i (d sc_j q_i - dmin m_j) x_i
//   = d sc_j (sum_i q_i x_i) - dmin m_j (sum_i x_i), and the sums of x over
//   each 32-element sub-block are computed once per call for all the rows
//   (SubBlockSums), so a super-block's mins are one multiply-add of 8 lanes;
// - the 32 bytes of two sub-blocks are read once: the low nibbles are one
//   sub-block, the high nibbles the next, each converted and multiplied into
//   its own partial sum, which its scale then multiplies once (not once per
//   weight);
// - the weights are prefetched kPrefetchBytes ahead, like the AVX-512 loops.
// Accumulation is in f32 throughout; the products d * sc and dmin * m are exact
// in f32 (an f16 times a 6-bit integer), so the result differs from decoding
// first only in the order of the f32 additions.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"

namespace kiln::cpu::dq {
namespace {

constexpr int64_t kPrefetchBytes = 2048;

inline float Half(const uint8_t* p) {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
}
inline __m256i U8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i I8x8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void Prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
}

// xs[j] = sum of x[32 j, 32 j + 32) for j < k / 32.
void SubBlockSums(const float* x, int64_t k, float* xs) {
  for (int64_t j = 0; j < k / 32; ++j) {
    const float* p = x + 32 * j;
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)),
                                   _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
    xs[j] = Sum(s);
  }
}

// The eight 6-bit scales (times d) and mins (times dmin) of a q4_k / q5_k
// super-block, as in quant::ScaleMinK4, from its 12 bytes read as three
// little-endian words w0 w1 w2: sc[0..3] = w0 & 63 and m[0..3] = w1 & 63 (per
// byte); sc[4..7] = the low nibbles of w2 with the top two bits of w0 above
// them, m[4..7] = the high nibbles of w2 with the top two bits of w1.
inline void ScalesMins(const uint8_t* b, __m256* scales, __m256* mins) {
  uint32_t w[3];
  std::memcpy(w, b + 4, 12);
  const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
  const uint64_t sc =
      (w[0] & six) | static_cast<uint64_t>((w[2] & nib) | (((w[0] >> 6) & two) << 4)) << 32;
  const uint64_t mn =
      (w[1] & six) | static_cast<uint64_t>(((w[2] >> 4) & nib) | (((w[1] >> 6) & two) << 4)) << 32;
  const __m256 scf =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
  const __m256 mnf =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
  *scales = _mm256_mul_ps(_mm256_set1_ps(Half(b)), scf);
  *mins = _mm256_mul_ps(_mm256_set1_ps(Half(b + 2)), mnf);
}

// q4_k (kHigh = false) and q5_k (kHigh = true): one weight row's dot product
// with x, xs its sub-block sums.
template <bool kHigh>
float DotK4Or5(const uint8_t* row, int64_t blocks, const float* x, const float* xs) {
  constexpr int64_t kBytes = kHigh ? 176 : 144;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 mins_acc = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi32(15);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * kBytes;
    Prefetch(blk);
    if constexpr (kBytes > 64) Prefetch(blk + 64);
    if constexpr (kBytes > 128) Prefetch(blk + 128);
    __m256 scales, mins;
    ScalesMins(blk, &scales, &mins);
    mins_acc = _mm256_fmadd_ps(mins, _mm256_loadu_ps(xs + 8 * b), mins_acc);
    alignas(32) float sc[8];
    _mm256_store_ps(sc, scales);
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + (kHigh ? 48 : 16);
    const float* xb = x + 256 * b;
    for (int p = 0; p < 4; ++p) {
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = U8x8(qs + 32 * p + 8 * c);
        __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_srli_epi32(v, 4);
        if constexpr (kHigh) {
          // Bit 2p (low nibble) and 2p + 1 (high nibble) of qh[l] are the
          // quant's fifth bit (+16).
          const __m256i h = U8x8(qh + 8 * c), one = _mm256_set1_epi32(1);
          const __m256i b0 = _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * p)), one);
          const __m256i b1 = _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * p + 1)), one);
          lo = _mm256_or_si256(lo, _mm256_slli_epi32(b0, 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi32(b1, 4));
        }
        s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_loadu_ps(xb + 64 * p + 8 * c), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_loadu_ps(xb + 64 * p + 32 + 8 * c), s1);
      }
      acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + 2 * p), s0, acc0);
      acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + 2 * p + 1), s1, acc1);
    }
  }
  return Sum(_mm256_add_ps(acc0, acc1)) - Sum(mins_acc);
}

// q8_0: x = d * q; two blocks per step into two accumulators.
float DotQ8_0(const uint8_t* row, int64_t blocks, const float* x) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 34;
    Prefetch(blk);
    const float* xb = x + 32 * b;
    __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(I8x8(blk + 2)), _mm256_loadu_ps(xb));
    __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(I8x8(blk + 10)), _mm256_loadu_ps(xb + 8));
    s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I8x8(blk + 18)), _mm256_loadu_ps(xb + 16), s0);
    s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I8x8(blk + 26)), _mm256_loadu_ps(xb + 24), s1);
    acc[b & 1] = _mm256_fmadd_ps(_mm256_set1_ps(Half(blk)), _mm256_add_ps(s0, s1), acc[b & 1]);
  }
  return Sum(_mm256_add_ps(acc[0], acc[1]));
}

// q4_0: x = d * (q - 8), q the low nibble of qs[i] (element i) or the high
// nibble (element i + 16).
float DotQ4_0(const uint8_t* row, int64_t blocks, const float* x) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m256i low4 = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 18;
    Prefetch(blk);
    const float* xb = x + 32 * b;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (int c = 0; c < 2; ++c) {
      const __m256i v = U8x8(blk + 2 + 8 * c);
      const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(v, low4), eight);
      const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight);
      s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_loadu_ps(xb + 8 * c), s0);
      s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_loadu_ps(xb + 16 + 8 * c), s1);
    }
    acc[b & 1] = _mm256_fmadd_ps(_mm256_set1_ps(Half(blk)), _mm256_add_ps(s0, s1), acc[b & 1]);
  }
  return Sum(_mm256_add_ps(acc[0], acc[1]));
}

// q6_k: element e of a block is d * scales[e / 16] * (q - 32). Per half h and
// l < 32: the quants of elements l, l+32, l+64, l+96 are the low nibble of
// ql[64h+l], of ql[64h+l+32], the high nibble of ql[64h+l], of ql[64h+l+32],
// with bits 0-1, 2-3, 4-5, 6-7 of qh[32h+l] above them. Each 16 elements share
// a scale: each group of 16 is summed alone and scaled once.
float DotQ6_K(const uint8_t* row, int64_t blocks, const float* x) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3),
                thirty_two = _mm256_set1_epi32(32);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 210;
    Prefetch(blk);
    Prefetch(blk + 64);
    Prefetch(blk + 128);
    Prefetch(blk + 192);
    const float d = Half(blk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    // The 16 scales times d, for broadcasts.
    alignas(32) float scale[16];
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc));
    _mm256_store_ps(scale, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8))));
    _mm256_store_ps(scale + 8, _mm256_mul_ps(_mm256_set1_ps(d),
                                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8)))));
    const float* xb = x + 256 * b;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + 64 * h;
      const uint8_t* qh = blk + 128 + 32 * h;
      // Elements 128h + 16g + [0, 16) for g < 8: group g = 2j + i covers l in
      // [16i, 16i + 16) of quarter j (j = 0..3: +0, +32, +64, +96).
      for (int i = 0; i < 2; ++i) {
        __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int c = 0; c < 2; ++c) {
          const int l = 16 * i + 8 * c;
          const __m256i a = U8x8(ql + l), a2 = U8x8(ql + 32 + l), hb = U8x8(qh + l);
          const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(hb, m2), 4));
          const __m256i q2 = _mm256_or_si256(_mm256_and_si256(a2, m4),
                                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2), m2), 4));
          const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 4), m2), 4));
          const __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(a2, 4), _mm256_slli_epi32(_mm256_srli_epi32(hb, 6), 4));
          const float* xl = xb + 128 * h + l;
          s[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q1, thirty_two)), _mm256_loadu_ps(xl), s[0]);
          s[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q2, thirty_two)), _mm256_loadu_ps(xl + 32), s[1]);
          s[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q3, thirty_two)), _mm256_loadu_ps(xl + 64), s[2]);
          s[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q4, thirty_two)), _mm256_loadu_ps(xl + 96), s[3]);
        }
        // Group of quarter j is scale index (128h + 32j + 16i) / 16 = 8h + 2j + i.
        acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 8 * h + i), s[0], acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 8 * h + 2 + i), s[1], acc1);
        acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 8 * h + 4 + i), s[2], acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 8 * h + 6 + i), s[3], acc1);
      }
    }
  }
  return Sum(_mm256_add_ps(acc0, acc1));
}

}  // namespace

void DotRowsAvx2(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k,
                 const float* x, int64_t ldx, int rows, float* y, int64_t ldy) {
  if (rows != 1) return Generic().dot_rows(dtype, w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
  switch (dtype) {
    case v1::DTYPE_Q4_K:
    case v1::DTYPE_Q5_K: {
      // The sub-block sums of x, once for every row of the range.
      thread_local std::vector<float> xs;
      if (static_cast<int64_t>(xs.size()) < k / 32 + 8) xs.resize(k / 32 + 8);
      SubBlockSums(x, k, xs.data());
      const int64_t blocks = k / quant::kQK;
      for (int64_t n = n0; n < n1; ++n) {
        y[n] = dtype == v1::DTYPE_Q4_K ? DotK4Or5<false>(w + n * row_bytes, blocks, x, xs.data())
                                       : DotK4Or5<true>(w + n * row_bytes, blocks, x, xs.data());
      }
      return;
    }
    case v1::DTYPE_Q6_K:
      for (int64_t n = n0; n < n1; ++n) y[n] = DotQ6_K(w + n * row_bytes, k / quant::kQK, x);
      return;
    case v1::DTYPE_Q8_0:
      for (int64_t n = n0; n < n1; ++n) y[n] = DotQ8_0(w + n * row_bytes, k / 32, x);
      return;
    case v1::DTYPE_Q4_0:
      for (int64_t n = n0; n < n1; ++n) y[n] = DotQ4_0(w + n * row_bytes, k / 32, x);
      return;
    default:
      return Generic().dot_rows(dtype, w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
  }
}

}  // namespace kiln::cpu::dq
