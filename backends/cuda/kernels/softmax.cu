// Softmax and LogSoftmax over the middle dim of [outer, n, inner]. Rows
// (inner == 1): one block per row, blocks striding over rows. Columns
// (inner > 1): one thread per (outer, inner) pair, coalesced along inner.
// exp(x - max) / sum, or x - max - log(sum); math in f32.
template <typename T>
__device__ void softmax_rows(const T* x, T* y, k_i64 rows, k_i64 n, int log_out) {
  __shared__ float scratch[32];
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    float m = -K_INF;
    for (k_i64 j = threadIdx.x; j < n; j += blockDim.x) m = k_max(m, k_load(x, base + j));
    m = k_block_max(m, scratch);
    float s = 0.0f;
    for (k_i64 j = threadIdx.x; j < n; j += blockDim.x) s += expf(k_load(x, base + j) - m);
    s = k_block_sum(s, scratch);
    const float inv = 1.0f / s, log_s = logf(s);
    for (k_i64 j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = k_load(x, base + j) - m;
      k_store(y, base + j, log_out ? v - log_s : expf(v) * inv);
    }
  }
}

template <typename T>
__device__ void softmax_cols(const T* x, T* y, k_i64 outer, k_i64 n, k_i64 inner, int log_out) {
  const k_i64 total = outer * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 base = (t / inner) * n * inner + t % inner;
    float m = -K_INF;
    for (k_i64 j = 0; j < n; ++j) m = k_max(m, k_load(x, base + j * inner));
    float s = 0.0f;
    for (k_i64 j = 0; j < n; ++j) s += expf(k_load(x, base + j * inner) - m);
    const float inv = 1.0f / s, log_s = logf(s);
    for (k_i64 j = 0; j < n; ++j) {
      const float v = k_load(x, base + j * inner) - m;
      k_store(y, base + j * inner, log_out ? v - log_s : expf(v) * inv);
    }
  }
}

#define KILN_SOFTMAX(S, T)                                                                \
  extern "C" __global__ void kiln_softmax_rows_##S(const T* x, T* y, k_i64 rows, k_i64 n, \
                                                   int log_out) {                         \
    softmax_rows<T>(x, y, rows, n, log_out);                                              \
  }                                                                                       \
  extern "C" __global__ void kiln_softmax_cols_##S(const T* x, T* y, k_i64 outer, k_i64 n, \
                                                   k_i64 inner, int log_out) {            \
    softmax_cols<T>(x, y, outer, n, inner, log_out);                                      \
  }
KILN_SOFTMAX(f32, float)
KILN_SOFTMAX(f16, k_f16)
KILN_SOFTMAX(bf16, k_bf16)

// The vectorized row form (n a multiple of K_VEC<T>::N, 16-byte aligned
// pointers; the host checks): the row in registers as packed 16-byte words
// (NV per thread), read once and written once with 16-byte accesses.
template <typename T, int NV>
__device__ void softmax_vec(const T* x, T* y, k_i64 rows, k_i64 n, int log_out) {
  constexpr int N = K_VEC<T>::N;
  __shared__ float scratch[32];
  const k_i64 nvec = n / N;
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    k_v16 raw[NV];
    float m = -K_INF;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
        raw[k] = k_ldraw(x, base + j * N);
        float v[N];
        k_unpack(x, raw[k], v);
#pragma unroll
        for (int l = 0; l < N; ++l) m = k_max(m, v[l]);
      }
    }
    m = k_block_max(m, scratch);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
        float v[N];
        k_unpack(x, raw[k], v);
#pragma unroll
        for (int l = 0; l < N; ++l) s += expf(v[l] - m);
      }
    }
    s = k_block_sum(s, scratch);
    const float inv = 1.0f / s, log_s = logf(s);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j >= nvec) continue;
      float v[N];
      k_unpack(x, raw[k], v);
#pragma unroll
      for (int l = 0; l < N; ++l) v[l] = log_out ? (v[l] - m) - log_s : expf(v[l] - m) * inv;
      k_stv(y, base + j * N, v);
    }
  }
}

#define KILN_SOFTMAX_VEC(S, T, NV)                                                            \
  extern "C" __global__ void __launch_bounds__(NV == 8 ? 1024 : 256, NV == 8 ? 1 : 4) kiln_softmax_v##NV##_##S(const T* x, T* y, k_i64 rows, k_i64 n,  \
                                                      int log_out) {                          \
    softmax_vec<T, NV>(x, y, rows, n, log_out);                                               \
  }
#define KILN_SOFTMAX_VECS(S, T)                                                  \
  KILN_SOFTMAX_VEC(S, T, 1) KILN_SOFTMAX_VEC(S, T, 2) KILN_SOFTMAX_VEC(S, T, 4) \
  KILN_SOFTMAX_VEC(S, T, 8)
KILN_SOFTMAX_VECS(f32, float)
KILN_SOFTMAX_VECS(f16, k_f16)
KILN_SOFTMAX_VECS(bf16, k_bf16)
