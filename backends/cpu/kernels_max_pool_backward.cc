// kiln.max_pool_backward (base/custom_ops.h): max pool's derivative as one
// pass over the input, registered at static init as an op of the built-in
// "kiln" plugin (so kernels_custom.cc runs it on the CPU through the plugin
// ABI, and every other device gets legalize's decomposition).
//
// Semantics are those of the composition autodiff wrote before (and that
// legalize still writes for other devices): the input padded with the lowest
// value of the dtype (as Pad stores -FLT_MAX / -DBL_MAX in it), each window
// scanned in row-major order, and the first element equal to y (the window's
// max) takes g; a padded element that comes first takes it away (dropped).
// NaN maxima match nothing. Overlapping windows add up. f32 and f64 compute
// in their own type; f16 / bf16 in f32 (exact compares, sums rounded once).
// The one difference: a non-finite g reaches only the window's maximum, where
// the composition's g * 0 spread NaN over the window (torch gives it to the
// maximum only, as here).
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/conv_wgrad.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "base/custom_ops.h"
#include "base/half.h"
#include "kiln/plugin.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kMaxAttr = int64_t{1} << 30;  // bounds window, stride and pads

// Spatial geometry as 2-D (a 1-D pool is H = 1).
struct Geo {
  int sp = 0;
  int64_t window[2] = {1, 1}, stride[2] = {1, 1}, lo[2] = {0, 0}, hi[2] = {0, 0};
};

int Fail(char* error, size_t error_size, const std::string& why) {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", why.c_str());
  return 1;
}

bool IsPoolFloat(int32_t dtype) {
  return dtype == v1::DTYPE_F32 || dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16 ||
         dtype == v1::DTYPE_F64;
}

// The payload's PoolAttrs for a pool over `sp` spatial dims, checked as the
// verifier checks a Pool node's.
bool ParseGeo(const void* payload, size_t size, int sp, Geo* geo, std::string* why) {
  v1::PoolAttrs a;
  if (size > (1u << 16) || !a.ParseFromArray(payload, static_cast<int>(size))) {
    *why = "payload is not a kiln.v1.PoolAttrs";
    return false;
  }
  if (a.kind() != v1::POOL_MAX) {
    *why = "payload's pool kind must be POOL_MAX";
    return false;
  }
  auto dims_ok = [sp](int n, bool may_be_empty) { return n == sp || (may_be_empty && n == 0); };
  if (!dims_ok(a.window_size(), false) || !dims_ok(a.stride_size(), true) ||
      !dims_ok(a.pad_low_size(), true) || !dims_ok(a.pad_high_size(), true)) {
    *why = "window, stride and padding need one entry per spatial dim of x";
    return false;
  }
  geo->sp = sp;
  const int off = 2 - sp;  // a 1-D pool fills the W slot
  for (int i = 0; i < sp; ++i) {
    const int64_t k = a.window(i);
    const int64_t s = a.stride_size() ? a.stride(i) : k;
    const int64_t lo = a.pad_low_size() ? a.pad_low(i) : 0;
    const int64_t hi = a.pad_high_size() ? a.pad_high(i) : 0;
    if (k < 1 || k > kMaxAttr || s < 1 || s > kMaxAttr) {
      *why = "window and stride must be in [1, 2^30]";
      return false;
    }
    if (lo < 0 || hi < 0 || lo >= k || hi >= k) {
      *why = "padding must be >= 0 and below the window";
      return false;
    }
    geo->window[off + i] = k, geo->stride[off + i] = s, geo->lo[off + i] = lo, geo->hi[off + i] = hi;
  }
  return true;
}

// The pool's result extent along spatial slot `i` for input extent `in`
// (-1 unknown), or -2 when the padded input is smaller than the window.
int64_t OutExtent(const Geo& g, int i, int64_t in) {
  if (in < 0) return -1;
  const int64_t padded = in + g.lo[i] + g.hi[i];
  if (padded < g.window[i]) return -2;
  return (padded - g.window[i]) / g.stride[i] + 1;
}

