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
  static T Act(T x, SmallAct act) {
    if (act == SmallAct::kNone) return x;
    if (act == SmallAct::kRelu) return _mm512_max_ps(_mm512_setzero_ps(), x);  // NaN stays NaN
    return ActCall(x, act);
  }
  // The transcendental activations, out of line: inlined into every
  // register tile they made the code several times larger for no speed (the
  // epilogue runs once per output, the K loop K times).
  __attribute__((noinline)) static T ActCall(T x, SmallAct act) {
    switch (act) {
      case SmallAct::kNone: return x;
      case SmallAct::kRelu: return _mm512_max_ps(_mm512_setzero_ps(), x);  // NaN stays NaN
      case SmallAct::kGelu: return Halves(x, [](__m256 v) { return simd::Gelu(v); });
      case SmallAct::kGeluTanh: return Halves(x, [](__m256 v) { return simd::GeluTanh(v); });
      case SmallAct::kSilu: return Halves(x, [](__m256 v) { return simd::Silu(v); });
      case SmallAct::kSigmoid: return Halves(x, [](__m256 v) { return simd::Sigmoid(v); });
      case SmallAct::kTanh: return Halves(x, [](__m256 v) { return simd::Tanh(v); });
    }
    return x;
  }
};

constexpr int kMaxMR = 12;
// Up to 8 accumulators for 1 row, 12-24 for more (each B vector is one panel).
constexpr int NpFor(int mr) {
  return mr == 1 ? 8 : (mr == 2 ? 6 : (mr <= 6 ? 4 : (mr <= 8 ? 3 : 2)));
}

#include "backends/cpu/small_matmul_kernel.inc"

}  // namespace

void SmallMatMulAvx512(const SmallMatMulArgs& args, int64_t panel_begin, int64_t panel_end) {
  RunPanels(args, panel_begin, panel_end);
}

}  // namespace kiln::cpu
