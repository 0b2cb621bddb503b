// Conv (1-D and 2-D, NCL / NCHW) through oneDNN convolution_forward, and Pool
// (max, avg) as plain loops.
//
// Conv layouts: weights arrive with every launch (they are not known to be
// constant at prepare time), so any layout change is paid per launch. The
// kernel lets oneDNN pick its preferred (blocked) layouts and reorders the
// source and weights in, and the result out, on each launch, except for
// pointwise and 1-D convs, where plain layouts measured faster (figures at
// PlainLayoutsWin).
//
// Storage types as for matmul: f32 as is, bf16 natively where oneDNN has a
// non-reference implementation, f16 (and bf16 otherwise) through f32 copies.
// Degenerate shapes oneDNN rejects (no input channels, an empty spatial input
// that padding alone turns into outputs) are filled with the bias, which is
// what the sum over zero taps gives.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::Claim;
using backend::KernelSpec;
using backend::TensorDesc;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Per-spatial-dim attribute with its default when empty.
absl::StatusOr<std::vector<int64_t>> Spatial(const google::protobuf::RepeatedField<int64_t>& f,
                                             int n, int64_t def, int64_t min, const char* name) {
  if (f.empty()) return std::vector<int64_t>(n, def);
  if (f.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(name, " needs ", n, " entries"));
  }
  std::vector<int64_t> v(f.begin(), f.end());
  for (int64_t x : v) {
    if (x < min) return absl::InvalidArgumentError(absl::StrCat(name, " must be >= ", min));
  }
  return v;
}

// ----------------------------------------------------------------------- conv

struct ConvConfig {
  DType dtype = v1::DTYPE_F32;
  int sp = 0;  // spatial dims: 1 or 2
  int64_t n = 0, c = 0, o = 0, groups = 1;
  std::vector<int64_t> in, kernel, out, stride, dilation, pad_lo, pad_hi;
  bool has_bias = false;
};

absl::StatusOr<ConvConfig> ConvConfigOf(const KernelSpec& spec) {
  if (spec.inputs.size() < 2 || spec.inputs.size() > 3 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("conv takes x, w and an optional bias");
  }
  const TensorDesc& x = spec.inputs[0];
  const TensorDesc& w = spec.inputs[1];
  ConvConfig c;
  c.dtype = x.dtype;
  if (!IsF32Storage(c.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat("conv on ", DTypeName(c.dtype), " is not implemented (f32, f16, bf16 are)"));
  }
  for (const TensorDesc& t : spec.inputs) {
    if (t.dtype != c.dtype) return absl::InvalidArgumentError("operand dtypes differ");
  }
  if ((x.rank() != 3 && x.rank() != 4) || w.rank() != x.rank()) {
    return absl::InvalidArgumentError("x must be [N, C, L] or [N, C, H, W], w of the same rank");
  }
  c.sp = static_cast<int>(x.rank()) - 2;
  const auto& a = spec.attrs.conv();
  c.groups = a.groups() == 0 ? 1 : a.groups();
  if (c.groups < 1) return absl::InvalidArgumentError("groups must be >= 1");
  KILN_ASSIGN_OR_RETURN(c.stride, Spatial(a.stride(), c.sp, 1, 1, "stride"));
  KILN_ASSIGN_OR_RETURN(c.dilation, Spatial(a.dilation(), c.sp, 1, 1, "dilation"));
  KILN_ASSIGN_OR_RETURN(c.pad_lo, Spatial(a.pad_low(), c.sp, 0, 0, "pad_low"));
  KILN_ASSIGN_OR_RETURN(c.pad_hi, Spatial(a.pad_high(), c.sp, 0, 0, "pad_high"));
  c.n = x.dims[0], c.c = x.dims[1], c.o = w.dims[0];
  if (c.c % c.groups != 0 || c.o % c.groups != 0 || w.dims[1] * c.groups != c.c) {
    return absl::InvalidArgumentError("channels do not match groups");
  }
  c.has_bias = spec.inputs.size() == 3;
  if (c.has_bias && spec.inputs[2].dims != Dims{c.o}) {
    return absl::InvalidArgumentError("bias must be [O]");
  }
  Dims want = {c.n, c.o};
  for (int i = 0; i < c.sp; ++i) {
    const int64_t in = x.dims[2 + i], k = w.dims[2 + i];
    const int64_t eff = c.dilation[i] * (k - 1) + 1;
    const int64_t padded = in + c.pad_lo[i] + c.pad_hi[i];
    if (k == 0 || padded < eff) return absl::InvalidArgumentError("kernel exceeds padded input");
    c.in.push_back(in);
    c.kernel.push_back(k);
    c.out.push_back((padded - eff) / c.stride[i] + 1);
    want.push_back(c.out.back());
  }
  if (spec.outputs[0].dims != want || spec.outputs[0].dtype != c.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("result must be ", DimsToString(want)));
  }
  return c;
}

