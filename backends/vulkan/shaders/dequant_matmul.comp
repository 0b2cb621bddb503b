#version 450
// DequantMatMul, tiled: y[m, n] = sum_k x[m, k] * W(k, n) for any M, with the
// weight stored [N, K] (TRANS_B, GGUF's linear layer) or [K, N]; its blocks
// run along the stored rows. A workgroup computes a BM x BN tile of y; each
// invocation a TM x TN block of it. Each step stages BK = 32 values of K: the
// x tile, and the weight tile decoded from its quant groups into shared
// memory (one 32-element group per weight row for [N, K], BN / 32 groups per
// K row for [K, N]), so every block is decoded once per workgroup. f32
// accumulation.
#extension GL_EXT_shader_16bit_storage : require
#include "dtype_io.glsl"

layout(local_size_x_id = 0) in;  // (BM / TM) * (BN / TN)
layout(constant_id = 1) const uint WTYPE = 0;
layout(constant_id = 2) const bool TRANS_B = true;  // W is [N, K]
const uint BM = 32u, BN = 64u, BK = 32u, TM = 2u, TN = 4u;

layout(std430, binding = 0) readonly buffer X { BUF_T x[]; };
layout(std430, binding = 1) readonly buffer W { uint16_t w[]; };
layout(std430, binding = 2) writeonly buffer Y { BUF_T y[]; };
layout(push_constant) uniform Push {
  uint M, N, K;
  uint row_bytes;
} pc;

#include "dequant_blocks.glsl"

shared float As[BK][BM + 1];
shared float Bs[BK][BN + 1];

void main() {
  const uint lid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
  const uint tx = lid % (BN / TN), ty = lid / (BN / TN);
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  float acc[TM][TN];
  for (uint i = 0u; i < TM; ++i) {
    for (uint j = 0u; j < TN; ++j) acc[i][j] = 0.0;
  }
  for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
    for (uint e = lid; e < BM * BK; e += WG) {
      const uint mm = e / BK, kk = e % BK, m = m0 + mm, k = k0 + kk;
      As[kk][mm] = m < pc.M && k < pc.K ? LOAD_VAL(x[m * pc.K + k]) : 0.0;
    }
    if (TRANS_B) {
      // K is whole blocks, so the group of k0 .. k0 + 31 is whole.
      for (uint nn = lid; nn < BN; nn += WG) {
        const uint n = n0 + nn;
        float v[32];
        if (n < pc.N) {
          dq_group(n * pc.row_bytes + (k0 / DQ_BLOCK_ELEMS) * DQ_BLOCK_BYTES,
                   (k0 % DQ_BLOCK_ELEMS) / 32u, v);
        } else {
          for (uint l = 0u; l < 32u; ++l) v[l] = 0.0;
        }
        for (uint l = 0u; l < 32u; ++l) Bs[l][nn] = v[l];
      }
    } else {
      // N is whole blocks, so a group starting below N is whole.
      for (uint t = lid; t < BK * (BN / 32u); t += WG) {
        const uint kk = t / (BN / 32u), c = t % (BN / 32u), k = k0 + kk, n = n0 + 32u * c;
        float v[32];
        if (k < pc.K && n < pc.N) {
          dq_group(k * pc.row_bytes + (n / DQ_BLOCK_ELEMS) * DQ_BLOCK_BYTES,
                   (n % DQ_BLOCK_ELEMS) / 32u, v);
        } else {
          for (uint l = 0u; l < 32u; ++l) v[l] = 0.0;
        }
        for (uint l = 0u; l < 32u; ++l) Bs[kk][32u * c + l] = v[l];
      }
    }
    barrier();
    for (uint kk = 0u; kk < BK; ++kk) {
      float ra[TM], rb[TN];
      for (uint i = 0u; i < TM; ++i) ra[i] = As[kk][ty + i * (BM / TM)];
      for (uint j = 0u; j < TN; ++j) rb[j] = Bs[kk][tx + j * (BN / TN)];
      for (uint i = 0u; i < TM; ++i) {
        for (uint j = 0u; j < TN; ++j) acc[i][j] = fma(ra[i], rb[j], acc[i][j]);
      }
    }
    barrier();
  }
  for (uint i = 0u; i < TM; ++i) {
    const uint m = m0 + ty + i * (BM / TM);
    if (m >= pc.M) continue;
    for (uint j = 0u; j < TN; ++j) {
      const uint n = n0 + tx + j * (BN / TN);
      if (n < pc.N) y[m * pc.N + n] = STORE_VAL(acc[i][j]);
    }
  }
}
