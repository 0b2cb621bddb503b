// The inner loops of DequantMatMul and Dequantize on block-quantized weights
// (GGUF layouts, backends/common/quant_blocks.h): decoding blocks to f32, and
// dot products of weight rows with a few activation rows that decode each
// block in registers and never write the f32 weights anywhere.
//
// Three implementations with one contract: AVX-512 (F, BW, DQ, VL; compiled in
// dequant_dot_avx512.cc with those flags and chosen at run time when the CPU
// and OS have them), AVX2 (dequant_dot_avx2.cc: the one-row matvec streamed
// in registers, the CPU backend's baseline ISA; several rows and decoding go
// to the portable loops) and a portable one over quant_blocks.h. All
// accumulate in f32. Thread-safe (pure functions over the caller's memory).
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"

namespace kiln::cpu::dq {

// The most activation rows one DotRows call takes (its accumulators live in
// registers).
inline constexpr int kMaxDotRows = 8;

// For each weight row n in [n0, n1) of a [N, k] block-quantized matrix whose
// rows are `row_bytes` apart, and each activation row r < rows:
//   y[r * ldy + n] = sum_j x[r * ldx + j] * W[n, j].
// REQUIRES: IsQuantized(dtype); k a whole number of blocks; 1 <= rows <=
// kMaxDotRows; x rows hold k floats.
using DotRowsFn = void (*)(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                           int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy);

// Decodes `blocks` consecutive blocks at `src` into blocks * block_elems floats.
using DecodeFn = void (*)(DType dtype, const uint8_t* src, int64_t blocks, float* dst);

struct Kernels {
  const char* isa;  // "avx512" or "generic", for implementation() strings
  DotRowsFn dot_rows;
  DecodeFn decode;
};

// The fastest implementation this CPU runs (not AVX-512 when the environment
// sets KILN_CPU_NO_AVX512=1; the portable one when it sets
// KILN_CPU_DQ_GENERIC=1); the same object every call.
const Kernels& Best();
// The portable implementation (tests compare the two).
const Kernels& Generic();

// ---- Int8 activations (CompileOptions.allow_int8_activations) ----
//
// The activation rows are rounded to int8 once per call, per Int8Group(wtype)
// values: d = amax / 127 (f32), q = round-half-even(x * (1 / d)) (q = 0 where
// amax = 0). The group is 32 (llama.cpp's q8_0) for q8_0, q4_0 and q6_k, and
// 256 (llama.cpp's q8_K: one scale per super-block) for q4_k and q5_k, whose
// AVX-512 kernel then applies the 6-bit sub-block scales in integers and
// converts once per super-block. Each weight row is multiplied in integers
// (exact int32 sums) and the scales are applied in f32. The result is the
// exact product of the rounded activations (x^ = d q) with the exact weights,
// up to f32 accumulation. The kernels use VNNI (vpdpbusd / vpdpwssd: unsigned
// weights x signed activations, the weight offsets folded in as precomputed
// sums) or AVX2 (vpmaddubsw).

inline constexpr int64_t kInt8Block = 32;  // the unit of Int8Rows.d / .sums

// Activation values per int8 scale for weights of `wtype` (a multiple of
// kInt8Block; the scale is stored once per kInt8Block values all the same).
inline constexpr int64_t Int8Group(DType wtype) {
  return wtype == v1::DTYPE_Q4_K || wtype == v1::DTYPE_Q5_K ? 256 : kInt8Block;
}

// Activation rows quantized for one weight dtype, in the layout the kernels
// read. Filled by QuantizeRows; reused across calls (the vectors only grow).
struct Int8Rows {
  DType wtype = v1::DTYPE_UNSPECIFIED;
  int rows = 0;
  int64_t k = 0;
  // rows x k int8 values. Natural order, except where `paired` (the AVX-512
  // kernels): q4_k / q5_k store each 256-block's 32-value sub-blocks in the
  // order 0 2 1 3 4 6 5 7 (the low and high nibbles of 64 weight bytes), and
  // q4_0 stores each pair of 32-blocks b, b + 1 as b[0:16) b+1[0:16) b[16:32)
  // b+1[16:32) (an odd last block stays in order).
  std::vector<int8_t> q;
  // rows x k / 32: the scale of each 32 values (natural order; the same for
  // the 8 of a 256-value group where Int8Group is 256).
  std::vector<float> d;
  // q4_k / q5_k: rows x k / 32, d * sum(q) of each 32 values (the mins' term).
  std::vector<float> sums;
  // q8_0, q4_0, q6_k: rows x k / 4, -offset * (the sum of each 4 stored q), the
  // weight's offset (128 for q8_0's sign flip, 8, 32) folded into the int32 dot
  // products: sum (w + off) q + c = sum w q over each 4 values.
  std::vector<int32_t> offsets;
  bool paired = false;
};

// Quantizes rows x k activations (ldx floats apart) for weights of `wtype`.
// The rounding is the same on every ISA (the f64 references mirror it).
// REQUIRES: IsQuantized(wtype); k a whole number of wtype's blocks.
void QuantizeRows(DType wtype, const float* x, int64_t ldx, int rows, int64_t k, bool paired,
                  Int8Rows& out);

// y[r * ldy + n] = sum_j x^[r, j] * W[n, j] for n in [n0, n1), every row of xq.
// REQUIRES: xq quantized for dtype (with `paired` as the implementation wants).
using DotRowsInt8Fn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                               const Int8Rows& xq, float* y, int64_t ldy);

struct Int8Kernels {
  const char* isa;  // "avx512vnni", "avx2" or "generic"
  bool paired;      // QuantizeRows layout this implementation reads
  DotRowsInt8Fn dot_rows;
};

// The fastest int8 implementation this CPU runs: AVX-512 VNNI where the CPU has
// AVX-512 F/BW/VL and VNNI (not with KILN_CPU_NO_AVX512=1), else AVX2 (not
// with KILN_CPU_DQ_GENERIC=1), else the portable loops.
const Int8Kernels& BestInt8();
const Int8Kernels& GenericInt8();

// Defined in dequant_int8_avx512.cc (call only where BestInt8 chose it) and
// dequant_int8_avx2.cc.
void DotRowsInt8Avx512(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                       const Int8Rows& xq, float* y, int64_t ldy);
void DotRowsInt8Avx2(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                     const Int8Rows& xq, float* y, int64_t ldy);

// Defined in dequant_dot_avx512.cc; call only where the CPU has AVX-512
// F/BW/DQ/VL (Best() checks).
void DotRowsAvx512(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                   int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy);
void DecodeAvx512(DType dtype, const uint8_t* src, int64_t blocks, float* dst);
// Defined in dequant_dot_avx2.cc (AVX2, FMA, F16C: the backend's baseline).
void DotRowsAvx2(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                 int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy);

}  // namespace kiln::cpu::dq
