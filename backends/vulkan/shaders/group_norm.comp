#version 450
// GroupNorm's split path, for few long rows (x [N, C, spatial...] as N *
// groups rows of n = C / groups * spatial elements): a row is cut into
// chunks of PER elements per invocation (gl_WorkGroupSize.x * PER), a
// workgroup per (chunk, row) (gl_WorkGroupID.x = chunk, .y = row), so every
// compute unit works on a few rows and x is read twice instead of three
// times (norm.comp's GROUP form, a workgroup per row, reads it three times).
// PHASE 0: a chunk's mean about the row's shift (its first value) and its M2
// about that mean, both from the values held in registers (two passes, no
// cancellation), into part[2 * (row * splits + chunk)] = (mean, M2).
// PHASE 1: every workgroup combines its row's partials (Chan's parallel
// formula: mean = sum(c_b mean_b) / n, M2 = sum(M2_b + c_b (mean_b -
// mean)^2)), then normalizes its chunk: y = ((x - shift) - mean) * rstd
// (* scale + bias), per channel (channel = row % groups * n / spatial + j /
// spatial). Math in f32.
#include "dtype_io.glsl"
#include "wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint PHASE = 0;
layout(constant_id = 2) const bool SCALE = false;
layout(constant_id = 3) const bool BIAS = false;

#define PER 16

// Unused operands are bound to a dummy range.
layout(std430, binding = 0) readonly buffer X { BUF_T x[]; };
layout(std430, binding = 1) readonly buffer G { BUF_T gamma[]; };
layout(std430, binding = 2) readonly buffer B { BUF_T beta[]; };
layout(std430, binding = 3) writeonly buffer Y { BUF_T y[]; };
layout(std430, binding = 4) buffer P { float part[]; };
layout(push_constant) uniform Push {
  uint n;
  uint spatial;
  uint groups;
  uint splits;
  float eps;
} pc;

DEFINE_WG_REDUCE(wg_sum, float, wg_add_f)

void main() {
  const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  const uint chunk = wg * PER;
  const uint split = gl_WorkGroupID.x, row = gl_WorkGroupID.y;
  const uint base = row * pc.n;
  const uint c0 = split * chunk, end = min(pc.n, c0 + chunk);
  const float shift = LOAD_VAL(x[base]);
  float v[PER];
  for (uint k = 0; k < PER; ++k) {
    const uint j = c0 + k * wg + lid;
    v[k] = j < end ? LOAD_VAL(x[base + j]) - shift : 0.0;
  }
  if (PHASE == 0) {
    float s = 0.0;
    for (uint k = 0; k < PER; ++k) s += v[k];  // out-of-range values are 0
    const float mean = wg_sum(s) / float(end - c0);
    float q = 0.0;
    for (uint k = 0; k < PER; ++k) {
      const float d = v[k] - mean;
      if (c0 + k * wg + lid < end) q += d * d;
    }
    const float m2 = wg_sum(q);
    if (lid == 0) {
      part[2 * (row * pc.splits + split)] = mean;
      part[2 * (row * pc.splits + split) + 1] = m2;
    }
    return;
  }
  const uint rp = 2 * row * pc.splits;
  float a = 0.0;
  for (uint b = lid; b < pc.splits; b += wg) {
    a += float(min(pc.n, (b + 1) * chunk) - b * chunk) * part[rp + 2 * b];
  }
  const float mean = wg_sum(a) / float(pc.n);
  float q = 0.0;
  for (uint b = lid; b < pc.splits; b += wg) {
    const float d = part[rp + 2 * b] - mean;
    q += part[rp + 2 * b + 1] + float(min(pc.n, (b + 1) * chunk) - b * chunk) * d * d;
  }
  const float rstd = 1.0 / sqrt(wg_sum(q) / float(pc.n) + pc.eps);
  const uint ch0 = (row % pc.groups) * (pc.n / pc.spatial);
  for (uint k = 0; k < PER; ++k) {
    const uint j = c0 + k * wg + lid;
    if (j >= end) continue;
    float o = (v[k] - mean) * rstd;
    const uint ch = ch0 + j / pc.spatial;
    if (SCALE) o *= LOAD_VAL(gamma[ch]);
    if (BIAS) o += LOAD_VAL(beta[ch]);
    y[base + j] = STORE_VAL(o);
  }
}
