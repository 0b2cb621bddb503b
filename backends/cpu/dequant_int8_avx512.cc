// AVX-512 VNNI dot products of GGUF weight rows with int8 activations
// (dequant_dot.h, "Int8 activations"). Compiled with -mavx512f/bw/dq/vl and
// -mavx512vnni (CMakeLists.txt); runs only where dq::BestInt8() found them.
//
// vpdpbusd multiplies unsigned bytes by signed bytes and adds each 4 products
// into an int32 lane. The weights are the unsigned side: q4_0 / q4_k / q5_k /
// q6_k quants are unsigned before their offset, and q8_0's signed quants become
// unsigned by flipping the sign bit (w + 128). The offsets (8, 32, 128) times
// the sums of each 4 activations are precomputed per call (Int8Rows.offsets)
// and start the accumulation, so each lane ends as the exact sum of 4 products
// of the signed weights. 64 weights per instruction: their int32 lanes are
// converted once and multiplied by a vector holding each lane's scale (weight
// scale x activation scale), so the per-weight work is integer.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"

namespace kiln::cpu::dq {
namespace {

constexpr int64_t kPrefetchBytes = 2048;

inline float Half(const uint8_t* p) {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
}
inline __m512i Load64(const void* p) { return _mm512_loadu_si512(p); }
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }

// The 16-lane index that repeats lane a eight times, then lane b.
inline __m512i Pick2(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

inline float Sum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// The eight 6-bit scales and mins of a q4_k / q5_k block (quant::ScaleMinK4),
// unpacked together from its 12 bytes as in dequant_dot_avx512.cc, times d and dmin.
inline void ScalesMins(const uint8_t* blk, __m256* sc, __m256* mn) {
  uint32_t w[3];
  std::memcpy(w, blk + 4, 12);
  const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
  const uint64_t s =
      (w[0] & six) | static_cast<uint64_t>((w[2] & nib) | (((w[0] >> 6) & two) << 4)) << 32;
  const uint64_t m =
      (w[1] & six) | static_cast<uint64_t>(((w[2] >> 4) & nib) | (((w[1] >> 6) & two) << 4)) << 32;
  *sc = _mm256_mul_ps(_mm256_set1_ps(Half(blk)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                     _mm_cvtsi64_si128(static_cast<int64_t>(s)))));
  *mn = _mm256_mul_ps(_mm256_set1_ps(Half(blk + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                         _mm_cvtsi64_si128(static_cast<int64_t>(m)))));
}

// q4_k (kFive = false) and q5_k. The activations are `paired` (sub-blocks
// 0 2 1 3 4 6 5 7): the low nibbles of qs[0, 64) are sub-blocks 0 and 2, the
// high ones 1 and 3, and likewise 4 6 / 5 7 for qs[64, 128). The mins leave the
// per-weight work: sum (d sc q - dmin m) x^ = d sc sum q x^ - dmin m sum x^,
// with sum x^ per 32 precomputed (Int8Rows.sums).
template <bool kFive>
float DotK4(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx, const float* sums) {
  constexpr int64_t kBytes = kFive ? 176 : 144;
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  __m256 mins = _mm256_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i pick[4] = {Pick2(0, 2), Pick2(1, 3), Pick2(4, 6), Pick2(5, 7)};
  // q5_k: the fifth bit of the low nibbles of qs[32p + l] is bit 2p of qh[l],
  // of the high nibbles bit 2p + 1; per vector, one bit per 32-byte half.
  const __m512i bit[4] = {
      _mm512_inserti64x4(_mm512_set1_epi8(0x01), _mm256_set1_epi8(0x04), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x02), _mm256_set1_epi8(0x08), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x10), _mm256_set1_epi8(0x40), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x20), _mm256_set1_epi8(static_cast<char>(0x80)), 1)};
  const __m512i sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 128), _MM_HINT_T0);
    __m256 sc, mn;
    ScalesMins(blk, &sc, &mn);
    mins = _mm256_fmadd_ps(mn, Load8(sums + 8 * b), mins);
    const __m512 scale = _mm512_castps256_ps512(_mm256_mul_ps(sc, Load8(dx + 8 * b)));
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m512i v0 = Load64(qs), v1 = Load64(qs + 64);
    __m512i u[4] = {_mm512_and_si512(v0, low4), _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4),
                    _mm512_and_si512(v1, low4), _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4)};
    if constexpr (kFive) {
      const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
      for (int i = 0; i < 4; ++i) {
        u[i] = _mm512_mask_add_epi8(u[i], _mm512_test_epi8_mask(h, bit[i]), u[i], sixteen);
      }
    }
    const int8_t* xb = q + 256 * b;
    for (int i = 0; i < 4; ++i) {
      const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[i], Load64(xb + 64 * i));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pick[i], scale), acc[i]);
    }
  }
  const __m512 all = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  return _mm512_reduce_add_ps(all) - Sum8(mins);
}

