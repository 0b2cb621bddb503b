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

// Vectors per V::ActBatch call (ActRows).
constexpr int kActBatch = 4;

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
  // The activations a tile's epilogue applies in registers (those
  // SmallActAfterStore leaves there: none and relu).
  static T Act(T x, SmallAct act) {
    if (act == SmallAct::kRelu) return _mm256_max_ps(_mm256_setzero_ps(), x);  // NaN stays NaN
    return x;
  }
  // Every activation on kActBatch vectors, for ActRows
  // (small_matmul_kernel.inc), which runs the transcendental ones over a
  // stored tile (inlined into every register tile they made the code several
  // times larger and spilled its accumulators); several vectors per call let
  // their long dependency chains overlap.
  static void ActBatch(T* x, SmallAct act) {
    auto each = [x](auto f) {
#pragma GCC unroll 4
      for (int i = 0; i < kActBatch; ++i) x[i] = f(x[i]);
    };
    switch (act) {
      case SmallAct::kNone: return;
      case SmallAct::kRelu: return each([](T v) { return _mm256_max_ps(_mm256_setzero_ps(), v); });
      case SmallAct::kGelu: return each([](T v) { return simd::Gelu(v); });
      case SmallAct::kGeluTanh: return each([](T v) { return simd::GeluTanh(v); });
      case SmallAct::kSilu: return each([](T v) { return simd::Silu(v); });
      case SmallAct::kSigmoid: return each([](T v) { return simd::Sigmoid(v); });
      case SmallAct::kTanh: return each([](T v) { return simd::Tanh(v); });
    }
  }
};

constexpr int kMaxMR = 6;
constexpr int kLargeMR = kMaxMR;
// 1 row: 4 panels (8 accumulators, B read straight into the FMAs); 2-3 rows:
// 2 panels; 4-6 rows: 1 panel (up to 12 accumulators + 2 B + 1 broadcast).
constexpr int NpFor(int mr) { return mr == 1 ? 4 : (mr <= 3 ? 2 : 1); }

#include "backends/cpu/small_matmul_kernel.inc"

}  // namespace

void SmallMatMulAvx2(const SmallMatMulArgs& args, int64_t panel_begin, int64_t panel_end) {
  if (args.m > kSmallMatMulMaxM) {
    RunPanelsLarge(args, panel_begin, panel_end);
  } else {
    RunPanels(args, panel_begin, panel_end);
  }
}

}  // namespace kiln::cpu
