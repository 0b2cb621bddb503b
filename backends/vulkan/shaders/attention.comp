#version 450
// Blocked attention with an online softmax (FlashAttention's schedule).
// q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] -> o [B, Hq, Sq, Dv].
// A workgroup takes BR query rows of one (batch, head) and walks key blocks
// of BC: logits = scale * q.k, then softcap, then the additive bias (MASK_BIAS);
// structural masks align the last query with the last key (query i sits at
// position i + Sk - Sq); a -inf logit is masked too. Each row keeps its
// running max and sum; a row that sees no key at all outputs zeros. Key
// blocks no row of the workgroup can see (causal, prefix, window) are
// skipped. Query head h reads kv head h / (Hq / Hkv) (GQA, MQA).
#include "dtype_io.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BR = 16;    // query rows per workgroup
layout(constant_id = 2) const uint BC = 32;    // keys per block
layout(constant_id = 3) const uint DMAX = 64;  // >= D and Dv

layout(std430, binding = 0) readonly buffer Q { BUF_T q[]; };
layout(std430, binding = 1) readonly buffer K { BUF_T k[]; };
layout(std430, binding = 2) readonly buffer V { BUF_T v[]; };
layout(std430, binding = 3) readonly buffer Bias { BUF_T bias[]; };  // MASK_BIAS
layout(std430, binding = 4) readonly buffer Keep { uint keep[]; };   // MASK_CUSTOM, bool bytes
layout(std430, binding = 5) writeonly buffer O { BUF_T o[]; };
// The mask kind is a push constant, not a specialization: one pipeline per
// dtype and head-dim bucket serves every mask.
layout(push_constant) uniform Push {
  uint mask;  // MaskKind
  uint B, Hq, Hkv, Sq, Sk, D, Dv;
  uint prefix;
  uint window;
  float scale;
  float softcap;   // 0 = off
  uint keep_sq;    // custom mask: its Sq stride (0 for a [B, Sk] mask)
  uint bias_strides[4];  // over [B, Hq, Sq, Sk], 0 where the bias broadcasts
} pc;

shared float Qs[BR][DMAX];
shared float Ks[BC][DMAX];
shared float Vs[BC][DMAX];
shared float S[BR][BC];
shared float red[gl_WorkGroupSize.x];
shared float row_alpha[BR];
shared float row_sum[BR];

// Invocations per query row in the softmax step (the workgroup size is a
// multiple of BR).
const uint TPR = gl_WorkGroupSize.x / BR;

const uint O_PER_THREAD = (BR * DMAX + gl_WorkGroupSize.x - 1) / gl_WorkGroupSize.x;

bool visible(int pos, int j) {
  if (pc.mask == 1) return j <= pos;                                     // causal
  if (pc.mask == 2) return j < int(pc.prefix) || j <= pos;              // prefix
  if (pc.mask == 4) return j <= pos && pos - j < int(pc.window);        // sliding window
  return true;
}

bool custom_keep(uint b, uint i, uint j) {
  const uint idx = b * (pc.keep_sq == 0u ? pc.Sk : pc.Sq * pc.Sk) + i * pc.keep_sq + j;
  return ((keep[idx >> 2] >> (8u * (idx & 3u))) & 0xffu) != 0u;
}

