// AVX-512 forms of the attention kernel's row steps (attention_rows.h): 16
// lanes a vector and one masked tail, so a row of 128 logits is 8 vectors.
// Compiled with -mavx512f/bw/dq/vl (CMakeLists.txt); called only where
// BestSmallMatMulIsa() found those on the CPU. GCC 12's own intrinsics
// (_mm512_reduce_*, undefined-vector fills) trip its uninitialized warnings.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/cpu/attention_rows.h"

namespace kiln::cpu {
namespace {

inline __m512 Set16(float v) { return _mm512_set1_ps(v); }

// exp(x) for 16 floats: Cody-Waite reduction and the Cephes expf polynomial
// (kernels_attention.cc's Exp8 on 16 lanes), 2^n by scalef. Arguments below
// -87 give exactly 0 (no denormal results); NaN stays NaN.
inline __m512 Exp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, Set16(-87.0f), _CMP_LT_OQ);
  x = _mm512_min_ps(Set16(88.0f), _mm512_max_ps(Set16(-87.0f), x));  // operand order keeps NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, Set16(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, Set16(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, Set16(-2.12194440e-4f), r);
  __m512 p = Set16(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, Set16(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, Set16(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, Set16(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, Set16(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, Set16(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, Set16(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

inline __mmask16 Tail(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// Transposes 16 rows of 16 floats in registers.
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
      t[8 * h + 4 + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0xDD);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
  }
}

}  // namespace

float AttnRowMaxAvx512(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  __m512 m0 = Set16(kNegInf), m1 = Set16(kNegInf);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + j + 16));
  }
  for (; j + 16 <= n; j += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + j));
  if (j < n) m1 = _mm512_max_ps(m1, _mm512_mask_loadu_ps(Set16(kNegInf), Tail(n - j), x + j));
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

float AttnExpShiftSumAvx512(float* x, int64_t n, float shift) {
  const __m512 s = Set16(shift);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
    const __m512 e1 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), s));
    _mm512_storeu_ps(x + j, e0);
    _mm512_storeu_ps(x + j + 16, e1);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  for (; j + 16 <= n; j += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
    _mm512_storeu_ps(x + j, e);
    sum0 = _mm512_add_ps(sum0, e);
  }
  if (j < n) {
    const __mmask16 t = Tail(n - j);
    // Lanes past n read -inf, whose exp is 0.
    const __m512 v = _mm512_mask_loadu_ps(Set16(-std::numeric_limits<float>::infinity()), t, x + j);
    const __m512 e = Exp16(_mm512_sub_ps(v, s));
    _mm512_mask_storeu_ps(x + j, t, e);
    sum1 = _mm512_add_ps(sum1, e);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

void AttnPackKeysAvx512(const float* k, int64_t ldk, int64_t cols, int64_t d, float scale,
                        float* out) {
  const __m512 sc = Set16(scale);
  for (int64_t j0 = 0, p = 0; j0 < cols; j0 += 16, ++p) {
    const int64_t keys = cols - j0 < 16 ? cols - j0 : 16;
    for (int64_t d0 = 0; d0 < d; d0 += 16) {
      const int64_t dims = d - d0 < 16 ? d - d0 : 16;
      const __mmask16 m = Tail(dims);
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = i < keys ? _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(m, k + (j0 + i) * ldk + d0))
                        : _mm512_setzero_ps();
      }
      Transpose16(r);
      float* dst = out + (p * d + d0) * 16;
      for (int64_t kk = 0; kk < dims; ++kk) _mm512_storeu_ps(dst + kk * 16, r[kk]);
    }
  }
}

}  // namespace kiln::cpu
