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
