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

#define KILN_REDUCE(S, T)                                                                    \
  extern "C" __global__ void kiln_reduce_rows_##S(const T* x, T* y, k_i64 outer, k_i64 r,    \
                                                  int kind) {                                \
    reduce_rows<T>(x, y, outer, r, kind);                                                    \
  }                                                                                          \
  extern "C" __global__ void kiln_reduce_cols_##S(const T* x, T* y, k_i64 outer, k_i64 r,    \
                                                  k_i64 inner, int kind) {                   \
    reduce_cols<T>(x, y, outer, r, inner, kind);                                             \
  }
KILN_REDUCE(f32, float)
KILN_REDUCE(f16, k_f16)
KILN_REDUCE(bf16, k_bf16)
