// Conformance cases for the quantization ops: DequantMatMul on every GGUF block
// type (q8_0 q4_0 q4_k q5_k q6_k), both weight layouts, M = 1 (decode), small
// batches, batches past the streaming path, K that is not a multiple of 256
// for the 32-element blocks, f16/bf16 activations and empty shapes; Quantize,
// Dequantize (int8/int4, per tensor and per channel, symmetric and with zero
// points, and the block types), FakeQuantize and FakeQuantizeLSQ's forward,
// with ties, NaN, infinities and saturation, and the launch errors of a bad
// scale or zero point.
//
// References: block weights are decoded exactly (quant_blocks.h's f64 form,
// itself checked on hand-built blocks) and multiplied in f64. Quantization
// follows the documented semantics (docs/quantization.md): x / s in the
// input's compute precision (f32 for f32/f16/bf16 storage), rounded half to
// even, plus the zero point, clamped to the grid.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/common/quant_blocks.h"
#include "base/half.h"
#include "tests/conformance/conformance.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance {
namespace {

using backend::KernelSpec;

constexpr DType kBlockTypes[] = {v1::DTYPE_Q8_0, v1::DTYPE_Q4_0, v1::DTYPE_Q4_K, v1::DTYPE_Q5_K,
                                 v1::DTYPE_Q6_K};

void PutHalf(uint8_t* p, double v) {
  const uint16_t h = FloatToHalf(static_cast<float>(v));
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Random blocks whose decoded weights lie within about [-1, 1]: random quant
// and scale bytes, and f16 super-scales sized for each type's integer range.
HostTensor RandomBlocks(std::mt19937_64& rng, DType dtype, const Dims& dims) {
  HostTensor t = std::move(HostTensor::Create(dtype, dims)).value();
  uint8_t* p = t.data_as<uint8_t>();
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < t.num_bytes(); ++i) p[i] = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<double> u(0.5, 1.0);
  std::bernoulli_distribution neg(0.3);
  const DTypeLayout l = LayoutOf(dtype);
  for (int64_t b = 0; b < t.num_bytes() / l.block_bytes; ++b) {
    uint8_t* blk = p + b * l.block_bytes;
    const double sign = neg(rng) ? -1 : 1;
    switch (dtype) {
      case v1::DTYPE_Q8_0:
        PutHalf(blk, sign * u(rng) / 128);
        break;
      case v1::DTYPE_Q4_0:
        PutHalf(blk, sign * u(rng) / 8);
        break;
      case v1::DTYPE_Q4_K:
        PutHalf(blk, u(rng) / (63 * 15));
        PutHalf(blk + 2, u(rng) / 126);
        break;
      case v1::DTYPE_Q5_K:
        PutHalf(blk, u(rng) / (63 * 31));
        PutHalf(blk + 2, u(rng) / 126);
        break;
      case v1::DTYPE_Q6_K:
        PutHalf(blk + 208, sign * u(rng) / (128 * 32));
        break;
      default:
        break;
    }
  }
  return t;
}

std::vector<double> DecodeExact(const HostTensor& w) {
  std::vector<double> v(w.num_elements());
  const int64_t blocks = w.num_elements() / LayoutOf(w.dtype()).block_elems;
  quant::DequantizeBlocks(w.dtype(), w.data_as<uint8_t>(), blocks, v.data());
  return v;
}

// x (as doubles, rows of k) @ the exact decoded weights, in long double.
std::vector<HostTensor> DequantMatMulOf(const KernelSpec& spec, const std::vector<double>& x,
                                        const HostTensor& wt, int64_t k) {
  const bool tb = spec.attrs.dequant_matmul().transpose_b();
  const std::vector<double> w = DecodeExact(wt);
  const int64_t n = tb ? wt.dims()[0] : wt.dims()[1];
  const int64_t m = k == 0 ? ref::NumElements(spec.outputs[0].dims) / std::max<int64_t>(n, 1)
                           : static_cast<int64_t>(x.size()) / k;
  HostTensor out = F64(spec.outputs[0].dims);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      long double s = 0;
      for (int64_t j = 0; j < k; ++j) s += x[r * k + j] * w[tb ? c * k + j : j * n + c];
      out.SetFromDouble(r * n + c, static_cast<double>(s));
    }
  }
  std::vector<HostTensor> result;
  result.push_back(std::move(out));
  return result;
}