// Checks (x, y, g) against the geometry; dims of -1 are unknown and match.
bool CheckTypes(const KilnTensorType* in, int32_t n, const void* payload, size_t payload_size,
                Geo* geo, std::string* why) {
  if (n != 3) {
    *why = "takes x, y = max_pool(x) and the cotangent g";
    return false;
  }
  const KilnTensorType &x = in[0], &y = in[1], &g = in[2];
  if (x.rank != 3 && x.rank != 4) {
    *why = "x must be [N, C, L] or [N, C, H, W]";
    return false;
  }
  if (y.rank != x.rank || g.rank != x.rank) {
    *why = "x, y and g must have the same rank";
    return false;
  }
  if (!IsPoolFloat(x.dtype) || y.dtype != x.dtype || g.dtype != x.dtype) {
    *why = "x, y and g must be one float dtype (f32, f16, bf16, f64)";
    return false;
  }
  if (!ParseGeo(payload, payload_size, x.rank - 2, geo, why)) return false;
  auto same = [](int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; };
  for (int d = 0; d < x.rank; ++d) {
    int64_t want = x.dims[d];
    if (d >= 2) {
      want = OutExtent(*geo, d - 2 + (2 - geo->sp), x.dims[d]);
      if (want == -2) {
        *why = "x is smaller than the window";
        return false;
      }
    }
    if (!same(y.dims[d], want) || !same(g.dims[d], y.dims[d])) {
      *why = "y and g must have max_pool(x)'s dims";
      return false;
    }
  }
  return true;
}

int Shape(const void* payload, size_t payload_size, const KilnTensorType* inputs, int32_t num_inputs,
          KilnTensorType* outputs, int32_t* num_outputs, char* error, size_t error_size) {
  Geo geo;
  std::string why;
  if (!CheckTypes(inputs, num_inputs, payload, payload_size, &geo, &why)) {
    return Fail(error, error_size, why);
  }
  outputs[0] = inputs[0];
  *num_outputs = 1;
  return 0;
}

// n (1..8) 2x2 windows of a tiling pool: r0 / r1 the two input rows (2n
// floats each), m / g the n results and cotangents, d0 / d1 dx's rows. The
// first of the window's four elements (row-major) equal to m takes g;
// compares are ordered (NaN matches nothing), as the scalar path's ==.
// Fewer than eight (a row's tail, or the whole row of a small plane: the
// CNN's second pool has seven) go through masked loads and stores.
inline __m256i FirstLanes(int64_t k) {  // lanes [0, k) set, k in [0, 8]
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline void Tile2x2Windows(int64_t n, const float* r0, const float* r1, const float* m,
                           const float* g, float* d0, float* d1) {
  const bool full = n == 8;
  const __m256i lo = full ? _mm256_set1_epi32(-1) : FirstLanes(std::min<int64_t>(2 * n, 8));
  const __m256i hi = full ? lo : FirstLanes(std::max<int64_t>(2 * n - 8, 0));
  const __m256i mn = full ? lo : FirstLanes(n);
  auto load = [full](const float* p, __m256i k) {
    return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, k);
  };
  auto store = [full](float* p, __m256i k, __m256 v) {
    if (full) {
      _mm256_storeu_ps(p, v);
    } else {
      _mm256_maskstore_ps(p, k, v);
    }
  };
  // Even / odd columns of each row, in the order shuffle gives: lane 0 holds
  // windows 0, 1, 4, 5 and lane 1 windows 2, 3, 6, 7; m and g are permuted to
  // match, and unpacklo / unpackhi undo the shuffle on the way out.
  const __m256 a0 = load(r0, lo), a1 = load(r0 + 8, hi);
  const __m256 b0 = load(r1, lo), b1 = load(r1 + 8, hi);
  const __m256 e0 = _mm256_shuffle_ps(a0, a1, 0x88), o0 = _mm256_shuffle_ps(a0, a1, 0xDD);
  const __m256 e1 = _mm256_shuffle_ps(b0, b1, 0x88), o1 = _mm256_shuffle_ps(b0, b1, 0xDD);
  const __m256 mm = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(load(m, mn)), 0xD8));
  const __m256 gg = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(load(g, mn)), 0xD8));
  const __m256 ka = _mm256_cmp_ps(e0, mm, _CMP_EQ_OQ);
  const __m256 kb = _mm256_andnot_ps(ka, _mm256_cmp_ps(o0, mm, _CMP_EQ_OQ));
  const __m256 taken = _mm256_or_ps(ka, kb);
  const __m256 ke = _mm256_andnot_ps(taken, _mm256_cmp_ps(e1, mm, _CMP_EQ_OQ));
  const __m256 kf = _mm256_andnot_ps(_mm256_or_ps(taken, ke), _mm256_cmp_ps(o1, mm, _CMP_EQ_OQ));
  const __m256 ga = _mm256_and_ps(ka, gg), gb = _mm256_and_ps(kb, gg);
  const __m256 ge = _mm256_and_ps(ke, gg), gf = _mm256_and_ps(kf, gg);
  store(d0, lo, _mm256_unpacklo_ps(ga, gb));
  store(d0 + 8, hi, _mm256_unpackhi_ps(ga, gb));
  store(d1, lo, _mm256_unpacklo_ps(ge, gf));
  store(d1 + 8, hi, _mm256_unpackhi_ps(ge, gf));
}

