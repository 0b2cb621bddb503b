// ConvTranspose2d: x [N, C, H, W], w [C, O/g, kH, kW] (PyTorch's layout),
// optional bias [O]; out[n, o, y, x] sums x[n, c, i, j] * w[c, o', p, q] over
// the group's input channels c and the taps with y = i*stride - pad_low +
// p*dilation (same for x).
//
// f32 (and f16 / bf16 through f32 copies) runs through oneDNN's
// convolution_backward_data: a transposed conv is the input gradient of the
// conv whose weights are w ([C, O/g, kH, kW] is
// that conv's [OC, IC/g, kH, kW]), whose source is the result and whose
// result is x. It is also what the autodiff pass emits for a 2-D conv's input
// gradient. Layouts as for the forward conv (kernels_conv.cc): oneDNN's
// preferred (blocked) ones, reordered in and out at each launch; the bias is
// added after. Taken when the output padding is below the stride (where the
// conv's size rule gives back H exactly; PyTorch's own bound).
//
// f64, and output padding at or over the stride, are computed in
// gather form (each output element reads the inputs that reach it), so
// threads own disjoint outputs and every sum runs in the same order:
// deterministic. Accumulates in f64 for f64 inputs, f32 otherwise (f16 /
// bf16 widened, rounded once at the end).
#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/onednn_util.h"
#include "backends/cpu/parallel.h"
#include "base/half.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;

std::vector<double> Widen(DType dt, const void* p, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = LoadAsDouble(dt, p, i);
  return out;
}

int64_t At(const google::protobuf::RepeatedField<int64_t>& v, int i, int64_t def) {
  return v.empty() ? def : v.size() == 1 ? v[0] : v[i];
}

// The geometry of one ConvTranspose2d spec, checked by CreateConvTranspose.
struct ConvTransposeShape {
  DType dtype = v1::DTYPE_F32;
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0, groups = 1, kh = 0, kw = 0, oh = 0, ow = 0;
  int64_t stride[2] = {1, 1}, dil[2] = {1, 1}, lo[2] = {0, 0}, hi[2] = {0, 0}, op[2] = {0, 0};
  bool has_bias = false;
};

