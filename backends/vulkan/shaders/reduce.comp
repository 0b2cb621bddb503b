#version 450
// Reduce (sum, mean, max, min, prod) over any set of axes. The host collapses
// the input into alternating runs of kept and reduced dims (at most 4 of
// each); output element o walks the kept dims, reduction index r the reduced
// ones. Two modes: a workgroup per output (PER_THREAD = false; long
// reductions) or an invocation per output (many outputs whose innermost dim
// is kept: neighbours read neighbours). Floats accumulate in f32 (sums with
// Kahan compensation), integers in 32/64 bits with wrapping; max and min
// propagate NaN.
#include "dtype_io.glsl"
#include "wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint KIND = 1;  // ReduceKind: 1 sum, 2 mean, 3 max, 4 min, 5 prod
layout(constant_id = 2) const bool PER_THREAD = false;

layout(std430, binding = 0) readonly buffer X { BUF_T x[]; };
layout(std430, binding = 1) writeonly buffer Y { BUF_T y[]; };
layout(push_constant) uniform Push {
  uint n_out;
  uint red_count;
  uint kept_rank;
  uint red_rank;
  uint kept_dims[4];
  uint kept_strides[4];
  uint red_dims[4];
  uint red_strides[4];
} pc;

VAL_T identity() {
  if (KIND == 3) return VAL_LOWEST;
  if (KIND == 4) return VAL_HIGHEST;
  if (KIND == 5) return VAL_ONE;
  return VAL_ZERO;
}

VAL_T combine(VAL_T a, VAL_T b) {
#if VAL_IS_FLOAT
  if ((KIND == 3 || KIND == 4) && (isnan(a) || isnan(b))) return K_NAN;
#endif
  if (KIND == 3) return max(a, b);
  if (KIND == 4) return min(a, b);
  if (KIND == 5) return a * b;
  return a + b;
}

DEFINE_WG_REDUCE(wg_combine, VAL_T, combine)

uint kept_offset(uint o) {
  uint off = 0u;
  for (int k = int(pc.kept_rank) - 1; k >= 0; --k) {
    off += (o % pc.kept_dims[k]) * pc.kept_strides[k];
    o /= pc.kept_dims[k];
  }
  return off;
}

uint red_offset(uint r) {
  uint off = 0u;
  for (int k = int(pc.red_rank) - 1; k >= 0; --k) {
    off += (r % pc.red_dims[k]) * pc.red_strides[k];
    r /= pc.red_dims[k];
  }
  return off;
}

// Accumulates elements r = first, first + step, ... of output o's reduction.
VAL_T accumulate(uint base, uint first, uint step) {
  VAL_T acc = identity();
#if VAL_IS_FLOAT
  precise float comp = 0.0;  // Kahan compensation for sums
#endif
  for (uint r = first; r < pc.red_count; r += step) {
    const VAL_T v = LOAD_VAL(x[base + red_offset(r)]);
#if VAL_IS_FLOAT
    if (KIND == 1 || KIND == 2) {
      precise const float t = v - comp;
      precise const float s = acc + t;
      comp = (s - acc) - t;
      acc = isinf(s) || isnan(s) ? acc + v : s;
      continue;
    }
#endif
    acc = combine(acc, v);
  }
  return acc;
}

VAL_T finish(VAL_T acc) {
#if VAL_IS_FLOAT
  if (KIND == 2) return acc / float(pc.red_count);
#endif
  return acc;
}

void main() {
  if (PER_THREAD) {
    const uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint o = gl_GlobalInvocationID.x; o < pc.n_out; o += step) {
      y[o] = STORE_VAL(finish(accumulate(kept_offset(o), 0u, 1u)));
    }
    return;
  }
  for (uint o = gl_WorkGroupID.x; o < pc.n_out; o += gl_NumWorkGroups.x) {
    const VAL_T part = accumulate(kept_offset(o), gl_LocalInvocationID.x, gl_WorkGroupSize.x);
    const VAL_T total = wg_combine(part);
    if (gl_LocalInvocationID.x == 0u) y[o] = STORE_VAL(finish(total));
  }
}
