#version 450
// f16 C = act(op(A) @ op(B) + bias) + residual on cooperative matrices
// (VK_NV_cooperative_matrix: 16x16x16, f16 inputs, f32 accumulation).
//
// A workgroup of SG_M x SG_N subgroups computes a BM x BN tile; each subgroup
// a (BM / SG_M) x (BN / SG_N) block of 16x16 fragments. A and B are staged
// BK deep in shared memory: while the subgroups multiply stage t, every
// invocation holds the 128-bit global loads of stage t + 1 in registers and
// stores them afterwards, into the other buffer (STAGES 2, one barrier per
// stage) or, after a barrier, into the same one (STAGES 1: half the shared
// memory, so a deeper BK fits). Shared rows are the tile's contiguous global
// rows (a transposed operand is staged as stored and read column-major),
// padded by 8 halves so the fragment loads hit distinct banks. Tiles visit
// the grid in GROUP_M-row bands for L2 reuse of B. The epilogue goes through
// a 16x16 f32 scratch per subgroup and stores 8 halves per invocation.
//
// REQUIRES (the host checks): M, N, K multiples of 16 (so every 8-half
// vector and every fragment is wholly inside or outside the matrix), buffer
// offsets multiples of 16 bytes, subgroups of 32, and BM, BN, BK, SG_M, SG_N
// such that the fragments tile the block.
//
// COOP_EMULATE builds the same kernel without cooperative matrices, for
// testing the tiling on devices that lack them (lavapipe): "subgroups" are
// 32 consecutive invocations that synchronize through workgroup barriers,
// and fragments are computed element by element from shared memory. Slow.
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require
#ifndef COOP_EMULATE
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "kmath.glsl"
#include "epilogue.glsl"

layout(local_size_x_id = 0) in;  // SG_M * SG_N * 32
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint BK = 32;
layout(constant_id = 4) const uint SG_M = 2;
layout(constant_id = 5) const uint SG_N = 4;
layout(constant_id = 6) const bool TRANS_A = false;  // A is [K, M]
layout(constant_id = 7) const bool TRANS_B = false;  // B is [N, K]
layout(constant_id = 8) const uint ACT = 0;          // UnaryKind, 0 = none
layout(constant_id = 9) const bool HAS_BIAS = false;
layout(constant_id = 10) const bool HAS_RESIDUAL = false;
layout(constant_id = 11) const uint GROUP_M = 8;  // 1 = plain row-major tile order
// 2: double-buffered staging (one barrier per stage); 1: one buffer, two
// barriers per stage, half the shared memory (deeper BK).
layout(constant_id = 12) const uint STAGES = 2;
// 0: a k-step loads all its A and B fragments, then multiplies; 1: loads
// the B fragments, then each A fragment just before its products (fewer
// live registers).
layout(constant_id = 13) const uint ORDER = 0;

layout(std430, binding = 0) readonly buffer A { uvec4 a[]; };  // 8 halves per element
layout(std430, binding = 1) readonly buffer B { uvec4 b[]; };
layout(std430, binding = 2) readonly buffer Bias { uint16_t bias[]; };
layout(std430, binding = 3) readonly buffer Res { uvec4 res[]; };
layout(std430, binding = 4) writeonly buffer C { uvec4 c[]; };
layout(push_constant) uniform Push {
  uint M, N, K;
  uint batch;
  uint batch_rank;
  uint bias_count;
  uint batch_dims[4];
  uint a_strides[4];  // elements, 0 where A broadcasts
  uint b_strides[4];
} pc;

const uint WG = SG_M * SG_N * 32;
const uint FM = BM / (SG_M * 16), FN = BN / (SG_N * 16);
// Staged tiles, in uvec4s: rows as stored in global memory, + 1 vector of pad.
const uint A_ROWS = TRANS_A ? BK : BM, A_VPR = (TRANS_A ? BM : BK) / 8, A_LD = A_VPR + 1;
const uint B_ROWS = TRANS_B ? BN : BK, B_VPR = (TRANS_B ? BK : BN) / 8, B_LD = B_VPR + 1;
const uint A_STAGE = A_ROWS * A_LD, B_STAGE = B_ROWS * B_LD;
const uint A_LOADS = (A_ROWS * A_VPR + WG - 1) / WG, B_LOADS = (B_ROWS * B_VPR + WG - 1) / WG;
// The epilogue scratch (16 rows of 16 floats + 1 vector of pad, per subgroup)
// reuses the staging memory.
const uint SCRATCH_LD = 5, SCRATCH = 16 * SCRATCH_LD;
const uint STAGING = STAGES * (A_STAGE + B_STAGE);
const uint SMEM = STAGING > SG_M * SG_N * SCRATCH ? STAGING : SG_M * SG_N * SCRATCH;
shared uvec4 smem[SMEM];

uvec4 pa[A_LOADS], pb[B_LOADS];

