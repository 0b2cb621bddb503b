// Rotary embedding on x [B, H, S, D]: pairs (i, i + rotary/2), or (2i, 2i+1)
// when interleaved, turn by position * theta^(-2i / rotary); dims past
// rotary pass through. Angles, cosines and sines in f64 (positions in the
// tens of thousands times a frequency lose whole radians in f32), rounded
// to f32 as the CPU kernel's table is, the rotation in f32. One thread per
// pair or passed-through element; each reads its elements before writing,
// so y may alias x. Positions: none (s + offset), or [S] / [B, S] integers
// of kind pos_kind (1 i8, 2 u8, 3 i16, 4 i32, 5 i64).
__device__ __forceinline__ k_i64 rope_position(const void* pos, int kind, k_i64 i) {
  switch (kind) {
    case 1: return static_cast<const k_i8*>(pos)[i];
    case 2: return static_cast<const k_u8*>(pos)[i];
    case 3: return static_cast<const k_i16*>(pos)[i];
    case 4: return static_cast<const k_i32*>(pos)[i];
    default: return static_cast<const k_i64*>(pos)[i];
  }
}

template <typename T>
__device__ void rope(const T* x, T* y, const void* pos, int pos_kind, int pos_per_batch, k_i64 h,
                     k_i64 s, k_i64 d, k_i64 rotary, int interleaved, double theta,
                     k_i64 offset, k_i64 rows) {
  const k_i64 half = rotary / 2;
  const k_i64 per_row = half + (d - rotary);
  const k_i64 total = rows * per_row;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 row = t / per_row, j = t % per_row;
    const k_i64 base = row * d;
    if (j >= half) {
      const k_i64 at = base + rotary + (j - half);
      k_store(y, at, k_load(x, at));
      continue;
    }
    const k_i64 si = row % s;
    k_i64 p = si + offset;
    if (pos_kind != 0) p = rope_position(pos, pos_kind, pos_per_batch ? (row / (h * s)) * s + si : si);
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(rotary));
    double sn, cs;
    sincos(static_cast<double>(p) * inv_freq, &sn, &cs);
    const float c = static_cast<float>(cs), sf = static_cast<float>(sn);
    const k_i64 ia = base + (interleaved ? 2 * j : j);
    const k_i64 ib = base + (interleaved ? 2 * j + 1 : j + half);
    const float a = k_load(x, ia), b = k_load(x, ib);
    k_store(y, ia, a * c - b * sf);
    k_store(y, ib, b * c + a * sf);
  }
}

#define KILN_ROPE(S, T)                                                                          \
  extern "C" __global__ void kiln_rope_##S(const T* x, T* y, const void* pos, int pos_kind,      \
                                           int pos_per_batch, k_i64 h, k_i64 s, k_i64 d,         \
                                           k_i64 rotary, int interleaved, double theta,          \
                                           k_i64 offset, k_i64 rows) {                           \
    rope<T>(x, y, pos, pos_kind, pos_per_batch, h, s, d, rotary, interleaved, theta, offset,     \
            rows);                                                                               \
  }
KILN_ROPE(f32, float)
KILN_ROPE(f16, k_f16)
KILN_ROPE(bf16, k_bf16)
