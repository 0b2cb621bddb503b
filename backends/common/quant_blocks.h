// GGUF (ggml) block-quantized storage: the reference decoding of every block
// type Kiln stores (q8_0, q4_0, q4_k, q5_k, q6_k), shared by the CPU kernels
// (their scalar path and the edges of their SIMD paths) and the tests.
//
// The layouts are ggml's (ggml-common.h / ggml-quants.c), little-endian, no
// padding. "f16" is an IEEE binary16; QK_K = 256.
//   q8_0  (32 elements, 34 bytes):  d:f16, qs:int8[32];        x[i] = d * qs[i]
//   q4_0  (32 elements, 18 bytes):  d:f16, qs:u8[16];          x[i] = d * ((qs[i] & 15) - 8),
//                                                              x[i+16] = d * ((qs[i] >> 4) - 8)
//   q4_k  (256 elements, 144 bytes): d:f16, dmin:f16, scales:u8[12], qs:u8[128]
//   q5_k  (256 elements, 176 bytes): d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128]
//   q6_k  (256 elements, 210 bytes): ql:u8[128], qh:u8[64], scales:int8[16], d:f16
// q4_k / q5_k: 8 sub-blocks of 32 with a 6-bit scale sc[j] and 6-bit min m[j]
// packed in 12 bytes (ScaleMinK4); sub-block j is x = d*sc[j]*q - dmin*m[j].
// Sub-blocks 2p and 2p+1 share the 32 bytes qs[32p..32p+32): the low nibbles
// are sub-block 2p, the high nibbles 2p+1. q5_k adds bit 2p (low) and 2p+1
// (high) of qh[l] as the quant's fifth bit (+16).
// q6_k: two halves of 128; in half h, for l < 32 the quants of elements
// l, l+32, l+64, l+96 are the low nibble of ql[64h+l], the low nibble of
// ql[64h+l+32], the high nibble of ql[64h+l], the high nibble of ql[64h+l+32],
// each with a 2-bit pair of qh[32h+l] (bits 0-1, 2-3, 4-5, 6-7) above it, minus
// 32; element e of the block is x = d * scales[e / 16] * q.
//
// Thread-safe (pure functions).
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace kiln::quant {

inline constexpr int64_t kQK = 256;  // elements of a k-quant super-block

// The 6-bit scale and min of sub-block j (0..7) of a q4_k / q5_k block's
// 12 packed bytes.
inline void ScaleMinK4(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Little-endian f16 at p, widened exactly.
float LoadHalf(const uint8_t* p);

// Decodes `blocks` consecutive blocks of `dtype` at `src` into
// blocks * LayoutOf(dtype).block_elems floats at `dst`.
// REQUIRES: IsQuantized(dtype); src holds blocks * block_bytes bytes.
// The float form rounds d*sc*q - dmin*m once (as ggml does); the double form
// is exact (every product of an f16 and the small integers is), for references.
void DequantizeBlocks(DType dtype, const uint8_t* src, int64_t blocks, float* dst);
void DequantizeBlocks(DType dtype, const uint8_t* src, int64_t blocks, double* dst);

}  // namespace kiln::quant