#ifndef COOP_EMULATE
#define FRAG16 fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAG32 fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define FRAG32_ZERO FRAG32(0.0)
// Fragment (row r, column c) at smem[off + r * ld] (rows contiguous) or
// smem[off + c * ld] (columns contiguous); off and ld in uvec4s.
#define FRAG_LOAD(f, off, ld, col_major) coopMatLoadNV(f, smem, off, ld, col_major)
#define FRAG_MAD(a, b, c) coopMatMulAddNV(a, b, c)
#define FRAG_STORE(f, off, ld) coopMatStoreNV(f, smem, off, ld, false)
#define SG_ID gl_SubgroupID
#define SG_LANE gl_SubgroupInvocationID
#define SG_SYNC() \
  subgroupMemoryBarrierShared(); \
  subgroupBarrier()
#else
// A/B fragments are views of the staged tile (it does not change between the
// load and the multiply); each lane of an accumulator holds elements
// lane + 32 * t (row-major), t < 8.
struct FragView { uint off, ld; bool col_major; };
struct FragAcc { float v[8]; };
#define FRAG16 FragView
#define FRAG32 FragAcc
#define FRAG32_ZERO FragAcc(float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
#define FRAG_LOAD(f, off, ld, col_major) f = FragView(off, ld, col_major)
#define FRAG_MAD(a, b, c) emu_mad(a, b, c)
#define FRAG_STORE(f, off, ld) emu_store(f, off, ld)
#define SG_ID (gl_LocalInvocationID.x / 32u)
#define SG_LANE (gl_LocalInvocationID.x % 32u)
#define SG_SYNC() \
  memoryBarrierShared(); \
  barrier()
float emu_at(FragView f, uint r, uint c) {
  const uint h = (f.off + (f.col_major ? c : r) * f.ld) * 8u + (f.col_major ? r : c);
  const uint w = smem[h / 8u][(h % 8u) / 2u];
  return k_f16_to_f32((h % 2u) == 0u ? (w & 0xffffu) : (w >> 16));
}
FragAcc emu_mad(FragView a, FragView b, FragAcc c) {
  [[dont_unroll]] for (uint t = 0u; t < 8u; ++t) {
    const uint e = SG_LANE + 32u * t;
    float sum = c.v[t];
    [[dont_unroll]] for (uint k = 0u; k < 16u; ++k) {
      sum += emu_at(a, e / 16u, k) * emu_at(b, k, e % 16u);
    }
    c.v[t] = sum;
  }
  return c;
}
void emu_store(FragAcc f, uint off, uint ld) {
  [[dont_unroll]] for (uint t = 0u; t < 8u; ++t) {
    const uint e = SG_LANE + 32u * t;
    smem[off + (e / 16u) * ld + (e % 16u) / 4u][e % 4u] = floatBitsToUint(f.v[t]);
  }
}
#endif

// Global rows of the A and B tiles starting at k0 into pa / pb (zeros outside).
void fetch(uint a_off, uint b_off, uint m0, uint n0, uint k0) {
  const uint lid = gl_LocalInvocationID.x;
  [[unroll]] for (uint l = 0u; l < A_LOADS; ++l) {
    const uint e = lid + l * WG, r = e / A_VPR, col = (e % A_VPR) * 8u;
    const uint row_g = (TRANS_A ? k0 : m0) + r, col_g = (TRANS_A ? m0 : k0) + col;
    const uint rows = TRANS_A ? pc.K : pc.M, cols = TRANS_A ? pc.M : pc.K;
    pa[l] = uvec4(0u);
    if (e < A_ROWS * A_VPR && row_g < rows && col_g < cols) {
      pa[l] = a[(a_off + row_g * cols + col_g) / 8u];
    }
  }
  [[unroll]] for (uint l = 0u; l < B_LOADS; ++l) {
    const uint e = lid + l * WG, r = e / B_VPR, col = (e % B_VPR) * 8u;
    const uint row_g = (TRANS_B ? n0 : k0) + r, col_g = (TRANS_B ? k0 : n0) + col;
    const uint rows = TRANS_B ? pc.N : pc.K, cols = TRANS_B ? pc.K : pc.N;
    pb[l] = uvec4(0u);
    if (e < B_ROWS * B_VPR && row_g < rows && col_g < cols) {
      pb[l] = b[(b_off + row_g * cols + col_g) / 8u];
    }
  }
}

void stage(uint buf) {
  const uint lid = gl_LocalInvocationID.x;
  const uint a_base = buf * A_STAGE, b_base = STAGES * A_STAGE + buf * B_STAGE;
  [[unroll]] for (uint l = 0u; l < A_LOADS; ++l) {
    const uint e = lid + l * WG;
    if (e < A_ROWS * A_VPR) smem[a_base + (e / A_VPR) * A_LD + e % A_VPR] = pa[l];
  }
  [[unroll]] for (uint l = 0u; l < B_LOADS; ++l) {
    const uint e = lid + l * WG;
    if (e < B_ROWS * B_VPR) smem[b_base + (e / B_VPR) * B_LD + e % B_VPR] = pb[l];
  }
}

