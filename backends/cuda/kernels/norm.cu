// LayerNorm, RmsNorm and FusedResidualNorm: one block per row of n elements
// (the normalized dims [axis, rank) flattened), blocks striding over rows.
// s = x (+ residual, rounded as the unfused add stores it); LayerNorm takes
// a two-pass mean and variance of s - shift (shift = the row's first value),
// so a large common offset costs no precision; RmsNorm the mean square;
// scale and bias are [n]. Math in f32.
template <typename T>
__device__ __forceinline__ float norm_in(const T* x, const T* res, k_i64 i, int has_res) {
  float v = k_load(x, i);
  if (has_res) v = k_round(x, v + k_load(res, i));
  return v;
}

template <typename T>
__device__ void norm_rows(const T* x, const T* res, const T* scale, const T* bias, T* y, T* sum,
                          k_i64 rows, k_i64 n, float eps, int rms, int has_res, int has_scale,
                          int has_bias, int emit_sum) {
  __shared__ float scratch[32];
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    float shift = 0.0f, delta = 0.0f;
    if (!rms) {
      shift = norm_in(x, res, base, has_res);
      float part = 0.0f;
      for (k_i64 j = threadIdx.x; j < n; j += blockDim.x) {
        part += norm_in(x, res, base + j, has_res) - shift;
      }
      delta = k_block_sum(part, scratch) / static_cast<float>(n);
    }
    float sq = 0.0f;
    for (k_i64 j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = (norm_in(x, res, base + j, has_res) - shift) - delta;
      sq += v * v;
    }
    const float rstd = 1.0f / sqrtf(k_block_sum(sq, scratch) / static_cast<float>(n) + eps);
    for (k_i64 j = threadIdx.x; j < n; j += blockDim.x) {
      const float s = norm_in(x, res, base + j, has_res);
      if (emit_sum) k_store(sum, base + j, s);
      float v = ((s - shift) - delta) * rstd;
      if (has_scale) v *= k_load(scale, j);
      if (has_bias) v += k_load(bias, j);
      k_store(y, base + j, v);
    }
  }
}

#define KILN_NORM(S, T)                                                                        \
  extern "C" __global__ void kiln_norm_##S(const T* x, const T* res, const T* scale,           \
                                           const T* bias, T* y, T* sum, k_i64 rows, k_i64 n,   \
                                           float eps, int rms, int has_res, int has_scale,     \
                                           int has_bias, int emit_sum) {                       \
    norm_rows<T>(x, res, scale, bias, y, sum, rows, n, eps, rms, has_res, has_scale, has_bias, \
                 emit_sum);                                                                    \
  }
KILN_NORM(f32, float)
KILN_NORM(f16, k_f16)
KILN_NORM(bf16, k_bf16)

// The vectorized form, for rows of n = a multiple of K_VEC<T>::N elements
// with every pointer 16-byte aligned (the host checks both): one block per
// row, thread t holding vectors t, t + blockDim.x, ... (NV of them) of the
// row in registers, so x (and the residual) are read once; 16-byte loads and
// stores; warp-shuffle block sums. Two passes over the registers: the mean,
// then the variance of v - mean (RmsNorm: the mean square).
template <typename T, int NV>
__device__ void norm_vec(const T* x, const T* res, const T* scale, const T* bias, T* y, T* sum,
                         k_i64 rows, k_i64 n, float eps, int rms, int has_res, int has_scale,
                         int has_bias, int emit_sum) {
  constexpr int N = K_VEC<T>::N;
  __shared__ float scratch[32];
  const k_i64 nvec = n / N;
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    float v[NV][N];
    float part = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
        k_ldv(x, base + j * N, v[k]);
        if (has_res) {
          float r[N];
          k_ldv(res, base + j * N, r);
#pragma unroll
          for (int l = 0; l < N; ++l) v[k][l] = k_round(x, v[k][l] + r[l]);
        }
#pragma unroll
        for (int l = 0; l < N; ++l) part += v[k][l];
      } else {
#pragma unroll
        for (int l = 0; l < N; ++l) v[k][l] = 0.0f;
      }
    }
    const float mean = rms ? 0.0f : k_block_sum(part, scratch) / static_cast<float>(n);
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
#pragma unroll
        for (int l = 0; l < N; ++l) {
          const float d = v[k][l] - mean;
          sq += d * d;
        }
      }
    }
    const float rstd = 1.0f / sqrtf(k_block_sum(sq, scratch) / static_cast<float>(n) + eps);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j >= nvec) continue;
      if (emit_sum) k_stv(sum, base + j * N, v[k]);
      float s[N], b[N], o[N];
      if (has_scale) k_ldv(scale, j * N, s);
      if (has_bias) k_ldv(bias, j * N, b);
#pragma unroll
      for (int l = 0; l < N; ++l) {
        float r = (v[k][l] - mean) * rstd;
        if (has_scale) r *= s[l];
        if (has_bias) r += b[l];
        o[l] = r;
      }
      k_stv(y, base + j * N, o);
    }
  }
}

#define KILN_NORM_VEC(S, T, NV)                                                                 \
  extern "C" __global__ void kiln_norm_v##NV##_##S(                                             \
      const T* x, const T* res, const T* scale, const T* bias, T* y, T* sum, k_i64 rows,        \
      k_i64 n, float eps, int rms, int has_res, int has_scale, int has_bias, int emit_sum) {    \
    norm_vec<T, NV>(x, res, scale, bias, y, sum, rows, n, eps, rms, has_res, has_scale,         \
                    has_bias, emit_sum);                                                        \
  }
#define KILN_NORM_VECS(S, T) \
  KILN_NORM_VEC(S, T, 1) KILN_NORM_VEC(S, T, 2) KILN_NORM_VEC(S, T, 4) KILN_NORM_VEC(S, T, 8)
KILN_NORM_VECS(f32, float)
KILN_NORM_VECS(f16, k_f16)
KILN_NORM_VECS(bf16, k_bf16)
