// Decoding GGUF block-quantized weights (backends/common/quant_blocks.h has
// the layouts) in 32-element quant groups (dq_group) or eighths of one
// (dq_part8). A q8_0 / q4_0 block is one group;
// a k-quant super-block of 256 is eight. Every block type's size is even, so
// the weights are read as 16-bit words (16-bit storage) and every f16 scale
// is one aligned word.
//
// The including shader declares the weight buffer `w` (uint16_t words) and
// the specialization constant WTYPE (DQ_Q8_0 ... DQ_Q6_K) before including.
#ifndef KILN_DEQUANT_BLOCKS_GLSL
#define KILN_DEQUANT_BLOCKS_GLSL

#define DQ_Q8_0 0u
#define DQ_Q4_0 1u
#define DQ_Q4_K 2u
#define DQ_Q5_K 3u
#define DQ_Q6_K 4u

const uint DQ_BLOCK_ELEMS = WTYPE <= DQ_Q4_0 ? 32u : 256u;
const uint DQ_BLOCK_BYTES = WTYPE == DQ_Q8_0   ? 34u
                            : WTYPE == DQ_Q4_0 ? 18u
                            : WTYPE == DQ_Q4_K ? 144u
                            : WTYPE == DQ_Q5_K ? 176u
                                               : 210u;
const uint DQ_GROUPS = DQ_BLOCK_ELEMS / 32u;  // quant groups per block

// The 16-bit word at an even byte offset, and its f16 value.
uint dq_word(uint byte_off) { return uint(w[byte_off >> 1]); }
float dq_half(uint byte_off) { return k_f16_to_f32(dq_word(byte_off)); }
uint dq_byte(uint byte_off) { return (dq_word(byte_off & ~1u) >> (8u * (byte_off & 1u))) & 0xffu; }
int dq_i8(uint b) { return int(b << 24) >> 24; }  // the low byte of b as a signed int

// The 6-bit scale (x) and min (y) of quant group j of a q4_k / q5_k block
// whose 12 scale bytes start at byte `s` (quant_blocks.h's ScaleMinK4).
uvec2 dq_scale_min_k4(uint s, uint j) {
  const uint bj = dq_byte(s + j), bj4 = dq_byte(s + j + 4u);
  if (j < 4u) return uvec2(bj & 63u, bj4 & 63u);
  const uint bjm4 = dq_byte(s + j - 4u);
  return uvec2((bj4 & 15u) | ((bjm4 >> 6) << 4), (bj4 >> 4) | ((bj >> 6) << 4));
}

// The 32 weights of quant group g (0 .. DQ_GROUPS - 1) of the block at byte b.
void dq_group(uint b, uint g, out float v[32]) {
  if (WTYPE == DQ_Q8_0) {
    const float d = dq_half(b);
    for (uint i = 0u; i < 16u; ++i) {
      const uint h = dq_word(b + 2u + 2u * i);
      v[2u * i] = d * float(dq_i8(h & 0xffu));
      v[2u * i + 1u] = d * float(dq_i8(h >> 8));
    }
  } else if (WTYPE == DQ_Q4_0) {
    const float d = dq_half(b);
    for (uint i = 0u; i < 8u; ++i) {
      const uint h = dq_word(b + 2u + 2u * i);
      v[2u * i] = d * float(int(h & 15u) - 8);
      v[2u * i + 1u] = d * float(int((h >> 8) & 15u) - 8);
      v[2u * i + 16u] = d * float(int((h >> 4) & 15u) - 8);
      v[2u * i + 17u] = d * float(int(h >> 12) - 8);
    }
  } else if (WTYPE == DQ_Q4_K || WTYPE == DQ_Q5_K) {
    const uvec2 sm = dq_scale_min_k4(b + 4u, g);
    const float dg = dq_half(b) * float(sm.x), mg = dq_half(b + 2u) * float(sm.y);
    const uint qs = b + (WTYPE == DQ_Q4_K ? 16u : 48u) + 32u * (g >> 1);
    const uint shift = 4u * (g & 1u);  // low nibbles: even groups, high: odd
    for (uint i = 0u; i < 16u; ++i) {
      const uint h = dq_word(qs + 2u * i);
      uint q0 = (h >> shift) & 15u, q1 = (h >> (8u + shift)) & 15u;
      if (WTYPE == DQ_Q5_K) {
        const uint hb = dq_word(b + 16u + 2u * i);  // qh[2i], qh[2i + 1]
        q0 |= ((hb >> g) & 1u) << 4;
        q1 |= ((hb >> (8u + g)) & 1u) << 4;
      }
      v[2u * i] = dg * float(q0) - mg;
      v[2u * i + 1u] = dg * float(q1) - mg;
    }
  } else {  // DQ_Q6_K: group g is elements 32g .. 32g + 31 of half g / 4
    const uint half_ = g >> 2, j = g & 3u;
    const float d = dq_half(b + 208u);
    const uint sw = dq_word(b + 192u + 2u * g);  // scales[2g], scales[2g + 1]
    const float s0 = d * float(dq_i8(sw & 0xffu)), s1 = d * float(dq_i8(sw >> 8));
    const uint ql = b + 64u * half_ + 32u * (j & 1u), qh = b + 128u + 32u * half_;
    const uint lshift = 4u * (j >> 1), hshift = 2u * j;
    for (uint i = 0u; i < 16u; ++i) {
      const uint hl = dq_word(ql + 2u * i), hh = dq_word(qh + 2u * i);
      const int q0 = int(((hl >> lshift) & 15u) | (((hh >> hshift) & 3u) << 4)) - 32;
      const int q1 = int(((hl >> (8u + lshift)) & 15u) | (((hh >> (8u + hshift)) & 3u) << 4)) - 32;
      const float s = i < 8u ? s0 : s1;
      v[2u * i] = s * float(q0);
      v[2u * i + 1u] = s * float(q1);
    }
  }
}

