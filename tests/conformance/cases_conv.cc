// Conformance cases for Conv (1-D and 2-D: stride, dilation, asymmetric
// padding, groups incl. depthwise, bias, degenerate shapes) and Pool (max and
// avg with and without count_include_pad, 1-D and 2-D). References are f64
// loops over the stored inputs.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/conformance/conformance.h"

namespace kiln::conformance {
namespace {

using backend::KernelSpec;

// Spatial attribute with its default when empty, widened to 2-D (H, W): a
// 1-D op is H = 1.
std::vector<int64_t> As2d(const google::protobuf::RepeatedField<int64_t>& f, int sp, int64_t def) {
  std::vector<int64_t> v(f.begin(), f.end());
  if (v.empty()) v.assign(sp, def);
  if (sp == 1) v.insert(v.begin(), def);
  return v;
}

Dims Widen(const Dims& d) {
  if (d.size() == 3) return {d[0], d[1], 1, d[2]};
  return d;
}

// ----------------------------------------------------------------------- conv

std::vector<HostTensor> ConvReference(const KernelSpec& spec, const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.conv();
  const int sp = static_cast<int>(in[0].rank()) - 2;
  const Dims x = Widen(in[0].dims()), w = Widen(in[1].dims()), y = Widen(spec.outputs[0].dims);
  const std::vector<int64_t> stride = As2d(a.stride(), sp, 1), dil = As2d(a.dilation(), sp, 1),
                             lo = As2d(a.pad_low(), sp, 0);
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  const int64_t cpg = x[1] / groups, opg = y[1] / groups;
  HostTensor out = F64(spec.outputs[0].dims);
  int64_t idx = 0;
  for (int64_t n = 0; n < y[0]; ++n) {
    for (int64_t o = 0; o < y[1]; ++o) {
      const int64_t g = o / opg;
      for (int64_t oy = 0; oy < y[2]; ++oy) {
        for (int64_t ox = 0; ox < y[3]; ++ox, ++idx) {
          double sum = in.size() > 2 ? At(in[2], o) : 0.0;
          for (int64_t ci = 0; ci < cpg; ++ci) {
            for (int64_t ky = 0; ky < w[2]; ++ky) {
              const int64_t iy = oy * stride[0] - lo[0] + ky * dil[0];
              if (iy < 0 || iy >= x[2]) continue;
              for (int64_t kx = 0; kx < w[3]; ++kx) {
                const int64_t ix = ox * stride[1] - lo[1] + kx * dil[1];
                if (ix < 0 || ix >= x[3]) continue;
                sum += At(in[0], ((n * x[1] + g * cpg + ci) * x[2] + iy) * x[3] + ix) *
                       At(in[1], ((o * w[1] + ci) * w[2] + ky) * w[3] + kx);
              }
            }
          }
          out.SetFromDouble(idx, sum);
        }
      }
    }
  }
  std::vector<HostTensor> result;
  result.push_back(std::move(out));
  return result;
}

struct ConvShape {
  std::string tag;
  Dims x, w;
  std::vector<int64_t> stride, dilation, lo, hi;
  int64_t groups = 1;
  bool bias = true;
};

Case MakeConv(const ConvShape& s, DType dtype) {
  Case c;
  c.name = absl::StrCat("conv/", DTypeName(dtype), "_", s.tag, "_x", absl::StrJoin(s.x, "x"), "_w",
                        absl::StrJoin(s.w, "x"));
  std::mt19937_64 rng = RngFor(c.name);
  const int sp = static_cast<int>(s.x.size()) - 2;
  auto get = [sp](const std::vector<int64_t>& v, int i, int64_t def) {
    return v.empty() ? def : v[i];
  };
  Dims out = {s.x[0], s.w[0]};
  for (int i = 0; i < sp; ++i) {
    const int64_t eff = get(s.dilation, i, 1) * (s.w[2 + i] - 1) + 1;
    out.push_back((s.x[2 + i] + get(s.lo, i, 0) + get(s.hi, i, 0) - eff) / get(s.stride, i, 1) + 1);
  }
  c.spec.name = c.name;
  c.spec.label = absl::StrCat("case ", c.name);
  c.spec.op = v1::OP_CONV;
  auto* a = c.spec.attrs.mutable_conv();
  for (int64_t v : s.stride) a->add_stride(v);
  for (int64_t v : s.dilation) a->add_dilation(v);
  for (int64_t v : s.lo) a->add_pad_low(v);
  for (int64_t v : s.hi) a->add_pad_high(v);
  a->set_groups(s.groups);
  c.spec.inputs = {Desc(dtype, s.x), Desc(dtype, s.w)};
  c.inputs.push_back(RandomTensor(rng, dtype, s.x));
  c.inputs.push_back(RandomTensor(rng, dtype, s.w));
  if (s.bias) {
    c.spec.inputs.push_back(Desc(dtype, {s.w[0]}));
    c.inputs.push_back(RandomTensor(rng, dtype, {s.w[0]}));
  }
  c.spec.outputs = {Desc(dtype, out)};
  c.reference = ConvReference;
  int64_t taps = s.w[1];
  for (int i = 0; i < sp; ++i) taps *= s.w[2 + i];
  c.tol = DefaultTolerance(dtype, taps + 1);
  return c;
}

// Random valid convolutions: groups, strides, dilations, asymmetric pads.
std::vector<ConvShape> RandomConvShapes(int count) {
  std::mt19937_64 rng = RngFor("conv_random");
  auto pick = [&rng](std::vector<int64_t> from) { return from[rng() % from.size()]; };
  std::vector<ConvShape> v;
  while (static_cast<int>(v.size()) < count) {
    ConvShape s;
    const int sp = 1 + static_cast<int>(rng() % 2);
    const int64_t groups = pick({1, 1, 2, 3});
    const int64_t cpg = pick({1, 2, 5, 16}), opg = pick({1, 3, 8});
    s.x = {pick({1, 2}), groups * cpg};
    s.w = {groups * opg, cpg};
    s.groups = groups;
    s.bias = rng() % 2;
    bool ok = true;
    for (int i = 0; i < sp; ++i) {
      const int64_t in = pick({1, 5, 9, 17, 33}), k = pick({1, 2, 3, 5});
      s.stride.push_back(pick({1, 1, 2, 3}));
      s.dilation.push_back(pick({1, 1, 2}));
      s.lo.push_back(pick({0, 1, 2}));
      s.hi.push_back(pick({0, 1, 3}));
      s.x.push_back(in);
      s.w.push_back(k);
      ok &= in + s.lo.back() + s.hi.back() >= s.dilation.back() * (k - 1) + 1;
    }
    s.tag = absl::StrCat("random", v.size());
    if (ok) v.push_back(s);
  }
  return v;
}

std::vector<Case> ConvCases() {
  const std::vector<ConvShape> f32 = {
      {"basic", {1, 3, 9, 9}, {4, 3, 3, 3}, {}, {}, {1, 1}, {1, 1}},
      {"stride2", {2, 3, 17, 17}, {5, 3, 3, 3}, {2, 2}, {}, {1, 1}, {1, 1}},
      {"dilation2", {1, 4, 17, 17}, {4, 4, 3, 3}, {}, {2, 2}, {2, 2}, {2, 2}, 1, false},
      {"asym_pad", {1, 3, 9, 8}, {4, 3, 3, 2}, {1, 2}, {1, 1}, {0, 1}, {2, 0}},
      {"stride_dilation", {1, 5, 17, 13}, {3, 5, 3, 3}, {3, 2}, {2, 3}, {1, 2}, {2, 1}},
      {"groups2", {2, 4, 7, 7}, {6, 2, 3, 3}, {}, {}, {1, 1}, {1, 1}, 2},
      {"depthwise", {1, 8, 9, 9}, {8, 1, 3, 3}, {}, {}, {1, 1}, {1, 1}, 8},
      {"depthwise_x2", {1, 4, 9, 9}, {8, 1, 3, 3}, {2, 2}, {}, {1, 1}, {1, 1}, 4},
      {"depthwise_big", {1, 32, 33, 33}, {32, 1, 3, 3}, {}, {}, {1, 1}, {1, 1}, 32},
      {"pointwise", {2, 17, 5, 5}, {33, 17, 1, 1}},
      {"blocked16", {1, 16, 17, 17}, {16, 16, 3, 3}, {}, {}, {1, 1}, {1, 1}},
      {"blocked65", {1, 65, 9, 9}, {33, 65, 3, 3}, {2, 2}, {}, {1, 1}, {0, 0}},
      {"stem7x7", {1, 3, 33, 33}, {16, 3, 7, 7}, {2, 2}, {}, {3, 3}, {3, 3}},
      {"kernel_eq_input", {1, 3, 5, 5}, {2, 3, 5, 5}},
      {"one", {1, 1, 1, 1}, {1, 1, 1, 1}},
      {"empty_batch", {0, 3, 5, 5}, {2, 3, 3, 3}},
      {"empty_out_channels", {1, 3, 5, 5}, {0, 3, 3, 3}, {}, {}, {}, {}, 1, false},
      {"no_in_channels", {1, 0, 5, 5}, {4, 0, 3, 3}},                         // bias only
      {"empty_spatial", {1, 2, 0, 3}, {4, 2, 1, 1}, {}, {}, {1, 0}, {1, 0}},  // padding only
      {"1d", {2, 5, 17}, {7, 5, 3}, {}, {}, {1}, {1}},
      {"1d_stride_dilation", {2, 5, 17}, {7, 5, 3}, {3}, {2}, {2}, {1}},
      {"1d_depthwise", {1, 5, 17}, {5, 1, 4}, {}, {}, {2}, {1}, 5},
      {"1d_blocked", {1, 64, 130}, {64, 64, 5}, {}, {}, {2}, {2}},
      {"1d_stride2", {1, 80, 65}, {130, 80, 3}, {2}, {}, {1}, {1}},
      {"1d_groups", {1, 6, 17}, {9, 2, 3}, {}, {}, {1}, {0}, 3, false},
  };
  std::vector<Case> cases;
  for (const ConvShape& s : f32) cases.push_back(MakeConv(s, v1::DTYPE_F32));
  for (const ConvShape& s : RandomConvShapes(16)) cases.push_back(MakeConv(s, v1::DTYPE_F32));
  const std::vector<ConvShape> low = {
      {"basic", {1, 3, 9, 9}, {4, 3, 3, 3}, {}, {}, {1, 1}, {1, 1}},
      {"stride_dilation", {1, 5, 17, 13}, {3, 5, 3, 3}, {3, 2}, {2, 3}, {1, 2}, {2, 1}},
      {"depthwise", {1, 8, 9, 9}, {8, 1, 3, 3}, {}, {}, {1, 1}, {1, 1}, 8},
      {"blocked16", {1, 16, 17, 17}, {16, 16, 3, 3}, {}, {}, {1, 1}, {1, 1}},
      {"1d", {2, 5, 17}, {7, 5, 3}, {}, {}, {1}, {1}},
      {"no_in_channels", {1, 0, 5, 5}, {4, 0, 3, 3}},
  };
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const ConvShape& s : low) cases.push_back(MakeConv(s, dtype));
  }
  return cases;
}

