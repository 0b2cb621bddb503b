// A weight-gradient-shaped Conv through oneDNN's convolution_backward_weights
// (conv_wgrad.h says when and why).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/conv_wgrad.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "base/custom_ops.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::KernelSpec;
using dt = dnnl::memory::data_type;
using ddims = dnnl::memory::dims;

// The conv y[A, O, P..] = x[A, B, In..] (*) w[O, B, K..] with its geometry,
// and the far-side padding of the backward-weights problem (`far`).
struct WgradShape {
  DType dtype = v1::DTYPE_F32;
  int64_t a = 0, b = 0, o = 0;
  int64_t in[2] = {0, 0}, k[2] = {0, 0}, p[2] = {0, 0};
  int64_t stride[2] = {1, 1}, dil[2] = {1, 1}, lo[2] = {0, 0}, far[2] = {0, 0};
};

constexpr int64_t kMinChannels = 4;

int64_t At(const google::protobuf::RepeatedField<int64_t>& v, int i, int64_t def) {
  return v.size() == 2 ? v[i] : def;
}

std::optional<WgradShape> ShapeOf(const KernelSpec& spec) {
  if (spec.op != v1::OP_CONV || spec.inputs.size() != 2 || spec.outputs.size() != 1) return std::nullopt;
  const backend::TensorDesc &x = spec.inputs[0], &w = spec.inputs[1], &y = spec.outputs[0];
  if (x.rank() != 4 || w.rank() != 4 || y.rank() != 4 || !IsF32Storage(x.dtype) ||
      w.dtype != x.dtype || y.dtype != x.dtype) {
    return std::nullopt;
  }
  const auto& attrs = spec.attrs.conv();
  if (attrs.groups() > 1) return std::nullopt;
  for (const auto* f : {&attrs.stride(), &attrs.dilation(), &attrs.pad_low(), &attrs.pad_high()}) {
    if (!f->empty() && f->size() != 2) return std::nullopt;
  }
  WgradShape s;
  s.dtype = x.dtype;
  s.a = x.dims[0], s.b = x.dims[1], s.o = w.dims[0];
  if (w.dims[1] != s.b || y.dims[0] != s.a || y.dims[1] != s.o) return std::nullopt;
  if (s.a <= 0 || s.b <= 0 || s.o <= 0) return std::nullopt;
  // oneDNN's backward-weights kernels with 1-3 input channels (the conv's
  // batch here: a first layer's weight gradient) measured no faster than the
  // forward conv; from 4 they were (docs/benchmarks.md, train9d).
  if (s.a < kMinChannels) return std::nullopt;
  for (int i = 0; i < 2; ++i) {
    s.in[i] = x.dims[2 + i], s.k[i] = w.dims[2 + i], s.p[i] = y.dims[2 + i];
    s.stride[i] = At(attrs.stride(), i, 1);
    s.dil[i] = At(attrs.dilation(), i, 1);
    s.lo[i] = At(attrs.pad_low(), i, 0);
    if (s.in[i] <= 0 || s.k[i] <= 0 || s.p[i] <= 0 || s.stride[i] < 1 || s.dil[i] < 1 || s.lo[i] < 0) {
      return std::nullopt;
    }
    // oneDNN's size rule for the backward-weights problem (kernel P with
    // dilation `stride`, stride `dil`, result K) gives K back exactly with
    // this far padding; the conv's own rule makes it at most pad_high.
    s.far[i] = (s.k[i] - 1) * s.dil[i] + (s.p[i] - 1) * s.stride[i] + 1 - s.in[i] - s.lo[i];
    if (s.far[i] < 0 || s.far[i] > At(attrs.pad_high(), i, 0)) return std::nullopt;
  }
  if (s.k[0] * s.k[1] <= s.p[0] * s.p[1]) return std::nullopt;
  return s;
}

// oneDNN's convolution_backward_weights over three user buffers (src, diff_dst,
// diff_weights) described by strided f32 descs, each reordered to and from the
// layout oneDNN prefers where that differs; f16 / bf16 storage is converted
// through f32 copies of `elems` elements each. Shared by both kernels below.
class DnnlBackwardWeights {
 public:
  struct Geometry {
    ddims strides, dilates, pad_l, pad_r;  // oneDNN's: dilates count the gaps
  };