// Weights e0 .. e0 + 7 (e0 in {0, 8, 16, 24}) of quant group g of the block
// at byte b: the matvec kernel's share of a group per invocation, so that
// neighbouring invocations read neighbouring bytes of the blocks.
void dq_part8(uint b, uint g, uint e0, out float v[8]) {
  if (WTYPE == DQ_Q8_0) {
    const float d = dq_half(b);
    for (uint i = 0u; i < 4u; ++i) {
      const uint h = dq_word(b + 2u + e0 + 2u * i);
      v[2u * i] = d * float(dq_i8(h & 0xffu));
      v[2u * i + 1u] = d * float(dq_i8(h >> 8));
    }
  } else if (WTYPE == DQ_Q4_0) {
    const float d = dq_half(b);
    const uint shift = e0 < 16u ? 0u : 4u;
    for (uint i = 0u; i < 4u; ++i) {
      const uint h = dq_word(b + 2u + (e0 & 15u) + 2u * i);
      v[2u * i] = d * float(int((h >> shift) & 15u) - 8);
      v[2u * i + 1u] = d * float(int((h >> (8u + shift)) & 15u) - 8);
    }
  } else if (WTYPE == DQ_Q4_K || WTYPE == DQ_Q5_K) {
    const uvec2 sm = dq_scale_min_k4(b + 4u, g);
    const float dg = dq_half(b) * float(sm.x), mg = dq_half(b + 2u) * float(sm.y);
    const uint qs = b + (WTYPE == DQ_Q4_K ? 16u : 48u) + 32u * (g >> 1) + e0;
    const uint shift = 4u * (g & 1u);
    for (uint i = 0u; i < 4u; ++i) {
      const uint h = dq_word(qs + 2u * i);
      uint q0 = (h >> shift) & 15u, q1 = (h >> (8u + shift)) & 15u;
      if (WTYPE == DQ_Q5_K) {
        const uint hb = dq_word(b + 16u + e0 + 2u * i);
        q0 |= ((hb >> g) & 1u) << 4;
        q1 |= ((hb >> (8u + g)) & 1u) << 4;
      }
      v[2u * i] = dg * float(q0) - mg;
      v[2u * i + 1u] = dg * float(q1) - mg;
    }
  } else {  // DQ_Q6_K
    const uint half_ = g >> 2, j = g & 3u;
    const float s = dq_half(b + 208u) * float(dq_i8(dq_byte(b + 192u + 2u * g + (e0 >> 4))));
    const uint ql = b + 64u * half_ + 32u * (j & 1u) + e0, qh = b + 128u + 32u * half_ + e0;
    const uint lshift = 4u * (j >> 1), hshift = 2u * j;
    for (uint i = 0u; i < 4u; ++i) {
      const uint hl = dq_word(ql + 2u * i), hh = dq_word(qh + 2u * i);
      v[2u * i] = s * float(int(((hl >> lshift) & 15u) | (((hh >> hshift) & 3u) << 4)) - 32);
      v[2u * i + 1u] =
          s * float(int(((hl >> (8u + lshift)) & 15u) | (((hh >> (8u + hshift)) & 3u) << 4)) - 32);
    }
  }
}

#endif  // KILN_DEQUANT_BLOCKS_GLSL