std::vector<HostTensor> DequantMatMulReference(const KernelSpec& spec,
                                               const std::vector<HostTensor>& in) {
  std::vector<double> x(in[0].num_elements());
  for (int64_t i = 0; i < in[0].num_elements(); ++i) x[i] = At(in[0], i);
  return DequantMatMulOf(spec, x, in[1], in[0].dims().back());
}

// CompileOptions.allow_int8_activations as the CPU computes it
// (backends/cpu/dequant_dot.h, docs/quantization.md): each row rounded per
// group of g values (g = 256 for q4_k / q5_k, llama.cpp's q8_K; 32 for the
// others, q8_0), in f32 (d = amax / 127, q = round-half-even(x * (1 / d)),
// q = 0 when amax = 0), then x^ = d q (exact in f64) times the exact weights.
// The kernel may differ from this only by its f32 accumulation.
std::vector<HostTensor> DequantMatMulInt8Reference(const KernelSpec& spec,
                                                   const std::vector<HostTensor>& in) {
  const int64_t k = in[0].dims().back();
  const DType wt = in[1].dtype();
  const int g = wt == v1::DTYPE_Q4_K || wt == v1::DTYPE_Q5_K ? 256 : 32;  // k is a multiple
  std::vector<double> x(in[0].num_elements());
  std::vector<float> v(g);
  for (int64_t b = 0; b * g < static_cast<int64_t>(x.size()); ++b) {
    float amax = 0;
    for (int i = 0; i < g; ++i) {
      v[i] = static_cast<float>(At(in[0], g * b + i));
      amax = std::max(amax, std::fabs(v[i]));
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < g; ++i) {
      x[g * b + i] = static_cast<double>(d) * std::clamp(std::nearbyint(v[i] * id), -127.0f, 127.0f);
    }
  }
  return DequantMatMulOf(spec, x, in[1], k);
}

Case DequantMatMulCase(DType act, DType wt, const Dims& lead, int64_t n, int64_t k, bool tb) {
  Dims xd = lead;
  xd.push_back(k);
  const Dims wd = tb ? Dims{n, k} : Dims{k, n};
  Dims yd = lead;
  yd.push_back(n);
  const std::string name = absl::StrCat("dequant_matmul/", DTypeName(wt), "_", DTypeName(act), "_",
                                        ref::Shape(xd), tb ? "_x_NK_" : "_x_KN_", ref::Shape(wd));
  auto rng = RngFor(name);
  v1::Attrs attrs;
  attrs.mutable_dequant_matmul()->set_transpose_b(tb);
  Case c;
  c.name = name;
  c.spec =
      ref::Spec(name, v1::OP_DEQUANT_MATMUL, attrs, {Desc(act, xd), Desc(wt, wd)}, {Desc(act, yd)});
  c.inputs = ref::Tensors{RandomTensor(rng, act, xd, -1, 1), RandomBlocks(rng, wt, wd)};
  c.reference = DequantMatMulReference;
  c.tol = DefaultTolerance(act, k);
  return c;
}

std::vector<Case> DequantMatMulCases() {
  std::vector<Case> cases;
  for (DType wt : kBlockTypes) {
    const int64_t be = LayoutOf(wt).block_elems;
    // K: one block, several, and (for the 32-element blocks) not a multiple of 256.
    const std::vector<int64_t> ks =
        be == 32 ? std::vector<int64_t>{32, 160, 4128} : std::vector<int64_t>{256, 768, 4096};
    for (int64_t k : ks) {
      const bool big = k > 1000;
      // [N, K] (GGUF's linear layer): decode, small batches, past the streaming path.
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {1}, big ? 67 : 7, k, true));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {}, 33, k, true));  // rank-1 x
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {8}, big ? 40 : 64, k, true));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {2, 5}, 17, k, true));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {16}, 3, k, true));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {17}, big ? 150 : 40, k, true));
      if (big) continue;
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {3}, 1, k, true));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {2, 20}, 9, k, true));
    }
    // The GPU kernels' edges: M = 3 (a partly filled group of the matvec
    // kernels' 4 rows) and M = 8 (the tiled kernels) with odd N.
    cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {3}, 33, ks[1], true));
    cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {8}, 65, ks[0], true));
    // [K, N]: blocks along N; K is any length. N past one 256-column chunk.
    const int64_t n_wide = be == 32 ? 288 : 512;
    for (int64_t k : {int64_t{5}, int64_t{64}, int64_t{1100}}) {
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {1}, be, k, false));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {8}, n_wide, k, false));
      cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {19}, n_wide, k, false));
    }
    // f16 / bf16 activations and results.
    cases.push_back(DequantMatMulCase(v1::DTYPE_F16, wt, {1}, 9, ks[1], true));
    cases.push_back(DequantMatMulCase(v1::DTYPE_BF16, wt, {4}, 9, ks[1], true));
    cases.push_back(DequantMatMulCase(v1::DTYPE_F16, wt, {20}, 9, ks[0], true));
    cases.push_back(DequantMatMulCase(v1::DTYPE_BF16, wt, {3}, be, 7, false));
    // Empty: no rows, no columns, K = 0.
    cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {0}, 5, be, true));
    cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {2}, 0, be, true));
    cases.push_back(DequantMatMulCase(v1::DTYPE_F32, wt, {3}, be, 0, false));
  }
  return cases;
}
const FamilyRegistration kDequantMatMul("dequant_matmul", DequantMatMulCases);

