// Conv (1-D and 2-D, NCL / NCHW) through oneDNN convolution_forward, and Pool
// (max, avg) as plain loops.
//
// Conv layouts: the kernel lets oneDNN pick its preferred (blocked) layouts
// and reorders the source in, and the result out, on each launch, except for
// pointwise and 1-D convs, where plain layouts measured faster (figures at
// PlainLayoutsWin). Weights whose value cannot change while the program lives
// (constants, inference params) are reordered once, when the engine packs them
// (backends/packing.h); others on each launch.
//
// FusedConv (made by the fuse pass) adds the per-output-channel epilogue of a
// folded BatchNorm ((conv + bias) * scale + shift) and an activation as oneDNN
// post-ops, and may take channels-last (NHWC) activations, which oneDNN's
// direct convolutions read and write as they are: a chain of such convs moves
// activations with no reorder at all (the fuse pass puts transposes at the
// chain's ends only).
//
// A conv whose kernel is spatially larger than its result (a weight gradient
// as autodiff writes it) runs as oneDNN's backward-weights (conv_wgrad.h).
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
#include "backends/cpu/conv_wgrad.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "backends/packing.h"
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
  // FusedConv's epilogue: (conv + bias) * scale + shift, then act.
  bool has_scale = false, has_shift = false;
  v1::UnaryKind act = v1::UNARY_KIND_UNSPECIFIED;
  bool channels_last = false;  // x [N, H, W, C], result [N, OH, OW, O]
};

// The oneDNN eltwise algorithm of an activation the epilogue can apply.
std::optional<std::pair<dnnl::algorithm, float>> EltwiseOf(v1::UnaryKind k) {
  switch (k) {
    case v1::UNARY_RELU: return std::make_pair(dnnl::algorithm::eltwise_relu, 0.0f);
    case v1::UNARY_GELU: return std::make_pair(dnnl::algorithm::eltwise_gelu_erf, 0.0f);
    case v1::UNARY_GELU_TANH: return std::make_pair(dnnl::algorithm::eltwise_gelu_tanh, 0.0f);
    case v1::UNARY_SILU: return std::make_pair(dnnl::algorithm::eltwise_swish, 1.0f);
    case v1::UNARY_SIGMOID: return std::make_pair(dnnl::algorithm::eltwise_logistic, 0.0f);
    case v1::UNARY_TANH: return std::make_pair(dnnl::algorithm::eltwise_tanh, 0.0f);
    default: return std::nullopt;
  }
}

const char* ActName(v1::UnaryKind k) {
  switch (k) {
    case v1::UNARY_RELU: return "relu";
    case v1::UNARY_GELU: return "gelu";
    case v1::UNARY_GELU_TANH: return "gelu_tanh";
    case v1::UNARY_SILU: return "silu";
    case v1::UNARY_SIGMOID: return "sigmoid";
    case v1::UNARY_TANH: return "tanh";
    default: return "?";
  }
}

