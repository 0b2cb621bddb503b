// Softmax, LogSoftmax, LayerNorm, RmsNorm, FusedResidualNorm and GroupNorm.
//
// All are row-wise: a row is the softmax axis (or the normalized trailing
// dims) and rows run in parallel. f32 rows use AVX2 (the vector exp of
// simd_math.h) with sums accumulated in f64, so long rows and rows with a
// large mean stay accurate; f16/bf16 rows are widened to f32 scratch and
// narrowed back; f64 rows are plain double loops. Softmax over an axis that
// is not the last works on [n, inner] slabs, vectorized across `inner`.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/simd_math.h"

namespace kiln::cpu {
namespace {

using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;
using simd::Set;

constexpr int64_t kGrainElems = int64_t{1} << 14;

inline void AddPd(__m256 v, __m256d& lo, __m256d& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

inline double HSumPd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// Sum of f(x[i]) in f64, 8 lanes at a time; masked-off tail lanes count 0.
template <typename F>
double SumF32(const float* x, int64_t n, F f) {
  __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) AddPd(f(_mm256_loadu_ps(x + i)), a, b);
  if (i < n) {
    const __m256i m = simd::TailMask(n - i);
    AddPd(_mm256_and_ps(f(_mm256_maskload_ps(x + i, m)), _mm256_castsi256_ps(m)), a, b);
  }
  return HSumPd(_mm256_add_pd(a, b));
}

float MaxF32(const float* x, int64_t n) {
  __m256 m0 = Set(-INFINITY), m1 = m0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
  if (i < n) {
    const __m256i m = simd::TailMask(n - i);
    m1 = _mm256_max_ps(
        m1, _mm256_blendv_ps(Set(-INFINITY), _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m)));
  }
  return simd::HMax(_mm256_max_ps(m0, m1));
}

// ---- Softmax / LogSoftmax.

void SoftmaxRowF32(const float* x, float* y, int64_t n, bool log) {
  const __m256 mx = Set(MaxF32(x, n));
  if (log) {
    const double sum = SumF32(x, n, [&](__m256 v) { return simd::Exp(_mm256_sub_ps(v, mx)); });
    const __m256 lse = Set(static_cast<float>(std::log(sum)));
    simd::MapF32(x, y, n, [&](__m256 v) { return _mm256_sub_ps(_mm256_sub_ps(v, mx), lse); });
    return;
  }
  // exp(x - max) goes to y (y may alias x: each element is read before it is
  // written), then y is scaled in place; one exp per element.
  __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = simd::Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), mx));
    _mm256_storeu_ps(y + i, e);
    AddPd(e, a, b);
  }
  if (i < n) {
    const __m256i m = simd::TailMask(n - i);
    const __m256 e = _mm256_and_ps(simd::Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), mx)),
                                   _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(y + i, m, e);
    AddPd(e, a, b);
  }
  const __m256 inv = Set(static_cast<float>(1.0 / HSumPd(_mm256_add_pd(a, b))));
  simd::MapF32(y, y, n, [&](__m256 v) { return _mm256_mul_ps(v, inv); });
}

// Softmax over the rows of an [n, inner] slab, across columns [c0, c1).
void SoftmaxColsF32(const float* x, float* y, int64_t n, int64_t inner, int64_t c0, int64_t c1,
                    bool log, std::vector<float>& mx, std::vector<double>& sum,
                    std::vector<float>& exps) {
  const int64_t w = c1 - c0;
  mx.assign(w, -INFINITY);
  sum.assign(w, 0.0);
  exps.resize(w);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * inner + c0;
    for (int64_t i = 0; i < w; ++i) mx[i] = (row[i] > mx[i] || std::isnan(row[i])) ? row[i] : mx[i];
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * inner + c0;
    // Log-softmax reads x again below, so its exps go to scratch, never to
    // y (which may alias x).
    float* e = log ? exps.data() : y + r * inner + c0;
    int64_t i = 0;
    for (; i + 8 <= w; i += 8) {
      _mm256_storeu_ps(e + i, simd::Exp(_mm256_sub_ps(_mm256_loadu_ps(row + i),
                                                      _mm256_loadu_ps(mx.data() + i))));
    }
    for (; i < w; ++i) e[i] = std::exp(row[i] - mx[i]);
    for (i = 0; i < w; ++i) sum[i] += e[i];
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * inner + c0;
    float* out = y + r * inner + c0;
    if (log) {
      for (int64_t i = 0; i < w; ++i) {
        out[i] = (row[i] - mx[i]) - static_cast<float>(std::log(sum[i]));
      }
    } else {
      for (int64_t i = 0; i < w; ++i) out[i] = static_cast<float>(out[i] / sum[i]);
    }
  }
}

