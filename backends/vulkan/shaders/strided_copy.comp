#version 450
// dst[dst_base + sum c_k * dst_strides[k]] = src[src_base + sum c_k * src_strides[k]]
// for every coordinate c of `dims` (row-major): transpose, slice, expand,
// concat (one dispatch per input). Strides and bases count elements.
#include "elem_types.glsl"

layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Src { ELEM src[]; };
layout(std430, binding = 1) writeonly buffer Dst { ELEM dst[]; };
layout(push_constant) uniform Push {
  uint count;
  uint rank;
  uint src_base;
  uint dst_base;
  uint dims[8];
  uint src_strides[8];
  uint dst_strides[8];
} pc;

void main() {
  const uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < pc.count; i += step) {
    uint rem = i;
    uint s = pc.src_base;
    uint d = pc.dst_base;
    for (int k = int(pc.rank) - 1; k >= 0; --k) {
      const uint c = rem % pc.dims[k];
      rem /= pc.dims[k];
      s += c * pc.src_strides[k];
      d += c * pc.dst_strides[k];
    }
    dst[d] = src[s];
  }
}