// DequantMatMul with KernelSpec.allow_int8_activations: on devices that list
// backend::kFeatureInt8Activations the [N, K] streaming path (M <= 16) must
// match the int8 algorithm's f64 reference; every other device, and those
// paths that stay f32 (M > 16, [K, N]), the exact reference.
std::vector<Case> DequantMatMulInt8Cases() {
  std::vector<Case> cases;
  auto add = [&](DType act, DType wt, const Dims& lead, int64_t n, int64_t k, bool tb,
                 const char* what = "") {
    Case c = DequantMatMulCase(act, wt, lead, n, k, tb);
    c.name = absl::StrCat("dequant_matmul_int8/", c.name.substr(c.name.find('/') + 1), what);
    c.spec.name = c.name;
    c.spec.allow_int8_activations = true;
    int64_t m = 1;
    for (int64_t d : lead) m *= d;
    if (tb && m <= 16) {
      c.traded_feature = backend::kFeatureInt8Activations;
      c.traded_reference = DequantMatMulInt8Reference;
      c.traded_tol = DefaultTolerance(act, k);
    }
    return &cases.emplace_back(std::move(c));
  };
  for (DType wt : kBlockTypes) {
    const int64_t be = LayoutOf(wt).block_elems;
    const std::vector<int64_t> ks =
        be == 32 ? std::vector<int64_t>{32, 160, 4128} : std::vector<int64_t>{256, 768, 4096};
    for (int64_t k : ks) {
      add(v1::DTYPE_F32, wt, {1}, k > 1000 ? 67 : 7, k, true);
      add(v1::DTYPE_F32, wt, {}, 33, k, true);
      add(v1::DTYPE_F32, wt, {3}, 17, k, true);
      add(v1::DTYPE_F32, wt, {8}, 40, k, true);
      add(v1::DTYPE_F32, wt, {2, 8}, 9, k, true);
    }
    // Rows with an all-zero block (d = 0) and an outlier that takes a block's
    // whole int8 range.
    Case* c = add(v1::DTYPE_F32, wt, {2}, 21, ks[1], true, "_zero_block_outlier");
    c->inputs[0].data_as<float>()[0] = 40.0f;
    for (int i = 0; i < 32; ++i) c->inputs[0].data_as<float>()[ks[1] + 64 + i] = 0.0f;
    add(v1::DTYPE_F16, wt, {1}, 9, ks[1], true);
    add(v1::DTYPE_BF16, wt, {4}, 9, ks[1], true);
    // The paths that stay exact with the option on.
    add(v1::DTYPE_F32, wt, {17}, 11, ks[1], true);
    add(v1::DTYPE_F32, wt, {2}, be, 64, false);
  }
  return cases;
}
const FamilyRegistration kDequantMatMulInt8("dequant_matmul_int8", DequantMatMulInt8Cases);

// ---- Quantize / Dequantize / FakeQuantize ----

struct QSpec {
  v1::OpKind op;
  int bits = 8;
  bool symmetric = false;
  int64_t axis = -100;  // -100 = per tensor
  DType to = v1::DTYPE_UNSPECIFIED;
};

struct Grid {
  double qmin, qmax;
};