void SoftmaxF64(const double* x, double* y, int64_t n, int64_t inner, bool log) {
  for (int64_t i = 0; i < inner; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int64_t r = 0; r < n; ++r) {
      const double v = x[r * inner + i];
      mx = (v > mx || std::isnan(v)) ? v : mx;
    }
    for (int64_t r = 0; r < n; ++r) sum += std::exp(x[r * inner + i] - mx);
    const double lse = std::log(sum);
    for (int64_t r = 0; r < n; ++r) {
      const double d = x[r * inner + i] - mx;
      y[r * inner + i] = log ? d - lse : std::exp(d) / sum;
    }
  }
}

KernelOr CreateSoftmax(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const bool log = spec.op == v1::OP_LOG_SOFTMAX;
  const auto& a = log ? spec.attrs.log_softmax() : spec.attrs.softmax();
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(a.has_axis() ? a.axis() : -1, x.rank(), &axis)) {
    return SpecError(spec, "softmax axis out of range for ", TypeString(x));
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, x.dims); !s.ok()) return s;
  const AxisSplit sp = SplitAround(x.dims, axis, axis + 1);
  const DType dt = x.dtype;
  constexpr int64_t kCols = 256;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:", log ? "log_softmax_" : "softmax_", DTypeName(dt)),
      [=](auto inputs, auto outputs) {
        const int64_t n = sp.n, inner = sp.inner;
        if (sp.outer * n * inner == 0) return absl::OkStatus();
        const char* xp = static_cast<const char*>(HostPtr(inputs[0]));
        char* yp = static_cast<char*>(HostPtr(outputs[0]));
        const int64_t esize = ElementSize(dt), slab = n * inner;
        if (dt == v1::DTYPE_F64) {
          ParallelFor(sp.outer, std::max<int64_t>(1, kGrainElems / slab),
                      [&](int64_t b, int64_t e) {
                        for (int64_t o = b; o < e; ++o) {
                          SoftmaxF64(reinterpret_cast<const double*>(xp) + o * slab,
                                     reinterpret_cast<double*>(yp) + o * slab, n, inner, log);
                        }
                      });
          return absl::OkStatus();
        }
        const bool half = dt != v1::DTYPE_F32;
        if (inner == 1) {
          ParallelFor(sp.outer, std::max<int64_t>(1, kGrainElems / n), [&](int64_t b, int64_t e) {
            std::vector<float> buf(half ? 2 * n : 0);
            for (int64_t o = b; o < e; ++o) {
              if (!half) {
                SoftmaxRowF32(reinterpret_cast<const float*>(xp) + o * n,
                              reinterpret_cast<float*>(yp) + o * n, n, log);
                continue;
              }
              WidenRow(xp + o * n * esize, dt, n, buf.data());
              SoftmaxRowF32(buf.data(), buf.data() + n, n, log);
              NarrowRow(buf.data() + n, dt, n, yp + o * n * esize);
            }
          });
          return absl::OkStatus();
        }
        // Softmax over a middle axis: slabs [n, inner], split into column chunks.
        const int64_t chunks = (inner + kCols - 1) / kCols;
        ParallelFor(sp.outer * chunks,
                    std::max<int64_t>(1, kGrainElems / (n * std::min(inner, kCols))),
                    [&](int64_t b, int64_t e) {
                      std::vector<float> mx, exps, wide(half ? 2 * slab : 0);
                      std::vector<double> sum;
                      int64_t widened = -1;
                      for (int64_t u = b; u < e; ++u) {
                        const int64_t o = u / chunks, c0 = (u % chunks) * kCols,
                                      c1 = std::min(inner, c0 + kCols);
                        if (!half) {
                          SoftmaxColsF32(reinterpret_cast<const float*>(xp) + o * slab,
                                         reinterpret_cast<float*>(yp) + o * slab, n, inner, c0, c1,
                                         log, mx, sum, exps);
                          continue;
                        }
                        if (widened != o)
                          WidenRow(xp + o * slab * esize, dt, slab, wide.data()), widened = o;
                        SoftmaxColsF32(wide.data(), wide.data() + slab, n, inner, c0, c1, log, mx,
                                       sum, exps);
                        for (int64_t r = 0; r < n; ++r) {
                          NarrowRow(wide.data() + slab + r * inner + c0, dt, c1 - c0,
                                    yp + (o * slab + r * inner + c0) * esize);
                        }
                      }
                    });
        return absl::OkStatus();
      });
}

