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
// with every pointer 16-byte aligned (the host checks both): blocks stride
// over rows (the host launches about as many blocks as fit on the device at
// once), thread t holding vectors t, t + blockDim.x, ... (NV of them) of
// the row in registers as packed 16-byte words (x + residual, rounded, when
// there is one), so x and the residual are read once; 16-byte loads and
// stores; warp-shuffle block sums. With NV <= 4 the next row's x (and its
// first value) is loaded before this row's sums and stores, so a block keeps
// a row's loads in flight through the other's barriers: one row at a time
// per block left the memory system idle between a row's phases. The
// statistics as the scalar kernel takes them: the mean of s - shift (shift
// = the row's first value), then the variance of (s - shift) - delta, both
// from the registers.
template <typename T, int NV>
__device__ __forceinline__ void norm_load_row(const T* x, k_i64 base, k_i64 nvec, k_v16* raw) {
  constexpr int N = K_VEC<T>::N;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
    if (j < nvec) raw[k] = k_ldraw(x, base + j * N);
  }
}

template <typename T, int NV>
__device__ void norm_vec(const T* x, const T* res, const T* scale, const T* bias, T* y, T* sum,
                         k_i64 rows, k_i64 n, float eps, int rms, int has_res, int has_scale,
                         int has_bias, int emit_sum) {
  constexpr int N = K_VEC<T>::N;
  constexpr bool kPrefetch = NV <= 4;
  __shared__ float scratch[32];
  const k_i64 nvec = n / N;
  k_v16 next[kPrefetch ? NV : 1];
  float next_first = 0.0f;
  if (kPrefetch && blockIdx.x < rows) {
    norm_load_row<T, NV>(x, static_cast<k_i64>(blockIdx.x) * n, nvec, next);
    next_first = k_load(x, static_cast<k_i64>(blockIdx.x) * n);
  }
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    k_v16 raw[NV];
    float first;
    if (kPrefetch) {
#pragma unroll
      for (int k = 0; k < NV; ++k) raw[k] = next[k];
      first = next_first;
      const k_i64 nrow = row + gridDim.x;
      if (nrow < rows) {
        norm_load_row<T, NV>(x, nrow * n, nvec, next);
        next_first = k_load(x, nrow * n);
      }
    } else {
      norm_load_row<T, NV>(x, base, nvec, raw);
      first = k_load(x, base);
    }
    if (has_res) first = k_round(x, first + k_load(res, base));
    const float shift = rms ? 0.0f : first;
    float part = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const k_i64 j = threadIdx.x + static_cast<k_i64>(k) * blockDim.x;
      if (j < nvec) {
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

// Registers: 64 per thread at 4 blocks of 256 (NV 1, 2); NV = 4 holds two
// rows of 4 vectors (the prefetch), 85 at 3 blocks, without spilling.
#define KILN_NORM_VEC(S, T, NV)                                                                 \
  extern "C" __global__ void __launch_bounds__(NV == 8 ? 1024 : 256, NV == 8 ? 1 : NV == 4 ? 3 : 4) kiln_norm_v##NV##_##S(                                             \
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

// GroupNorm: x [N, C, spatial...] as N * groups rows of n = C / groups *
// spatial contiguous elements (one group's channels times the spatial
// positions), one block per row, blocks striding over rows. The statistics
// as LayerNorm's: two passes about the row's first value, so a large common
// offset costs no precision; scale and bias are per channel (channel =
// row % groups * C / groups + j / spatial). Math in f32; n fits 32 bits (the
// host checks), so the channel division is a 32-bit one.
template <typename T>
__device__ void group_norm_rows(const T* x, const T* scale, const T* bias, T* y, k_i64 rows,
                                k_i64 groups, unsigned n, unsigned spatial, float eps,
                                int has_scale, int has_bias) {
  __shared__ float scratch[32];
  const unsigned cg = n / spatial;
  for (k_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
    const k_i64 base = row * n;
    const float shift = k_load(x, base);
    float part = 0.0f;
    for (unsigned j = threadIdx.x; j < n; j += blockDim.x) part += k_load(x, base + j) - shift;
    const float delta = k_block_sum(part, scratch) / static_cast<float>(n);
    float sq = 0.0f;
    for (unsigned j = threadIdx.x; j < n; j += blockDim.x) {
      const float d = (k_load(x, base + j) - shift) - delta;
      sq += d * d;
    }
    const float rstd = 1.0f / sqrtf(k_block_sum(sq, scratch) / static_cast<float>(n) + eps);
    const k_i64 ch0 = (row % groups) * cg;
    for (unsigned j = threadIdx.x; j < n; j += blockDim.x) {
      float v = ((k_load(x, base + j) - shift) - delta) * rstd;
      const k_i64 ch = ch0 + j / spatial;
      if (has_scale) v *= k_load(scale, ch);
      if (has_bias) v += k_load(bias, ch);
      k_store(y, base + j, v);
    }
  }
}

#define KILN_GROUP_NORM(S, T)                                                                   \
  extern "C" __global__ void kiln_group_norm_##S(const T* x, const T* scale, const T* bias, T* y, \
                                                 k_i64 rows, k_i64 groups, unsigned n,           \
                                                 unsigned spatial, float eps, int has_scale,     \
                                                 int has_bias) {                                 \
    group_norm_rows<T>(x, scale, bias, y, rows, groups, n, spatial, eps, has_scale, has_bias);   \
  }
KILN_GROUP_NORM(f32, float)
KILN_GROUP_NORM(f16, k_f16)
KILN_GROUP_NORM(bf16, k_bf16)