  // Returns oneDNN's implementation name.
  std::string Build(DType dtype, const dnnl::memory::desc& src_user, const dnnl::memory::desc& dst_user,
                    const dnnl::memory::desc& wts_user, const ddims& src, const ddims& dst,
                    const ddims& wts, const Geometry& g, const int64_t (&elems)[3]) {
    dtype_ = dtype;
    const dnnl::memory::desc src_any(src, dt::f32, dnnl::memory::format_tag::any),
        dst_any(dst, dt::f32, dnnl::memory::format_tag::any),
        wts_any(wts, dt::f32, dnnl::memory::format_tag::any);
    const dnnl::convolution_forward::desc fwd(dnnl::prop_kind::forward_training,
                                              dnnl::algorithm::convolution_direct, src_any, wts_any,
                                              dst_any, g.strides, g.dilates, g.pad_l, g.pad_r);
    const dnnl::convolution_forward::primitive_desc hint(fwd, DnnlEngine());
    const dnnl::convolution_backward_weights::desc bwd(dnnl::algorithm::convolution_direct, src_any,
                                                       wts_any, dst_any, g.strides, g.dilates,
                                                       g.pad_l, g.pad_r);
    const dnnl::convolution_backward_weights::primitive_desc pd(bwd, DnnlEngine(), hint);
    stream_ = dnnl::stream(DnnlEngine());
    src_user_ = dnnl::memory(src_user, DnnlEngine(), DNNL_MEMORY_NONE);
    dst_user_ = dnnl::memory(dst_user, DnnlEngine(), DNNL_MEMORY_NONE);
    wts_user_ = dnnl::memory(wts_user, DnnlEngine(), DNNL_MEMORY_NONE);
    if (pd.src_desc() != src_user) {
      src_mem_ = dnnl::memory(pd.src_desc(), DnnlEngine());
      src_reorder_ = dnnl::reorder(src_user_, src_mem_);
    }
    if (pd.diff_dst_desc() != dst_user) {
      dst_mem_ = dnnl::memory(pd.diff_dst_desc(), DnnlEngine());
      dst_reorder_ = dnnl::reorder(dst_user_, dst_mem_);
    }
    if (pd.diff_weights_desc() != wts_user) {
      wts_mem_ = dnnl::memory(pd.diff_weights_desc(), DnnlEngine());
      wts_reorder_ = dnnl::reorder(wts_mem_, wts_user_);
    }
    primitive_ = dnnl::convolution_backward_weights(pd);
    if (dtype_ != v1::DTYPE_F32) {
      for (int i = 0; i < 3; ++i) f32_[i].resize(static_cast<size_t>(elems[i]));
    }
    return pd.impl_info_str();
  }

  absl::Status Run(const char* what, const void* src, const void* diff_dst, void* diff_wts) {
    void* out = diff_wts;
    if (dtype_ != v1::DTYPE_F32) {  // f16 / bf16 storage: computed in f32
      ParallelConvertToF32(dtype_, src, f32_[0].data(), static_cast<int64_t>(f32_[0].size()));
      ParallelConvertToF32(dtype_, diff_dst, f32_[1].data(), static_cast<int64_t>(f32_[1].size()));
      src = f32_[0].data();
      diff_dst = f32_[1].data();
      out = f32_[2].data();
    }
    KILN_RETURN_IF_ERROR(DnnlTry(what, [&] {
      src_user_.set_data_handle(const_cast<void*>(src));
      dst_user_.set_data_handle(const_cast<void*>(diff_dst));
      wts_user_.set_data_handle(out);
      if (src_reorder_) src_reorder_->execute(stream_, src_user_, src_mem_);
      if (dst_reorder_) dst_reorder_->execute(stream_, dst_user_, dst_mem_);
      primitive_.execute(stream_, {{DNNL_ARG_SRC, src_reorder_ ? src_mem_ : src_user_},
                                   {DNNL_ARG_DIFF_DST, dst_reorder_ ? dst_mem_ : dst_user_},
                                   {DNNL_ARG_DIFF_WEIGHTS, wts_reorder_ ? wts_mem_ : wts_user_}});
      if (wts_reorder_) wts_reorder_->execute(stream_, wts_mem_, wts_user_);
      stream_.wait();
    }));
    if (dtype_ != v1::DTYPE_F32) {
      ParallelConvertFromF32(f32_[2].data(), dtype_, diff_wts, static_cast<int64_t>(f32_[2].size()));
    }
    return absl::OkStatus();
  }