// ---- LayerNorm, RmsNorm, FusedResidualNorm.

struct NormPlan {
  DType dtype = v1::DTYPE_UNSPECIFIED;
  bool rms = false;
  double eps = 1e-5;
  int64_t rows = 0, n = 0;
  int residual = -1, scale = -1, bias = -1;  // input indices, -1 = absent
  bool emit_sum = false;
};

// A row's statistics, for y = ((x - shift) - delta) * rstd: shift is the
// f32-rounded mean (0 for RmsNorm), delta the mean of x - shift.
struct RowStats {
  float shift = 0, delta = 0, rstd = 1;
};

RowStats RowStatsF32(const float* x, int64_t n, bool rms, double eps) {
  __m256 shift = _mm256_setzero_ps();
  double mean = 0;
  if (!rms) {
    mean = SumF32(x, n, [](__m256 v) { return v; }) / static_cast<double>(n);
    shift = Set(static_cast<float>(mean));
  }
  // Second moment about the f32-rounded mean, corrected by the square of
  // the centered values' own mean (exact algebra, so the rounding of the
  // mean costs nothing).
  __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + k), shift);
    AddPd(d, s1a, s1b);
    AddPd(_mm256_mul_ps(d, d), s2a, s2b);
  }
  if (k < n) {
    const __m256i m = simd::TailMask(n - k);
    const __m256 d =
        _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(x + k, m), shift), _mm256_castsi256_ps(m));
    AddPd(d, s1a, s1b);
    AddPd(_mm256_mul_ps(d, d), s2a, s2b);
  }
  const double dm = HSumPd(_mm256_add_pd(s1a, s1b)) / static_cast<double>(n);
  const double m2 = HSumPd(_mm256_add_pd(s2a, s2b)) / static_cast<double>(n);
  const double var = rms ? m2 : std::max(0.0, m2 - dm * dm);
  return {static_cast<float>(mean), rms ? 0.0f : static_cast<float>(dm),
          static_cast<float>(1.0 / std::sqrt(var + eps))};
}

