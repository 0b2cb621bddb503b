#version 450
// TopK along an axis: for each (outer, inner) row of n values, the k largest
// (or smallest) in order, ties by the lower index, NaN above +inf (leading
// the largest, trailing the smallest), values copied bit for bit and their
// indices (i32, or i64 as two words). An invocation per row selects k times
// the next element after the previous one in that total order: O(n k) per
// row, no scratch memory (rows are short in the graphs TopK serves: logits'
// top-k, beam search). The key type: KEY_F32, KEY_F16, KEY_BF16 or KEY_I32.
#if defined(KEY_F16) || defined(KEY_BF16)
#extension GL_EXT_shader_16bit_storage : require
#define RAW uint16_t
#else
#define RAW uint
#endif
#include "kmath.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SMALLEST = false;
layout(constant_id = 2) const bool INDEX64 = true;

layout(std430, binding = 0) readonly buffer X { RAW x[]; };
layout(std430, binding = 1) writeonly buffer V { RAW values[]; };
layout(std430, binding = 2) writeonly buffer I { uint indices[]; };
layout(push_constant) uniform Push {
  uint outer, n, inner, k;
} pc;

#if defined(KEY_I32)
#define KEY_T int
KEY_T key_of(uint r) { return int(r); }
bool nan_bits(uint r) { return false; }
#elif defined(KEY_F32)
#define KEY_T float
KEY_T key_of(uint r) { return uintBitsToFloat(r); }
bool nan_bits(uint r) { return (r & 0x7fffffffu) > 0x7f800000u; }
#elif defined(KEY_F16)
#define KEY_T float
KEY_T key_of(uint r) { return k_f16_to_f32(r); }
bool nan_bits(uint r) { return (r & 0x7fffu) > 0x7c00u; }
#elif defined(KEY_BF16)
#define KEY_T float
KEY_T key_of(uint r) { return k_bf16_to_f32(r); }
bool nan_bits(uint r) { return (r & 0x7fffu) > 0x7f80u; }
#else
#error "define one KEY_* type"
#endif

// Whether element p (raw bits rp) comes before element q in the output order.
bool before(uint rp, uint p, uint rq, uint q) {
  const bool pn = nan_bits(rp), qn = nan_bits(rq);
  if (pn || qn) {
    if (pn && qn) return p < q;
    return SMALLEST ? qn : pn;
  }
  const KEY_T u = key_of(rp), v = key_of(rq);
  if (u != v) return SMALLEST ? u < v : u > v;
  return p < q;
}

void main() {
  const uint rows = pc.outer * pc.inner;
  for (uint row = gl_GlobalInvocationID.x; row < rows;
       row += gl_NumWorkGroups.x * gl_WorkGroupSize.x) {
    const uint o = row / pc.inner, i = row % pc.inner;
    const uint base = o * pc.n * pc.inner + i;
    uint prev = 0u, prev_raw = 0u;
    for (uint j = 0u; j < pc.k; ++j) {
      uint best = 0xffffffffu, best_raw = 0u;
      for (uint r = 0u; r < pc.n; ++r) {
        const uint raw = uint(x[base + r * pc.inner]);
        if (j > 0u && !before(prev_raw, prev, raw, r)) continue;  // already taken
        if (best == 0xffffffffu || before(raw, r, best_raw, best)) {
          best = r;
          best_raw = raw;
        }
      }
      const uint dst = o * pc.k * pc.inner + j * pc.inner + i;
      values[dst] = RAW(best_raw);
      if (INDEX64) {
        indices[2u * dst] = best;
        indices[2u * dst + 1u] = 0u;
      } else {
        indices[dst] = best;
      }
      prev = best;
      prev_raw = best_raw;
    }
  }
}
