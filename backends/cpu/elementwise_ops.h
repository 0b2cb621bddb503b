// Elementwise primitives over contiguous arrays, shared by the standalone
// elementwise kernels, FusedElementwise, the losses and other kernel files
// (FusedMatMul's activation epilogue can call UnaryF32).
//
// Values are computed in one of three register classes: f32 (for f32, f16 and
// bf16 storage), f64, and i64 (every integer type and bool). A value of a
// narrower type held in a wider register always holds a value of its own type
// (RoundToDType restores that after each operation), so fused and unfused
// graphs compute the same bits.
//
// Semantics where the IR leaves room (documented for every backend to match):
// - Integer add/sub/mul wrap (two's complement); integer div truncates toward
//   zero, x / 0 = 0, and INT_MIN / -1 = INT_MIN (wraps).
// - Binary max/min and clamp propagate NaN as NumPy does.
// - Cast float -> int truncates toward zero and saturates at the target's
//   range; NaN -> 0. Int -> narrower int wraps. Anything -> bool is x != 0
//   (NaN -> true). Float -> f16/bf16 rounds to nearest even.
// - Round is round-half-to-even (numpy.round). Sign keeps +-0 and NaN.
//
// All functions: n >= 0; outputs may alias inputs element for element (y may
// be x), never with an offset. Thread-safe (pure functions).
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::cpu::ew {

enum class RegClass : uint8_t { kF32, kF64, kI64 };

// REQUIRES: a dense dtype.
RegClass ClassOf(DType dtype);
inline int64_t RegSize(RegClass c) { return c == RegClass::kF32 ? 4 : 8; }

// Storage -> register class, n elements. stride is 1 (contiguous) or 0 (one
// element repeated n times).
void Load(const void* src, DType dtype, int64_t stride, int64_t n, void* dst);
// Register class -> storage of `dtype` (same class), n contiguous elements.
void Store(const void* src, DType dtype, int64_t n, void* dst);
// Rounds register values to what `dtype` can hold (f16/bf16 rounding,
// narrow-int wrapping, bool to 0/1); a no-op for f32, f64 and i64.
void RoundToDType(void* values, DType dtype, int64_t n);
// Fills n registers of class `cls` with `value` converted as Cast would.
void Fill(RegClass cls, DType dtype, double value, int64_t n, void* dst);

// Whether a unary kind is implemented for a dtype (floats: all; signed
// integers: identity, relu, neg, abs, sign).
bool UnarySupported(int kind, DType dtype);
bool BinarySupported(int kind, DType dtype);

void UnaryF32(int kind, const float* x, float* y, int64_t n);
void UnaryF64(int kind, const double* x, double* y, int64_t n);
void UnaryI64(int kind, const int64_t* x, int64_t* y, int64_t n);
void Unary(RegClass cls, int kind, const void* x, void* y, int64_t n);

void Binary(RegClass cls, int kind, const void* a, const void* b, void* y, int64_t n);
// y (i64 class, 0/1) = a <kind> b, a and b of class `cls`. NaN compares
// unequal to everything.
void Compare(RegClass cls, int kind, const void* a, const void* b, void* y, int64_t n);
// y = cond ? a : b; cond is i64 class.
void Where(RegClass cls, const void* cond, const void* a, const void* b, void* y, int64_t n);
// Converts values of dtype `from` (in its class) to dtype `to` (in its class).
void Cast(DType from, DType to, const void* x, void* y, int64_t n);
void Clamp(RegClass cls, DType dtype, bool has_lo, double lo, bool has_hi, double hi, const void* x,
           void* y, int64_t n);

}  // namespace kiln::cpu::ew
