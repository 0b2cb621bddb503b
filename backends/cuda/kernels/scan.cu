// Cumsum and ArgMax along the middle dim of [outer, n, inner], for the float
// and integer dtypes: one thread per (outer, inner) column, walking n in
// order (coalesced along inner). Cumsum accumulates floats in f64 and
// integers in wrapping 64 bits, as the CPU reference does; exclusive writes
// the sum before the element, reverse walks from the end. ArgMax gives the
// first index of the maximum, or of the first NaN.
template <typename T>
__device__ void cumsum(const T* x, T* y, k_i64 outer, k_i64 n, k_i64 inner, int exclusive,
                       int reverse) {
  typedef decltype(k_acc(x, 0)) A;
  const k_i64 total = outer * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 base = (t / inner) * n * inner + t % inner;
    A acc = 0;
    for (k_i64 step = 0; step < n; ++step) {
      const k_i64 at = base + (reverse ? n - 1 - step : step) * inner;
      const A v = k_acc(x, at);
      if (exclusive) k_put(y, at, acc);
      acc = k_add(acc, v);
      if (!exclusive) k_put(y, at, acc);
    }
  }
}

template <typename T, typename I>
__device__ void argmax(const T* x, I* y, k_i64 outer, k_i64 n, k_i64 inner) {
  typedef decltype(k_acc(x, 0)) A;
  const k_i64 total = outer * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 base = (t / inner) * n * inner + t % inner;
    A best = k_acc(x, base);
    k_i64 at = 0;
    for (k_i64 j = 1; j < n && !k_isnan(best); ++j) {
      const A v = k_acc(x, base + j * inner);
      if (v > best || k_isnan(v)) best = v, at = j;
    }
    y[t] = static_cast<I>(at);
  }
}

#define KILN_SCAN(S, T)                                                                        \
  extern "C" __global__ void kiln_cumsum_##S(const T* x, T* y, k_i64 outer, k_i64 n,           \
                                             k_i64 inner, int exclusive, int reverse) {        \
    cumsum<T>(x, y, outer, n, inner, exclusive, reverse);                                      \
  }                                                                                            \
  extern "C" __global__ void kiln_argmax_##S##_i32(const T* x, k_i32* y, k_i64 outer, k_i64 n, \
                                                   k_i64 inner) {                              \
    argmax<T, k_i32>(x, y, outer, n, inner);                                                   \
  }                                                                                            \
  extern "C" __global__ void kiln_argmax_##S##_i64(const T* x, k_i64* y, k_i64 outer, k_i64 n, \
                                                   k_i64 inner) {                              \
    argmax<T, k_i64>(x, y, outer, n, inner);                                                   \
  }
KILN_SCAN(f32, float)
KILN_SCAN(f16, k_f16)
KILN_SCAN(bf16, k_bf16)
KILN_SCAN(i8, k_i8)
KILN_SCAN(u8, k_u8)
KILN_SCAN(i16, k_i16)
KILN_SCAN(i32, k_i32)
KILN_SCAN(i64, k_i64)