// q6_k: per half of 128, 64 bytes of ql give elements [0, 64) (low nibbles,
// with qh bits 0-1 for the first 32 and 2-3 for the next) and [64, 128) (high
// nibbles, bits 4-5 and 6-7): natural order. A scale per 16 weights (4 lanes).
float DotQ6K(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx,
             const int32_t* offsets) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  const __m512i low4 = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30);
  // Lane l of vector i has the scale of group 4i + l / 4; dx per 32 is dx[g / 2].
  const __m512i pick[4] = {
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
      _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
      _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
      _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 210;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 128), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 192), _MM_HINT_T0);
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192))));
    const __m512 dxe = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(Load8(dx + 8 * b)));
    const __m512 scale = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(Half(blk + 208)), sc), dxe);
    const int8_t* xb = q + 256 * b;
    const int32_t* cb = offsets + 64 * b;
    for (int h = 0; h < 2; ++h) {
      const __m512i l = Load64(blk + 64 * h);
      const __m256i hr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m512i hs = _mm512_inserti64x4(_mm512_castsi256_si512(hr), _mm256_srli_epi16(hr, 2), 1);
      const __m512i u0 = _mm512_or_si512(_mm512_and_si512(l, low4),
                                         _mm512_and_si512(_mm512_slli_epi16(hs, 4), top2));
      const __m512i u1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                         _mm512_and_si512(hs, top2));
      const __m512i s0 = _mm512_dpbusd_epi32(Load64(cb + 32 * h), u0, Load64(xb + 128 * h));
      const __m512i s1 = _mm512_dpbusd_epi32(Load64(cb + 32 * h + 16), u1, Load64(xb + 128 * h + 64));
      acc[2 * h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0),
                                   _mm512_permutexvar_ps(pick[2 * h], scale), acc[2 * h]);
      acc[2 * h + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1),
                                       _mm512_permutexvar_ps(pick[2 * h + 1], scale), acc[2 * h + 1]);
    }
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// q8_0 and q4_0, two 32-blocks per vector; an odd last block in scalar code
// (the same exact integer sum).
float DotQ8_0(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx,
              const int32_t* offsets) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    const uint8_t* blk = row + b * 34;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 36)), 1);
    const __m512i s =
        _mm512_dpbusd_epi32(Load64(offsets + 8 * b), _mm512_xor_si512(w, flip), Load64(q + 32 * b));
    const __m512 scale = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(Half(blk) * dx[b])),
                                            _mm256_set1_ps(Half(blk + 34) * dx[b + 1]), 1);
    if ((b & 2) == 0) {
      acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc0);
    } else {
      acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc1);
    }
  }
  float tail = 0;
  if (b < blocks) {
    const uint8_t* blk = row + b * 34;
    const int8_t* w = reinterpret_cast<const int8_t*>(blk + 2);
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += w[i] * q[32 * b + i];
    tail = Half(blk) * dx[b] * static_cast<float>(s);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail;
}

// q4_0: the activations are `paired`: blocks b, b + 1 as b[0:16) b+1[0:16)
// b[16:32) b+1[16:32), which is the low nibbles of both blocks' 16 bytes, then
// the high ones. Lanes 0-3 and 8-11 are block b, 4-7 and 12-15 block b + 1.
float DotQ4_0(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx,
              const int32_t* offsets) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) {
    const uint8_t* blk = row + b * 18;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    const __m256i v =
        _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(blk + 20), reinterpret_cast<const __m128i*>(blk + 2));
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low4)),
                                         _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), 1);
    const __m512i s = _mm512_dpbusd_epi32(Load64(offsets + 8 * b), u, Load64(q + 32 * b));
    const __m256 half = _mm256_set_m128(_mm_set1_ps(Half(blk + 18) * dx[b + 1]), _mm_set1_ps(Half(blk) * dx[b]));
    const __m512 scale = _mm512_broadcast_f32x8(half);
    if ((b & 2) == 0) {
      acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc0);
    } else {
      acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc1);
    }
  }
  float tail = 0;
  if (b < blocks) {
    const uint8_t* blk = row + b * 18;
    int32_t s = 0;
    for (int i = 0; i < 16; ++i) {
      s += ((blk[2 + i] & 15) - 8) * q[32 * b + i] + ((blk[2 + i] >> 4) - 8) * q[32 * b + 16 + i];
    }
    tail = Half(blk) * dx[b] * static_cast<float>(s);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail;
}

}  // namespace

void DotRowsInt8Avx512(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                       const Int8Rows& xq, float* y, int64_t ldy) {
  const int64_t k = xq.k, nb = k / kInt8Block;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    for (int r = 0; r < xq.rows; ++r) {
      const int8_t* q = xq.q.data() + r * k;
      const float* dx = xq.d.data() + r * nb;
      float v = 0;
      switch (xq.wtype) {
        case v1::DTYPE_Q8_0:
          v = DotQ8_0(row, k / 32, q, dx, xq.offsets.data() + r * (k / 4));
          break;
        case v1::DTYPE_Q4_0:
          v = DotQ4_0(row, k / 32, q, dx, xq.offsets.data() + r * (k / 4));
          break;
        case v1::DTYPE_Q4_K:
          v = DotK4<false>(row, k / 256, q, dx, xq.sums.data() + r * nb);
          break;
        case v1::DTYPE_Q5_K:
          v = DotK4<true>(row, k / 256, q, dx, xq.sums.data() + r * nb);
          break;
        case v1::DTYPE_Q6_K:
          v = DotQ6K(row, k / 256, q, dx, xq.offsets.data() + r * (k / 4));
          break;
        default:
          break;  // REQUIRES: a block type
      }
      y[r * ldy + n] = v;
    }
  }
}

}  // namespace kiln::cpu::dq