absl::StatusOr<ConvConfig> ConvConfigOf(const KernelSpec& spec) {
  const bool fused = spec.op == v1::OP_FUSED_CONV;
  const v1::FusedConvAttrs& f = spec.attrs.fused_conv();
  const auto& a = fused ? f.conv() : spec.attrs.conv();
  ConvConfig c;
  if (fused) {
    c.has_bias = f.has_bias();
    c.has_scale = f.has_scale();
    c.has_shift = f.has_shift();
    c.act = f.activation();
    c.channels_last = f.channels_last();
    const size_t want = 2 + c.has_bias + c.has_scale + c.has_shift;
    if (spec.inputs.size() != want || spec.outputs.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused conv takes ", want, " operands and gives one result"));
    }
    if (c.act != v1::UNARY_KIND_UNSPECIFIED && !EltwiseOf(c.act)) {
      return absl::UnimplementedError(
          absl::StrCat("conv epilogue activation ", v1::UnaryKind_Name(c.act), " is not implemented"));
    }
  } else {
    if (spec.inputs.size() < 2 || spec.inputs.size() > 3 || spec.outputs.size() != 1) {
      return absl::InvalidArgumentError("conv takes x, w and an optional bias");
    }
    c.has_bias = spec.inputs.size() == 3;
  }
  TensorDesc x = spec.inputs[0];
  const TensorDesc& w = spec.inputs[1];
  c.dtype = x.dtype;
  if (!IsF32Storage(c.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat("conv on ", DTypeName(c.dtype), " is not implemented (f32, f16, bf16 are)"));
  }
  for (const TensorDesc& t : spec.inputs) {
    if (t.dtype != c.dtype) return absl::InvalidArgumentError("operand dtypes differ");
  }
  if (c.channels_last) {
    if (x.rank() != 4) return absl::InvalidArgumentError("channels_last needs x [N, H, W, C]");
    x.dims = {x.dims[0], x.dims[3], x.dims[1], x.dims[2]};
  }
  if ((x.rank() != 3 && x.rank() != 4) || w.rank() != x.rank()) {
    return absl::InvalidArgumentError("x must be [N, C, L] or [N, C, H, W], w of the same rank");
  }
  c.sp = static_cast<int>(x.rank()) - 2;
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
  if (c.has_bias && spec.inputs[2].dims != Dims{c.o}) {
    return absl::InvalidArgumentError("bias must be [O]");
  }
  for (size_t i = 2 + c.has_bias; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].num_elements() != c.o) {
      return absl::InvalidArgumentError("scale and shift must hold one value per output channel");
    }
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
  if (c.channels_last) want = {want[0], want[2], want[3], want[1]};
  if (spec.outputs[0].dims != want || spec.outputs[0].dtype != c.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("result must be ", DimsToString(want)));
  }
  return c;
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
// (Weights reorders are paid once when the engine packs them: PackingKernel.)
// A channels-last conv reads and writes NHWC as given (no reorders at all).
bool PlainLayoutsWin(const ConvConfig& c) {
  if (c.channels_last) return false;
  if (c.groups != 1) return false;
  if (c.sp == 1) return true;
  for (int i = 0; i < c.sp; ++i) {
    if (c.kernel[i] != 1 || c.stride[i] != 1 || c.pad_lo[i] != 0 || c.pad_hi[i] != 0) return false;
  }
  return true;
}

// A stable text of a memory descriptor's layout: kernels whose weights descs
// print equal hold equal packed bytes for equal values.
std::string LayoutKey(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::string s = absl::StrCat("dt", static_cast<int>(d.data_type), ":fk",
                               static_cast<int>(d.format_kind), ":dims");
  for (int i = 0; i < d.ndims; ++i) absl::StrAppend(&s, i ? "x" : "", d.dims[i]);
  if (d.format_kind == dnnl_blocked) {
    const auto& b = d.format_desc.blocking;
    absl::StrAppend(&s, ":strides");
    for (int i = 0; i < d.ndims; ++i) absl::StrAppend(&s, i ? "," : "", b.strides[i]);
    absl::StrAppend(&s, ":blocks");
    for (int i = 0; i < b.inner_nblks; ++i) absl::StrAppend(&s, i ? "," : "", b.inner_idxs[i], "/", b.inner_blks[i]);
  }
  absl::StrAppend(&s, ":extra", static_cast<int>(d.extra.flags), ":size", md.get_size());
  return s;
}

// Conv weights in the primitive's own (blocked) layout, made once by Pack.
class PackedConvWeights final : public backend::PackedOperand {
 public:
  explicit PackedConvWeights(dnnl::memory m) : memory(std::move(m)) {}
  int64_t bytes() const override { return static_cast<int64_t>(memory.get_desc().get_size()); }
  dnnl::memory memory;
};