Grid GridOf(const KernelSpec& spec) {
  int bits = 8;
  bool sign = true;
  switch (spec.op) {
    case v1::OP_QUANTIZE:
      bits = spec.attrs.quantize().bits();
      sign = spec.outputs[0].dtype == v1::DTYPE_I8;
      break;
    case v1::OP_FAKE_QUANTIZE:
      bits = spec.attrs.fake_quantize().bits();
      sign = spec.attrs.fake_quantize().symmetric();
      break;
    default:
      bits = spec.attrs.fake_quantize_lsq().bits();
      sign = spec.attrs.fake_quantize_lsq().symmetric();
      break;
  }
  const double levels = std::ldexp(1.0, bits);
  return sign ? Grid{-levels / 2, levels / 2 - 1} : Grid{0, levels - 1};
}

// Channel of flat element i: the scale's length along `axis`, else 0.
struct ChannelMap {
  int64_t channels = 1, inner = 1;
  int64_t operator()(int64_t i) const { return (i / inner) % channels; }
};
ChannelMap ChannelsOf(const Dims& x, const HostTensor& scale, bool per_channel, int64_t axis) {
  ChannelMap m;
  if (!per_channel) {
    m.inner = std::max<int64_t>(ref::NumElements(x), 1);
    return m;
  }
  const int64_t a = axis < 0 ? axis + static_cast<int64_t>(x.size()) : axis;
  m.channels = scale.num_elements();
  for (size_t d = a + 1; d < x.size(); ++d) m.inner *= x[d];
  return m;
}

// round_half_even(x / s) + zp, clamped; x / s in the input's precision.
double QuantizeRef(double x, double s, double zp, DType in, Grid g) {
  if (std::isnan(x)) return zp;
  const double v = in == v1::DTYPE_F64
                       ? x / s
                       : static_cast<double>(static_cast<float>(x) / static_cast<float>(s));
  const double q = std::nearbyint(v) + zp;
  return std::min(std::max(q, g.qmin), g.qmax);
}

std::vector<HostTensor> QuantReference(const KernelSpec& spec, const std::vector<HostTensor>& in) {
  bool per_channel = false;
  int64_t axis = 0;
  switch (spec.op) {
    case v1::OP_QUANTIZE:
      per_channel = spec.attrs.quantize().has_axis();
      axis = spec.attrs.quantize().axis();
      break;
    case v1::OP_DEQUANTIZE:
      per_channel = spec.attrs.dequantize().has_axis();
      axis = spec.attrs.dequantize().axis();
      break;
    case v1::OP_FAKE_QUANTIZE:
      per_channel = spec.attrs.fake_quantize().has_axis();
      axis = spec.attrs.fake_quantize().axis();
      break;
    default:
      per_channel = spec.attrs.fake_quantize_lsq().has_axis();
      axis = spec.attrs.fake_quantize_lsq().axis();
      break;
  }
  const HostTensor& x = in[0];
  HostTensor out = F64(spec.outputs[0].dims);
  std::vector<HostTensor> result;
  if (spec.op == v1::OP_DEQUANTIZE && IsQuantized(x.dtype())) {
    const std::vector<double> w = DecodeExact(x);
    for (size_t i = 0; i < w.size(); ++i) out.SetFromDouble(i, w[i]);
    result.push_back(std::move(out));
    return result;
  }
  const ChannelMap ch = ChannelsOf(x.dims(), in[1], per_channel, axis);
  const bool has_zp = in.size() == 3;
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    const int64_t c = ch(i);
    const double s = At(in[1], c), zp = has_zp ? At(in[2], c) : 0.0;
    double y = 0;
    if (spec.op == v1::OP_DEQUANTIZE) {
      y = (At(x, i) - zp) * s;
    } else {
      const double q = QuantizeRef(At(x, i), s, zp, x.dtype(), GridOf(spec));
      y = spec.op == v1::OP_QUANTIZE ? q : (q - zp) * s;
    }
    out.SetFromDouble(i, y);
  }
  result.push_back(std::move(out));
  return result;
}

