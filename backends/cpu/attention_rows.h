// The attention kernel's row steps (kernels_attention.cc) on one row of a
// block's logits: its max, and exp(x - shift) in place with the sum. The
// AVX-512 forms (attention_rows_avx512.cc, compiled with its own -m flags)
// run where the CPU has AVX-512 (BestSmallMatMulIsa(): KILN_CPU_NO_AVX512=1
// forces the AVX2 forms); both compute the same Cephes exp (about 2 ulp), and
// arguments below -87 (-inf included) give exactly 0.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// max(x[0, n)); -inf for n = 0.
float AttnRowMaxAvx512(const float* x, int64_t n);
// x[j] = exp(x[j] - shift) for j < n; returns their sum.
float AttnExpShiftSumAvx512(float* x, int64_t n, float shift);
// Keys [0, cols) of a K block (key j's d floats at k + j * ldk), times
// `scale`, as panels of 16 keys for SmallMatMulAvx512 (the B of Q @ K^T):
// panel p holds dim kk's 16 keys at out + (p * d + kk) * 16; keys past cols
// are zero. 16 x 16 transposes in registers.
void AttnPackKeysAvx512(const float* k, int64_t ldk, int64_t cols, int64_t d, float scale,
                        float* out);

}  // namespace kiln::cpu
