// Strided copies (Transpose, Slice, Expand, Concat): dst[dst_base + sum c_k
// dst[k]] = src[src_base + sum c_k src[k]] over the index space `dims`, for
// elements of 1, 2, 4 or 8 bytes (the bytes are moved, not interpreted), or of
// 16 bytes: a copy whose innermost run is contiguous on both sides and whose
// offsets are multiples of 16 bytes, moved as k_v16 vectors.
// The index type I is 32-bit where every offset fits (cheaper division).
struct StridedParams {
  k_i64 count, rank, src_base, dst_base;
  k_i64 dims[8], src[8], dst[8];
};

template <typename E, typename I>
__device__ void strided_copy(const E* src, E* dst, const StridedParams& p) {
  // The loop over dims has a fixed bound and is unrolled, so each dim's
  // extent and strides are read from the parameter bank at a constant index:
  // copied into arrays indexed by a run-time k they lived in local memory (a
  // 96-byte stack frame per thread, ~0.4 TB/s on an H100 for the head
  // transposes around attention; bert8).
  const int rank = static_cast<int>(p.rank);
  const I count = static_cast<I>(p.count);
  for (I t = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; t < count;
       t += static_cast<I>(gridDim.x) * blockDim.x) {
    I rem = t, s = static_cast<I>(p.src_base), d = static_cast<I>(p.dst_base);
#pragma unroll
    for (int k = 7; k >= 0; --k) {
      if (k < rank) {
        const I n = static_cast<I>(p.dims[k]);
        const I c = rem % n;
        rem /= n;
        s += c * static_cast<I>(p.src[k]);
        d += c * static_cast<I>(p.dst[k]);
      }
    }
    dst[d] = src[s];
  }
}

#define KILN_STRIDED(N, E)                                                                    \
  extern "C" __global__ void kiln_strided_copy_e##N(const E* src, E* dst, StridedParams p) {   \
    strided_copy<E, k_u64>(src, dst, p);                                                      \
  }                                                                                           \
  extern "C" __global__ void kiln_strided_copy32_e##N(const E* src, E* dst, StridedParams p) { \
    strided_copy<E, unsigned>(src, dst, p);                                                   \
  }
KILN_STRIDED(1, unsigned char)
KILN_STRIDED(2, unsigned short)
KILN_STRIDED(4, unsigned)
KILN_STRIDED(8, unsigned long long)
KILN_STRIDED(16, k_v16)