// y = (x - mean) / sqrt(var + eps) * scale + bias, or x / sqrt(mean(x^2) + eps) * scale.
void NormRowF32(const NormPlan& p, const float* x, float* y, const float* scale,
                const float* bias) {
  const int64_t n = p.n;
  const RowStats st = RowStatsF32(x, n, p.rms, p.eps);
  const __m256 shift = Set(st.shift), r = Set(st.rstd);
  // x - mean as (x - shift) - dm: the first difference is exact for x near
  // the mean, so a large mean does not leak its rounding into the output.
  const __m256 c = Set(st.delta);
  int64_t i = 0;
  auto one = [&](__m256 v, __m256 s, __m256 b) {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(v, shift), c), r), s, b);
  };
  const __m256 one_v = Set(1.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 s = scale ? _mm256_loadu_ps(scale + i) : one_v;
    const __m256 b = bias ? _mm256_loadu_ps(bias + i) : zero;
    _mm256_storeu_ps(y + i, one(_mm256_loadu_ps(x + i), s, b));
  }
  if (i < n) {
    const __m256i m = simd::TailMask(n - i);
    const __m256 s = scale ? _mm256_maskload_ps(scale + i, m) : one_v;
    const __m256 b = bias ? _mm256_maskload_ps(bias + i, m) : zero;
    _mm256_maskstore_ps(y + i, m, one(_mm256_maskload_ps(x + i, m), s, b));
  }
}

void NormRowF64(const NormPlan& p, const double* x, double* y, const double* scale,
                const double* bias) {
  const int64_t n = p.n;
  double mean = 0;
  if (!p.rms) {
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= static_cast<double>(n);
  }
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const double r = 1.0 / std::sqrt(var / static_cast<double>(n) + p.eps);
  for (int64_t i = 0; i < n; ++i)
    y[i] = (x[i] - mean) * r * (scale ? scale[i] : 1.0) + (bias ? bias[i] : 0.0);
}

absl::Status RunNorm(const NormPlan& p, std::span<const backend::BufferView> inputs,
                     std::span<const backend::BufferView> outputs) {
  if (p.rows * p.n == 0) return absl::OkStatus();
  const int64_t n = p.n, esize = ElementSize(p.dtype);
  auto in = [&](int i) { return i < 0 ? nullptr : static_cast<const char*>(HostPtr(inputs[i])); };
  const char* x = in(0);
  const char* res = in(p.residual);
  char* y = static_cast<char*>(HostPtr(outputs[0]));
  char* sum_out = p.emit_sum ? static_cast<char*>(HostPtr(outputs[1])) : nullptr;
  // A norm reads and writes each row about as a copy does: chunks of at
  // least kCopyGrainBytes read and written (the encoder layer's 128 x 768
  // LayerNorms: 103-122 us p50 on two threads, 68-76 us on one, under load;
  // docs/benchmarks.md, enc12b).
  const int64_t grain =
      std::max<int64_t>({int64_t{1}, kGrainElems / n, kCopyGrainBytes / (2 * n * esize)});
  if (p.dtype == v1::DTYPE_F64) {
    auto d = [](const char* c) { return reinterpret_cast<const double*>(c); };
    ParallelFor(p.rows, grain, [&](int64_t b, int64_t e) {
      std::vector<double> s(res ? n : 0);
      for (int64_t row = b; row < e; ++row) {
        const double* xr = d(x) + row * n;
        if (res) {
          for (int64_t i = 0; i < n; ++i) s[i] = xr[i] + d(res)[row * n + i];
          if (sum_out) std::copy(s.begin(), s.end(), reinterpret_cast<double*>(sum_out) + row * n);
          xr = s.data();
        }
        NormRowF64(p, xr, reinterpret_cast<double*>(y) + row * n, d(in(p.scale)), d(in(p.bias)));
      }
    });
    return absl::OkStatus();
  }
  // f32 compute; scale and bias widened once per launch.
  const bool half = p.dtype != v1::DTYPE_F32;
  std::vector<float> scale, bias;
  if (p.scale >= 0) scale.resize(n), WidenRow(in(p.scale), p.dtype, n, scale.data());
  if (p.bias >= 0) bias.resize(n), WidenRow(in(p.bias), p.dtype, n, bias.data());
  const float* sp = p.scale >= 0 ? scale.data() : nullptr;
  const float* bp = p.bias >= 0 ? bias.data() : nullptr;
  ParallelFor(p.rows, grain, [&](int64_t b, int64_t e) {
    std::vector<float> xs(half || res ? n : 0), rs(half && res ? n : 0), ys(half ? n : 0);
    for (int64_t row = b; row < e; ++row) {
      const int64_t off = row * n * esize;
      const float* xr = reinterpret_cast<const float*>(x + off);
      if (half) WidenRow(x + off, p.dtype, n, xs.data()), xr = xs.data();
      if (res) {
        const float* rr = reinterpret_cast<const float*>(res + off);
        if (half) WidenRow(res + off, p.dtype, n, rs.data()), rr = rs.data();
        float* s = xs.data();
        for (int64_t i = 0; i < n; ++i) s[i] = xr[i] + rr[i];
        // The norm reads the sum as stored, as the unfused graph would.
        ew::RoundToDType(s, p.dtype, n);
        if (sum_out) NarrowRow(s, p.dtype, n, sum_out + off);
        xr = s;
      }
      if (!half) {
        NormRowF32(p, xr, reinterpret_cast<float*>(y + off), sp, bp);
        continue;
      }
      NormRowF32(p, xr, ys.data(), sp, bp);
      NarrowRow(ys.data(), p.dtype, n, y + off);
    }
  });
  return absl::OkStatus();
}

