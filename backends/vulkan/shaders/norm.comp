#version 450
// LayerNorm / RmsNorm over rows of n trailing elements, optionally after a
// residual add (FusedResidualNorm: s = x + residual, stored in the dtype,
// optionally written out, then normalized). A workgroup per row. LayerNorm
// centers relative to the row's first element (x - shift is exact for
// nearby values) and keeps the mean as shift + delta, so a large common
// offset costs no precision; the variance is a second pass. GROUP: GroupNorm,
// a row is one group's channels times the spatial positions and scale / bias
// are per channel (index (row % groups * n + j) / spatial).
#include "dtype_io.glsl"
#include "wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool RMS = false;
layout(constant_id = 2) const bool RESIDUAL = false;
layout(constant_id = 3) const bool EMIT_SUM = false;
layout(constant_id = 4) const bool SCALE = false;
layout(constant_id = 5) const bool BIAS = false;
layout(constant_id = 6) const bool GROUP = false;

// Unused operands are bound to a dummy range.
layout(std430, binding = 0) readonly buffer X { BUF_T x[]; };
layout(std430, binding = 1) readonly buffer R { BUF_T res[]; };
layout(std430, binding = 2) readonly buffer G { BUF_T gamma[]; };
layout(std430, binding = 3) readonly buffer B { BUF_T beta[]; };
layout(std430, binding = 4) writeonly buffer Y { BUF_T y[]; };
layout(std430, binding = 5) writeonly buffer S { BUF_T sum_out[]; };
layout(push_constant) uniform Push {
  uint rows;
  uint n;
  float eps;
  uint groups;
  uint spatial;
} pc;

DEFINE_WG_REDUCE(wg_sum, float, wg_add_f)

float value(uint i) {
  if (!RESIDUAL) return LOAD_VAL(x[i]);
  // The sum as the unfused add would store it.
  return LOAD_VAL(STORE_VAL(LOAD_VAL(x[i]) + LOAD_VAL(res[i])));
}

void main() {
  const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < pc.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * pc.n;
    float shift = 0.0, delta = 0.0;  // mean = shift + delta
    if (!RMS) {
      shift = value(base);
      float part = 0.0;
      for (uint j = lid; j < pc.n; j += wg) part += value(base + j) - shift;
      delta = wg_sum(part) / float(pc.n);
    }
    float sq = 0.0;
    for (uint j = lid; j < pc.n; j += wg) {
      const float d = (value(base + j) - shift) - delta;
      sq += d * d;
    }
    const float rstd = 1.0 / sqrt(wg_sum(sq) / float(pc.n) + pc.eps);
    for (uint j = lid; j < pc.n; j += wg) {
      const float v = value(base + j);
      if (EMIT_SUM) sum_out[base + j] = STORE_VAL(v);
      float o = ((v - shift) - delta) * rstd;
      const uint p = GROUP ? ((row % pc.groups) * pc.n + j) / pc.spatial : j;
      if (SCALE) o *= LOAD_VAL(gamma[p]);
      if (BIAS) o += LOAD_VAL(beta[p]);
      y[base + j] = STORE_VAL(o);
    }
  }
}
