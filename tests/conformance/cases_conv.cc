// Conformance cases for Conv (1-D and 2-D: stride, dilation, asymmetric
// padding, groups incl. depthwise, bias, degenerate shapes) and Pool (max and
// avg with and without count_include_pad, 1-D and 2-D), and FusedConv (the
// conv with a per-channel scale/shift and activation epilogue, channels-last
// or not, weights packed or not). References are f64 loops over the stored
// inputs.
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
  auto get = [](const std::vector<int64_t>& v, int i, int64_t def) {
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
      // Kernels larger than the result: the shapes of the weight gradients
      // autodiff writes (the CPU runs them as oneDNN backward-weights).
      {"wgrad_like", {4, 4, 10, 10}, {5, 4, 10, 10}, {}, {}, {1, 1}, {1, 1}, 1, false},
      {"wgrad_fwd_stride2", {4, 4, 11, 11}, {5, 4, 6, 6}, {}, {2, 2}, {1, 1}, {1, 1}, 1, false},
      {"wgrad_fwd_dilation2", {5, 4, 12, 12}, {5, 4, 12, 12}, {2, 2}, {}, {2, 2}, {2, 2}, 1, false},
      {"wgrad_asym", {6, 3, 9, 8}, {4, 3, 8, 6}, {}, {}, {1, 0}, {1, 2}, 1, false},
      {"wgrad_floor", {4, 3, 10, 10}, {4, 3, 5, 5}, {3, 3}, {}, {1, 1}, {2, 2}, 1, false},
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
      {"wgrad_like", {4, 4, 10, 10}, {5, 4, 10, 10}, {}, {}, {1, 1}, {1, 1}, 1, false},
  };
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const ConvShape& s : low) cases.push_back(MakeConv(s, dtype));
  }
  return cases;
}

// ----------------------------------------------------------------- fused conv

// FusedConv: act((conv(x, w) + bias) * scale + shift), channels-last or not,
// against the conv reference above with the epilogue applied in f64.
double ActivateF64(v1::UnaryKind k, double v) {
  switch (k) {
    case v1::UNARY_RELU: return v > 0 ? v : 0.0;
    case v1::UNARY_GELU: return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case v1::UNARY_GELU_TANH:
      return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case v1::UNARY_SILU: return v / (1.0 + std::exp(-v));
    case v1::UNARY_SIGMOID: return 1.0 / (1.0 + std::exp(-v));
    case v1::UNARY_TANH: return std::tanh(v);
    default: return v;
  }
}

// [N, H, W, C] <-> [N, C, H, W] copies of a tensor as f64.
HostTensor Permute4(const HostTensor& t, bool to_nchw) {
  const Dims& d = t.dims();
  const Dims out_dims = to_nchw ? Dims{d[0], d[3], d[1], d[2]} : Dims{d[0], d[2], d[3], d[1]};
  HostTensor out = F64(out_dims);
  const int64_t n = out_dims[0];
  // Index in NCHW terms: c, h, w of the NCHW side.
  const int64_t c = to_nchw ? d[3] : d[1], h = to_nchw ? d[1] : d[2], w = to_nchw ? d[2] : d[3];
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ci = 0; ci < c; ++ci) {
      for (int64_t y = 0; y < h; ++y) {
        for (int64_t x = 0; x < w; ++x) {
          const int64_t nchw = ((i * c + ci) * h + y) * w + x;
          const int64_t nhwc = ((i * h + y) * w + x) * c + ci;
          if (to_nchw) {
            out.SetFromDouble(nchw, At(t, nhwc));
          } else {
            out.SetFromDouble(nhwc, At(t, nchw));
          }
        }
      }
    }
  }
  return out;
}

