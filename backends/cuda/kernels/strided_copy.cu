// Strided copies (Transpose, Slice, Expand, Concat): dst[dst_base + sum c_k
// dst[k]] = src[src_base + sum c_k src[k]] over the index space `dims`, for
// elements of 1, 2, 4 or 8 bytes (the bytes are moved, not interpreted).
struct StridedParams {
  k_i64 count, rank, src_base, dst_base;
  k_i64 dims[8], src[8], dst[8];
};

template <typename E>
__device__ void strided_copy(const E* src, E* dst, const StridedParams& p) {
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.count;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    k_i64 rem = t, s = p.src_base, d = p.dst_base;
    for (int k = static_cast<int>(p.rank) - 1; k >= 0; --k) {
      const k_i64 c = rem % p.dims[k];
      rem /= p.dims[k];
      s += c * p.src[k];
      d += c * p.dst[k];
    }
    dst[d] = src[s];
  }
}

#define KILN_STRIDED(N, E)                                                                  \
  extern "C" __global__ void kiln_strided_copy_e##N(const E* src, E* dst, StridedParams p) { \
    strided_copy<E>(src, dst, p);                                                           \
  }
KILN_STRIDED(1, unsigned char)
KILN_STRIDED(2, unsigned short)
KILN_STRIDED(4, unsigned)
KILN_STRIDED(8, unsigned long long)
