// TopK along the middle dim of [outer, n, inner]: for each (outer, inner)
// row, the k largest (or smallest) values in order, ties by the lower index,
// NaN above +inf (leading the largest, trailing the smallest), as the CPU
// kernel orders them; values copied bit for bit, indices i32 or i64. A thread
// per row selects k times the next element after the previous one in that
// total order: O(n k) per row and no scratch (the rows TopK serves, logits'
// top-k and beam search, are short next to the work of the graphs around it).
template <typename T>
__device__ __forceinline__ bool topk_before(const T* x, k_i64 base, k_i64 inner, k_i64 p, k_i64 q,
                                            int smallest) {
  const auto u = k_acc(x, base + p * inner), v = k_acc(x, base + q * inner);
  const bool un = k_isnan(u), vn = k_isnan(v);
  if (un || vn) {
    if (un && vn) return p < q;
    return smallest ? vn : un;
  }
  if (u != v) return smallest ? u < v : u > v;
  return p < q;
}

template <typename T, typename I>
__device__ void topk(const T* x, T* values, I* indices, k_i64 outer, k_i64 n, k_i64 inner,
                     k_i64 k, int smallest) {
  const k_i64 total = outer * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 o = t / inner, i = t % inner;
    const k_i64 base = o * n * inner + i;
    k_i64 prev = -1;
    for (k_i64 j = 0; j < k; ++j) {
      k_i64 best = -1;
      for (k_i64 r = 0; r < n; ++r) {
        if (prev >= 0 && !topk_before(x, base, inner, prev, r, smallest)) continue;  // taken
        if (best < 0 || topk_before(x, base, inner, r, best, smallest)) best = r;
      }
      const k_i64 dst = o * k * inner + j * inner + i;
      values[dst] = x[base + best * inner];
      indices[dst] = static_cast<I>(best);
      prev = best;
    }
  }
}

#define KILN_TOPK(S, T)                                                                          \
  extern "C" __global__ void kiln_topk_##S##_i32(const T* x, T* v, k_i32* idx, k_i64 outer,     \
                                                 k_i64 n, k_i64 inner, k_i64 k, int smallest) { \
    topk<T, k_i32>(x, v, idx, outer, n, inner, k, smallest);                                     \
  }                                                                                              \
  extern "C" __global__ void kiln_topk_##S##_i64(const T* x, T* v, k_i64* idx, k_i64 outer,     \
                                                 k_i64 n, k_i64 inner, k_i64 k, int smallest) { \
    topk<T, k_i64>(x, v, idx, outer, n, inner, k, smallest);                                     \
  }
KILN_TOPK(f32, float)
KILN_TOPK(f16, k_f16)
KILN_TOPK(bf16, k_bf16)
KILN_TOPK(i8, k_i8)
KILN_TOPK(u8, k_u8)
KILN_TOPK(i16, k_i16)
KILN_TOPK(i32, k_i32)
KILN_TOPK(i64, k_i64)