Claim SupportsConv(const KernelSpec& spec) {
  auto c = ConvConfigOf(spec);
  if (!c.ok()) return Claim::No(std::string(c.status().message()));
  return Claim::Yes();
}

// Where plain NCL/NCHW layouts beat oneDNN's blocked ones once the per-launch
// reorders (source, weights, result) are paid. Measured with oneDNN 2.6 on 2
// threads of a quiet AVX-512 Xeon (this 2-core dev machine was saturated by
// builds; the directions it did show agree), batch 1, medians of 21 runs in
// two sessions, blocked time including reorders:
//   3x3 64->64 at 56x56      plain 1.9-2.2 ms   blocked 1.0-1.1 ms
//   7x7/2 3->64 at 224x224   plain 2.7-2.8 ms   blocked 1.2 ms
//   3x3 256->256 at 14x14    plain 1.7 ms       blocked 1.1-1.2 ms
//   depthwise 3x3, 144 ch    plain 2.8 ms       blocked 0.5-1.2 ms
//   1x1 256->64 at 56x56     plain 0.45 ms      blocked 0.65-0.67 ms
//   1x1 512->1024 at 14x14   plain 1.0-1.1 ms   blocked 1.3-1.4 ms
//   1-D k3 80->256, L 3000   plain 2.4-3.4 ms   blocked 3.8-3.9 ms
//   1-D k3 512->512, L 1500  plain 10.7-11.3 ms blocked 12.2-12.5 ms
// A pointwise conv on plain NCHW is one GEMM per image, so reorders only add
// traffic; 1-D convs gain little from blocking. Everything else goes blocked.
bool PlainLayoutsWin(const ConvConfig& c) {
  if (c.groups != 1) return false;
  if (c.sp == 1) return true;
  for (int i = 0; i < c.sp; ++i) {
    if (c.kernel[i] != 1 || c.stride[i] != 1 || c.pad_lo[i] != 0 || c.pad_hi[i] != 0) return false;
  }
  return true;
}

class ConvKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    KILN_ASSIGN_OR_RETURN(ConvConfig c, ConvConfigOf(spec));
    auto kernel = std::unique_ptr<ConvKernel>(new ConvKernel(std::move(c)));
    kernel->x_elements_ = spec.inputs[0].num_elements();
    kernel->w_elements_ = spec.inputs[1].num_elements();
    kernel->out_elements_ = spec.outputs[0].num_elements();
    KILN_RETURN_IF_ERROR(DnnlTry(spec.label, [&] { kernel->Build(); })) << "building " << spec.name;
    return std::unique_ptr<backend::Kernel>(std::move(kernel));
  }

  std::string implementation() const override {
    std::string s = absl::StrCat("onednn:conv", c_.sp, "d");
    if (c_.dtype != v1::DTYPE_F32) absl::StrAppend(&s, "_", DTypeName(c_.dtype));
    if (c_.has_bias) absl::StrAppend(&s, "+bias");
    if (bias_fill_) absl::StrAppend(&s, "(bias fill)");
    return s;
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    if (out_elements_ == 0) return absl::OkStatus();
    if (bias_fill_)
      return FillWithBias(c_.has_bias ? inputs[2].host() : nullptr, outputs[0].host());
    const void* x = inputs[0].host();
    const void* w = inputs[1].host();
    const void* bias = c_.has_bias ? inputs[2].host() : nullptr;
    void* y = outputs[0].host();
    if (convert_) {
      ParallelConvertToF32(c_.dtype, x, x32_.data(), x_elements_);
      ParallelConvertToF32(c_.dtype, w, w32_.data(), w_elements_);
      x = x32_.data();
      w = w32_.data();
      if (bias != nullptr) {
        ConvertToF32(c_.dtype, bias, b32_.data(), c_.o);
        bias = b32_.data();
      }
      y = y32_.data();
    }
    absl::Status status = DnnlTry("conv", [&] {
      x_user_.set_data_handle(const_cast<void*>(x));
      w_user_.set_data_handle(const_cast<void*>(w));
      y_user_.set_data_handle(y);
      if (x_reorder_) x_reorder_->execute(stream_, x_user_, x_conv_);
      if (w_reorder_) w_reorder_->execute(stream_, w_user_, w_conv_);
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, x_reorder_ ? x_conv_ : x_user_},
          {DNNL_ARG_WEIGHTS, w_reorder_ ? w_conv_ : w_user_},
          {DNNL_ARG_DST, y_reorder_ ? y_conv_ : y_user_}};
      if (bias != nullptr) {
        bias_.set_data_handle(const_cast<void*>(bias));
        args.emplace(DNNL_ARG_BIAS, bias_);
      }
      primitive_.execute(stream_, args);
      if (y_reorder_) y_reorder_->execute(stream_, y_conv_, y_user_);
      stream_.wait();
    });
    if (!status.ok()) return status;
    if (convert_) ParallelConvertFromF32(y32_.data(), c_.dtype, outputs[0].host(), out_elements_);
    return absl::OkStatus();
  }

 private:
  explicit ConvKernel(ConvConfig c) : c_(std::move(c)) {}

  // The sum over zero taps: bias (or 0) everywhere.
  absl::Status FillWithBias(const void* bias, void* y) const {
    const int64_t plane = out_elements_ / std::max<int64_t>(1, c_.n * c_.o);
    const size_t es = ElementSize(c_.dtype);
    std::vector<float> row(plane);
    for (int64_t i = 0; i < c_.n * c_.o; ++i) {
      std::fill(row.begin(), row.end(), bias != nullptr ? LoadF32(c_.dtype, bias, i % c_.o) : 0.0f);
      ConvertFromF32(row.data(), c_.dtype, static_cast<char*>(y) + i * plane * es, plane);
    }
    return absl::OkStatus();
  }

  dnnl::convolution_forward::primitive_desc MakeDesc(dt type, bool blocked) {
    dnnl::memory::dims x_dims = {c_.n, c_.c}, y_dims = {c_.n, c_.o}, w_dims;
    if (c_.groups > 1)
      w_dims = {c_.groups, c_.o / c_.groups, c_.c / c_.groups};
    else
      w_dims = {c_.o, c_.c};
    dnnl::memory::dims strides, dilates, pad_l, pad_r;
    for (int i = 0; i < c_.sp; ++i) {
      x_dims.push_back(c_.in[i]);
      y_dims.push_back(c_.out[i]);
      w_dims.push_back(c_.kernel[i]);
      strides.push_back(c_.stride[i]);
      dilates.push_back(c_.dilation[i] - 1);  // oneDNN counts the gaps
      pad_l.push_back(c_.pad_lo[i]);
      pad_r.push_back(c_.pad_hi[i]);
    }
    const tag act = c_.sp == 1 ? tag::ncw : tag::nchw;
    const tag wt = c_.sp == 1 ? (c_.groups > 1 ? tag::goiw : tag::oiw)
                              : (c_.groups > 1 ? tag::goihw : tag::oihw);
    const dnnl::memory::desc x_plain(x_dims, type, act), y_plain(y_dims, type, act),
        w_plain(w_dims, type, wt);
    const dnnl::memory::desc x_md = blocked ? dnnl::memory::desc(x_dims, type, tag::any) : x_plain;
    const dnnl::memory::desc y_md = blocked ? dnnl::memory::desc(y_dims, type, tag::any) : y_plain;
    const dnnl::memory::desc w_md = blocked ? dnnl::memory::desc(w_dims, type, tag::any) : w_plain;
    const dnnl::memory::desc b_md =
        c_.has_bias ? dnnl::memory::desc({c_.o}, type, tag::x) : dnnl::memory::desc();
    const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, x_md, w_md,
                                               b_md, y_md, strides, dilates, pad_l, pad_r);
    dnnl::convolution_forward::primitive_desc pd(desc, DnnlEngine());
    x_user_ = dnnl::memory(x_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    w_user_ = dnnl::memory(w_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    y_user_ = dnnl::memory(y_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    if (c_.has_bias) bias_ = dnnl::memory(b_md, DnnlEngine(), DNNL_MEMORY_NONE);
    x_reorder_.reset();
    w_reorder_.reset();
    y_reorder_.reset();
    // Reorders only where oneDNN's preferred layout differs from ours; the
    // blocked buffers are allocated here and reused by every launch.
    if (pd.src_desc() != x_plain) {
      x_conv_ = dnnl::memory(pd.src_desc(), DnnlEngine());
      x_reorder_ = dnnl::reorder(x_user_, x_conv_);
    }
    if (pd.weights_desc() != w_plain) {
      w_conv_ = dnnl::memory(pd.weights_desc(), DnnlEngine());
      w_reorder_ = dnnl::reorder(w_user_, w_conv_);
    }
    if (pd.dst_desc() != y_plain) {
      y_conv_ = dnnl::memory(pd.dst_desc(), DnnlEngine());
      y_reorder_ = dnnl::reorder(y_conv_, y_user_);
    }
    return pd;
  }

  void Build() {
    if (out_elements_ == 0) return;
    bool empty_input = c_.c == 0;
    for (int64_t in : c_.in) empty_input |= in == 0;
    if (empty_input) {
      bias_fill_ = true;
      return;
    }
    stream_ = dnnl::stream(DnnlEngine());
    const bool blocked = !PlainLayoutsWin(c_);
    std::optional<dnnl::convolution_forward::primitive_desc> pd;
    if (c_.dtype == v1::DTYPE_BF16) {
      // bf16 natively only where oneDNN has more than its reference loops.
      try {
        pd = MakeDesc(dt::bf16, blocked);
        if (std::string(pd->impl_info_str()).rfind("ref", 0) == 0) pd.reset();
      } catch (const dnnl::error&) {
        pd.reset();
      }
    } else if (c_.dtype == v1::DTYPE_F32) {
      pd = MakeDesc(dt::f32, blocked);
    }
    if (!pd) {
      convert_ = true;
      pd = MakeDesc(dt::f32, blocked);
      x32_.resize(x_elements_);
      w32_.resize(w_elements_);
      if (c_.has_bias) b32_.resize(c_.o);
      y32_.resize(out_elements_);
    }
    primitive_ = dnnl::convolution_forward(*pd);
  }

  const ConvConfig c_;
  int64_t x_elements_ = 0, w_elements_ = 0, out_elements_ = 0;
  bool bias_fill_ = false;
  bool convert_ = false;
  dnnl::stream stream_;
  dnnl::convolution_forward primitive_;
  dnnl::memory x_user_, w_user_, y_user_, bias_, x_conv_, w_conv_, y_conv_;
  std::optional<dnnl::reorder> x_reorder_, w_reorder_, y_reorder_;
  std::vector<float> x32_, w32_, b32_, y32_;  // f32 copies when converting
};

// ----------------------------------------------------------------------- pool

struct PoolConfig {
  DType dtype = v1::DTYPE_F32;
  bool max = true;
  bool count_include_pad = false;
  int sp = 0;
  int64_t planes = 0;  // N * C
  // Spatial extents as 2-D (a 1-D pool is H = 1).
  int64_t ih = 1, iw = 1, oh = 1, ow = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
};

absl::StatusOr<PoolConfig> PoolConfigOf(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("pool takes one operand");
  }
  const TensorDesc& x = spec.inputs[0];
  PoolConfig c;
  c.dtype = x.dtype;
  if (!IsF32Storage(c.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat("pool on ", DTypeName(c.dtype), " is not implemented (f32, f16, bf16 are)"));
  }
  if (x.rank() != 3 && x.rank() != 4) return absl::InvalidArgumentError("x must be rank 3 or 4");
  c.sp = static_cast<int>(x.rank()) - 2;
  const auto& a = spec.attrs.pool();
  if (a.kind() != v1::POOL_MAX && a.kind() != v1::POOL_AVG) {
    return absl::InvalidArgumentError("unknown pool kind");
  }
  c.max = a.kind() == v1::POOL_MAX;
  c.count_include_pad = a.count_include_pad();
  if (a.window_size() != c.sp) return absl::InvalidArgumentError("window needs one entry per dim");
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> window, Spatial(a.window(), c.sp, 1, 1, "window"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> stride, Spatial(a.stride(), c.sp, 1, 1, "stride"));
  if (a.stride().empty()) stride = window;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> lo, Spatial(a.pad_low(), c.sp, 0, 0, "pad_low"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> hi, Spatial(a.pad_high(), c.sp, 0, 0, "pad_high"));
  Dims want = {x.dims[0], x.dims[1]};
  std::vector<int64_t> out;
  for (int i = 0; i < c.sp; ++i) {
    if (lo[i] >= window[i] || hi[i] >= window[i]) {
      return absl::InvalidArgumentError("padding must be below the window");
    }
    const int64_t padded = x.dims[2 + i] + lo[i] + hi[i];
    if (padded < window[i]) return absl::InvalidArgumentError("input smaller than the window");
    out.push_back((padded - window[i]) / stride[i] + 1);
    want.push_back(out.back());
  }
  if (spec.outputs[0].dims != want || spec.outputs[0].dtype != c.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("result must be ", DimsToString(want)));
  }
  c.planes = x.dims[0] * x.dims[1];
  const int h = c.sp == 2 ? 0 : -1, w = c.sp - 1;  // index of H (if any) and W
  if (h >= 0) {
    c.ih = x.dims[2], c.oh = out[h], c.kh = window[h], c.sh = stride[h], c.ph = lo[h];
  }
  c.iw = x.dims[2 + w], c.ow = out[w], c.kw = window[w], c.sw = stride[w], c.pw = lo[w];
  return c;
}

