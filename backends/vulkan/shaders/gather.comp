#version 450
// numpy.take(data, indices, axis) over data viewed as [outer, axis_size, inner]:
// out[o, j, i] = data[o, idx[j], i]. Negative indices count from the end. An
// index outside [-axis_size, axis_size) is never dereferenced: its outputs
// become zero and one of them is reported in the error slot (code 1, then
// the index's position, and its value's low and high words).
#include "elem_types.glsl"

layout(local_size_x_id = 0) in;
// The index dtype: 0 = i32, 1 = i64 (int pairs), 2 = i16, 3 = i8, 4 = u8 (the
// narrow ones unpacked from 32-bit words, so no 8/16-bit storage is needed).
layout(constant_id = 1) const uint IDX_KIND = 0;

layout(std430, binding = 0) readonly buffer Data { ELEM data[]; };
layout(std430, binding = 1) readonly buffer Idx { int idx[]; };
layout(std430, binding = 2) writeonly buffer Out { ELEM out_[]; };
layout(std430, binding = 3) buffer Err { uint err[]; };
layout(push_constant) uniform Push {
  uint outer;
  uint nidx;
  uint axis_size;
  uint inner;
  uint slot;
} pc;

void main() {
  const uint total = pc.outer * pc.nidx * pc.inner;
  const uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += step) {
    const uint in_ = i % pc.inner;
    const uint t = i / pc.inner;
    const uint j = t % pc.nidx;
    const uint o = t / pc.nidx;
    int lo;
    if (IDX_KIND == 0) {
      lo = idx[j];
    } else if (IDX_KIND == 1) {
      lo = idx[2 * j];
    } else if (IDX_KIND == 2) {
      lo = bitfieldExtract(idx[j >> 1], int(16 * (j & 1)), 16);
    } else if (IDX_KIND == 3) {
      lo = bitfieldExtract(idx[j >> 2], int(8 * (j & 3)), 8);
    } else {
      lo = int(bitfieldExtract(uint(idx[j >> 2]), int(8 * (j & 3)), 8));
    }
    const int hi = IDX_KIND == 1 ? idx[2 * j + 1] : (lo < 0 ? -1 : 0);
    // The 64-bit value hi:lo is in range iff it fits 32 bits and -n <= v < n.
    const bool fits = (hi == 0 && lo >= 0) || (hi == -1 && lo < 0);
    const int n = int(pc.axis_size);
    if (!fits || lo >= n || lo < -n) {
      if (atomicCompSwap(err[4 * pc.slot], 0u, 1u) == 0u) {
        err[4 * pc.slot + 1] = j;
        err[4 * pc.slot + 2] = uint(lo);
        err[4 * pc.slot + 3] = uint(hi);
      }
      out_[i] = ELEM_ZERO;
      continue;
    }
    const uint v = uint(lo < 0 ? lo + n : lo);
    out_[i] = data[(o * pc.axis_size + v) * pc.inner + in_];
  }
}