v1::Attrs AttrsFor(const QSpec& q) {
  v1::Attrs a;
  switch (q.op) {
    case v1::OP_QUANTIZE: {
      auto* m = a.mutable_quantize();
      m->set_bits(q.bits);
      m->set_symmetric(q.symmetric);
      m->set_to(q.to);
      if (q.axis != -100) m->set_axis(q.axis);
      break;
    }
    case v1::OP_DEQUANTIZE: {
      auto* m = a.mutable_dequantize();
      m->set_to(q.to);
      if (q.axis != -100) m->set_axis(q.axis);
      break;
    }
    case v1::OP_FAKE_QUANTIZE: {
      auto* m = a.mutable_fake_quantize();
      m->set_bits(q.bits);
      m->set_symmetric(q.symmetric);
      if (q.axis != -100) m->set_axis(q.axis);
      break;
    }
    default: {
      auto* m = a.mutable_fake_quantize_lsq();
      m->set_bits(q.bits);
      m->set_symmetric(q.symmetric);
      if (q.axis != -100) m->set_axis(q.axis);
      break;
    }
  }
  return a;
}

// x: uniform over about twice the grid's span (so both ends saturate), with
// exact ties (k + 0.5) * s, NaN, +-inf and +-0 at the front.
HostTensor QuantInput(std::mt19937_64& rng, DType dt, const Dims& dims, double s, Grid g) {
  HostTensor x = RandomTensor(rng, dt, dims, (g.qmin - 20) * s, (g.qmax + 20) * s);
  const double inf = std::numeric_limits<double>::infinity();
  const double specials[] = {0.5 * s,      1.5 * s, 2.5 * s, -0.5 * s, -1.5 * s, -2.5 * s,
                             std::nan(""), inf,     -inf,    0.0,      -0.0,     3 * s};
  for (int64_t i = 0; i < x.num_elements() && i < 12; ++i) x.SetFromDouble(i, specials[i]);
  return x;
}

std::string QName(const QSpec& q, DType in, const Dims& dims, const char* extra) {
  const char* op = q.op == v1::OP_QUANTIZE        ? "quantize"
                   : q.op == v1::OP_DEQUANTIZE    ? "dequantize"
                   : q.op == v1::OP_FAKE_QUANTIZE ? "fake_quantize"
                                                  : "fake_quantize_lsq";
  return absl::StrCat(
      op, "/", DTypeName(in), "_", ref::Shape(dims), "_b", q.bits, q.symmetric ? "_sym" : "_asym",
      q.axis == -100 ? std::string("_tensor") : absl::StrCat("_axis", q.axis),
      q.to != v1::DTYPE_UNSPECIFIED ? absl::StrCat("_", DTypeName(q.to)) : "", extra);
}

// Scale (and zero point, if `zp`) for x of `dims`: scalar or [C] along axis.
Dims ScaleDims(const QSpec& q, const Dims& dims) {
  if (q.axis == -100) return {};
  const int64_t a = q.axis < 0 ? q.axis + static_cast<int64_t>(dims.size()) : q.axis;
  return {dims[a]};
}

// One Quantize / FakeQuantize(LSQ) case. zp_dtype UNSPECIFIED = no zero point.
Case QuantCase(const QSpec& q, DType in, const Dims& dims, DType zp_dtype) {
  const std::string name = QName(
      q, in, dims,
      zp_dtype == v1::DTYPE_UNSPECIFIED ? "" : absl::StrCat("_zp", DTypeName(zp_dtype)).c_str());
  auto rng = RngFor(name);
  const Dims sd = ScaleDims(q, dims);
  Case c;
  c.name = name;
  const DType out = q.op == v1::OP_QUANTIZE ? q.to : in;
  std::vector<backend::TensorDesc> ins = {Desc(in, dims), Desc(v1::DTYPE_F32, sd)};
  if (zp_dtype != v1::DTYPE_UNSPECIFIED) ins.push_back(Desc(zp_dtype, sd));
  c.spec = ref::Spec(name, q.op, AttrsFor(q), ins, {Desc(out, dims)});
  const Grid g = GridOf(c.spec);
  // Per-tensor: a power-of-two scale, so the ties are exact in every dtype.
  HostTensor s = q.axis == -100 ? ref::Values(v1::DTYPE_F32, sd, {0.25})
                                : RandomTensor(rng, v1::DTYPE_F32, sd, 0.01, 0.1);
  const double s0 = At(s, 0);
  std::vector<HostTensor> inputs;
  inputs.push_back(QuantInput(rng, in, dims, s0, g));
  inputs.push_back(std::move(s));
  if (zp_dtype != v1::DTYPE_UNSPECIFIED) {
    inputs.push_back(RandomTensor(rng, zp_dtype, sd, g.qmin, g.qmax));
  }
  c.inputs = std::move(inputs);
  c.reference = QuantReference;
  c.tol = q.op == v1::OP_QUANTIZE ? Tolerance{0, 0} : DefaultTolerance(in);
  return c;
}

