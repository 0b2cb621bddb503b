#version 450
// f16 C = act(op(A) @ op(B) + bias) + residual on cooperative matrices
// (VK_NV_cooperative_matrix: 16x16x16, f16 inputs, f32 accumulation). A
// workgroup of SG_M x SG_N subgroups computes a (SG_M * FM * 16) x
// (SG_N * FN * 16) tile; each subgroup FM x FN fragments, loaded straight
// from global memory. The f32 tile then goes through shared memory for the
// epilogue and the f16 store. REQUIRES: M, N, K multiples of 16 (the host
// checks), so no fragment straddles an edge.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#include "kmath.glsl"
#include "epilogue.glsl"

layout(local_size_x_id = 0) in;  // SG_M * SG_N * subgroup size
layout(constant_id = 1) const uint SG_M = 2;
layout(constant_id = 2) const uint SG_N = 2;
layout(constant_id = 3) const uint FM = 2;
layout(constant_id = 4) const uint FN = 2;
layout(constant_id = 5) const bool TRANS_A = false;
layout(constant_id = 6) const bool TRANS_B = false;
layout(constant_id = 7) const uint ACT = 0;
layout(constant_id = 8) const bool HAS_BIAS = false;
layout(constant_id = 9) const bool HAS_RESIDUAL = false;

layout(std430, binding = 0) readonly buffer A { float16_t a[]; };
layout(std430, binding = 1) readonly buffer B { float16_t b[]; };
layout(std430, binding = 2) readonly buffer Bias { uint16_t bias[]; };
layout(std430, binding = 3) readonly buffer Res { uint16_t res[]; };
layout(std430, binding = 4) writeonly buffer C { uint16_t c[]; };
layout(push_constant) uniform Push {
  uint M, N, K;
  uint batch;
  uint batch_rank;
  uint bias_count;
  uint batch_dims[4];
  uint a_strides[4];
  uint b_strides[4];
} pc;

const uint TILE_M = SG_M * FM * 16;
const uint TILE_N = SG_N * FN * 16;
shared float tile[TILE_M * TILE_N];

void main() {
  const uint sgm = gl_SubgroupID / SG_N, sgn = gl_SubgroupID % SG_N;
  const uint m0 = gl_WorkGroupID.y * TILE_M, n0 = gl_WorkGroupID.x * TILE_N;
  for (uint batch = gl_WorkGroupID.z; batch < pc.batch; batch += gl_NumWorkGroups.z) {
    uint a_off = 0u, b_off = 0u, rem = batch;
    for (int d = int(pc.batch_rank) - 1; d >= 0; --d) {
      const uint i = rem % pc.batch_dims[d];
      rem /= pc.batch_dims[d];
      a_off += i * pc.a_strides[d];
      b_off += i * pc.b_strides[d];
    }
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
    for (uint i = 0u; i < FM; ++i) {
      for (uint j = 0u; j < FN; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    }
    for (uint k = 0u; k < pc.K; k += 16u) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];
      for (uint i = 0u; i < FM; ++i) {
        const uint m = m0 + (sgm * FM + i) * 16u;
        fa[i] = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(0.0);
        if (m < pc.M) {
          coopMatLoadNV(fa[i], a, a_off + (TRANS_A ? k * pc.M + m : m * pc.K + k),
                        TRANS_A ? pc.M : pc.K, TRANS_A);
        }
      }
      for (uint j = 0u; j < FN; ++j) {
        const uint n = n0 + (sgn * FN + j) * 16u;
        fb[j] = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(0.0);
        if (n < pc.N) {
          coopMatLoadNV(fb[j], b, b_off + (TRANS_B ? n * pc.K + k : k * pc.N + n),
                        TRANS_B ? pc.K : pc.N, TRANS_B);
        }
      }
      for (uint i = 0u; i < FM; ++i) {
        for (uint j = 0u; j < FN; ++j) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
      }
    }
    for (uint i = 0u; i < FM; ++i) {
      for (uint j = 0u; j < FN; ++j) {
        const uint r = (sgm * FM + i) * 16u, col = (sgn * FN + j) * 16u;
        coopMatStoreNV(acc[i][j], tile, r * TILE_N + col, TILE_N, false);
      }
    }
    barrier();
    for (uint e = gl_LocalInvocationID.x; e < TILE_M * TILE_N; e += gl_WorkGroupSize.x) {
      const uint m = m0 + e / TILE_N, n = n0 + e % TILE_N;
      if (m >= pc.M || n >= pc.N) continue;
      const uint at = (batch * pc.M + m) * pc.N + n;
      float v = tile[e];
      if (HAS_BIAS) v += k_f16_to_f32(uint(bias[at % pc.bias_count]));
      v = k_activate(ACT, v);
      if (HAS_RESIDUAL) v += k_f16_to_f32(uint(res[at]));
      c[at] = uint16_t(k_f32_to_f16(v));
    }
    barrier();
  }
}
