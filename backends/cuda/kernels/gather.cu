// numpy.take(data, indices, axis) over data viewed as [outer, axis_size,
// inner]: out[o, j, i] = data[o, idx[j], i]. Negative indices count from the
// end. An index outside [-axis_size, axis_size) is never dereferenced: its
// outputs become zero and one of them is reported in the error slot (code 1,
// then the index's position and its value). Elements of 1/2/4/8 bytes are
// moved, not interpreted.
template <typename E, typename I>
__device__ void gather(const E* data, const I* idx, E* out, k_i64 outer, k_i64 nidx,
                       k_i64 axis_size, k_i64 inner, k_u64* err) {
  const k_i64 total = outer * nidx * inner;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    const k_i64 in_ = t % inner;
    const k_i64 r = t / inner;
    const k_i64 j = r % nidx;
    const k_i64 o = r / nidx;
    const k_i64 v = static_cast<k_i64>(idx[j]);
    const k_i64 w = v < 0 ? v + axis_size : v;
    if (w < 0 || w >= axis_size) {
      out[t] = E(0);
      if (atomicCAS(err, 0ull, 1ull) == 0ull) {
        err[1] = static_cast<k_u64>(j);
        err[2] = static_cast<k_u64>(v);
        __threadfence_system();
      }
      continue;
    }
    out[t] = data[(o * axis_size + w) * inner + in_];
  }
}

#define KILN_GATHER(N, E, IN, I)                                                              \
  extern "C" __global__ void kiln_gather_e##N##_##IN(const E* data, const I* idx, E* out,     \
                                                     k_i64 outer, k_i64 nidx, k_i64 axis_size, \
                                                     k_i64 inner, k_u64* err) {               \
    gather<E, I>(data, idx, out, outer, nidx, axis_size, inner, err);                         \
  }
#define KILN_GATHER_INDICES(N, E)               \
  KILN_GATHER(N, E, i32, int)                   \
  KILN_GATHER(N, E, i64, long long)             \
  KILN_GATHER(N, E, i16, short)                 \
  KILN_GATHER(N, E, i8, signed char)            \
  KILN_GATHER(N, E, u8, unsigned char)
KILN_GATHER_INDICES(1, unsigned char)
KILN_GATHER_INDICES(2, unsigned short)
KILN_GATHER_INDICES(4, unsigned)
KILN_GATHER_INDICES(8, unsigned long long)