// ConvTranspose2d as oneDNN's convolution_backward_data in f32 (see the top).
class OnednnConvTransposeKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec,
                                                                 const ConvTransposeShape& g) {
    std::unique_ptr<OnednnConvTransposeKernel> k(new OnednnConvTransposeKernel(g));
    KILN_RETURN_IF_ERROR(DnnlTry(spec.label, [&] { k->Build(); })) << "building " << spec.name;
    return std::unique_ptr<backend::Kernel>(std::move(k));
  }

  std::string implementation() const override {
    return absl::StrCat("onednn:conv_transpose2d_bwd_data", x_reorder_ || y_reorder_ ? "_blocked" : "",
                        g_.has_bias ? "+bias" : "");
  }

  absl::Status Run(std::span<const backend::BufferView> inputs,
                   std::span<const backend::BufferView> outputs) override {
    const void* x = inputs[0].host();
    const void* w = inputs[1].host();
    float* y = static_cast<float*>(outputs[0].host());
    if (g_.dtype != v1::DTYPE_F32) {  // f16 / bf16 storage: computed in f32
      ParallelConvertToF32(g_.dtype, x, x32_.data(), static_cast<int64_t>(x32_.size()));
      ParallelConvertToF32(g_.dtype, w, w32_.data(), static_cast<int64_t>(w32_.size()));
      x = x32_.data();
      w = w32_.data();
      y = y32_.data();
    }
    KILN_RETURN_IF_ERROR(DnnlTry("conv_transpose2d", [&] {
      x_user_.set_data_handle(const_cast<void*>(x));
      w_user_.set_data_handle(const_cast<void*>(w));
      y_user_.set_data_handle(y);
      if (x_reorder_) x_reorder_->execute(stream_, x_user_, x_mem_);
      if (w_reorder_) w_reorder_->execute(stream_, w_user_, w_mem_);
      primitive_.execute(stream_, {{DNNL_ARG_DIFF_DST, x_reorder_ ? x_mem_ : x_user_},
                                   {DNNL_ARG_WEIGHTS, w_reorder_ ? w_mem_ : w_user_},
                                   {DNNL_ARG_DIFF_SRC, y_reorder_ ? y_mem_ : y_user_}});
      if (y_reorder_) y_reorder_->execute(stream_, y_mem_, y_user_);
      stream_.wait();
    }));
    if (g_.has_bias) {
      std::vector<float> b(static_cast<size_t>(g_.o));
      ConvertToF32(g_.dtype, inputs[2].host(), b.data(), g_.o);
      const int64_t plane = g_.oh * g_.ow;
      ParallelFor(g_.n * g_.o, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, plane)),
                  [&](int64_t p0, int64_t p1) {
                    for (int64_t p = p0; p < p1; ++p) {
                      const float v = b[p % g_.o];
                      float* row = y + p * plane;
                      for (int64_t i = 0; i < plane; ++i) row[i] += v;
                    }
                  });
    }
    if (g_.dtype != v1::DTYPE_F32) {
      ParallelConvertFromF32(y32_.data(), g_.dtype, outputs[0].host(),
                             static_cast<int64_t>(y32_.size()));
    }
    return absl::OkStatus();
  }

 private:
  explicit OnednnConvTransposeKernel(const ConvTransposeShape& g) : g_(g) {}

  void Build() {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    using dims = dnnl::memory::dims;
    // The conv whose input gradient this is: src = our result, dst = our x.
    const dims src = {g_.n, g_.o, g_.oh, g_.ow}, dst = {g_.n, g_.c, g_.h, g_.w};
    const dims wd = g_.groups > 1 ? dims{g_.groups, g_.c / g_.groups, g_.o / g_.groups, g_.kh, g_.kw}
                                  : dims{g_.c, g_.o, g_.kh, g_.kw};
    const dims strides = {g_.stride[0], g_.stride[1]};
    const dims dilates = {g_.dil[0] - 1, g_.dil[1] - 1};  // oneDNN counts the gaps
    const dims pad_l = {g_.lo[0], g_.lo[1]}, pad_r = {g_.hi[0], g_.hi[1]};
    const dnnl::memory::desc src_plain(src, dt::f32, tag::nchw), dst_plain(dst, dt::f32, tag::nchw),
        w_plain(wd, dt::f32, g_.groups > 1 ? tag::goihw : tag::oihw);
    const dnnl::memory::desc src_any(src, dt::f32, tag::any), dst_any(dst, dt::f32, tag::any),
        w_any(wd, dt::f32, tag::any);
    const dnnl::convolution_forward::desc fwd(dnnl::prop_kind::forward_training,
                                              dnnl::algorithm::convolution_direct, src_any, w_any,
                                              dst_any, strides, dilates, pad_l, pad_r);
    const dnnl::convolution_forward::primitive_desc hint(fwd, DnnlEngine());
    const dnnl::convolution_backward_data::desc bwd(dnnl::algorithm::convolution_direct, src_any,
                                                    w_any, dst_any, strides, dilates, pad_l, pad_r);
    const dnnl::convolution_backward_data::primitive_desc pd(bwd, DnnlEngine(), hint);
    stream_ = dnnl::stream(DnnlEngine());
    x_user_ = dnnl::memory(dst_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    w_user_ = dnnl::memory(w_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    y_user_ = dnnl::memory(src_plain, DnnlEngine(), DNNL_MEMORY_NONE);
    if (pd.diff_dst_desc() != dst_plain) {
      x_mem_ = dnnl::memory(pd.diff_dst_desc(), DnnlEngine());
      x_reorder_ = dnnl::reorder(x_user_, x_mem_);
    }
    if (pd.weights_desc() != w_plain) {
      w_mem_ = dnnl::memory(pd.weights_desc(), DnnlEngine());
      w_reorder_ = dnnl::reorder(w_user_, w_mem_);
    }
    if (pd.diff_src_desc() != src_plain) {
      y_mem_ = dnnl::memory(pd.diff_src_desc(), DnnlEngine());
      y_reorder_ = dnnl::reorder(y_mem_, y_user_);
    }
    primitive_ = dnnl::convolution_backward_data(pd);
    if (g_.dtype != v1::DTYPE_F32) {
      x32_.resize(static_cast<size_t>(g_.n * g_.c * g_.h * g_.w));
      w32_.resize(static_cast<size_t>(g_.c * (g_.o / g_.groups) * g_.kh * g_.kw));
      y32_.resize(static_cast<size_t>(g_.n * g_.o * g_.oh * g_.ow));
    }
  }

  const ConvTransposeShape g_;
  dnnl::stream stream_;
  dnnl::convolution_backward_data primitive_;
  dnnl::memory x_user_, w_user_, y_user_, x_mem_, w_mem_, y_mem_;
  std::optional<dnnl::reorder> x_reorder_, w_reorder_, y_reorder_;
  std::vector<float> x32_, w32_, y32_;  // f32 copies of f16 / bf16 storage
};

Claim SupportsConvTranspose(const KernelSpec& spec) {
  if (spec.inputs.size() < 2 || spec.inputs.size() > 3) return Claim::No("expects x, w and an optional bias");
  if (!IsFloat(spec.inputs[0].dtype)) return Claim::No("conv_transpose2d takes floats");
  return Claim::Yes();
}

KernelOr CreateConvTranspose(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 2, 3, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& w = spec.inputs[1];
  const auto& a = spec.attrs.conv_transpose2d();
  if (x.rank() != 4 || w.rank() != 4 || w.dtype != x.dtype) {
    return SpecError(spec, "x and w must be rank-4 ", DTypeName(x.dtype), ", got ", TypeString(x), " and ", TypeString(w));
  }
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  const int64_t n = x.dims[0], c = x.dims[1], h = x.dims[2], wd = x.dims[3];
  const int64_t opg = w.dims[1], kh = w.dims[2], kw = w.dims[3];
  if (groups < 1 || c % groups != 0 || w.dims[0] != c) {
    return SpecError(spec, "w must be [", c, ", O/groups, kH, kW] with ", c, " channels divisible by groups=", groups,
                     ", got ", TypeString(w));
  }
  const int64_t o = opg * groups, cpg = c / groups;
  int64_t stride[2], dil[2], lo[2];
  for (int i = 0; i < 2; ++i) {
    stride[i] = At(a.stride(), i, 1);
    dil[i] = At(a.dilation(), i, 1);
    lo[i] = At(a.pad_low(), i, 0);
  }
  const auto& out_desc = spec.outputs[0];
  if (out_desc.rank() != 4 || out_desc.dims[0] != n || out_desc.dims[1] != o || out_desc.dtype != x.dtype) {
    return SpecError(spec, "output must be ", DTypeName(x.dtype), "[", n, ", ", o, ", H', W'], got ", TypeString(out_desc));
  }
  const int64_t oh = out_desc.dims[2], ow = out_desc.dims[3];
  const bool has_bias = spec.inputs.size() == 3;
  if (has_bias && (spec.inputs[2].dims != Dims{o} || spec.inputs[2].dtype != x.dtype)) {
    return SpecError(spec, "bias must be ", DTypeName(x.dtype), "[", o, "], got ", TypeString(spec.inputs[2]));
  }
  const DType dt = x.dtype;
  ConvTransposeShape g;
  g.n = n, g.c = c, g.h = h, g.w = wd, g.o = o, g.groups = groups, g.kh = kh, g.kw = kw;
  g.dtype = dt, g.oh = oh, g.ow = ow, g.has_bias = has_bias;
  bool onednn = IsF32Storage(dt) && n * o * oh * ow > 0 && n * c * h * wd > 0 && kh > 0 && kw > 0;
  for (int i = 0; i < 2; ++i) {
    g.stride[i] = stride[i], g.dil[i] = dil[i], g.lo[i] = lo[i];
    g.hi[i] = At(a.pad_high(), i, 0);
    g.op[i] = At(a.output_padding(), i, 0);
    onednn = onednn && g.op[i] < stride[i];
  }
  if (onednn) return OnednnConvTransposeKernel::Create(spec, g);
  return FnKernel::Make(
      spec, absl::StrCat("cpu:conv_transpose2d_direct_", DTypeName(dt)), [=](auto inputs, auto outputs) -> absl::Status {
        if (n * o * oh * ow == 0) return absl::OkStatus();
        const std::vector<double> xv = Widen(dt, HostPtr(inputs[0]), n * c * h * wd);
        const std::vector<double> wv = Widen(dt, HostPtr(inputs[1]), c * opg * kh * kw);
        const std::vector<double> bv = has_bias ? Widen(dt, HostPtr(inputs[2]), o) : std::vector<double>();
        void* out = HostPtr(outputs[0]);
        const bool f64 = dt == v1::DTYPE_F64;
        ParallelFor(n * o, 1, [&](int64_t b, int64_t e) {
          for (int64_t no = b; no < e; ++no) {
            const int64_t ni = no / o, oc = no % o, g = oc / opg, ocg = oc % opg;
            for (int64_t y = 0; y < oh; ++y) {
              for (int64_t xo = 0; xo < ow; ++xo) {
                double acc64 = has_bias ? bv[oc] : 0.0;
                float acc32 = static_cast<float>(acc64);
                for (int64_t p = 0; p < kh; ++p) {
                  const int64_t ty = y + lo[0] - p * dil[0];
                  if (ty < 0 || ty % stride[0] != 0 || ty / stride[0] >= h) continue;
                  const int64_t iy = ty / stride[0];
                  for (int64_t q = 0; q < kw; ++q) {
                    const int64_t tx = xo + lo[1] - q * dil[1];
                    if (tx < 0 || tx % stride[1] != 0 || tx / stride[1] >= wd) continue;
                    const int64_t ix = tx / stride[1];
                    for (int64_t ci = 0; ci < cpg; ++ci) {
                      const int64_t ch = g * cpg + ci;
                      const double prod = xv[((ni * c + ch) * h + iy) * wd + ix] * wv[((ch * opg + ocg) * kh + p) * kw + q];
                      if (f64) {
                        acc64 += prod;
                      } else {
                        acc32 += static_cast<float>(prod);
                      }
                    }
                  }
                }
                StoreFloatFromDouble(dt, out, ((ni * o + oc) * oh + y) * ow + xo, f64 ? acc64 : acc32);
              }
            }
          }
        });
        return absl::OkStatus();
      });
}

const CpuOpRegistration kRegistration({
    {v1::OP_CONV_TRANSPOSE2D, SupportsConvTranspose, CreateConvTranspose},
});

}  // namespace
}  // namespace kiln::cpu
