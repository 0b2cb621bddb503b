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
// row in registers as packed 16-byte words (x + residual, rounded, when
// there is one), so x and the residual are read once; 16-byte loads and
// stores; warp-shuffle block sums. The statistics as the scalar kernel
// takes them: the mean of s - shift (shift = the row's first value), then
// the variance of (s - shift) - delta, both from the registers.
template <typename T, int NV>
__device__ void norm_vec(const T* x, const T* res, const T* scale, const T* bias, T* y, T* sum,
                         k_i64 rows, k_i64 n, float eps, int rms, int has_res, int has_scale,
                         int has_bias, int emit_sum) {
  constexpr int N = K_VEC<T>::N;
  __shared__ float scratch[32];
  const k_i64 nvec = n / N;
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    k_v16 raw[NV];
    const float shift = rms ? 0.0f : norm_in(x, res, base, has_res);
    float part = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
        raw[k] = k_ldraw(x, base + j * N);
        float v[N];
        k_unpack(x, raw[k], v);
        if (has_res) {
          float r[N];
          k_ldv(res, base + j * N, r);
#pragma unroll
          for (int l = 0; l < N; ++l) v[l] = k_round(x, v[l] + r[l]);
          raw[k] = k_pack(x, v);
        }
#pragma unroll
        for (int l = 0; l < N; ++l) part += v[l] - shift;
      }
    }
    const float delta = rms ? 0.0f : k_block_sum(part, scratch) / static_cast<float>(n);
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
        float v[N];
        k_unpack(x, raw[k], v);
#pragma unroll
        for (int l = 0; l < N; ++l) {
          const float d = (v[l] - shift) - delta;
          sq += d * d;
        }
      }
    }
    const float rstd = 1.0f / sqrtf(k_block_sum(sq, scratch) / static_cast<float>(n) + eps);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j >= nvec) continue;
      if (emit_sum) k_straw(sum, base + j * N, raw[k]);
      float v[N], s[N], b[N];
      k_unpack(x, raw[k], v);
      if (has_scale) k_ldv(scale, j * N, s);
      if (has_bias) k_ldv(bias, j * N, b);
#pragma unroll
      for (int l = 0; l < N; ++l) {
        float r = ((v[l] - shift) - delta) * rstd;
        if (has_scale) r *= s[l];
        if (has_bias) r += b[l];
        v[l] = r;
      }
      k_stv(y, base + j * N, v);
    }
  }
}

#define KILN_NORM_VEC(S, T, NV)                                                                 \
  extern "C" __global__ void __launch_bounds__(NV == 8 ? 1024 : 256, NV == 8 ? 1 : 4) kiln_norm_v##NV##_##S(                                             \
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
