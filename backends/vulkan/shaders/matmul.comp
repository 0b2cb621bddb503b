#version 450
// Batched C = act(op(A) @ op(B) + bias) + residual, tiled through shared
// memory. A workgroup computes a BM x BN tile of one batch; each invocation
// a TM x TN block of it (rows ty + i * (BM / TM), columns tx + j * (BN / TN)
// so neighbours read neighbouring shared words). A and B are staged BK deep.
// Accumulation is f32 whatever the storage dtype. Batch dims (up to 4 after
// collapsing) broadcast through zero strides.
#include "dtype_io.glsl"
#include "epilogue.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 4;
layout(constant_id = 5) const uint TN = 4;
layout(constant_id = 6) const bool TRANS_A = false;  // A is [K, M]
layout(constant_id = 7) const bool TRANS_B = false;  // B is [N, K]
layout(constant_id = 8) const uint ACT = 0;          // UnaryKind, 0 = none
layout(constant_id = 9) const bool HAS_BIAS = false;
layout(constant_id = 10) const bool HAS_RESIDUAL = false;

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
  uint a_strides[4];  // elements, 0 where A broadcasts
  uint b_strides[4];
} pc;

// Rows padded by one word: the transposed staging writes stay conflict-free.
shared float As[BK][BM + 1];
shared float Bs[BK][BN + 1];

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint WG = gl_WorkGroupSize.x;  // (BM / TM) * (BN / TN)
  const uint tx = lid % (BN / TN), ty = lid / (BN / TN);
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  for (uint batch = gl_WorkGroupID.z; batch < pc.batch; batch += gl_NumWorkGroups.z) {
    uint a_off = 0u, b_off = 0u, rem = batch;
    for (int d = int(pc.batch_rank) - 1; d >= 0; --d) {
      const uint i = rem % pc.batch_dims[d];
      rem /= pc.batch_dims[d];
      a_off += i * pc.a_strides[d];
      b_off += i * pc.b_strides[d];
    }
    float acc[TM][TN];
    for (uint i = 0u; i < TM; ++i) {
      for (uint j = 0u; j < TN; ++j) acc[i][j] = 0.0;
    }
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
      // Stage A[m0 .. m0 + BM, k0 .. k0 + BK] and B[k0 .., n0 ..], zero-padded.
      for (uint e = lid; e < BM * BK; e += WG) {
        const uint mm = TRANS_A ? e % BM : e / BK, kk = TRANS_A ? e / BM : e % BK;
        const uint m = m0 + mm, k = k0 + kk;
        float v = 0.0;
        if (m < pc.M && k < pc.K) {
          v = LOAD_VAL(a[a_off + (TRANS_A ? k * pc.M + m : m * pc.K + k)]);
        }
        As[kk][mm] = v;
      }
      for (uint e = lid; e < BN * BK; e += WG) {
        const uint nn = TRANS_B ? e / BK : e % BN, kk = TRANS_B ? e % BK : e / BN;
        const uint n = n0 + nn, k = k0 + kk;
        float v = 0.0;
        if (n < pc.N && k < pc.K) {
          v = LOAD_VAL(b[b_off + (TRANS_B ? n * pc.K + k : k * pc.N + n)]);
        }
        Bs[kk][nn] = v;
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
        if (n >= pc.N) continue;
        const uint at = (batch * pc.M + m) * pc.N + n;
        float v = acc[i][j];
        if (HAS_BIAS) v += LOAD_VAL(bias[at % pc.bias_count]);
        v = k_activate(ACT, v);
        if (HAS_RESIDUAL) v += LOAD_VAL(res[at]);
        c[at] = STORE_VAL(v);
      }
    }
  }
}
