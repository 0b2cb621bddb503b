#version 450
// Softmax / LogSoftmax along one axis of x viewed as [outer, n, inner].
// inner == 1: a workgroup per row (ROWS); otherwise an invocation per
// (outer, inner) column. Three passes: max, sum of exp(x - max), write.
#include "dtype_io.glsl"
#include "wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool LOG = false;
layout(constant_id = 2) const bool ROWS = true;

layout(std430, binding = 0) readonly buffer X { BUF_T x[]; };
layout(std430, binding = 1) writeonly buffer Y { BUF_T y[]; };
layout(push_constant) uniform Push {
  uint outer;
  uint n;
  uint inner;
} pc;

DEFINE_WG_REDUCE(wg_max, float, wg_max_f)
DEFINE_WG_REDUCE(wg_sum, float, wg_add_f)

float result(float v, float mx, float sum) {
  return LOG ? (v - mx) - k_log(sum) : k_exp(v - mx) / sum;
}

void main() {
  if (ROWS) {
    const uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    for (uint row = gl_WorkGroupID.x; row < pc.outer; row += gl_NumWorkGroups.x) {
      const uint base = row * pc.n;
      float mx = -K_INF;
      for (uint j = lid; j < pc.n; j += wg) mx = wg_max_f(mx, LOAD_VAL(x[base + j]));
      mx = wg_max(mx);
      float sum = 0.0;
      for (uint j = lid; j < pc.n; j += wg) sum += k_exp(LOAD_VAL(x[base + j]) - mx);
      sum = wg_sum(sum);
      for (uint j = lid; j < pc.n; j += wg) y[base + j] = STORE_VAL(result(LOAD_VAL(x[base + j]), mx, sum));
    }
    return;
  }
  const uint columns = pc.outer * pc.inner;
  const uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint c = gl_GlobalInvocationID.x; c < columns; c += step) {
    const uint base = (c / pc.inner) * pc.n * pc.inner + c % pc.inner;
    float mx = -K_INF;
    for (uint j = 0u; j < pc.n; ++j) mx = wg_max_f(mx, LOAD_VAL(x[base + j * pc.inner]));
    float sum = 0.0;
    for (uint j = 0u; j < pc.n; ++j) sum += k_exp(LOAD_VAL(x[base + j * pc.inner]) - mx);
    for (uint j = 0u; j < pc.n; ++j) {
      y[base + j * pc.inner] = STORE_VAL(result(LOAD_VAL(x[base + j * pc.inner]), mx, sum));
    }
  }
}
