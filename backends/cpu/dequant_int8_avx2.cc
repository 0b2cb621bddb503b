// AVX2 dot products of GGUF weight rows with int8 activations (dequant_dot.h,
// "Int8 activations"), for CPUs without AVX-512 VNNI; the backend's baseline
// ISA (AVX2, FMA, F16C), natural-order activations.
//
// vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16
// lanes, saturating: the unsigned side is the weights (q4_0 / q4_k / q5_k /
// q6_k quants before their offset, at most 63, so a pair stays below 2^15),
// and q8_0 takes |w| with w's sign moved onto the activation (as llama.cpp
// does: |w| <= 128, |q| <= 127, a pair at most 32512). vpmaddwd by ones then
// sums each 4 products into an int32 lane; the offsets (8, 32) come from the
// precomputed sums of each 4 activations (Int8Rows.offsets).
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
inline __m256i Load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Eight int32 lanes, each the sum of 4 products u * x (u unsigned).
inline __m256i Dot4(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

inline float Sum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

float DotQ8_0(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + 34 * b;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    const __m256i w = Load32(blk + 2), x = Load32(q + 32 * b);
    const __m256i s = Dot4(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    const __m256 scale = _mm256_set1_ps(Half(blk) * dx[b]);
    if (b & 1) {
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc1);
    } else {
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc0);
    }
  }
  return Sum8(_mm256_add_ps(acc0, acc1));
}

float DotQ4_0(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx,
              const int32_t* offsets) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + 18 * b;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4);
    const __m256i s = _mm256_add_epi32(Dot4(u, Load32(q + 32 * b)), Load32(offsets + 8 * b));
    const __m256 scale = _mm256_set1_ps(Half(blk) * dx[b]);
    if (b & 1) {
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc1);
    } else {
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc0);
    }
  }
  return Sum8(_mm256_add_ps(acc0, acc1));
}

template <bool kFive>
float DotK4(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx, const float* sums) {
  constexpr int64_t kBytes = kFive ? 176 : 144;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 128), _MM_HINT_T0);
    // The eight 6-bit scales and mins as in dequant_dot_avx512.cc.
    uint32_t w[3];
    std::memcpy(w, blk + 4, 12);
    const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
    const uint64_t sc =
        (w[0] & six) | static_cast<uint64_t>((w[2] & nib) | (((w[0] >> 6) & two) << 4)) << 32;
    const uint64_t mn =
        (w[1] & six) | static_cast<uint64_t>(((w[2] >> 4) & nib) | (((w[1] >> 6) & two) << 4)) << 32;
    const __m256 scf = _mm256_mul_ps(
        _mm256_set1_ps(Half(blk)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc)))));
    const __m256 mnf = _mm256_mul_ps(
        _mm256_set1_ps(Half(blk + 2)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn)))));
    mins = _mm256_fmadd_ps(mnf, _mm256_loadu_ps(sums + 8 * b), mins);
    alignas(32) float scale[8];
    _mm256_store_ps(scale, _mm256_mul_ps(scf, _mm256_loadu_ps(dx + 8 * b)));
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    __m256i h = _mm256_setzero_si256();
    if constexpr (kFive) h = Load32(blk + 16);
    const int8_t* xb = q + 256 * b;
    for (int p = 0; p < 4; ++p) {
      const __m256i v = Load32(qs + 32 * p);
      __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      if constexpr (kFive) {
        // Bit 2p of qh[l] over the low nibble, bit 2p + 1 over the high one.
        const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * p)), one);
        const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * p + 1)), one);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
      }
      const __m256i s0 = Dot4(lo, Load32(xb + 64 * p)), s1 = Dot4(hi, Load32(xb + 64 * p + 32));
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(scale[2 * p]), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(scale[2 * p + 1]), acc1);
    }
  }
  return Sum8(_mm256_add_ps(acc0, acc1)) - Sum8(mins);
}

float DotQ6K(const uint8_t* row, int64_t blocks, const int8_t* q, const float* dx,
             const int32_t* offsets) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 210;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 128), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 192), _MM_HINT_T0);
    const float d = Half(blk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const int8_t* xb = q + 256 * b;
    const int32_t* cb = offsets + 64 * b;
    const float* db = dx + 8 * b;
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = Load32(blk + 64 * h), l1 = Load32(blk + 64 * h + 32);
      const __m256i hh = Load32(blk + 128 + 32 * h);
      // Elements 128h + 32i + l, i = 0..3 (quant_blocks.h's q6_k layout).
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(hh, three), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2), three), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 4), three), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 6), three), 4))};
      for (int i = 0; i < 4; ++i) {
        const int e = 128 * h + 32 * i;  // 32 elements: groups e / 16 and e / 16 + 1
        const __m256i s = _mm256_add_epi32(Dot4(u[i], Load32(xb + e)), Load32(cb + e / 4));
        const float dd = d * db[e / 32];
        const __m256 scale = _mm256_set_m128(_mm_set1_ps(dd * static_cast<float>(sc[e / 16 + 1])),
                                             _mm_set1_ps(dd * static_cast<float>(sc[e / 16])));
        if (i & 1) {
          acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc1);
        } else {
          acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc0);
        }
      }
    }
  }
  return Sum8(_mm256_add_ps(acc0, acc1));
}

}  // namespace

void DotRowsInt8Avx2(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
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
          v = DotQ8_0(row, k / 32, q, dx);
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