 private:
  DType dtype_ = v1::DTYPE_F32;
  dnnl::stream stream_;
  dnnl::convolution_backward_weights primitive_;
  dnnl::memory src_user_, dst_user_, wts_user_, src_mem_, dst_mem_, wts_mem_;
  std::optional<dnnl::reorder> src_reorder_, dst_reorder_, wts_reorder_;
  std::vector<float> f32_[3];  // f32 copies of f16 / bf16 storage: src, diff_dst, diff_weights
};

class ConvWgradKernel final : public CpuKernel {
 public:
  explicit ConvWgradKernel(const WgradShape& s) : s_(s) {}

  std::string implementation() const override {
    return absl::StrCat("onednn:conv2d_as_bwd_weights",
                        s_.dtype == v1::DTYPE_F32 ? "" : absl::StrCat("_", DTypeName(s_.dtype)), "(",
                        impl_, ")");
  }

  void Build() {
    // x [A, B, H, W] is oneDNN's source [mb = B, ic = A, H, W]; w [O, B, K..]
    // its diff_dst [mb = B, oc = O, K..]; y [A, O, P..] its diff_weights
    // [oc = O, ic = A, P..]: strided views of the plain buffers.
    const int64_t hw = s_.in[0] * s_.in[1], kk = s_.k[0] * s_.k[1], pp = s_.p[0] * s_.p[1];
    const ddims src = {s_.b, s_.a, s_.in[0], s_.in[1]}, dst = {s_.b, s_.o, s_.k[0], s_.k[1]},
                wts = {s_.o, s_.a, s_.p[0], s_.p[1]};
    const dnnl::memory::desc src_user(src, dt::f32, ddims{hw, s_.b * hw, s_.in[1], 1});
    const dnnl::memory::desc dst_user(dst, dt::f32, ddims{kk, s_.b * kk, s_.k[1], 1});
    const dnnl::memory::desc wts_user(wts, dt::f32, ddims{pp, s_.o * pp, s_.p[1], 1});
    // oneDNN's problem: kernel P with dilation `stride`, stride `dil`, result K.
    const DnnlBackwardWeights::Geometry g = {{s_.dil[0], s_.dil[1]},
                                             {s_.stride[0] - 1, s_.stride[1] - 1},
                                             {s_.lo[0], s_.lo[1]},
                                             {s_.far[0], s_.far[1]}};
    impl_ = bw_.Build(s_.dtype, src_user, dst_user, wts_user, src, dst, wts, g,
                      {s_.a * s_.b * hw, s_.o * s_.b * kk, s_.a * s_.o * pp});
  }

  absl::Status Run(std::span<const BufferView> inputs, std::span<const BufferView> outputs) override {
    return bw_.Run("conv as backward weights", inputs[0].host(), inputs[1].host(), outputs[0].host());
  }

 private:
  const WgradShape s_;
  std::string impl_;
  DnnlBackwardWeights bw_;
};

// ---- kiln.conv2d_backward_weights(x, g, w) ----

// dw[O, C, K..] of y[N, O, P..] = conv(x[N, C, S..], w) for the cotangent g
// of y: the geometry from the payload, `far` the far-side padding that makes
// oneDNN's size rule give P exactly (negative: x's last rows are never read,
// and oneDNN sees x cropped by them).
struct BwdWeightsShape {
  DType dtype = v1::DTYPE_F32;
  int64_t n = 0, c = 0, o = 0;
  int64_t in[2] = {0, 0}, k[2] = {0, 0}, p[2] = {0, 0};
  int64_t stride[2] = {1, 1}, dil[2] = {1, 1}, lo[2] = {0, 0}, far[2] = {0, 0};
};

constexpr int64_t kMaxGeometry = int64_t{1} << 20;