std::vector<HostTensor> FusedConvReference(const KernelSpec& spec,
                                           const std::vector<HostTensor>& in) {
  const auto& a = spec.attrs.fused_conv();
  KernelSpec conv;
  conv.op = v1::OP_CONV;
  *conv.attrs.mutable_conv() = a.conv();
  Dims out_dims = spec.outputs[0].dims;
  if (a.channels_last()) out_dims = {out_dims[0], out_dims[3], out_dims[1], out_dims[2]};
  conv.outputs = {Desc(v1::DTYPE_F64, out_dims)};
  std::vector<HostTensor> conv_in;
  conv_in.push_back(a.channels_last() ? Permute4(in[0], true) : in[0].Clone());
  conv_in.push_back(in[1].Clone());
  size_t next = 2;
  if (a.has_bias()) conv_in.push_back(in[next++].Clone());
  HostTensor y = std::move(ConvReference(conv, conv_in)[0]);
  const HostTensor* scale = a.has_scale() ? &in[next++] : nullptr;
  const HostTensor* shift = a.has_shift() ? &in[next++] : nullptr;
  const int64_t o = out_dims[1];
  int64_t plane = 1;
  for (size_t i = 2; i < out_dims.size(); ++i) plane *= out_dims[i];
  for (int64_t i = 0; i < y.num_elements(); ++i) {
    const int64_t ch = (i / plane) % o;
    double v = At(y, i);
    if (scale != nullptr) v *= At(*scale, ch);
    if (shift != nullptr) v += At(*shift, ch);
    y.SetFromDouble(i, ActivateF64(a.activation(), v));
  }
  std::vector<HostTensor> result;
  result.push_back(a.channels_last() ? Permute4(y, false) : std::move(y));
  return result;
}

struct FusedConvCase {
  ConvShape shape;
  bool scale = true, shift = true;
  v1::UnaryKind act = v1::UNARY_RELU;
  bool channels_last = false;
  bool packed = false;
  Dims scale_dims;  // empty: [1, O, 1, 1] (or [1, O, 1] for 1-D)
};

Case MakeFusedConv(const FusedConvCase& f, DType dtype) {
  Case plain = MakeConv(f.shape, dtype);
  Case c;
  c.name = absl::StrCat("fused_conv/", DTypeName(dtype), "_", f.shape.tag,
                        f.channels_last ? "_nhwc" : "", f.packed ? "_packed" : "",
                        f.scale ? "_scale" : "", f.shift ? "_shift" : "",
                        f.act != v1::UNARY_KIND_UNSPECIFIED ? "_" : "",
                        f.act != v1::UNARY_KIND_UNSPECIFIED ? v1::UnaryKind_Name(f.act) : "", "_x",
                        absl::StrJoin(f.shape.x, "x"), "_w", absl::StrJoin(f.shape.w, "x"));
  std::mt19937_64 rng = RngFor(c.name);
  c.spec = plain.spec;
  c.spec.name = c.name;
  c.spec.label = absl::StrCat("case ", c.name);
  c.spec.op = v1::OP_FUSED_CONV;
  c.spec.attrs.Clear();
  auto* a = c.spec.attrs.mutable_fused_conv();
  *a->mutable_conv() = plain.spec.attrs.conv();
  a->set_has_bias(f.shape.bias);
  a->set_has_scale(f.scale);
  a->set_has_shift(f.shift);
  a->set_activation(f.act);
  a->set_channels_last(f.channels_last);
  c.inputs = std::move(plain.inputs);
  const int64_t o = f.shape.w[0];
  Dims pc = f.scale_dims;
  if (pc.empty()) {
    pc.assign(f.shape.x.size(), 1);
    pc[1] = o;
  }
  if (f.scale) {
    c.spec.inputs.push_back(Desc(dtype, pc));
    c.inputs.push_back(RandomTensor(rng, dtype, pc, 0.5, 1.5));
  }
  if (f.shift) {
    c.spec.inputs.push_back(Desc(dtype, pc));
    c.inputs.push_back(RandomTensor(rng, dtype, pc));
  }
  if (f.channels_last) {
    const Dims& x = c.spec.inputs[0].dims;
    c.spec.inputs[0].dims = {x[0], x[2], x[3], x[1]};
    c.inputs[0] = Permute4(c.inputs[0], false);
    HostTensor stored = std::move(HostTensor::Create(dtype, c.spec.inputs[0].dims)).value();
    for (int64_t i = 0; i < stored.num_elements(); ++i) stored.SetFromDouble(i, At(c.inputs[0], i));
    c.inputs[0] = std::move(stored);
    const Dims& y = c.spec.outputs[0].dims;
    c.spec.outputs[0].dims = {y[0], y[2], y[3], y[1]};
  }
  c.reference = FusedConvReference;
  c.tol = plain.tol;
  // The scale (up to 1.5) scales the conv's error; oneDNN's activations are
  // polynomial approximations (a few ulp).
  c.tol.atol *= 2;
  c.tol.rtol *= 2;
  c.pack_inputs = f.packed;
  return c;
}