// ----------------------------------------------------------------------- pool

std::vector<HostTensor> PoolReference(const KernelSpec& spec, const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.pool();
  const int sp = static_cast<int>(in[0].rank()) - 2;
  const Dims x = Widen(in[0].dims()), y = Widen(spec.outputs[0].dims);
  std::vector<int64_t> window(a.window().begin(), a.window().end());
  if (sp == 1) window.insert(window.begin(), 1);
  std::vector<int64_t> stride = a.stride().empty() ? window : As2d(a.stride(), sp, 1);
  const std::vector<int64_t> lo = As2d(a.pad_low(), sp, 0);
  const bool max = a.kind() == v1::POOL_MAX;
  HostTensor out = F64(spec.outputs[0].dims);
  int64_t idx = 0;
  for (int64_t p = 0; p < y[0] * y[1]; ++p) {
    for (int64_t oy = 0; oy < y[2]; ++oy) {
      for (int64_t ox = 0; ox < y[3]; ++ox, ++idx) {
        double acc = max ? -INFINITY : 0.0;
        int64_t count = 0;
        for (int64_t ky = 0; ky < window[0]; ++ky) {
          for (int64_t kx = 0; kx < window[1]; ++kx) {
            const int64_t iy = oy * stride[0] - lo[0] + ky, ix = ox * stride[1] - lo[1] + kx;
            if (iy < 0 || iy >= x[2] || ix < 0 || ix >= x[3]) continue;
            const double v = At(in[0], (p * x[2] + iy) * x[3] + ix);
            acc = max ? std::max(acc, v) : acc + v;
            ++count;
          }
        }
        if (!max) acc /= a.count_include_pad() ? window[0] * window[1] : count;
        out.SetFromDouble(idx, acc);
      }
    }
  }
  std::vector<HostTensor> result;
  result.push_back(std::move(out));
  return result;
}