// Checks the types (dims of -1 unknown, matching anything) and the payload;
// fills `s` (meaningful where the dims are known).
bool CheckBwdWeights(const KilnTensorType* in, int32_t count, const void* payload, size_t size,
                     BwdWeightsShape* s, std::string* why) {
  if (count != 3) {
    *why = "takes x, the cotangent g of conv(x, w), and w";
    return false;
  }
  const KilnTensorType &x = in[0], &g = in[1], &w = in[2];
  if (x.rank != 4 || g.rank != 4 || w.rank != 4) {
    *why = "x, g and w must be rank 4 (a 2-D conv)";
    return false;
  }
  if (!IsF32Storage(static_cast<DType>(x.dtype)) || g.dtype != x.dtype || w.dtype != x.dtype) {
    *why = "x, g and w must be one dtype of f32, f16, bf16";
    return false;
  }
  v1::ConvAttrs a;
  if (size > (1u << 16) || !a.ParseFromArray(payload, static_cast<int>(size))) {
    *why = "payload is not a kiln.v1.ConvAttrs";
    return false;
  }
  if (a.groups() > 1) {
    *why = "groups must be 1";
    return false;
  }
  for (const auto* f : {&a.stride(), &a.dilation(), &a.pad_low(), &a.pad_high()}) {
    if (!f->empty() && f->size() != 2) {
      *why = "stride, dilation and padding need two entries (or none)";
      return false;
    }
  }
  auto same = [](int64_t u, int64_t v) { return u < 0 || v < 0 || u == v; };
  if (!same(g.dims[0], x.dims[0]) || !same(w.dims[1], x.dims[1]) || !same(g.dims[1], w.dims[0])) {
    *why = "x [N, C, H, W], g [N, O, P, Q] and w [O, C, KH, KW] disagree";
    return false;
  }
  s->dtype = static_cast<DType>(x.dtype);
  s->n = x.dims[0], s->c = x.dims[1], s->o = w.dims[0];
  for (int i = 0; i < 2; ++i) {
    s->in[i] = x.dims[2 + i], s->k[i] = w.dims[2 + i], s->p[i] = g.dims[2 + i];
    s->stride[i] = At(a.stride(), i, 1);
    s->dil[i] = At(a.dilation(), i, 1);
    s->lo[i] = At(a.pad_low(), i, 0);
    const int64_t hi = At(a.pad_high(), i, 0);
    if (s->stride[i] < 1 || s->dil[i] < 1 || s->stride[i] > kMaxGeometry || s->dil[i] > kMaxGeometry ||
        s->lo[i] < 0 || hi < 0 || s->lo[i] > kMaxGeometry || hi > kMaxGeometry) {
      *why = "stride and dilation must be in [1, 2^20], padding in [0, 2^20]";
      return false;
    }
    if (s->in[i] < 0 || s->k[i] < 0) continue;  // unknown: checked when known
    const int64_t span = (s->k[i] - 1) * s->dil[i] + 1;
    const int64_t padded = s->in[i] + s->lo[i] + hi;
    if (s->k[i] < 1 || padded < span) {
      *why = "the kernel is larger than the padded input";
      return false;
    }
    const int64_t want = (padded - span) / s->stride[i] + 1;
    if (!same(s->p[i], want)) {
      *why = "g must have conv(x, w)'s dims";
      return false;
    }
    s->p[i] = want;
    s->far[i] = (want - 1) * s->stride[i] + span - s->in[i] - s->lo[i];
  }
  return true;
}

int Fail(char* error, size_t error_size, const std::string& why) {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", why.c_str());
  return 1;
}

class ConvBwdWeightsKernel final : public CpuKernel {
 public:
  explicit ConvBwdWeightsKernel(const BwdWeightsShape& s) : s_(s) {}

  // No batch, channels or result: dw is all zeros (oneDNN takes no empty dims).
  bool empty() const {
    return s_.n == 0 || s_.c == 0 || s_.o == 0 || s_.p[0] * s_.p[1] == 0 || s_.in[0] * s_.in[1] == 0;
  }

  std::string implementation() const override {
    return absl::StrCat("onednn:conv2d_bwd_weights",
                        s_.dtype == v1::DTYPE_F32 ? "" : absl::StrCat("_", DTypeName(s_.dtype)), "(",
                        impl_, ")");
  }