void main() {
  const uint sgm = SG_ID / SG_N, sgn = SG_ID % SG_N, lane = SG_LANE;
  // Tile order: bands of GROUP_M tile rows, column by column inside a band.
  const uint tiles_n = gl_NumWorkGroups.x, tiles_m = gl_NumWorkGroups.y;
  const uint id = gl_WorkGroupID.y * tiles_n + gl_WorkGroupID.x;
  const uint band = id / (GROUP_M * tiles_n), first = band * GROUP_M;
  const uint rows_in_band = min(tiles_m - first, GROUP_M);
  const uint in_band = id - band * GROUP_M * tiles_n;
  const uint m0 = (first + in_band % rows_in_band) * BM, n0 = (in_band / rows_in_band) * BN;
  const uint stages = (pc.K + BK - 1u) / BK;
  for (uint batch = gl_WorkGroupID.z; batch < pc.batch; batch += gl_NumWorkGroups.z) {
    uint a_off = 0u, b_off = 0u, rem = batch;
    for (int d = int(pc.batch_rank) - 1; d >= 0; --d) {
      const uint i = rem % pc.batch_dims[d];
      rem /= pc.batch_dims[d];
      a_off += i * pc.a_strides[d];
      b_off += i * pc.b_strides[d];
    }
    FRAG32 acc[FM][FN];
    [[unroll]] for (uint i = 0u; i < FM; ++i) {
      [[unroll]] for (uint j = 0u; j < FN; ++j) acc[i][j] = FRAG32_ZERO;
    }
    fetch(a_off, b_off, m0, n0, 0u);
    stage(0u);
    barrier();
    for (uint t = 0u; t < stages; ++t) {
      const uint buf = STAGES == 2u ? t & 1u : 0u;
      const bool more = t + 1u < stages;
      if (more) fetch(a_off, b_off, m0, n0, (t + 1u) * BK);
      const uint a_base = buf * A_STAGE, b_base = STAGES * A_STAGE + buf * B_STAGE;
      [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
        FRAG16 fa[FM], fb[FN];
        [[unroll]] for (uint j = 0u; j < FN; ++j) {
          const uint nn = (sgn * FN + j) * 16u;
          FRAG_LOAD(fb[j], b_base + (TRANS_B ? nn * B_LD + kk / 8u : kk * B_LD + nn / 8u), B_LD,
                    TRANS_B);
        }
        [[unroll]] for (uint i = 0u; i < FM; ++i) {
          // ORDER 0: every A fragment at i == 0; ORDER 1: fragment i now.
          [[unroll]] for (uint i2 = i; i2 < (ORDER == 0u ? (i == 0u ? FM : 0u) : i + 1u); ++i2) {
            const uint mm = (sgm * FM + i2) * 16u;
            FRAG_LOAD(fa[i2], a_base + (TRANS_A ? kk * A_LD + mm / 8u : mm * A_LD + kk / 8u), A_LD,
                      TRANS_A);
          }
          [[unroll]] for (uint j = 0u; j < FN; ++j) {
            acc[i][j] = FRAG_MAD(fa[i], fb[j], acc[i][j]);
          }
        }
      }
      if (STAGES == 1u) barrier();  // everyone is done reading the one buffer
      if (more) stage(STAGES == 2u ? buf ^ 1u : 0u);
      barrier();
    }
    // Epilogue: lane l takes row l / 2, halves (l % 2) * 8 .. + 8 of each fragment.
    const uint scratch = SG_ID * SCRATCH;
    const uint row = lane / 2u, half8 = (lane % 2u) * 8u;
    [[unroll]] for (uint i = 0u; i < FM; ++i) {
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
        FRAG_STORE(acc[i][j], scratch, SCRATCH_LD);
        SG_SYNC();
        const uint m = m0 + (sgm * FM + i) * 16u + row, n = n0 + (sgn * FN + j) * 16u + half8;
        if (m < pc.M && n < pc.N) {
          const uint at = (batch * pc.M + m) * pc.N + n;
          uvec4 packed;
          // Not unrolled: each pass inlines k_activate twice (the SPIR-V stays small).
          [[dont_unroll]] for (uint p = 0u; p < 4u; ++p) {
            const uvec4 s = smem[scratch + row * SCRATCH_LD + half8 / 4u + p / 2u];
            const uint r = HAS_RESIDUAL ? res[at / 8u][p] : 0u;
            const uint w = (p % 2u) * 2u;
            float v[2] = {uintBitsToFloat(s[w]), uintBitsToFloat(s[w + 1u])};
            [[unroll]] for (uint h = 0u; h < 2u; ++h) {
              if (HAS_BIAS) v[h] += k_f16_to_f32(uint(bias[(at + 2u * p + h) % pc.bias_count]));
              v[h] = k_activate(ACT, v[h]);
              if (HAS_RESIDUAL) v[h] += k_f16_to_f32(h == 0u ? (r & 0xffffu) : (r >> 16));
            }
            packed[p] = k_f32_to_f16(v[0]) | (k_f32_to_f16(v[1]) << 16);
          }
          c[at / 8u] = packed;
        }
        SG_SYNC();  // the scratch is rewritten by the next fragment
      }
    }
    barrier();  // the scratch is the next batch's staging memory
  }
}