KernelOr CreateNorm(const KernelSpec& spec) {
  NormPlan p;
  bool has_axis = false, has_eps = false;
  int64_t axis_attr = -1;
  double eps = 0;
  size_t params = 0;  // scale/bias inputs after x (and residual)
  int first_param = 1;
  switch (spec.op) {
    case v1::OP_LAYER_NORM: {
      const auto& a = spec.attrs.layer_norm();
      has_axis = a.has_axis(), axis_attr = a.axis(), has_eps = a.has_epsilon(), eps = a.epsilon();
      if (auto s = CheckArity(spec, 1, 3, 1); !s.ok()) return s;
      params = spec.inputs.size() - 1;
      break;
    }
    case v1::OP_RMS_NORM: {
      const auto& a = spec.attrs.rms_norm();
      has_axis = a.has_axis(), axis_attr = a.axis(), has_eps = a.has_epsilon(), eps = a.epsilon();
      p.rms = true;
      if (auto s = CheckArity(spec, 1, 2, 1); !s.ok()) return s;
      params = spec.inputs.size() - 1;
      break;
    }
    default: {
      const auto& a = spec.attrs.fused_residual_norm();
      has_axis = a.has_axis(), axis_attr = a.axis(), has_eps = a.has_epsilon(), eps = a.epsilon();
      p.rms = a.rms();
      p.emit_sum = a.emit_sum();
      params = size_t{a.has_scale()} + size_t{a.has_bias()};
      if (auto s = CheckArity(spec, 2 + params, 2 + params, a.emit_sum() ? 2 : 1); !s.ok())
        return s;
      p.residual = 1;
      first_param = 2;
      if (a.has_bias() && !a.has_scale()) p.bias = 2;  // bias without scale
      break;
    }
  }
  const auto& x = spec.inputs[0];
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(has_axis ? axis_attr : -1, x.rank(), &axis)) {
    return SpecError(spec, "norm axis out of range for ", TypeString(x));
  }
  if (has_eps && !(eps > 0 && std::isfinite(eps)))
    return SpecError(spec, "epsilon must be positive");
  p.eps = has_eps ? eps : (p.rms ? 1e-6 : 1e-5);
  p.dtype = x.dtype;
  p.rows = Product(x.dims, 0, axis);
  p.n = Product(x.dims, axis, x.dims.size());
  const Dims norm_dims(x.dims.begin() + axis, x.dims.end());
  if (p.bias < 0 && params >= 1) p.scale = first_param;
  if (p.bias < 0 && params >= 2) p.bias = first_param + 1;
  for (size_t i = 1; i < spec.inputs.size(); ++i) {
    const auto& t = spec.inputs[i];
    const bool ok = t.dtype == x.dtype &&
                    (static_cast<int>(i) == p.residual ? t.dims == x.dims : t.dims == norm_dims);
    if (!ok)
      return SpecError(spec, "input ", i, " ", TypeString(t), " does not fit ", TypeString(x));
  }
  for (size_t k = 0; k < spec.outputs.size(); ++k) {
    if (auto s = CheckOutput(spec, k, x.dtype, x.dims); !s.ok()) return s;
  }
  const std::string name = spec.op == v1::OP_FUSED_RESIDUAL_NORM
                               ? (p.rms ? "residual_rms_norm" : "residual_layer_norm")
                               : (p.rms ? "rms_norm" : "layer_norm");
  return FnKernel::Make(spec, absl::StrCat("cpu:", name, "_", DTypeName(x.dtype)),
                        [p](auto inputs, auto outputs) { return RunNorm(p, inputs, outputs); });
}

