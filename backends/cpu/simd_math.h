// AVX2 + FMA single-precision math for the CPU kernels: exp, log, tanh, erf,
// erfc and the activations built on them. Accuracy target: ~2 ulp (a few
// 1e-7 relative) over the whole float range, with IEEE results at the edges
// (NaN in -> NaN out, overflow -> inf, underflow -> 0). Activations return
// their limits at +-inf (gelu(-inf) = -0, not the NaN of a naive x * cdf(x)).
//
// Every function is a pure, inline function of its lanes; MapF32 applies one
// over an array with a masked tail, so callers never write tail loops.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace kiln::cpu::simd {

inline __m256 Set(float v) { return _mm256_set1_ps(v); }
inline __m256 IsNan(__m256 x) { return _mm256_cmp_ps(x, x, _CMP_UNORD_Q); }
inline __m256 Abs(__m256 x) { return _mm256_andnot_ps(Set(-0.0f), x); }
// Magnitude of `mag` with the sign of `sign`.
inline __m256 CopySign(__m256 mag, __m256 sign) {
  return _mm256_or_ps(Abs(mag), _mm256_and_ps(sign, Set(-0.0f)));
}

// exp(a + b) where a + b is not representable in one float (erfc's
// -z*z + poly): the reduction subtracts n*ln2 from `a` exactly (Cody-Waite)
// before adding b. Cephes expf polynomial; 2^n applied in two halves so that
// subnormal results and overflow to inf come out right.
inline __m256 ExpHiLo(__m256 a, __m256 b) {
  const __m256 s = _mm256_add_ps(a, b);
  const __m256 sc = _mm256_min_ps(_mm256_max_ps(s, Set(-104.0f)), Set(89.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(sc, Set(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, Set(0.693359375f), a);
  r = _mm256_fnmadd_ps(n, Set(-2.12194440e-4f), r);
  r = _mm256_add_ps(r, b);
  __m256 p = Set(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, Set(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, Set(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, Set(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, Set(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, Set(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, Set(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 res = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  // Out of range lanes computed garbage above; their results are exact here.
  res = _mm256_blendv_ps(res, _mm256_setzero_ps(), _mm256_cmp_ps(s, Set(-104.0f), _CMP_LT_OQ));
  res = _mm256_blendv_ps(res, Set(INFINITY), _mm256_cmp_ps(s, Set(89.0f), _CMP_GT_OQ));
  return _mm256_blendv_ps(res, s, IsNan(s));
}

inline __m256 Exp(__m256 x) { return ExpHiLo(x, _mm256_setzero_ps()); }

// Natural log (Cephes logf). log(0) = -inf, log(x < 0) = NaN, log(inf) = inf;
// subnormal inputs are scaled into the normal range first.
inline __m256 Log(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, Set(1.17549435e-38f), _CMP_LT_OQ);
  const __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, Set(8388608.0f)), tiny);
  const __m256i bits = _mm256_castps_si256(xs);
  __m256 e =
      _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  e = _mm256_sub_ps(e, _mm256_and_ps(tiny, Set(23.0f)));
  // Mantissa in [0.5, 1).
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  const __m256 small = _mm256_cmp_ps(m, Set(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(small, Set(1.0f)));
  m = _mm256_sub_ps(_mm256_add_ps(m, _mm256_and_ps(small, m)), Set(1.0f));
  const __m256 z = _mm256_mul_ps(m, m);
  __m256 y = Set(7.0376836292e-2f);
  y = _mm256_fmadd_ps(y, m, Set(-1.1514610310e-1f));
  y = _mm256_fmadd_ps(y, m, Set(1.1676998740e-1f));
  y = _mm256_fmadd_ps(y, m, Set(-1.2420140846e-1f));
  y = _mm256_fmadd_ps(y, m, Set(1.4249322787e-1f));
  y = _mm256_fmadd_ps(y, m, Set(-1.6668057665e-1f));
  y = _mm256_fmadd_ps(y, m, Set(2.0000714765e-1f));
  y = _mm256_fmadd_ps(y, m, Set(-2.4999993993e-1f));
  y = _mm256_fmadd_ps(y, m, Set(3.3333331174e-1f));
  y = _mm256_mul_ps(y, _mm256_mul_ps(m, z));
  y = _mm256_fmadd_ps(e, Set(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, Set(0.5f), y);
  __m256 r = _mm256_add_ps(m, y);
  r = _mm256_fmadd_ps(e, Set(0.693359375f), r);
  // Edges: +inf and NaN pass through, 0 -> -inf, negative -> NaN.
  const __m256 pass = _mm256_or_ps(IsNan(x), _mm256_cmp_ps(x, Set(INFINITY), _CMP_EQ_OQ));
  r = _mm256_blendv_ps(r, x, pass);
  r = _mm256_blendv_ps(r, Set(-INFINITY), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ));
  return _mm256_blendv_ps(r, Set(NAN), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

// log(1 + y) for 0 <= y <= 1, accurate for tiny y (the u - 1 correction trick).
inline __m256 Log1pUnit(__m256 y) {
  const __m256 u = _mm256_add_ps(y, Set(1.0f));
  const __m256 d = _mm256_sub_ps(u, Set(1.0f));
  const __m256 r = _mm256_mul_ps(Log(u), _mm256_div_ps(y, d));
  return _mm256_blendv_ps(r, y, _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_EQ_OQ));
}

// tanh: Cephes odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above.
inline __m256 Tanh(__m256 x) {
  const __m256 ax = Abs(x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = Set(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, Set(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, Set(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, Set(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, Set(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(x, z), p, x);
  const __m256 e = Exp(_mm256_add_ps(ax, ax));
  const __m256 large =
      CopySign(_mm256_sub_ps(Set(1.0f), _mm256_div_ps(Set(2.0f), _mm256_add_ps(e, Set(1.0f)))), x);
  const __m256 r = _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, Set(0.625f), _CMP_LT_OQ));
  return _mm256_blendv_ps(r, x, IsNan(x));
}

// erf(z) / (2/sqrt(pi)) Taylor series times z, for |z| < 0.5 (truncation
// error ~4e-10 relative there).
inline __m256 ErfSmall(__m256 z) {
  const __m256 z2 = _mm256_mul_ps(z, z);
  __m256 p = Set(1.0f / 9360.0f);
  p = _mm256_fmadd_ps(p, z2, Set(-1.0f / 1320.0f));
  p = _mm256_fmadd_ps(p, z2, Set(1.0f / 216.0f));
  p = _mm256_fmadd_ps(p, z2, Set(-1.0f / 42.0f));
  p = _mm256_fmadd_ps(p, z2, Set(1.0f / 10.0f));
  p = _mm256_fmadd_ps(p, z2, Set(-1.0f / 3.0f));
  p = _mm256_fmadd_ps(p, z2, Set(1.0f));
  return _mm256_mul_ps(_mm256_mul_ps(p, z), Set(1.12837916709551257f));
}

// erfc(z) for z >= 0 given z*z as hi + lo (exact), by the Chebyshev fit of
// Numerical Recipes' erfcc (fractional error < 1.2e-7 for every z >= 0).
// Splitting z*z keeps the exp argument exact, which matters for z ~ 10.
inline __m256 ErfcLarge(__m256 z, __m256 z2_hi, __m256 z2_lo) {
  const __m256 t = _mm256_div_ps(Set(1.0f), _mm256_fmadd_ps(z, Set(0.5f), Set(1.0f)));
  __m256 p = Set(0.17087277f);
  p = _mm256_fmadd_ps(p, t, Set(-0.82215223f));
  p = _mm256_fmadd_ps(p, t, Set(1.48851587f));
  p = _mm256_fmadd_ps(p, t, Set(-1.13520398f));
  p = _mm256_fmadd_ps(p, t, Set(0.27886807f));
  p = _mm256_fmadd_ps(p, t, Set(-0.18628806f));
  p = _mm256_fmadd_ps(p, t, Set(0.09678418f));
  p = _mm256_fmadd_ps(p, t, Set(0.37409196f));
  p = _mm256_fmadd_ps(p, t, Set(1.00002368f));
  p = _mm256_fmadd_ps(p, t, Set(-1.26551223f));
  return _mm256_mul_ps(t,
                       ExpHiLo(_mm256_sub_ps(_mm256_setzero_ps(), z2_hi), _mm256_sub_ps(p, z2_lo)));
}

// erfc(|x| * scale) for the caller's scale (1 or 1/sqrt(2)); z2 is formed
// from x so the square stays exact. |x| is capped where erfc is already 0.
inline __m256 ErfcAbsScaled(__m256 x, float scale, float scale_sq) {
  const __m256 ax = _mm256_min_ps(Abs(x), Set(30.0f));
  const __m256 z = _mm256_mul_ps(ax, Set(scale));
  const __m256 hi = _mm256_mul_ps(ax, ax);
  const __m256 lo = _mm256_fmsub_ps(ax, ax, hi);
  const __m256 large =
      ErfcLarge(z, _mm256_mul_ps(hi, Set(scale_sq)), _mm256_mul_ps(lo, Set(scale_sq)));
  const __m256 small = _mm256_sub_ps(Set(1.0f), ErfSmall(z));
  return _mm256_blendv_ps(large, small, _mm256_cmp_ps(z, Set(0.5f), _CMP_LT_OQ));
}

inline __m256 Erf(__m256 x) {
  const __m256 large = CopySign(_mm256_sub_ps(Set(1.0f), ErfcAbsScaled(x, 1.0f, 1.0f)), x);
  const __m256 r =
      _mm256_blendv_ps(large, ErfSmall(x), _mm256_cmp_ps(Abs(x), Set(0.5f), _CMP_LT_OQ));
  return _mm256_blendv_ps(r, x, IsNan(x));
}

// gelu(x) = x * Phi(x), Phi(x) = erfc(-x / sqrt(2)) / 2, evaluated on the
// side that does not cancel: x * (1 - e) for x >= 0, x * e for x < 0 with
// e = erfc(|x| / sqrt(2)) / 2 in [0, 0.5]. The Chebyshev erfc is relatively
// accurate for every z >= 0 and 1 - e >= 0.5 never cancels, so unlike erf no
// small-argument branch is needed.
inline __m256 Gelu(__m256 x) {
  const __m256 xc = _mm256_max_ps(Set(-30.0f), x);       // keeps NaN; gelu(-30) is -0 in f32
  const __m256 ax = _mm256_min_ps(Abs(xc), Set(30.0f));  // erfc(30 / sqrt(2)) is 0 in f32
  const __m256 hi = _mm256_mul_ps(ax, ax);
  const __m256 lo = _mm256_fmsub_ps(ax, ax, hi);
  const __m256 erfc = ErfcLarge(_mm256_mul_ps(ax, Set(0.70710678118654752f)),
                                _mm256_mul_ps(hi, Set(0.5f)), _mm256_mul_ps(lo, Set(0.5f)));
  const __m256 e = _mm256_mul_ps(erfc, Set(0.5f));
  const __m256 neg = _mm256_cmp_ps(xc, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 phi = _mm256_blendv_ps(_mm256_sub_ps(Set(1.0f), e), e, neg);
  return _mm256_mul_ps(xc, phi);
}

// 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
// the second form has no cancellation for negative x.
inline __m256 GeluTanh(__m256 x) {
  const __m256 xc = _mm256_max_ps(Set(-1000.0f), x);
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(xc, xc), xc);
  const __m256 u2 =
      _mm256_mul_ps(_mm256_fmadd_ps(x3, Set(0.044715f), xc), Set(-2.0f * 0.79788456080286536f));
  return _mm256_div_ps(xc, _mm256_add_ps(Set(1.0f), Exp(u2)));
}

inline __m256 Sigmoid(__m256 x) {
  return _mm256_div_ps(Set(1.0f),
                       _mm256_add_ps(Set(1.0f), Exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

inline __m256 Silu(__m256 x) {
  const __m256 xc = _mm256_max_ps(Set(-1000.0f), x);
  return _mm256_div_ps(xc, _mm256_add_ps(Set(1.0f), Exp(_mm256_sub_ps(_mm256_setzero_ps(), xc))));
}

// log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)).
inline __m256 Softplus(__m256 x) {
  const __m256 t = Log1pUnit(Exp(_mm256_sub_ps(_mm256_setzero_ps(), Abs(x))));
  return _mm256_add_ps(_mm256_max_ps(_mm256_setzero_ps(), x), t);
}

// Lanes [0, n) of a tail of n < 8 elements, for masked loads and stores.
inline __m256i TailMask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// y[i] = f(x[i]) for i < n, 8 lanes at a time and one masked tail. x and y
// may be the same array.
template <typename F>
inline void MapF32(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(y + i, m, f(_mm256_maskload_ps(x + i, m)));
  }
}

// Horizontal sum and max of 8 lanes.
inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace kiln::cpu::simd