struct PoolShape {
  std::string tag;
  v1::PoolKind kind;
  Dims x;
  std::vector<int64_t> window, stride, lo, hi;
  bool count_include_pad = false;
};

Case MakePool(const PoolShape& s, DType dtype) {
  Case c;
  c.name = absl::StrCat("pool/", DTypeName(dtype), "_", s.tag, "_", absl::StrJoin(s.x, "x"));
  std::mt19937_64 rng = RngFor(c.name);
  const int sp = static_cast<int>(s.x.size()) - 2;
  Dims out = {s.x[0], s.x[1]};
  int64_t window = 1;
  for (int i = 0; i < sp; ++i) {
    const int64_t stride = s.stride.empty() ? s.window[i] : s.stride[i];
    const int64_t lo = s.lo.empty() ? 0 : s.lo[i], hi = s.hi.empty() ? 0 : s.hi[i];
    out.push_back((s.x[2 + i] + lo + hi - s.window[i]) / stride + 1);
    window *= s.window[i];
  }
  c.spec.name = c.name;
  c.spec.label = absl::StrCat("case ", c.name);
  c.spec.op = v1::OP_POOL;
  auto* a = c.spec.attrs.mutable_pool();
  a->set_kind(s.kind);
  for (int64_t v : s.window) a->add_window(v);
  for (int64_t v : s.stride) a->add_stride(v);
  for (int64_t v : s.lo) a->add_pad_low(v);
  for (int64_t v : s.hi) a->add_pad_high(v);
  a->set_count_include_pad(s.count_include_pad);
  c.spec.inputs = {Desc(dtype, s.x)};
  c.spec.outputs = {Desc(dtype, out)};
  c.inputs.push_back(RandomTensor(rng, dtype, s.x));
  c.reference = PoolReference;
  c.tol = DefaultTolerance(dtype, s.kind == v1::POOL_MAX ? 1 : window);
  return c;
}