// ---- GroupNorm: x [N, C, spatial...]. Each of the N * groups rows is one
// group's C / groups channels times the spatial positions, contiguous: its
// statistics as LayerNorm's rows (f64 sums about the f32 mean), then each
// channel's scale and bias over its run of spatial positions.

struct GroupNormPlan {
  DType dtype = v1::DTYPE_UNSPECIFIED;
  double eps = 1e-5;
  int64_t rows = 0, groups = 1, channels_per_group = 0, spatial = 0;
  bool scale = false, bias = false;
};

// y[i] = ((x[i] - shift) - delta) * rstd * s + b over `n` elements.
void ApplyGroupF32(const float* x, float* y, int64_t n, const RowStats& st, float s, float b) {
  const __m256 shift = Set(st.shift), c = Set(st.delta), r = Set(st.rstd), sv = Set(s),
               bv = Set(b);
  auto one = [&](__m256 v) {
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_sub_ps(v, shift), c), r), sv, bv);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, one(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = simd::TailMask(n - i);
    _mm256_maskstore_ps(y + i, m, one(_mm256_maskload_ps(x + i, m)));
  }
}

absl::Status RunGroupNorm(const GroupNormPlan& p, std::span<const backend::BufferView> inputs,
                          std::span<const backend::BufferView> outputs) {
  const int64_t cg = p.channels_per_group, sp = p.spatial, n = cg * sp;
  if (p.rows * n == 0) return absl::OkStatus();
  const int64_t esize = ElementSize(p.dtype);
  const char* x = static_cast<const char*>(HostPtr(inputs[0]));
  char* y = static_cast<char*>(HostPtr(outputs[0]));
  const char* scale = p.scale ? static_cast<const char*>(HostPtr(inputs[1])) : nullptr;
  const char* bias = p.bias ? static_cast<const char*>(HostPtr(inputs[2])) : nullptr;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / n);
  if (p.dtype == v1::DTYPE_F64) {
    const auto* sd = reinterpret_cast<const double*>(scale);
    const auto* bd = reinterpret_cast<const double*>(bias);
    ParallelFor(p.rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const double* xr = reinterpret_cast<const double*>(x) + row * n;
        double* yr = reinterpret_cast<double*>(y) + row * n;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n; ++i) mean += xr[i];
        mean /= static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        const double r = 1.0 / std::sqrt(var / static_cast<double>(n) + p.eps);
        const int64_t ch0 = (row % p.groups) * cg;
        for (int64_t c = 0; c < cg; ++c) {
          const double s = sd ? sd[ch0 + c] : 1.0, bb = bd ? bd[ch0 + c] : 0.0;
          for (int64_t i = c * sp; i < (c + 1) * sp; ++i) yr[i] = (xr[i] - mean) * r * s + bb;
        }
      }
    });
    return absl::OkStatus();
  }
  // f32 compute; scale and bias widened once per launch.
  const bool half = p.dtype != v1::DTYPE_F32;
  const int64_t channels = p.groups * cg;
  std::vector<float> sw, bw;
  if (scale) sw.resize(channels), WidenRow(scale, p.dtype, channels, sw.data());
  if (bias) bw.resize(channels), WidenRow(bias, p.dtype, channels, bw.data());
  ParallelFor(p.rows, grain, [&](int64_t b, int64_t e) {
    std::vector<float> xs(half ? n : 0), ys(half ? n : 0);
    for (int64_t row = b; row < e; ++row) {
      const int64_t off = row * n * esize;
      const float* xr = reinterpret_cast<const float*>(x + off);
      float* yr = reinterpret_cast<float*>(y + off);
      if (half) WidenRow(x + off, p.dtype, n, xs.data()), xr = xs.data(), yr = ys.data();
      const RowStats st = RowStatsF32(xr, n, false, p.eps);
      const int64_t ch0 = (row % p.groups) * cg;
      for (int64_t c = 0; c < cg; ++c) {
        ApplyGroupF32(xr + c * sp, yr + c * sp, sp, st, scale ? sw[ch0 + c] : 1.0f,
                      bias ? bw[ch0 + c] : 0.0f);
      }
      if (half) NarrowRow(ys.data(), p.dtype, n, y + off);
    }
  });
  return absl::OkStatus();
}