std::vector<Case> FusedConvCases() {
  const ConvShape k3 = {"k3", {2, 3, 9, 9}, {16, 3, 3, 3}, {}, {}, {1, 1}, {1, 1}};
  const ConvShape k3s2 = {"k3s2", {2, 16, 17, 17}, {32, 16, 3, 3}, {2, 2}, {}, {1, 1}, {1, 1}};
  const ConvShape nobias = {"nobias", {1, 8, 11, 7}, {24, 8, 3, 3}, {}, {}, {1, 1}, {1, 1}, 1, false};
  const ConvShape grouped = {"groups2", {1, 8, 9, 9}, {16, 4, 3, 3}, {}, {}, {1, 1}, {1, 1}, 2};
  const ConvShape dw = {"depthwise", {1, 32, 9, 9}, {32, 1, 3, 3}, {}, {}, {1, 1}, {1, 1}, 32};
  const ConvShape pw = {"pointwise", {2, 17, 5, 5}, {33, 17, 1, 1}};
  const ConvShape empty = {"no_in_channels", {1, 0, 5, 5}, {4, 0, 3, 3}};
  const ConvShape one_d = {"1d", {2, 5, 17}, {7, 5, 3}, {}, {}, {1}, {1}};
  const std::vector<FusedConvCase> f32 = {
      {k3},
      {k3, true, true, v1::UNARY_RELU, true},
      {k3, true, true, v1::UNARY_RELU, true, true},
      {k3s2, true, true, v1::UNARY_RELU, false, true},
      {k3s2, true, true, v1::UNARY_RELU, true, true},
      {k3s2, false, false, v1::UNARY_RELU, true},
      {k3s2, false, false, v1::UNARY_KIND_UNSPECIFIED, true, true},
      {nobias, false, true, v1::UNARY_SILU, true},
      {nobias, true, false, v1::UNARY_GELU},
      {nobias, true, true, v1::UNARY_GELU_TANH, true},
      {nobias, true, true, v1::UNARY_SIGMOID},
      {nobias, true, true, v1::UNARY_TANH, true, true},
      {grouped, true, true, v1::UNARY_RELU, true},
      {dw, true, true, v1::UNARY_RELU, true, true},
      {dw, true, true, v1::UNARY_RELU, false, true},
      {pw, true, true, v1::UNARY_RELU, false, true},
      {pw, true, true, v1::UNARY_RELU, true},
      {k3, true, true, v1::UNARY_RELU, false, false, {16, 1, 1}},
      {k3, true, true, v1::UNARY_RELU, true, false, {16}},
      {empty, true, true, v1::UNARY_SIGMOID},
      {empty, true, true, v1::UNARY_RELU, true},
      {one_d, true, true, v1::UNARY_RELU},
      {one_d, true, true, v1::UNARY_RELU, false, true},
  };
  std::vector<Case> cases;
  for (const FusedConvCase& f : f32) cases.push_back(MakeFusedConv(f, v1::DTYPE_F32));
  const std::vector<FusedConvCase> low = {
      {k3},
      {k3s2, true, true, v1::UNARY_RELU, false, true},
      {empty, true, true, v1::UNARY_RELU},
  };
  for (DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (const FusedConvCase& f : low) cases.push_back(MakeFusedConv(f, dtype));
  }
  // Plain conv with its weights packed by the engine (constants, params).
  for (const ConvShape& s : {k3, k3s2, dw, grouped}) {
    Case c = MakeConv(s, v1::DTYPE_F32);
    c.name = absl::StrCat(c.name, "_packed");
    c.spec.name = c.name;
    c.pack_inputs = true;
    cases.push_back(std::move(c));
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
const FamilyRegistration kFusedConv("fused_conv", FusedConvCases);

}  // namespace
}  // namespace kiln::conformance