// One [H, W] plane: dx from x, y, g (see the top for the rule).
template <typename T>
void BackwardPlane(const Geo& c, int64_t ih, int64_t iw, int64_t oh, int64_t ow, T pad,
                   const T* x, const T* y, const T* g, T* dx) {
  if (c.window[0] == 2 && c.window[1] == 2 && c.stride[0] == 2 && c.stride[1] == 2 &&
      c.lo[0] == 0 && c.lo[1] == 0 && 2 * oh == ih && 2 * ow == iw) {
    // The CNN's 2x2 / stride 2 pool tiling the input: every dx element is
    // written once, no zero fill, no bounds; f32 eight windows at a time
    // (masked at a row's end) without branches (which window element is the
    // maximum is data: a branch per element mispredicts most of the time).
    for (int64_t oy = 0; oy < oh; ++oy) {
      const T* r0 = x + 2 * oy * iw;
      const T* r1 = r0 + iw;
      T* d0 = dx + 2 * oy * iw;
      T* d1 = d0 + iw;
      int64_t ox = 0;
      if constexpr (std::is_same_v<T, float>) {
        for (; ox < ow; ox += 8) {
          Tile2x2Windows(std::min<int64_t>(8, ow - ox), r0 + 2 * ox, r1 + 2 * ox, y + oy * ow + ox,
                         g + oy * ow + ox, d0 + 2 * ox, d1 + 2 * ox);
        }
      }
      for (; ox < ow; ++ox) {
        const T m = y[oy * ow + ox], gv = g[oy * ow + ox];
        const bool a = r0[2 * ox] == m;
        const bool b = !a && r0[2 * ox + 1] == m;
        const bool e = !a && !b && r1[2 * ox] == m;
        const bool f = !a && !b && !e && r1[2 * ox + 1] == m;
        d0[2 * ox] = a ? gv : T(0);
        d0[2 * ox + 1] = b ? gv : T(0);
        d1[2 * ox] = e ? gv : T(0);
        d1[2 * ox + 1] = f ? gv : T(0);
      }
    }
    return;
  }
  std::fill(dx, dx + ih * iw, T(0));
  for (int64_t oy = 0; oy < oh; ++oy) {
    const int64_t y0 = oy * c.stride[0] - c.lo[0];
    for (int64_t ox = 0; ox < ow; ++ox) {
      const int64_t x0 = ox * c.stride[1] - c.lo[1];
      const T m = y[oy * ow + ox], gv = g[oy * ow + ox];
      bool found = false;
      for (int64_t ky = 0; ky < c.window[0] && !found; ++ky) {
        const int64_t iy = y0 + ky;
        const bool row_in = iy >= 0 && iy < ih;
        for (int64_t kx = 0; kx < c.window[1]; ++kx) {
          const int64_t ix = x0 + kx;
          const bool in = row_in && ix >= 0 && ix < iw;
          if ((in ? x[iy * iw + ix] : pad) == m) {
            if (in) dx[iy * iw + ix] += gv;
            found = true;
            break;
          }
        }
      }
    }
  }
}

// What Pad stores for max pool's padding value in each dtype.
float PadValueF32(int32_t dtype) {
  const float lowest = -std::numeric_limits<float>::max();
  if (dtype == v1::DTYPE_F16) return HalfToFloat(FloatToHalf(lowest));
  if (dtype == v1::DTYPE_BF16) return Bf16ToFloat(FloatToBf16(lowest));
  return lowest;
}