KernelOr CreateGroupNorm(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 3, 1); !s.ok()) return s;
  const auto& a = spec.attrs.group_norm();
  const auto& x = spec.inputs[0];
  if (x.rank() < 2) return SpecError(spec, "group_norm needs x [N, C, ...], got ", TypeString(x));
  const int64_t channels = x.dims[1];
  if (a.groups() <= 0 || channels % a.groups() != 0) {
    return SpecError(spec, "groups=", a.groups(), " does not divide the ", channels, " channels");
  }
  if (a.has_epsilon() && !(a.epsilon() > 0 && std::isfinite(a.epsilon())))
    return SpecError(spec, "epsilon must be positive");
  for (size_t i = 1; i < spec.inputs.size(); ++i) {
    const auto& t = spec.inputs[i];
    if (t.dtype != x.dtype || t.dims != Dims{channels})
      return SpecError(spec, "input ", i, " ", TypeString(t), " is not [C] of ", TypeString(x));
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, x.dims); !s.ok()) return s;
  GroupNormPlan p;
  p.dtype = x.dtype;
  p.eps = a.has_epsilon() ? a.epsilon() : 1e-5;
  p.groups = a.groups();
  p.rows = x.dims[0] * p.groups;
  p.channels_per_group = channels / p.groups;
  p.spatial = Product(x.dims, 2, x.dims.size());
  p.scale = spec.inputs.size() > 1;
  p.bias = spec.inputs.size() > 2;
  return FnKernel::Make(spec, absl::StrCat("cpu:group_norm_", DTypeName(x.dtype)),
                        [p](auto inputs, auto outputs) { return RunGroupNorm(p, inputs, outputs); });
}

Claim SupportsFloat(const KernelSpec& spec) {
  if (spec.inputs.empty()) return Claim::No("expects an input");
  if (!IsFloat(spec.inputs[0].dtype)) {
    return Claim::No(absl::StrCat("cpu implements ", v1::OpKind_Name(spec.op),
                                  " on f32, f16, bf16 and f64, not ",
                                  DTypeName(spec.inputs[0].dtype)));
  }
  return Claim::Yes();
}

const CpuOpRegistration kRegistration({
    {v1::OP_SOFTMAX, SupportsFloat, CreateSoftmax},
    {v1::OP_LOG_SOFTMAX, SupportsFloat, CreateSoftmax},
    {v1::OP_LAYER_NORM, SupportsFloat, CreateNorm},
    {v1::OP_RMS_NORM, SupportsFloat, CreateNorm},
    {v1::OP_FUSED_RESIDUAL_NORM, SupportsFloat, CreateNorm},
    {v1::OP_GROUP_NORM, SupportsFloat, CreateGroupNorm},
});

}  // namespace
}  // namespace kiln::cpu