std::vector<Case> PoolCases() {
  using v1::POOL_AVG, v1::POOL_MAX;
  const std::vector<PoolShape> f32 = {
      {"max3s2p1", POOL_MAX, {2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
      {"max2", POOL_MAX, {2, 3, 8, 9}, {2, 2}},
      {"max_asym", POOL_MAX, {1, 2, 9, 8}, {3, 2}, {1, 2}, {0, 1}, {2, 0}},
      {"max3x1", POOL_MAX, {1, 2, 9, 8}, {3, 1}, {1, 2}},
      {"avg3s2p1_incl", POOL_AVG, {2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
      {"avg3s2p1_excl", POOL_AVG, {2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {"avg_asym_excl", POOL_AVG, {1, 2, 9, 8}, {3, 2}, {1, 2}, {0, 1}, {2, 0}, false},
      {"avg2", POOL_AVG, {1, 3, 17, 17}, {2, 2}},
      {"global_avg", POOL_AVG, {2, 17, 7, 7}, {7, 7}},
      {"max1d", POOL_MAX, {2, 3, 17}, {3}, {2}, {1}, {1}},
      {"avg1d_incl", POOL_AVG, {2, 3, 17}, {4}, {1}, {2}, {3}, true},
      {"avg1d_excl", POOL_AVG, {2, 3, 17}, {4}, {1}, {2}, {3}, false},
      {"one", POOL_MAX, {1, 1, 1, 1}, {1, 1}},
      {"empty_batch", POOL_MAX, {0, 3, 4, 4}, {2, 2}},
      {"empty_channels", POOL_AVG, {2, 0, 4, 4}, {2, 2}},
      {"big", POOL_MAX, {1, 16, 65, 65}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
  };
  std::vector<Case> cases;
  for (const PoolShape& s : f32) cases.push_back(MakePool(s, v1::DTYPE_F32));
  const std::vector<PoolShape> low = {
      {"max3s2p1", POOL_MAX, {2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
      {"avg3s2p1_excl", POOL_AVG, {2, 3, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {"avg1d_incl", POOL_AVG, {2, 3, 17}, {4}, {1}, {2}, {3}, true},
  };
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const PoolShape& s : low) cases.push_back(MakePool(s, dtype));
  }
  return cases;
}

const FamilyRegistration kConv("conv", ConvCases);
const FamilyRegistration kPool("pool", PoolCases);

}  // namespace
}  // namespace kiln::conformance