int Kernel(const void* payload, size_t payload_size, const KilnTensor* inputs, int32_t num_inputs,
           KilnTensor* outputs, int32_t num_outputs, char* error, size_t error_size) {
  if (num_outputs != 1 || num_inputs != 3) return Fail(error, error_size, "takes x, y, g; gives dx");
  KilnTensorType types[3] = {inputs[0].type, inputs[1].type, inputs[2].type};
  Geo geo;
  std::string why;
  if (!CheckTypes(types, 3, payload, payload_size, &geo, &why)) return Fail(error, error_size, why);
  const KilnTensorType& xt = types[0];
  const KilnTensorType& yt = types[1];
  if (outputs[0].type.dtype != xt.dtype || outputs[0].type.rank != xt.rank ||
      !std::equal(xt.dims, xt.dims + xt.rank, outputs[0].type.dims)) {
    return Fail(error, error_size, "dx must have x's type");
  }
  const int64_t planes = xt.dims[0] * xt.dims[1];
  const int64_t ih = xt.rank == 4 ? xt.dims[2] : 1, iw = xt.dims[xt.rank - 1];
  const int64_t oh = yt.rank == 4 ? yt.dims[2] : 1, ow = yt.dims[yt.rank - 1];
  const int64_t in_plane = ih * iw, out_plane = oh * ow;
  if (planes == 0 || in_plane == 0) return 0;
  const int32_t dt = xt.dtype;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, in_plane));
  if (dt == v1::DTYPE_F64) {
    const auto* x = static_cast<const double*>(inputs[0].data);
    const auto* y = static_cast<const double*>(inputs[1].data);
    const auto* g = static_cast<const double*>(inputs[2].data);
    auto* dx = static_cast<double*>(outputs[0].data);
    const double pad = -std::numeric_limits<double>::max();
    ParallelFor(planes, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        BackwardPlane<double>(geo, ih, iw, oh, ow, pad, x + p * in_plane, y + p * out_plane,
                              g + p * out_plane, dx + p * in_plane);
      }
    });
    return 0;
  }
  const float pad = PadValueF32(dt);
  if (dt == v1::DTYPE_F32) {
    const auto* x = static_cast<const float*>(inputs[0].data);
    const auto* y = static_cast<const float*>(inputs[1].data);
    const auto* g = static_cast<const float*>(inputs[2].data);
    auto* dx = static_cast<float*>(outputs[0].data);
    ParallelFor(planes, grain, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        BackwardPlane<float>(geo, ih, iw, oh, ow, pad, x + p * in_plane, y + p * out_plane,
                             g + p * out_plane, dx + p * in_plane);
      }
    });
    return 0;
  }
  const DType dtype = static_cast<DType>(dt);
  const size_t es = 2;  // f16 / bf16
  const char* x = static_cast<const char*>(inputs[0].data);
  const char* y = static_cast<const char*>(inputs[1].data);
  const char* g = static_cast<const char*>(inputs[2].data);
  char* dx = static_cast<char*>(outputs[0].data);
  ParallelFor(planes, grain, [&](int64_t p0, int64_t p1) {
    std::vector<float> xf(in_plane), yf(out_plane), gf(out_plane), df(in_plane);
    for (int64_t p = p0; p < p1; ++p) {
      ConvertToF32(dtype, x + p * in_plane * es, xf.data(), in_plane);
      ConvertToF32(dtype, y + p * out_plane * es, yf.data(), out_plane);
      ConvertToF32(dtype, g + p * out_plane * es, gf.data(), out_plane);
      BackwardPlane<float>(geo, ih, iw, oh, ow, pad, xf.data(), yf.data(), gf.data(), df.data());
      ConvertFromF32(df.data(), dtype, dx + p * in_plane * es, in_plane);
    }
  });
  return 0;
}

// kiln.conv2d_backward_weights runs as the CPU backend's own kernel
// (kernels_custom.cc creates it, conv_wgrad.h); the ABI entry only says so.
int ConvBackwardWeightsThroughAbi(const void*, size_t, const KilnTensor*, int32_t, KilnTensor*, int32_t,
                                  char* error, size_t error_size) {
  return Fail(error, error_size, "runs as the CPU backend's own kernel, not through the plugin ABI");
}

const KilnCustomOp kOps[] = {
    {kMaxPoolBackwardOp, &Shape, &Kernel, {nullptr, nullptr, nullptr, nullptr}},
    {kConvBackwardWeightsOp, &ConvBackwardWeightsShape, &ConvBackwardWeightsThroughAbi,
     {nullptr, nullptr, nullptr, nullptr}},
};
const KilnPlugin kBuiltinPlugin = {KILN_PLUGIN_ABI_VERSION, sizeof(KilnPlugin), "kiln", "builtin-1",
                                   2, kOps};

// Registered before main, so before kilnd loads any plugin directory.
[[maybe_unused]] const bool kRegistered = [] {
  const absl::Status s = CustomOpRegistry::Global().Register(kBuiltinPlugin, "", "");
  if (!s.ok()) std::fprintf(stderr, "kiln: built-in ops not registered: %s\n", std::string(s.message()).c_str());
  return s.ok();
}();

}  // namespace
}  // namespace kiln::cpu
