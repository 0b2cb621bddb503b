// The small-M matmul loops for AVX-512 (16 floats a vector, one per panel):
// register tiles of up to 12 rows by 2 panels (24 of the 32 zmm registers).
// Compiled with -mavx512f/bw/dq/vl (CMakeLists.txt); nothing here runs unless
// BestSmallMatMulIsa() found those on the CPU. The AVX2 math of simd_math.h
// is included into this file's anonymous namespace so that its inline
// functions, compiled here with AVX-512 enabled, can never be the copy the
// linker keeps for the rest of the library.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#include "backends/cpu/small_matmul.h"

namespace kiln::cpu {
namespace {
namespace local {
#include "backends/cpu/simd_math.h"
}  // namespace local

namespace simd = local::kiln::cpu::simd;

// simd_math.h's Gelu on 16 lanes: the same erfc (Numerical Recipes' erfcc,
// z*z split into hi + lo), the same exp polynomial with 2^n applied by
// scalef (exact for subnormal results and overflow), and the same side
// choice, so the accuracy is that of the 8-lane function.
inline __m512 Set16(float v) { return _mm512_set1_ps(v); }

inline __m512 ExpHiLo16(__m512 a, __m512 b) {
  const __m512 s = _mm512_add_ps(a, b);
  const __m512 sc = _mm512_min_ps(_mm512_max_ps(s, Set16(-104.0f)), Set16(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(sc, Set16(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, Set16(0.693359375f), a);
  r = _mm512_fnmadd_ps(n, Set16(-2.12194440e-4f), r);
  r = _mm512_add_ps(r, b);
  __m512 p = Set16(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, Set16(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, Set16(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, Set16(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, Set16(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, Set16(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, Set16(1.0f)));
  __m512 res = _mm512_scalef_ps(p, n);
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(s, Set16(-104.0f), _CMP_LT_OQ),
                           _mm512_setzero_ps());
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(s, Set16(89.0f), _CMP_GT_OQ), Set16(INFINITY));
  return _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q), s);
}

inline __m512 Gelu16(__m512 x) {
  const __m512 xc = _mm512_max_ps(Set16(-30.0f), x);  // keeps NaN; gelu(-30) is -0 in f32
  const __m512 ax = _mm512_min_ps(_mm512_abs_ps(xc), Set16(30.0f));
  const __m512 hi = _mm512_mul_ps(ax, ax);
  const __m512 lo = _mm512_fmsub_ps(ax, ax, hi);
  const __m512 z = _mm512_mul_ps(ax, Set16(0.70710678118654752f));
  const __m512 t = _mm512_div_ps(Set16(1.0f), _mm512_fmadd_ps(z, Set16(0.5f), Set16(1.0f)));
  __m512 p = Set16(0.17087277f);
  p = _mm512_fmadd_ps(p, t, Set16(-0.82215223f));
  p = _mm512_fmadd_ps(p, t, Set16(1.48851587f));
  p = _mm512_fmadd_ps(p, t, Set16(-1.13520398f));
  p = _mm512_fmadd_ps(p, t, Set16(0.27886807f));
  p = _mm512_fmadd_ps(p, t, Set16(-0.18628806f));
  p = _mm512_fmadd_ps(p, t, Set16(0.09678418f));
  p = _mm512_fmadd_ps(p, t, Set16(0.37409196f));
  p = _mm512_fmadd_ps(p, t, Set16(1.00002368f));
  p = _mm512_fmadd_ps(p, t, Set16(-1.26551223f));
  const __m512 z2_hi = _mm512_mul_ps(hi, Set16(0.5f)), z2_lo = _mm512_mul_ps(lo, Set16(0.5f));
  const __m512 erfc =
      _mm512_mul_ps(t, ExpHiLo16(_mm512_sub_ps(_mm512_setzero_ps(), z2_hi), _mm512_sub_ps(p, z2_lo)));
  const __m512 e = _mm512_mul_ps(erfc, Set16(0.5f));
  const __mmask16 neg = _mm512_cmp_ps_mask(xc, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 phi = _mm512_mask_mov_ps(_mm512_sub_ps(Set16(1.0f), e), neg, e);
  return _mm512_mul_ps(xc, phi);
}

// Vectors per V::ActBatch call (ActRows).
constexpr int kActBatch = 4;

struct V {
  using T = __m512;
  static constexpr int kLanes = 16;
  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static T Zero() { return _mm512_setzero_ps(); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static T LoadN(const float* p, int n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, T v, int n) { _mm512_mask_storeu_ps(p, Mask(n), v); }
  static T Bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  template <typename F>
  static T Halves(T x, F f) {
    const __m256 lo = f(_mm512_castps512_ps256(x));
    const __m256 hi = f(_mm512_extractf32x8_ps(x, 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
  // The activations a tile's epilogue applies in registers (those
  // SmallActAfterStore leaves there: none and relu).
  static T Act(T x, SmallAct act) {
    if (act == SmallAct::kRelu) return _mm512_max_ps(_mm512_setzero_ps(), x);  // NaN stays NaN
    return x;
  }
  // Every activation on kActBatch vectors, for ActRows
  // (small_matmul_kernel.inc), which runs the transcendental ones over a
  // stored tile (inlined into every register tile they made the code several
  // times larger and spilled its accumulators); several vectors per call let
  // their long dependency chains overlap. GELU has a 16-lane form (Gelu16);
  // the rest run simd_math.h's 8-lane functions on each half.
  static void ActBatch(T* x, SmallAct act) {
    auto each = [x](auto f) {
#pragma GCC unroll 4
      for (int i = 0; i < kActBatch; ++i) x[i] = f(x[i]);
    };
    switch (act) {
      case SmallAct::kNone: return;
      case SmallAct::kRelu: return each([](T v) { return _mm512_max_ps(_mm512_setzero_ps(), v); });
      case SmallAct::kGelu: return each([](T v) { return Gelu16(v); });
      case SmallAct::kGeluTanh:
        return each([](T v) { return Halves(v, [](__m256 h) { return simd::GeluTanh(h); }); });
      case SmallAct::kSilu:
        return each([](T v) { return Halves(v, [](__m256 h) { return simd::Silu(h); }); });
      case SmallAct::kSigmoid:
        return each([](T v) { return Halves(v, [](__m256 h) { return simd::Sigmoid(h); }); });
      case SmallAct::kTanh:
        return each([](T v) { return Halves(v, [](__m256 h) { return simd::Tanh(h); }); });
    }
  }
};

constexpr int kMaxMR = 12;
constexpr int kLargeMR = 8;
// Up to 8 accumulators for 1 row, 12-24 for more (each B vector is one panel).
constexpr int NpFor(int mr) {
  return mr == 1 ? 8 : (mr == 2 ? 6 : (mr <= 6 ? 4 : (mr <= 8 ? 3 : 2)));
}

#include "backends/cpu/small_matmul_kernel.inc"

}  // namespace

void SmallMatMulAvx512(const SmallMatMulArgs& args, int64_t panel_begin, int64_t panel_end) {
  if (args.m > kSmallMatMulMaxM) {
    RunPanelsLarge(args, panel_begin, panel_end);
  } else {
    RunPanels(args, panel_begin, panel_end);
  }
}

}  // namespace kiln::cpu
