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

// GroupNorm's split path, for few long rows (N * groups below twice the SM
// count: one block per row leaves SMs idle and reads x three times).
// A row is cut into chunks of K_GN_CHUNK elements, a block per (chunk, row)
// (grid.x = splits, grid.y = rows), 256 threads holding 16 elements each in
// registers. kiln_group_norm_stats_*: a chunk's mean about the row's shift
// (its first value) and its M2 about that mean, both from the registers (two
// passes, no cancellation), into part[row][split] = (mean, M2).
// kiln_group_norm_apply_*: every block first combines its row's partials
// (Chan's parallel formula: mean = sum(c_b mean_b) / n, M2 = sum(M2_b +
// c_b (mean_b - mean)^2), in f32), then normalizes its chunk. y = ((x -
// shift) - mean) * rstd (* scale + bias), the same arithmetic as the row
// kernel's. x is read twice (once per kernel) instead of three times, and
// both kernels cover every SM. The _v forms load 16-byte vectors (n a
// multiple of K_VEC<T>::N and x, y 16-byte aligned: the host checks); the _s
// forms one element at a time.
#define K_GN_THREADS 256
#define K_GN_PER 16
#define K_GN_CHUNK (K_GN_THREADS * K_GN_PER)

// Loads the chunk [c0, end) of the row at `base` into v (W consecutive
// elements per load); valid[k] says whether load k was in range.
template <typename T, int W>
__device__ __forceinline__ void group_norm_load(const T* x, k_i64 base, unsigned c0, unsigned end,
                                                float* v, bool* valid) {
#pragma unroll
  for (int k = 0; k < K_GN_PER / W; ++k) {
    const unsigned j = c0 + (k * K_GN_THREADS + threadIdx.x) * W;
    valid[k] = j < end;
    if (!valid[k]) continue;
    if (W == 1) {
      v[k] = k_load(x, base + j);
    } else {
      k_ldv(x, base + j, v + k * W);
    }
  }
}

template <typename T, int W>
__device__ void group_norm_stats(const T* x, float* part, unsigned n, unsigned splits) {
  __shared__ float scratch[32];
  const unsigned split = blockIdx.x;
  const k_i64 row = blockIdx.y, base = row * n;
  const unsigned c0 = split * K_GN_CHUNK, end = min(n, c0 + K_GN_CHUNK);
  const float shift = k_load(x, base);
  float v[K_GN_PER];
  bool valid[K_GN_PER / W];
  group_norm_load<T, W>(x, base, c0, end, v, valid);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < K_GN_PER / W; ++k) {
    if (!valid[k]) continue;
#pragma unroll
    for (int l = 0; l < W; ++l) {
      v[k * W + l] -= shift;
      s += v[k * W + l];
    }
  }
  const float mean = k_block_sum(s, scratch) / static_cast<float>(end - c0);
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < K_GN_PER / W; ++k) {
    if (!valid[k]) continue;
#pragma unroll
    for (int l = 0; l < W; ++l) {
      const float d = v[k * W + l] - mean;
      q += d * d;
    }
  }
  const float m2 = k_block_sum(q, scratch);
  if (threadIdx.x == 0) {
    part[2 * (row * splits + split)] = mean;
    part[2 * (row * splits + split) + 1] = m2;
  }
}

template <typename T, int W>
__device__ void group_norm_apply(const T* x, const T* scale, const T* bias, T* y,
                                 const float* part, k_i64 groups, unsigned n, unsigned spatial,
                                 unsigned splits, float eps, int has_scale, int has_bias) {
  __shared__ float scratch[32];
  const unsigned split = blockIdx.x;
  const k_i64 row = blockIdx.y, base = row * n;
  const float* rp = part + 2 * row * splits;
  float a = 0.0f;
  for (unsigned b = threadIdx.x; b < splits; b += blockDim.x) {
    const float c = static_cast<float>(min(n, (b + 1) * K_GN_CHUNK) - b * K_GN_CHUNK);
    a += c * rp[2 * b];
  }
  const float mean = k_block_sum(a, scratch) / static_cast<float>(n);
  float q = 0.0f;
  for (unsigned b = threadIdx.x; b < splits; b += blockDim.x) {
    const float c = static_cast<float>(min(n, (b + 1) * K_GN_CHUNK) - b * K_GN_CHUNK);
    const float d = rp[2 * b] - mean;
    q += rp[2 * b + 1] + c * d * d;
  }
  const float rstd = 1.0f / sqrtf(k_block_sum(q, scratch) / static_cast<float>(n) + eps);
  const unsigned c0 = split * K_GN_CHUNK, end = min(n, c0 + K_GN_CHUNK);
  const float shift = k_load(x, base);
  float v[K_GN_PER];
  bool valid[K_GN_PER / W];
  group_norm_load<T, W>(x, base, c0, end, v, valid);
  const k_i64 ch0 = (row % groups) * (n / spatial);
#pragma unroll
  for (int k = 0; k < K_GN_PER / W; ++k) {
    if (!valid[k]) continue;
    const unsigned j = c0 + (k * K_GN_THREADS + threadIdx.x) * W;
    unsigned ch = j / spatial, at = j - ch * spatial;  // channel within the group, position
    float o[W];
#pragma unroll
    for (int l = 0; l < W; ++l) {
      float r = ((v[k * W + l] - shift) - mean) * rstd;
      if (has_scale) r *= k_load(scale, ch0 + ch);
      if (has_bias) r += k_load(bias, ch0 + ch);
      o[l] = r;
      if (++at == spatial) at = 0, ++ch;
    }
    if (W == 1) {
      k_store(y, base + j, o[0]);
    } else {
      k_stv(y, base + j, o);
    }
  }
}

#define KILN_GROUP_NORM_SPLIT(S, T, F, W)                                                        \
  extern "C" __global__ void __launch_bounds__(K_GN_THREADS) kiln_group_norm_stats_##F##_##S(    \
      const T* x, float* part, unsigned n, unsigned splits) {                                    \
    group_norm_stats<T, W>(x, part, n, splits);                                                 \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(K_GN_THREADS) kiln_group_norm_apply_##F##_##S(    \
      const T* x, const T* scale, const T* bias, T* y, const float* part, k_i64 groups,         \
      unsigned n, unsigned spatial, unsigned splits, float eps, int has_scale, int has_bias) {   \
    group_norm_apply<T, W>(x, scale, bias, y, part, groups, n, spatial, splits, eps, has_scale, \
                           has_bias);                                                           \
  }
KILN_GROUP_NORM_SPLIT(f32, float, s, 1)
KILN_GROUP_NORM_SPLIT(f16, k_f16, s, 1)
KILN_GROUP_NORM_SPLIT(bf16, k_bf16, s, 1)
KILN_GROUP_NORM_SPLIT(f32, float, v, 4)
KILN_GROUP_NORM_SPLIT(f16, k_f16, v, 8)
KILN_GROUP_NORM_SPLIT(bf16, k_bf16, v, 8)