void main() {
  const uint lid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
  const uint i0 = gl_WorkGroupID.x * BR;
  const uint h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
  const uint hk = h / (pc.Hq / pc.Hkv);
  const uint q_base = ((b * pc.Hq + h) * pc.Sq) * pc.D;
  const uint kv_base = (b * pc.Hkv + hk) * pc.Sk;
  const int shift = int(pc.Sk) - int(pc.Sq);

  for (uint e = lid; e < BR * DMAX; e += WG) {
    const uint qi = e / DMAX, d = e % DMAX;
    Qs[qi][d] = (i0 + qi < pc.Sq && d < pc.D) ? LOAD_VAL(q[q_base + (i0 + qi) * pc.D + d]) : 0.0;
  }
  // Row i of this invocation's softmax group, its column offset, and the
  // row's running max and sum (every member of the group keeps the same).
  const uint i = lid / TPR, c = lid % TPR;
  float m_row = -K_INF, l_row = 0.0;
  float acc[O_PER_THREAD];
  for (uint r = 0u; r < O_PER_THREAD; ++r) acc[r] = 0.0;

  // The keys any row of this workgroup may see.
  const int last_row = int(min(i0 + BR, pc.Sq)) - 1;
  int k_begin = 0, k_end = int(pc.Sk);
  if (pc.mask == 1 || pc.mask == 4) k_end = min(k_end, last_row + shift + 1);
  if (pc.mask == 2) k_end = min(k_end, max(int(pc.prefix), last_row + shift + 1));
  if (pc.mask == 4) k_begin = max(0, int(i0) + shift - int(pc.window) + 1);
  barrier();

  for (int j0 = k_begin; j0 < k_end; j0 += int(BC)) {
    for (uint e = lid; e < BC * DMAX; e += WG) {
      const uint j = e / DMAX, d = e % DMAX;
      const uint key = uint(j0) + j;
      const bool in_k = key < pc.Sk;
      Ks[j][d] = (in_k && d < pc.D) ? LOAD_VAL(k[(kv_base + key) * pc.D + d]) : 0.0;
      Vs[j][d] = (in_k && d < pc.Dv) ? LOAD_VAL(v[(kv_base + key) * pc.Dv + d]) : 0.0;
    }
    barrier();
    // Logits of row i for columns j = c, c + TPR, ...; the row's TPR
    // invocations then agree on its max and sum through `red`.
    float local_max = -K_INF;
    for (uint j = c; j < BC; j += TPR) {
      const uint row = i0 + i, key = uint(j0) + j;
      float l = -K_INF;
      if (row < pc.Sq && key < pc.Sk && visible(int(row) + shift, int(key)) &&
          (pc.mask != 5 || custom_keep(b, row, key))) {
        float dot = 0.0;
        for (uint d = 0u; d < pc.D; ++d) dot = fma(Qs[i][d], Ks[j][d], dot);
        l = pc.scale * dot;
        if (pc.softcap > 0.0) l = pc.softcap * k_tanh(l / pc.softcap);
        if (pc.mask == 6) {
          l += LOAD_VAL(bias[b * pc.bias_strides[0] + h * pc.bias_strides[1] +
                             row * pc.bias_strides[2] + key * pc.bias_strides[3]]);
        }
      }
      S[i][j] = l;
      local_max = max(local_max, l);
    }
    red[lid] = local_max;
    barrier();
    float block_max = -K_INF;
    for (uint t = 0u; t < TPR; ++t) block_max = max(block_max, red[i * TPR + t]);
    const float m_new = max(m_row, block_max);
    const float alpha = m_row == -K_INF ? 0.0 : k_exp(m_row - m_new);
    float local_sum = 0.0;
    for (uint j = c; j < BC; j += TPR) {
      const float p = S[i][j] == -K_INF ? 0.0 : k_exp(S[i][j] - m_new);
      S[i][j] = p;
      local_sum += p;
    }
    barrier();  // every invocation has read `red`
    red[lid] = local_sum;
    if (c == 0u) row_alpha[i] = alpha;
    barrier();
    float block_sum = 0.0;
    for (uint t = 0u; t < TPR; ++t) block_sum += red[i * TPR + t];
    l_row = l_row * alpha + block_sum;
    m_row = m_new;
    for (uint r = 0u; r < O_PER_THREAD; ++r) {
      const uint e = lid + r * WG;
      if (e >= BR * DMAX) break;
      const uint oi = e / DMAX, d = e % DMAX;
      float s = acc[r] * row_alpha[oi];
      for (uint j = 0u; j < BC; ++j) s = fma(S[oi][j], Vs[j][d], s);
      acc[r] = s;
    }
    barrier();
  }
  if (c == 0u) row_sum[i] = l_row;
  barrier();
  for (uint r = 0u; r < O_PER_THREAD; ++r) {
    const uint e = lid + r * WG;
    if (e >= BR * DMAX) break;
    const uint oi = e / DMAX, d = e % DMAX;
    const uint row = i0 + oi;
    if (row >= pc.Sq || d >= pc.Dv) continue;
    const float l = row_sum[oi];
    o[((b * pc.Hq + h) * pc.Sq + row) * pc.Dv + d] = STORE_VAL(l > 0.0 ? acc[r] / l : 0.0);
  }
}