Claim SupportsPool(const KernelSpec& spec) {
  auto c = PoolConfigOf(spec);
  if (!c.ok()) return Claim::No(std::string(c.status().message()));
  return Claim::Yes();
}

// Max ignores padding (and propagates NaN); avg divides by the window size
// with count_include_pad, else by the number of real elements under it. The
// shape rules keep every window overlapping the input, so neither is empty.
class PoolKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    KILN_ASSIGN_OR_RETURN(PoolConfig c, PoolConfigOf(spec));
    return std::unique_ptr<backend::Kernel>(new PoolKernel(c));
  }

  std::string implementation() const override {
    return absl::StrCat("cpu:", c_.max ? "max" : "avg", "pool", c_.sp, "d_", DTypeName(c_.dtype));
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    const int64_t in_plane = c_.ih * c_.iw, out_plane = c_.oh * c_.ow;
    if (c_.planes == 0 || out_plane == 0) return absl::OkStatus();
    const char* x = static_cast<const char*>(inputs[0].host());
    char* y = static_cast<char*>(outputs[0].host());
    const size_t es = ElementSize(c_.dtype);
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, in_plane));
    // A result planned into the input's memory is computed from a copy.
    const char* x_end = x + inputs[0].bytes;
    const bool in_place = y < x_end && x < y + outputs[0].bytes;
    ParallelFor(c_.planes, grain, [&](int64_t p0, int64_t p1) {
      if (c_.dtype == v1::DTYPE_F32 && !in_place) {
        for (int64_t p = p0; p < p1; ++p) {
          PoolPlane(reinterpret_cast<const float*>(x) + p * in_plane,
                    reinterpret_cast<float*>(y) + p * out_plane);
        }
        return;
      }
      std::vector<float> in(in_plane), out(out_plane);
      for (int64_t p = p0; p < p1; ++p) {
        ConvertToF32(c_.dtype, x + p * in_plane * es, in.data(), in_plane);
        PoolPlane(in.data(), out.data());
        ConvertFromF32(out.data(), c_.dtype, y + p * out_plane * es, out_plane);
      }
    });
    return absl::OkStatus();
  }

 private:
  explicit PoolKernel(const PoolConfig& c) : c_(c) {}

  // max(a, b) that propagates NaN (either operand), without branches.
  static float NanMax(float a, float b) { return (b > a || b != b) ? b : a; }

  void PoolPlane(const float* in, float* out) const {
    if (c_.max && c_.kh == 2 && c_.kw == 2 && c_.sh == 2 && c_.sw == 2 && c_.ph == 0 &&
        c_.pw == 0) {
      // The CNN's 2x2 / stride 2 pool: no bounds or early exits per element
      // (the general loop below ran at ~4 ns an input element).
      for (int64_t oy = 0; oy < c_.oh; ++oy) {
        const float* r0 = in + 2 * oy * c_.iw;
        const float* r1 = r0 + c_.iw;
        float* o = out + oy * c_.ow;
        for (int64_t ox = 0; ox < c_.ow; ++ox) {
          o[ox] = NanMax(NanMax(r0[2 * ox], r0[2 * ox + 1]), NanMax(r1[2 * ox], r1[2 * ox + 1]));
        }
      }
      return;
    }
    for (int64_t oy = 0; oy < c_.oh; ++oy) {
      const int64_t y0 = oy * c_.sh - c_.ph;
      const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min(y0 + c_.kh, c_.ih);
      for (int64_t ox = 0; ox < c_.ow; ++ox) {
        const int64_t x0 = ox * c_.sw - c_.pw;
        const int64_t xa = std::max<int64_t>(x0, 0), xb = std::min(x0 + c_.kw, c_.iw);
        float acc = c_.max ? -std::numeric_limits<float>::infinity() : 0.0f;
        for (int64_t iy = ya; iy < yb; ++iy) {
          const float* row = in + iy * c_.iw;
          if (c_.max) {
            for (int64_t ix = xa; ix < xb; ++ix) {
              if (row[ix] > acc || std::isnan(row[ix])) acc = row[ix];
              if (std::isnan(acc)) break;
            }
          } else {
            for (int64_t ix = xa; ix < xb; ++ix) acc += row[ix];
          }
        }
        if (!c_.max) {
          const int64_t count = c_.count_include_pad ? c_.kh * c_.kw : (yb - ya) * (xb - xa);
          acc /= static_cast<float>(count);
        }
        out[oy * c_.ow + ox] = acc;
      }
    }
  }

  const PoolConfig c_;
};

const CpuOpRegistration kRegistration({
    {v1::OP_CONV, &SupportsConv, &ConvKernel::Create},
    {v1::OP_POOL, &SupportsPool, &PoolKernel::Create},
});

}  // namespace
}  // namespace kiln::cpu