class ConvKernel final : public CpuKernel, public backend::PackingKernel {
 public:
  static absl::StatusOr<std::unique_ptr<ConvKernel>> Make(const KernelSpec& spec) {
    KILN_ASSIGN_OR_RETURN(ConvConfig c, ConvConfigOf(spec));
    auto kernel = std::unique_ptr<ConvKernel>(new ConvKernel(std::move(c)));
    kernel->x_elements_ = spec.inputs[0].num_elements();
    kernel->w_elements_ = spec.inputs[1].num_elements();
    kernel->out_elements_ = spec.outputs[0].num_elements();
    KILN_RETURN_IF_ERROR(DnnlTry(spec.label, [&] { kernel->Build(); })) << "building " << spec.name;
    return kernel;
  }

  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    if (IsWeightGradientShaped(spec)) {
      KILN_RETURN_IF_ERROR(ConvConfigOf(spec).status());
      return CreateConvAsWeightGradient(spec);
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ConvKernel> kernel, Make(spec));
    return std::unique_ptr<backend::Kernel>(std::move(kernel));
  }

  // The implementation oneDNN chose ("" when no primitive is built).
  std::string onednn_impl() const { return impl_; }

  std::string implementation() const override {
    std::string s = absl::StrCat("onednn:conv", c_.sp, "d");
    if (c_.channels_last) {
      absl::StrAppend(&s, "_nhwc");
    } else if (x_reorder_ || y_reorder_) {
      absl::StrAppend(&s, "_blocked");
    }
    if (c_.dtype != v1::DTYPE_F32) absl::StrAppend(&s, "_", DTypeName(c_.dtype));
    if (c_.has_bias) absl::StrAppend(&s, "+bias");
    if (c_.has_scale) absl::StrAppend(&s, "+scale");
    if (c_.has_shift) absl::StrAppend(&s, "+shift");
    if (c_.act != v1::UNARY_KIND_UNSPECIFIED) absl::StrAppend(&s, "+", ActName(c_.act));
    if (packed_w_ != nullptr) absl::StrAppend(&s, "+packed_w");
    if (bias_fill_) absl::StrAppend(&s, "(bias fill)");
    return s;
  }

  // The weights are packable when oneDNN wants them in another layout than
  // the plain one they arrive in (and the kernel feeds oneDNN the storage
  // directly, not through f32 copies).
  std::vector<int> packable_inputs() const override {
    if (bias_fill_ || convert_ || !w_reorder_) return {};
    return {1};
  }

  std::string packing_key(int input) const override {
    return absl::StrCat("cpu:onednn_conv_weights:", w_plain_key_, "->", w_conv_key_,
                        ":input=", input);
  }

  absl::StatusOr<std::shared_ptr<const backend::PackedOperand>> Pack(
      int input, const BufferView& value) const override {
    if (input != 1 || !w_reorder_ || convert_) {
      return absl::InvalidArgumentError(absl::StrCat("input ", input, " is not packable"));
    }
    const int64_t want = static_cast<int64_t>(w_plain_desc_.get_size());
    if (value.bytes != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("packing conv weights: ", value.bytes, " bytes, want ", want));
    }
    std::shared_ptr<PackedConvWeights> packed;
    // Local memory objects and stream: Pack may run beside this kernel's launches.
    KILN_RETURN_IF_ERROR(DnnlTry("packing conv weights", [&] {
      dnnl::memory user(w_plain_desc_, DnnlEngine(), const_cast<void*>(value.host()));
      dnnl::memory blocked(w_conv_desc_, DnnlEngine());
      dnnl::stream stream(DnnlEngine());
      dnnl::reorder(user, blocked).execute(stream, user, blocked);
      stream.wait();
      packed = std::make_shared<PackedConvWeights>(std::move(blocked));
    }));
    return std::shared_ptr<const backend::PackedOperand>(std::move(packed));
  }

  void UsePacked(int input, const backend::PackedOperand* packed) override {
    if (input == 1) packed_w_ = dynamic_cast<const PackedConvWeights*>(packed);
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    if (out_elements_ == 0) return absl::OkStatus();
    if (bias_fill_) return FillEpilogue(inputs, outputs[0].host());
    const void* x = inputs[0].host();
    const void* w = inputs[1].host();
    int next = 2;
    const void* bias = c_.has_bias ? inputs[next++].host() : nullptr;
    const void* scale = c_.has_scale ? inputs[next++].host() : nullptr;
    const void* shift = c_.has_shift ? inputs[next++].host() : nullptr;
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
    // The epilogue's per-channel operands are f32 for every storage type.
    if (scale != nullptr && c_.dtype != v1::DTYPE_F32) {
      ConvertToF32(c_.dtype, scale, scale32_.data(), c_.o);
      scale = scale32_.data();
    }
    if (shift != nullptr && c_.dtype != v1::DTYPE_F32) {
      ConvertToF32(c_.dtype, shift, shift32_.data(), c_.o);
      shift = shift32_.data();
    }
    absl::Status status = DnnlTry("conv", [&] {
      x_user_.set_data_handle(const_cast<void*>(x));
      y_user_.set_data_handle(y);
      if (x_reorder_) x_reorder_->execute(stream_, x_user_, x_conv_);
      dnnl::memory weights;
      if (packed_w_ != nullptr) {
        weights = packed_w_->memory;
      } else {
        w_user_.set_data_handle(const_cast<void*>(w));
        if (w_reorder_) w_reorder_->execute(stream_, w_user_, w_conv_);
        weights = w_reorder_ ? w_conv_ : w_user_;
      }
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, x_reorder_ ? x_conv_ : x_user_},
          {DNNL_ARG_WEIGHTS, weights},
          {DNNL_ARG_DST, y_reorder_ ? y_conv_ : y_user_}};
      if (bias != nullptr) {
        bias_.set_data_handle(const_cast<void*>(bias));
        args.emplace(DNNL_ARG_BIAS, bias_);
      }
      if (scale != nullptr) {
        scale_.set_data_handle(const_cast<void*>(scale));
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(scale_post_op_) | DNNL_ARG_SRC_1, scale_);
      }
      if (shift != nullptr) {
        shift_.set_data_handle(const_cast<void*>(shift));
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(shift_post_op_) | DNNL_ARG_SRC_1, shift_);
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

  static float Activate(v1::UnaryKind k, float v) {
    switch (k) {
      case v1::UNARY_RELU: return v > 0 ? v : 0.0f;
      case v1::UNARY_GELU: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
      case v1::UNARY_GELU_TANH:
        return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
      case v1::UNARY_SILU: return v / (1.0f + std::exp(-v));
      case v1::UNARY_SIGMOID: return 1.0f / (1.0f + std::exp(-v));
      case v1::UNARY_TANH: return std::tanh(v);
      default: return v;
    }
  }

  // The sum over zero taps: bias (or 0), through the epilogue, everywhere.
  absl::Status FillEpilogue(std::span<const BufferView> inputs, void* y) const {
    int next = 2;
    const void* bias = c_.has_bias ? inputs[next++].host() : nullptr;
    const void* scale = c_.has_scale ? inputs[next++].host() : nullptr;
    const void* shift = c_.has_shift ? inputs[next++].host() : nullptr;
    std::vector<float> per(c_.o);
    for (int64_t o = 0; o < c_.o; ++o) {
      float v = bias != nullptr ? LoadF32(c_.dtype, bias, o) : 0.0f;
      if (scale != nullptr) v *= LoadF32(c_.dtype, scale, o);
      if (shift != nullptr) v += LoadF32(c_.dtype, shift, o);
      per[o] = Activate(c_.act, v);
    }
    const int64_t plane = out_elements_ / std::max<int64_t>(1, c_.n * c_.o);
    const size_t es = ElementSize(c_.dtype);
    if (c_.channels_last) {  // [N, OH, OW, O]: every pixel is the per-channel row
      for (int64_t p = 0; p < c_.n * plane; ++p) {
        ConvertFromF32(per.data(), c_.dtype, static_cast<char*>(y) + p * c_.o * es, c_.o);
      }
      return absl::OkStatus();
    }
    std::vector<float> row(plane);
    for (int64_t i = 0; i < c_.n * c_.o; ++i) {
      std::fill(row.begin(), row.end(), per[i % c_.o]);
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
    const tag act = c_.sp == 1 ? tag::ncw : (c_.channels_last ? tag::nhwc : tag::nchw);
    const tag wt = c_.sp == 1 ? (c_.groups > 1 ? tag::goiw : tag::oiw)
                              : (c_.groups > 1 ? tag::goihw : tag::oihw);
    const dnnl::memory::desc x_plain(x_dims, type, act), y_plain(y_dims, type, act),
        w_plain(w_dims, type, wt);
    // Channels-last activations are taken as they are; the weights may still
    // be reordered (once, when packed).
    const bool any_act = blocked && !c_.channels_last;
    const dnnl::memory::desc x_md = any_act ? dnnl::memory::desc(x_dims, type, tag::any) : x_plain;
    const dnnl::memory::desc y_md = any_act ? dnnl::memory::desc(y_dims, type, tag::any) : y_plain;
    const dnnl::memory::desc w_md = blocked ? dnnl::memory::desc(w_dims, type, tag::any) : w_plain;
    const dnnl::memory::desc b_md =
        c_.has_bias ? dnnl::memory::desc({c_.o}, type, tag::x) : dnnl::memory::desc();
    const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::convolution_direct, x_md, w_md,
                                               b_md, y_md, strides, dilates, pad_l, pad_r);
    // The epilogue as post-ops; scale and shift broadcast per channel.
    dnnl::post_ops ops;
    dnnl::memory::dims per_channel(static_cast<size_t>(c_.sp + 2), 1);
    per_channel[1] = c_.o;
    const dnnl::memory::desc pc_md(per_channel, dt::f32, c_.sp == 1 ? tag::abc : tag::abcd);
    int index = 0;
    if (c_.has_scale) {
      ops.append_binary(dnnl::algorithm::binary_mul, pc_md);
      scale_post_op_ = index++;
    }
    if (c_.has_shift) {
      ops.append_binary(dnnl::algorithm::binary_add, pc_md);
      shift_post_op_ = index++;
    }
    if (c_.act != v1::UNARY_KIND_UNSPECIFIED) {
      const auto [alg, alpha] = *EltwiseOf(c_.act);
      ops.append_eltwise(1.0f, alg, alpha, 0.0f);
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    dnnl::convolution_forward::primitive_desc pd(desc, attr, DnnlEngine());
    x_user_ = dnnl::memory(x_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    w_user_ = dnnl::memory(w_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    y_user_ = dnnl::memory(y_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    if (c_.has_bias) bias_ = dnnl::memory(b_md, DnnlEngine(), DNNL_MEMORY_NONE);
    if (c_.has_scale) scale_ = dnnl::memory(pc_md, DnnlEngine(), DNNL_MEMORY_NONE);
    if (c_.has_shift) shift_ = dnnl::memory(pc_md, DnnlEngine(), DNNL_MEMORY_NONE);
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
    w_plain_desc_ = w_plain;
    w_conv_desc_ = pd.weights_desc();
    w_plain_key_ = LayoutKey(w_plain);
    w_conv_key_ = LayoutKey(pd.weights_desc());
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
    if (c_.has_scale) scale32_.resize(c_.o);
    if (c_.has_shift) shift32_.resize(c_.o);
    impl_ = pd->impl_info_str();
    primitive_ = dnnl::convolution_forward(*pd);
  }

  const ConvConfig c_;
  int64_t x_elements_ = 0, w_elements_ = 0, out_elements_ = 0;
  bool bias_fill_ = false;
  bool convert_ = false;
  int scale_post_op_ = -1, shift_post_op_ = -1;
  std::string impl_;
  dnnl::stream stream_;
  dnnl::convolution_forward primitive_;
  dnnl::memory x_user_, w_user_, y_user_, bias_, scale_, shift_, x_conv_, w_conv_, y_conv_;
  std::optional<dnnl::reorder> x_reorder_, w_reorder_, y_reorder_;
  dnnl::memory::desc w_plain_desc_, w_conv_desc_;
  std::string w_plain_key_, w_conv_key_;
  const PackedConvWeights* packed_w_ = nullptr;  // bound by UsePacked, owned by the engine
  std::vector<float> x32_, w32_, b32_, y32_, scale32_, shift32_;  // f32 copies when converting
};

// Conv claims every valid spec. FusedConv claims a channels-last spec only
// where oneDNN runs it with a direct (non-reference, non-GEMM) implementation,
// so the fuse pass keeps activations channels-last only where that pays.
Claim SupportsConv(const KernelSpec& spec) {
  auto c = ConvConfigOf(spec);
  if (!c.ok()) return Claim::No(std::string(c.status().message()));
  if (c->channels_last) {
    auto kernel = ConvKernel::Make(spec);
    if (!kernel.ok()) return Claim::No(std::string(kernel.status().message()));
    const std::string impl = (*kernel)->onednn_impl();  // empty: no primitive (nothing to compute)
    if (impl.rfind("ref", 0) == 0 || impl.find("gemm") != std::string::npos) {
      return Claim::No(absl::StrCat("no direct channels-last convolution (oneDNN: ", impl, ")"));
    }
  }
  return Claim::Yes();
}

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
    {v1::OP_FUSED_CONV, &SupportsConv, &ConvKernel::Create},
    {v1::OP_POOL, &SupportsPool, &PoolKernel::Create},
});

}  // namespace
}  // namespace kiln::cpu
