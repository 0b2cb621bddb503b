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

// Defined in dequant_dot_avx512.cc; call only where the CPU has AVX-512
// F/BW/DQ/VL (Best() checks).
void DotRowsAvx512(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                   int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy);
void DecodeAvx512(DType dtype, const uint8_t* src, int64_t blocks, float* dst);
// Defined in dequant_dot_avx2.cc (AVX2, FMA, F16C: the backend's baseline).
void DotRowsAvx2(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                 int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy);

}  // namespace kiln::cpu::dq
