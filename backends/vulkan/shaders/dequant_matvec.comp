#version 450
// DequantMatMul for a few activation rows (decoding) on a weight stored
// [N, K] (GGUF's linear layer): y[m, n] = sum_k x[m, k] * W[n, k]. A
// workgroup takes one weight row at a time; its invocations stride over the
// row's 32-element quant groups, decode each in registers once and multiply
// it into up to ROWS activation rows, then reduce through shared memory. The
// weights are read once per ROWS activation rows (the host sends M <= ROWS
// here). Accumulates in f32.
#extension GL_EXT_shader_16bit_storage : require
#include "dtype_io.glsl"

layout(local_size_x_id = 0) in;               // a power of two
layout(constant_id = 1) const uint WTYPE = 0;  // DQ_Q8_0 ... DQ_Q6_K
const uint ROWS = 4u;

layout(std430, binding = 0) readonly buffer X { BUF_T x[]; };
layout(std430, binding = 1) readonly buffer W { uint16_t w[]; };
layout(std430, binding = 2) writeonly buffer Y { BUF_T y[]; };
layout(push_constant) uniform Push {
  uint M, N, K;
  uint row_bytes;  // bytes of one stored weight row
} pc;

#include "dequant_blocks.glsl"

shared float partial[ROWS][gl_WorkGroupSize.x];

void main() {
  const uint lid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
  const uint groups = pc.K / 32u;
  const uint e0 = 8u * (lid & 3u), per_step = WG / 4u;
  for (uint n = gl_WorkGroupID.x; n < pc.N; n += gl_NumWorkGroups.x) {
    const uint row = n * pc.row_bytes;
    for (uint m0 = 0u; m0 < pc.M; m0 += ROWS) {
      const uint rows = min(ROWS, pc.M - m0);
      float acc[ROWS];
      for (uint r = 0u; r < ROWS; ++r) acc[r] = 0.0;
      for (uint g = lid / 4u; g < groups; g += per_step) {
        float v[8];
        dq_part8(row + (g / DQ_GROUPS) * DQ_BLOCK_BYTES, g % DQ_GROUPS, e0, v);
        for (uint r = 0u; r < rows; ++r) {
          const uint xo = (m0 + r) * pc.K + 32u * g + e0;
          float s = 0.0;
          for (uint l = 0u; l < 8u; ++l) s = fma(v[l], LOAD_VAL(x[xo + l]), s);
          acc[r] += s;
        }
      }
      for (uint r = 0u; r < ROWS; ++r) partial[r][lid] = acc[r];
      barrier();
      for (uint half_ = WG / 2u; half_ > 0u; half_ >>= 1) {
        if (lid < half_) {
          for (uint r = 0u; r < ROWS; ++r) partial[r][lid] += partial[r][lid + half_];
        }
        barrier();
      }
      if (lid < rows) y[(m0 + lid) * pc.N + n] = STORE_VAL(partial[lid][0]);
      barrier();
    }
  }
}
