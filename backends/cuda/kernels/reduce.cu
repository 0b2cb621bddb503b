// Reduce (Sum, Mean, Max, Min, Prod) over the middle dim of [outer, r, inner]
// (the reduced axes, contiguous after merging dims). Rows (inner == 1): one
// block per output, blocks striding. Columns: one thread per output,
// coalesced along inner. Max and Min propagate NaN. Accumulates in f32.
// kind: 0 sum, 1 mean, 2 max, 3 min, 4 prod.
__device__ __forceinline__ float reduce_init(int kind) {
  return kind == 2 ? -K_INF : kind == 3 ? K_INF : kind == 4 ? 1.0f : 0.0f;
}
__device__ __forceinline__ float reduce_step(int kind, float a, float b) {
  switch (kind) {
    case 2: return k_max(a, b);
    case 3: return k_min(a, b);
    case 4: return a * b;
    default: return a + b;
  }
}

template <typename T>
__device__ void reduce_rows(const T* x, T* y, k_i64 outer, k_i64 r, int kind) {
  __shared__ float scratch[32];
  __shared__ float partial[1024];
  for (k_i64 row = blockIdx.x; row < outer; row += gridDim.x) {
    float acc = reduce_init(kind);
    for (k_i64 j = threadIdx.x; j < r; j += blockDim.x) acc = reduce_step(kind, acc, k_load(x, row * r + j));
    float v;
    if (kind == 0 || kind == 1) {
      v = k_block_sum(acc, scratch);
    } else if (kind == 2) {
      v = k_block_max(acc, scratch);
    } else {
      // Min and Prod through shared memory, in a fixed order.
      __syncthreads();
      partial[threadIdx.x] = acc;
      __syncthreads();
      for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] = reduce_step(kind, partial[threadIdx.x], partial[threadIdx.x + s]);
        __syncthreads();
      }
      v = partial[0];
    }
    if (kind == 1) v /= static_cast<float>(r);
    if (threadIdx.x == 0) k_store(y, row, v);
  }
}

template <typename T>
__device__ void reduce_cols(const T* x, T* y, k_i64 outer, k_i64 r, k_i64 inner, int kind) {
  const k_i64 total = outer * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 base = (t / inner) * r * inner + t % inner;
    float acc = reduce_init(kind);
    for (k_i64 j = 0; j < r; ++j) acc = reduce_step(kind, acc, k_load(x, base + j * inner));
    if (kind == 1) acc /= static_cast<float>(r);
    k_store(y, t, acc);
  }
}

// Columns with few outputs and a long reduced dim (a bias gradient: [64]
// from [16384, 64]): the serial loop above would give each of 64 threads
// 16384 dependent steps. Here a block of 256 threads (32 x 8) takes 32
// adjacent columns of one outer index (coalesced along inner) and one of
// `splits` contiguous slices of r; its 8 rows of threads stride over the
// slice and fold in a fixed order through shared memory. With splits == 1 the block
// writes y; else it writes its f32 partial to part[(o * splits + s) * inner
// + col] and reduce_cols_finish folds the splits, in order. Deterministic.
// Grid: x = outer * ceil(inner / 32) tiles, y = splits.
template <typename T>
__device__ void reduce_cols_split(const T* x, T* y, float* part, k_i64 outer, k_i64 r,
                                  k_i64 inner, k_i64 splits, int kind) {
  __shared__ float tile[8][33];
  const unsigned tx = threadIdx.x & 31u, ty = threadIdx.x >> 5;  // 256 threads: 32 x 8
  const k_i64 tiles_per_outer = (inner + 31) / 32;
  const k_i64 o = static_cast<k_i64>(blockIdx.x) / tiles_per_outer;
  const k_i64 col = (static_cast<k_i64>(blockIdx.x) % tiles_per_outer) * 32 + tx;
  const k_i64 s = blockIdx.y;
  const k_i64 chunk = (r + splits - 1) / splits;
  const k_i64 lo = s * chunk, hi = lo + chunk < r ? lo + chunk : r;
  float acc = reduce_init(kind);
  if (o < outer && col < inner) {
    const T* base = x + o * r * inner + col;
    k_i64 j = lo + ty;
    // Four independent loads in flight per thread, folded in row order.
    for (; j + 24 < hi; j += 32) {
      const float a0 = k_load(base, j * inner), a1 = k_load(base, (j + 8) * inner);
      const float a2 = k_load(base, (j + 16) * inner), a3 = k_load(base, (j + 24) * inner);
      acc = reduce_step(kind, reduce_step(kind, reduce_step(kind, reduce_step(kind, acc, a0), a1), a2), a3);
    }
    for (; j < hi; j += 8) acc = reduce_step(kind, acc, k_load(base, j * inner));
  }
  tile[ty][tx] = acc;
  __syncthreads();
  if (ty != 0 || o >= outer || col >= inner) return;
  float v = tile[0][tx];
  for (int t = 1; t < 8; ++t) v = reduce_step(kind, v, tile[t][tx]);
  if (splits > 1) {
    part[(o * splits + s) * inner + col] = v;
    return;
  }
  if (kind == 1) v /= static_cast<float>(r);
  k_store(y, o * inner + col, v);
}

template <typename T>
__device__ void reduce_cols_finish(const float* part, T* y, k_i64 outer, k_i64 r, k_i64 inner,
                                   k_i64 splits, int kind) {
  const k_i64 total = outer * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const float* p = part + (t / inner) * splits * inner + t % inner;
    float v = p[0];
    for (k_i64 s = 1; s < splits; ++s) v = reduce_step(kind, v, p[s * inner]);
    if (kind == 1) v /= static_cast<float>(r);
    k_store(y, t, v);
  }
}