  void Build() {
    // x as it lies, cropped where the far padding is negative (rows the conv
    // never reads); g and dw plain.
    const int64_t h = s_.in[0], w = s_.in[1];
    const int64_t h_read = h + std::min<int64_t>(s_.far[0], 0);
    const int64_t w_read = w + std::min<int64_t>(s_.far[1], 0);
    const ddims src = {s_.n, s_.c, h_read, w_read}, dst = {s_.n, s_.o, s_.p[0], s_.p[1]},
                wts = {s_.o, s_.c, s_.k[0], s_.k[1]};
    const dnnl::memory::desc src_user(src, dt::f32, ddims{s_.c * h * w, h * w, w, 1});
    const dnnl::memory::desc dst_user(dst, dt::f32, dnnl::memory::format_tag::nchw);
    const dnnl::memory::desc wts_user(wts, dt::f32, dnnl::memory::format_tag::oihw);
    const DnnlBackwardWeights::Geometry geo = {
        {s_.stride[0], s_.stride[1]},
        {s_.dil[0] - 1, s_.dil[1] - 1},
        {s_.lo[0], s_.lo[1]},
        {std::max<int64_t>(s_.far[0], 0), std::max<int64_t>(s_.far[1], 0)}};
    impl_ = bw_.Build(s_.dtype, src_user, dst_user, wts_user, src, dst, wts, geo,
                      {s_.n * s_.c * h * w, s_.n * s_.o * s_.p[0] * s_.p[1],
                       s_.o * s_.c * s_.k[0] * s_.k[1]});
  }

  absl::Status Run(std::span<const BufferView> inputs, std::span<const BufferView> outputs) override {
    if (empty()) {
      std::memset(outputs[0].host(), 0, static_cast<size_t>(s_.o * s_.c * s_.k[0] * s_.k[1]) *
                                            (s_.dtype == v1::DTYPE_F32 ? 4 : 2));
      return absl::OkStatus();
    }
    return bw_.Run("conv backward weights", inputs[0].host(), inputs[1].host(), outputs[0].host());
  }

 private:
  const BwdWeightsShape s_;
  std::string impl_;
  DnnlBackwardWeights bw_;
};

KilnTensorType TypeOf(const backend::TensorDesc& d) {
  KilnTensorType t{};
  t.dtype = static_cast<int32_t>(d.dtype);
  t.rank = static_cast<int32_t>(d.rank());
  for (int64_t i = 0; i < d.rank() && i < KILN_PLUGIN_MAX_RANK; ++i) t.dims[i] = d.dims[i];
  return t;
}

}  // namespace

int ConvBackwardWeightsShape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                             int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                             char* error, size_t error_size) {
  BwdWeightsShape s;
  std::string why;
  if (!CheckBwdWeights(inputs, num_inputs, payload, payload_size, &s, &why)) {
    return Fail(error, error_size, why);
  }
  outputs[0] = inputs[2];
  *num_outputs = 1;
  return 0;
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateConvBackwardWeights(const KernelSpec& spec) {
  if (spec.inputs.size() != 3 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(spec.label, ": takes x, g, w and gives dw"));
  }
  for (const auto& d : spec.inputs) {
    if (d.rank() != 4) return absl::InvalidArgumentError(absl::StrCat(spec.label, ": operands must be rank 4"));
  }
  const KilnTensorType types[3] = {TypeOf(spec.inputs[0]), TypeOf(spec.inputs[1]), TypeOf(spec.inputs[2])};
  BwdWeightsShape s;
  std::string why;
  const std::string& payload = spec.attrs.custom().payload();
  if (!CheckBwdWeights(types, 3, payload.data(), payload.size(), &s, &why)) {
    return absl::InvalidArgumentError(absl::StrCat(spec.label, ": ", why));
  }
  if (!(spec.outputs[0].dtype == spec.inputs[2].dtype && spec.outputs[0].dims == spec.inputs[2].dims)) {
    return absl::InvalidArgumentError(absl::StrCat(spec.label, ": dw must have w's type"));
  }
  auto k = std::make_unique<ConvBwdWeightsKernel>(s);
  if (!k->empty()) KILN_RETURN_IF_ERROR(DnnlTry(spec.label, [&] { k->Build(); })) << "building " << spec.name;
  return std::unique_ptr<backend::Kernel>(std::move(k));
}

bool IsWeightGradientShaped(const KernelSpec& spec) { return ShapeOf(spec).has_value(); }

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateConvAsWeightGradient(const KernelSpec& spec) {
  const std::optional<WgradShape> s = ShapeOf(spec);
  if (!s) return absl::InternalError(absl::StrCat(spec.label, ": not a weight-gradient-shaped conv"));
  auto k = std::make_unique<ConvWgradKernel>(*s);
  KILN_RETURN_IF_ERROR(DnnlTry(spec.label, [&] { k->Build(); })) << "building " << spec.name;
  return std::unique_ptr<backend::Kernel>(std::move(k));
}

}  // namespace kiln::cpu
