// The small-M matmul loops for AVX2 + FMA (8 floats a vector): register tiles
// of up to 6 rows by 16 columns (12 accumulators of the 16 ymm registers).
// This file is compiled with the library's own -march (x86-64-v3).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "backends/cpu/simd_math.h"
#include "backends/cpu/small_matmul.h"

namespace kiln::cpu {
namespace {

struct V {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T Zero() { return _mm256_setzero_ps(); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static T LoadN(const float* p, int n) { return _mm256_maskload_ps(p, simd::TailMask(n)); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static void StoreN(float* p, T v, int n) { _mm256_maskstore_ps(p, simd::TailMask(n), v); }
  static T Bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Act(T x, SmallAct act) {
    if (act == SmallAct::kNone) return x;
    if (act == SmallAct::kRelu) return _mm256_max_ps(_mm256_setzero_ps(), x);  // NaN stays NaN
    return ActCall(x, act);
  }
  // The transcendental activations, out of line: inlined into every
  // register tile they made the code several times larger for no speed (the
  // epilogue runs once per output, the K loop K times).
  __attribute__((noinline)) static T ActCall(T x, SmallAct act) {
    switch (act) {
      case SmallAct::kNone: return x;
      case SmallAct::kRelu: return _mm256_max_ps(_mm256_setzero_ps(), x);  // NaN stays NaN
      case SmallAct::kGelu: return simd::Gelu(x);
      case SmallAct::kGeluTanh: return simd::GeluTanh(x);
      case SmallAct::kSilu: return simd::Silu(x);
      case SmallAct::kSigmoid: return simd::Sigmoid(x);
      case SmallAct::kTanh: return simd::Tanh(x);
    }
    return x;
  }
};

constexpr int kMaxMR = 6;
// 1 row: 4 panels (8 accumulators, B read straight into the FMAs); 2-3 rows:
// 2 panels; 4-6 rows: 1 panel (up to 12 accumulators + 2 B + 1 broadcast).
constexpr int NpFor(int mr) { return mr == 1 ? 4 : (mr <= 3 ? 2 : 1); }

#include "backends/cpu/small_matmul_kernel.inc"

}  // namespace

void SmallMatMulAvx2(const SmallMatMulArgs& args, int64_t panel_begin, int64_t panel_end) {
  RunPanels(args, panel_begin, panel_end);
}

}  // namespace kiln::cpu