std::vector<Case> QuantizeCases() {
  std::vector<Case> cases;
  const std::vector<Dims> shapes = {{}, {0, 3}, {1000}, {64, 1024}};
  for (DType in : ref::FloatTypes()) {
    for (int bits : {8, 4}) {
      for (const Dims& d : shapes) {
        cases.push_back(QuantCase({v1::OP_QUANTIZE, bits, true, -100, v1::DTYPE_I8}, in, d,
                                  v1::DTYPE_UNSPECIFIED));
        cases.push_back(
            QuantCase({v1::OP_QUANTIZE, bits, false, -100, v1::DTYPE_U8}, in, d, v1::DTYPE_U8));
      }
      cases.push_back(QuantCase({v1::OP_QUANTIZE, bits, false, -100, v1::DTYPE_U8}, in, {33},
                                v1::DTYPE_UNSPECIFIED));
      cases.push_back(
          QuantCase({v1::OP_QUANTIZE, bits, false, 1, v1::DTYPE_I8}, in, {4, 5, 3}, v1::DTYPE_I8));
      cases.push_back(QuantCase({v1::OP_QUANTIZE, bits, true, -1, v1::DTYPE_I8}, in, {7, 130},
                                v1::DTYPE_UNSPECIFIED));
      cases.push_back(
          QuantCase({v1::OP_QUANTIZE, bits, false, 0, v1::DTYPE_U8}, in, {9, 2000}, v1::DTYPE_U8));
    }
  }
  // Launch errors: a zero or negative scale; a zero point off the 4-bit grid.
  {
    Case c = QuantCase({v1::OP_QUANTIZE, 8, true, -100, v1::DTYPE_I8}, v1::DTYPE_F32, {4},
                       v1::DTYPE_UNSPECIFIED);
    c.name += "_zero_scale";
    c.inputs[1].SetFromDouble(0, 0.0);
    c.expect_error = absl::StrCat(c.spec.label, ": scale is 0; it must be positive and finite");
    cases.push_back(std::move(c));
  }
  {
    Case c = QuantCase({v1::OP_QUANTIZE, 8, false, 1, v1::DTYPE_I8}, v1::DTYPE_F32, {2, 3},
                       v1::DTYPE_UNSPECIFIED);
    c.name += "_negative_scale";
    c.inputs[1].SetFromDouble(2, -0.5);
    c.expect_error = absl::StrCat(c.spec.label, ": scale of channel 2 is -0.5");
    cases.push_back(std::move(c));
  }
  {
    Case c = QuantCase({v1::OP_QUANTIZE, 4, false, -100, v1::DTYPE_I8}, v1::DTYPE_F32, {4},
                       v1::DTYPE_I8);
    c.name += "_zp_off_grid";
    c.inputs[2].SetFromDouble(0, 9);
    c.expect_error =
        absl::StrCat(c.spec.label, ": zero point is 9, outside the 4-bit grid [-8, 7]");
    cases.push_back(std::move(c));
  }
  return cases;
}
const FamilyRegistration kQuantize("quantize", QuantizeCases);

Case DequantCase(const QSpec& q, DType in, const Dims& dims, bool zp) {
  const std::string name = QName(q, in, dims, zp ? "_zp" : "");
  auto rng = RngFor(name);
  const Dims sd = ScaleDims(q, dims);
  Case c;
  c.name = name;
  std::vector<backend::TensorDesc> ins = {Desc(in, dims), Desc(v1::DTYPE_F16, sd)};
  if (zp) ins.push_back(Desc(in, sd));
  const DType out = q.to == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : q.to;
  c.spec = ref::Spec(name, q.op, AttrsFor(q), ins, {Desc(out, dims)});
  const auto [lo, hi] = ref::IntRange(in);
  std::vector<HostTensor> inputs;
  inputs.push_back(RandomTensor(rng, in, dims, lo, hi));
  inputs.push_back(RandomTensor(rng, v1::DTYPE_F16, sd, -0.1, 0.1));  // any sign dequantizes
  if (zp) inputs.push_back(RandomTensor(rng, in, sd, lo, hi));
  c.inputs = std::move(inputs);
  c.reference = QuantReference;
  c.tol = DefaultTolerance(out);
  return c;
}

