// Pad: out[c] = x[source(c)] per dim, or the pad value. Constant mode fills
// outside the input; reflect mirrors without repeating the edge (-c, or
// 2(n-1) - c: pads are below the dim's size); edge repeats the border
// element. One thread per output element (grid-striding); elements of 1, 2,
// 4 or 8 bytes are moved, not interpreted, and `value` is the pad element's
// bits (converted on the host as Cast converts).
#define K_PAD_MAX_RANK 8
struct PadParams {
  k_i64 rank, count, mode;  // mode: 0 constant, 1 reflect, 2 edge
  k_i64 out_dims[K_PAD_MAX_RANK], in_dims[K_PAD_MAX_RANK], lo[K_PAD_MAX_RANK];
  k_i64 in_str[K_PAD_MAX_RANK];
};

template <typename E>
__device__ void pad(const E* x, E* y, const PadParams& p, E value) {
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.count;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    k_i64 rem = t, src = 0;
    bool fill = false;
    for (int k = static_cast<int>(p.rank) - 1; k >= 0; --k) {
      const k_i64 n = p.in_dims[k];
      k_i64 c = rem % p.out_dims[k] - p.lo[k];
      rem /= p.out_dims[k];
      if (c < 0 || c >= n) {
        if (p.mode == 1) {
          c = c < 0 ? -c : 2 * (n - 1) - c;
        } else if (p.mode == 2) {
          c = c < 0 ? 0 : n - 1;
        } else {
          fill = true;
          break;
        }
      }
      src += c * p.in_str[k];
    }
    y[t] = fill ? value : x[src];
  }
}

#define KILN_PAD(B, E)                                                                     \
  extern "C" __global__ void kiln_pad_e##B(const E* x, E* y, PadParams p, E value) {       \
    pad<E>(x, y, p, value);                                                                \
  }
KILN_PAD(1, unsigned char)
KILN_PAD(2, unsigned short)
KILN_PAD(4, unsigned int)
KILN_PAD(8, k_u64)