#define KILN_REDUCE(S, T)                                                                    \
  extern "C" __global__ void kiln_reduce_rows_##S(const T* x, T* y, k_i64 outer, k_i64 r,    \
                                                  int kind) {                                \
    reduce_rows<T>(x, y, outer, r, kind);                                                    \
  }                                                                                          \
  extern "C" __global__ void kiln_reduce_cols_##S(const T* x, T* y, k_i64 outer, k_i64 r,    \
                                                  k_i64 inner, int kind) {                   \
    reduce_cols<T>(x, y, outer, r, inner, kind);                                             \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(256) kiln_reduce_cols_split_##S(              \
      const T* x, T* y, float* part, k_i64 outer, k_i64 r, k_i64 inner, k_i64 splits,        \
      int kind) {                                                                            \
    reduce_cols_split<T>(x, y, part, outer, r, inner, splits, kind);                         \
  }                                                                                          \
  extern "C" __global__ void kiln_reduce_cols_finish_##S(const float* part, T* y,            \
                                                         k_i64 outer, k_i64 r, k_i64 inner,  \
                                                         k_i64 splits, int kind) {           \
    reduce_cols_finish<T>(part, y, outer, r, inner, splits, kind);                           \
  }
KILN_REDUCE(f32, float)
KILN_REDUCE(f16, k_f16)
KILN_REDUCE(bf16, k_bf16)

// The general path: any axes, any float or integer dtype. Output element o
// (row-major over the kept dims) folds the reduced dims' elements in
// row-major order; one block per output (blocks striding), threads striding
// over the reduced elements, then a fixed-order tree in shared memory.
// Floats accumulate in f64 (max/min propagate NaN), integers in i64 with
// sums and products wrapping as the dtype does. An empty reduction gives the
// identity (mean: NaN). blockDim.x is a power of two, at most 256.
#define K_RED_MAX_RANK 8
struct ReduceGen {
  k_i64 kept_rank, red_rank, n_out, n_red;
  k_i64 kept_dims[K_RED_MAX_RANK], kept_str[K_RED_MAX_RANK];
  k_i64 red_dims[K_RED_MAX_RANK], red_str[K_RED_MAX_RANK];
};

template <typename A>
__device__ __forceinline__ A reduce_gen_init(int kind);
template <>
__device__ __forceinline__ double reduce_gen_init<double>(int kind) {
  return kind == 2 ? -__longlong_as_double(0x7ff0000000000000ll)
         : kind == 3 ? __longlong_as_double(0x7ff0000000000000ll)
         : kind == 4 ? 1.0 : 0.0;
}
template <>
__device__ __forceinline__ k_i64 reduce_gen_init<k_i64>(int kind) {
  return kind == 2 ? static_cast<k_i64>(0x8000000000000000ull)
         : kind == 3 ? 0x7fffffffffffffffll
         : kind == 4 ? 1 : 0;
}
template <typename A>
__device__ __forceinline__ A reduce_gen_step(int kind, A a, A x) {
  switch (kind) {
    case 2: return (k_isnan(a) || k_isnan(x)) ? (k_isnan(a) ? a : x) : (x > a ? x : a);
    case 3: return (k_isnan(a) || k_isnan(x)) ? (k_isnan(a) ? a : x) : (x < a ? x : a);
    case 4: return k_mul(a, x);
    default: return k_add(a, x);
  }
}

template <typename T>
__device__ void reduce_gen(const T* x, T* y, const ReduceGen& p, int kind) {
  typedef decltype(k_acc(x, 0)) A;
  __shared__ A partial[256];
  for (k_i64 o = blockIdx.x; o < p.n_out; o += gridDim.x) {
    k_i64 base = 0, rem = o;
    for (int k = static_cast<int>(p.kept_rank) - 1; k >= 0; --k) {
      base += (rem % p.kept_dims[k]) * p.kept_str[k];
      rem /= p.kept_dims[k];
    }
    A acc = reduce_gen_init<A>(kind);
    for (k_i64 j = threadIdx.x; j < p.n_red; j += blockDim.x) {
      k_i64 off = base;
      rem = j;
      for (int k = static_cast<int>(p.red_rank) - 1; k >= 0; --k) {
        off += (rem % p.red_dims[k]) * p.red_str[k];
        rem /= p.red_dims[k];
      }
      acc = reduce_gen_step(kind, acc, k_acc(x, off));
    }
    __syncthreads();
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        partial[threadIdx.x] = reduce_gen_step(kind, partial[threadIdx.x], partial[threadIdx.x + s]);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      A v = partial[0];
      if (kind == 1) v = v / static_cast<A>(p.n_red);
      k_put(y, o, v);
    }
  }
}

#define KILN_REDUCE_GEN(S, T)                                                                  \
  extern "C" __global__ void kiln_reduce_gen_##S(const T* x, T* y, ReduceGen p, int kind) {    \
    reduce_gen<T>(x, y, p, kind);                                                              \
  }
KILN_REDUCE_GEN(f32, float)
KILN_REDUCE_GEN(f16, k_f16)
KILN_REDUCE_GEN(bf16, k_bf16)
KILN_REDUCE_GEN(i8, k_i8)
KILN_REDUCE_GEN(u8, k_u8)
KILN_REDUCE_GEN(i16, k_i16)
KILN_REDUCE_GEN(i32, k_i32)
KILN_REDUCE_GEN(i64, k_i64)