Case DequantBlocksCase(DType wt, const Dims& dims, DType to) {
  const std::string name =
      absl::StrCat("dequantize/", DTypeName(wt), "_", ref::Shape(dims), "_to_", DTypeName(to));
  auto rng = RngFor(name);
  v1::Attrs attrs;
  attrs.mutable_dequantize()->set_to(to);
  Case c;
  c.name = name;
  c.spec = ref::Spec(name, v1::OP_DEQUANTIZE, attrs, {Desc(wt, dims)}, {Desc(to, dims)});
  c.inputs = ref::Tensors{RandomBlocks(rng, wt, dims)};
  c.reference = QuantReference;
  // f32 rounds d*sc*q - dmin*m once; f64 is exact.
  c.tol = DefaultTolerance(to);
  return c;
}

std::vector<Case> DequantizeCases() {
  std::vector<Case> cases;
  for (DType in : {v1::DTYPE_I8, v1::DTYPE_U8}) {
    for (DType to : ref::FloatTypes()) {
      for (const Dims& d : {Dims{}, Dims{0}, Dims{1000}, Dims{70, 1000}}) {
        cases.push_back(DequantCase({v1::OP_DEQUANTIZE, 8, false, -100, to}, in, d, false));
        cases.push_back(DequantCase({v1::OP_DEQUANTIZE, 8, false, -100, to}, in, d, true));
      }
      cases.push_back(DequantCase({v1::OP_DEQUANTIZE, 8, false, 1, to}, in, {4, 5, 3}, true));
      cases.push_back(DequantCase({v1::OP_DEQUANTIZE, 8, false, -2, to}, in, {6, 7, 33}, false));
    }
  }
  for (DType wt : kBlockTypes) {
    const int64_t be = LayoutOf(wt).block_elems;
    for (DType to : ref::FloatTypes()) cases.push_back(DequantBlocksCase(wt, {3, 2 * be}, to));
    cases.push_back(DequantBlocksCase(wt, {be * 64}, v1::DTYPE_F32));  // runs in parallel
    cases.push_back(DequantBlocksCase(wt, {2, 0, be}, v1::DTYPE_F32));
  }
  return cases;
}
const FamilyRegistration kDequantize("dequantize", DequantizeCases);

std::vector<Case> FakeQuantizeCases() {
  std::vector<Case> cases;
  for (v1::OpKind op : {v1::OP_FAKE_QUANTIZE, v1::OP_FAKE_QUANTIZE_LSQ}) {
    for (DType in : ref::FloatTypes()) {
      for (int bits : {8, 4}) {
        for (const Dims& d : {Dims{}, Dims{1000}, Dims{64, 1024}}) {
          cases.push_back(QuantCase({op, bits, true, -100}, in, d, v1::DTYPE_UNSPECIFIED));
          cases.push_back(QuantCase({op, bits, false, -100}, in, d, v1::DTYPE_UNSPECIFIED));
        }
        cases.push_back(QuantCase({op, bits, true, 0}, in, {16, 9}, v1::DTYPE_UNSPECIFIED));
        cases.push_back(QuantCase({op, bits, false, -1}, in, {5, 3, 130}, v1::DTYPE_UNSPECIFIED));
        if (op == v1::OP_FAKE_QUANTIZE) {
          cases.push_back(QuantCase({op, bits, false, -100}, in, {1000}, v1::DTYPE_F32));
          cases.push_back(QuantCase({op, bits, false, 1}, in, {4, 6, 5}, v1::DTYPE_I32));
        }
      }
    }
  }
  Case c =
      QuantCase({v1::OP_FAKE_QUANTIZE, 8, false, 0}, v1::DTYPE_F32, {3, 4}, v1::DTYPE_UNSPECIFIED);
  c.name += "_inf_scale";
  c.inputs[1].SetFromDouble(1, std::numeric_limits<double>::infinity());
  c.expect_error = absl::StrCat(c.spec.label, ": scale of channel 1 is inf");
  cases.push_back(std::move(c));
  return cases;
}
const FamilyRegistration kFakeQuantize("fake_quantize", FakeQuantizeCases);

}  // namespace
}  // namespace kiln::conformance
