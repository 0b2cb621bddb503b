#version 450
// Matrix-vector products (decoding: M == 1 or N == 1) where both operands
// run contiguously along K: a subgroup per output element, its lanes
// striding over K, combined with subgroupAdd. The same epilogue and batch
// broadcasting as matmul.comp. REQUIRES: subgroup arithmetic in compute.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "dtype_io.glsl"
#include "epilogue.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ACT = 0;
layout(constant_id = 2) const bool HAS_BIAS = false;
layout(constant_id = 3) const bool HAS_RESIDUAL = false;

layout(std430, binding = 0) readonly buffer A { BUF_T a[]; };
layout(std430, binding = 1) readonly buffer B { BUF_T b[]; };
layout(std430, binding = 2) readonly buffer Bias { BUF_T bias[]; };
layout(std430, binding = 3) readonly buffer Res { BUF_T res[]; };
layout(std430, binding = 4) writeonly buffer C { BUF_T c[]; };
layout(push_constant) uniform Push {
  uint M, N, K;
  uint batch;
  uint batch_rank;
  uint bias_count;
  uint batch_dims[4];
  uint a_strides[4];
  uint b_strides[4];
} pc;

void main() {
  const uint per_group = gl_NumSubgroups;
  const uint total = pc.batch * pc.M * pc.N;
  for (uint out_i = gl_WorkGroupID.x * per_group + gl_SubgroupID; out_i < total;
       out_i += gl_NumWorkGroups.x * per_group) {
    const uint n = out_i % pc.N, m = (out_i / pc.N) % pc.M, batch = out_i / (pc.M * pc.N);
    uint a_off = 0u, b_off = 0u, rem = batch;
    for (int d = int(pc.batch_rank) - 1; d >= 0; --d) {
      const uint i = rem % pc.batch_dims[d];
      rem /= pc.batch_dims[d];
      a_off += i * pc.a_strides[d];
      b_off += i * pc.b_strides[d];
    }
    // Row m of A and column n of B, both contiguous along K (M or N is 1).
    a_off += m * pc.K;
    b_off += n * pc.K;
    float acc = 0.0;
    for (uint k = gl_SubgroupInvocationID; k < pc.K; k += gl_SubgroupSize) {
      acc = fma(LOAD_VAL(a[a_off + k]), LOAD_VAL(b[b_off + k]), acc);
    }
    acc = subgroupAdd(acc);
    if (subgroupElect()) {
      const uint at = out_i;
      float v = acc;
      if (HAS_BIAS) v += LOAD_VAL(bias[at % pc.bias_count]);
      v = k_activate(ACT, v);
      if (HAS_RESIDUAL) v += LOAD_VAL(res[at]);
      c[at] = STORE_VAL(v);
    }
  }
}
