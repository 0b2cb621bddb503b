// Losses. Row and element math and every sum in f64; the final sums run in
// one block in a fixed order, so results do not depend on scheduling.
//
// SoftmaxCrossEntropy, one block per row of C logits: lse = logsumexp(x);
// integer labels give (1 - s)(lse - x_y) + s(lse - mean(x)), probability
// labels sum_c ((1 - s) p_c + s / C)(lse - x_c). A row whose label is
// ignore_index gives 0 and is not counted (valid[r] = 0); a label outside
// [0, C) gives 0 and is reported in the error slot (code 1, row, label).
// loss[r] and valid[r] feed loss_sum; with reduction none the row's loss is
// stored into `none` instead.
__device__ __forceinline__ k_i64 xent_label(const void* labels, int kind, k_i64 i) {
  switch (kind) {
    case 1: return static_cast<const k_i8*>(labels)[i];
    case 2: return static_cast<const k_u8*>(labels)[i];
    case 3: return static_cast<const k_i16*>(labels)[i];
    case 4: return static_cast<const k_i32*>(labels)[i];
    default: return static_cast<const k_i64*>(labels)[i];
  }
}

template <typename T>
__device__ void xent_rows(const T* x, const void* labels, int label_kind, const T* probs,
                          double* loss, double* valid, T* none, k_i64 rows, k_i64 c,
                          double smoothing, int has_ignore, k_i64 ignore, k_u64* err) {
  __shared__ double scratch[32];
  for (k_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const k_i64 base = r * c;
    k_i64 label = 0;
    bool skip = false;
    if (label_kind != 0) {
      label = xent_label(labels, label_kind, r);
      if (has_ignore && label == ignore) {
        skip = true;
      } else if (label < 0 || label >= c) {
        skip = true;
        if (threadIdx.x == 0 && atomicCAS(err, 0ull, 1ull) == 0ull) {
          err[1] = static_cast<k_u64>(r);
          err[2] = static_cast<k_u64>(label);
          __threadfence_system();
        }
      }
    }
    double l = 0.0;
    if (!skip) {
      float mf = -K_INF;
      for (k_i64 j = threadIdx.x; j < c; j += blockDim.x) mf = k_max(mf, k_load(x, base + j));
      const double m = k_block_max(mf, reinterpret_cast<float*>(scratch));
      double se = 0.0, sx = 0.0;
      for (k_i64 j = threadIdx.x; j < c; j += blockDim.x) {
        const double v = k_load(x, base + j);
        se += exp(v - m);
        sx += v;
      }
      se = k_block_sum_f64(se, scratch);
      const double lse = m + log(se);
      if (label_kind != 0) {
        sx = k_block_sum_f64(sx, scratch);
        l = (1.0 - smoothing) * (lse - static_cast<double>(k_load(x, base + label)));
        if (smoothing > 0.0) l += smoothing * (lse - sx / static_cast<double>(c));
      } else {
        double part = 0.0;
        for (k_i64 j = threadIdx.x; j < c; j += blockDim.x) {
          const double q = (1.0 - smoothing) * k_load(probs, base + j) +
                           smoothing / static_cast<double>(c);
          part += q * (lse - static_cast<double>(k_load(x, base + j)));
        }
        l = k_block_sum_f64(part, scratch);
      }
    }
    if (threadIdx.x == 0) {
      if (none != nullptr) {
        k_store(none, r, static_cast<float>(l));
      } else {
        loss[r] = l;
        valid[r] = (label_kind != 0 && skip) ? 0.0 : 1.0;
      }
    }
    __syncthreads();
  }
}

// MeanSquaredError over the broadcast of pred and target (rank <= 8, a
// stride of 0 where a side broadcasts): the square of the f32 difference,
// stored rounded (reduction none), or summed in f64 per block into
// partial[blockIdx.x] for loss_sum.
#define K_MSE_MAX_RANK 8
struct MseParams {
  k_i64 rank, count;
  k_i64 dims[K_MSE_MAX_RANK], ps[K_MSE_MAX_RANK], ts[K_MSE_MAX_RANK];
};

template <typename T>
__device__ void mse(const T* pred, const T* target, T* none, double* partial, MseParams p) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (k_i64 t = static_cast<k_i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.count;
       t += static_cast<k_i64>(gridDim.x) * blockDim.x) {
    k_i64 rem = t, pi = 0, ti = 0;
    for (int k = static_cast<int>(p.rank) - 1; k >= 0; --k) {
      const k_i64 c = rem % p.dims[k];
      rem /= p.dims[k];
      pi += c * p.ps[k];
      ti += c * p.ts[k];
    }
    const float d = k_load(pred, pi) - k_load(target, ti);
    const float sq = d * d;
    if (none != nullptr) {
      k_store(none, t, sq);
    } else {
      acc += sq;
    }
  }
  if (none == nullptr) {
    acc = k_block_sum_f64(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  }
}

// out = sum(values[0, n)) / (mean ? count : 1), where count is the sum of
// valid[0, n) when `valid` is given. One block, fixed order.
template <typename T>
__device__ void loss_sum(const double* values, const double* valid, k_i64 n, double count,
                         int mean, T* out) {
  __shared__ double scratch[32];
  double s = 0.0, k = 0.0;
  for (k_i64 i = threadIdx.x; i < n; i += blockDim.x) {
    s += values[i];
    if (valid != nullptr) k += valid[i];
  }
  s = k_block_sum_f64(s, scratch);
  if (valid != nullptr) count = k_block_sum_f64(k, scratch);
  if (threadIdx.x == 0) k_store(out, 0, static_cast<float>(mean ? s / count : s));
}

#define KILN_LOSS(S, T)                                                                          \
  extern "C" __global__ void kiln_xent_##S(const T* x, const void* labels, int label_kind,      \
                                           const T* probs, double* loss, double* valid, T* none, \
                                           k_i64 rows, k_i64 c, double smoothing,               \
                                           int has_ignore, k_i64 ignore, k_u64* err) {           \
    xent_rows<T>(x, labels, label_kind, probs, loss, valid, none, rows, c, smoothing,           \
                 has_ignore, ignore, err);                                                       \
  }                                                                                              \
  extern "C" __global__ void kiln_mse_##S(const T* pred, const T* target, T* none,              \
                                          double* partial, MseParams p) {                        \
    mse<T>(pred, target, none, partial, p);                                                      \
  }                                                                                              \
  extern "C" __global__ void kiln_loss_sum_##S(const double* values, const double* valid,       \
                                               k_i64 n, double count, int mean, T* out) {        \
    loss_sum<T>(values, valid, n, count, mean, out);                                             \
  }
KILN_LOSS(f32, float)
KILN_LOSS(f16, k_f16)
KILN_LOSS(bf16, k_bf16)
