// Normalization and softmax: LayerNorm, RmsNorm, FusedResidualNorm
// (kernels/norm.cu) and Softmax, LogSoftmax (kernels/softmax.cu), for f32,
// f16 and bf16.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

// Threads per block for a row of `n`: a multiple of 32, up to 256.
unsigned RowBlock(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + 31) / 32 * 32, 32, 256));
}

struct NormPlan {
  bool rms = false, residual = false, emit_sum = false, scale = false, bias = false;
  int64_t axis = -1;
  double eps = 0;
};

absl::StatusOr<NormPlan> PlanNorm(const KernelSpec& spec) {
  NormPlan p;
  bool has_axis = false, has_eps = false;
  switch (spec.op) {
    case v1::OP_LAYER_NORM: {
      const auto& a = spec.attrs.layer_norm();
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      p.scale = spec.inputs.size() > 1;
      p.bias = spec.inputs.size() > 2;
      if (spec.inputs.size() > 3)
        return absl::InvalidArgumentError("layer_norm takes x, scale, bias");
      break;
    }
    case v1::OP_RMS_NORM: {
      const auto& a = spec.attrs.rms_norm();
      p.rms = true;
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      p.scale = spec.inputs.size() > 1;
      if (spec.inputs.size() > 2) return absl::InvalidArgumentError("rms_norm takes no bias");
      break;
    }
    case v1::OP_FUSED_RESIDUAL_NORM: {
      const auto& a = spec.attrs.fused_residual_norm();
      p.rms = a.rms(), p.residual = true, p.emit_sum = a.emit_sum();
      p.scale = a.has_scale(), p.bias = a.has_bias();
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      if (spec.inputs.size() != 2u + p.scale + p.bias) {
        return absl::InvalidArgumentError("operand count does not match has_scale/has_bias");
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("not a norm");
  }
  if (spec.outputs.size() != (p.emit_sum ? 2u : 1u)) {
    return absl::InvalidArgumentError("output count does not match emit_sum");
  }
  if (!has_eps) p.eps = p.rms ? 1e-6 : 1e-5;
  if (!has_axis) p.axis = -1;
  const int64_t rank = static_cast<int64_t>(spec.inputs[0].dims.size());
  if (p.axis < 0) p.axis += rank;
  if (p.axis < 0 || p.axis >= rank) return absl::InvalidArgumentError("axis out of range");
  if (p.residual && spec.inputs[1].dims != spec.inputs[0].dims) {
    return absl::InvalidArgumentError("x and residual differ in shape");
  }
  int64_t n = 1;
  for (size_t k = p.axis; k < spec.inputs[0].dims.size(); ++k) n *= spec.inputs[0].dims[k];
  for (size_t i = 1 + p.residual; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].num_elements() != n) {
      return absl::InvalidArgumentError("scale and bias must have the normalized dims' size");
    }
  }
  return p;
}

Claim SameFloatDType(const KernelSpec& spec, const char* what) {
  const DType dt = spec.inputs[0].dtype;
  for (const auto& t : spec.inputs) {
    if (t.dtype != dt) return Claim::No(absl::StrCat("cuda ", what, ": operands differ in dtype"));
  }
  for (const auto& t : spec.outputs) {
    if (t.dtype != dt) return Claim::No(absl::StrCat("cuda ", what, ": results differ in dtype"));
  }
  return FloatDType(dt, what);
}

Claim SupportsNorm(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.outputs.empty()) return Claim::No("malformed spec");
  absl::StatusOr<NormPlan> p = PlanNorm(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda norm: ", p.status().message()));
  return SameFloatDType(spec, "norm");
}

class NormKernel final : public CudaKernel {
 public:
  NormKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, NormPlan plan, int64_t rows,
             int64_t n, std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), plan_(plan), rows_(rows), n_(n) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    size_t next = 1;
    CUdeviceptr x = in[0], res = 0, scale = 0, bias = 0, y = out[0], sum = 0;
    if (plan_.residual) res = in[next++];
    if (plan_.scale) scale = in[next++];
    if (plan_.bias) bias = in[next++];
    if (plan_.emit_sum) sum = out[1];
    float eps = static_cast<float>(plan_.eps);
    int rms = plan_.rms, has_res = plan_.residual, has_scale = plan_.scale, has_bias = plan_.bias,
        emit = plan_.emit_sum;
    int64_t rows = rows_, n = n_;
    void* args[] = {&x, &res, &scale, &bias,    &y,         &sum,      &rows,
                    &n, &eps, &rms,   &has_res, &has_scale, &has_bias, &emit};
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>(rows_, device_.caps().max_grid_x));
    return LaunchKernel(s, fn_.fn, std::max(grid, 1u), 1, 1, RowBlock(n_), 0, args);
  }

 private:
  LoadedFunction fn_;
  NormPlan plan_;
  int64_t rows_, n_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateNorm(CudaDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(NormPlan plan, PlanNorm(spec));
  const Dims& dims = spec.inputs[0].dims;
  int64_t rows = 1, n = 1;
  for (int64_t k = 0; k < plan.axis; ++k) rows *= dims[k];
  for (size_t k = plan.axis; k < dims.size(); ++k) n *= dims[k];
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn, LoadFunction(d, "norm", KernelSource("norm.cu"),
                                                        absl::StrCat("kiln_norm_", dt), context));
  const char* what = plan.residual ? (plan.rms ? "residual_rms_norm_" : "residual_layer_norm_")
                                   : (plan.rms ? "rms_norm_" : "layer_norm_");
  return std::unique_ptr<backend::Kernel>(std::make_unique<NormKernel>(
      d, spec, std::move(fn), plan, rows, n, absl::StrCat("nvrtc:", what, dt)));
}

// ---- Softmax / LogSoftmax ----

Claim SupportsSoftmax(const CudaDevice&, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1 || spec.inputs[0].dims.empty() ||
      spec.inputs[0].dims != spec.outputs[0].dims) {
    return Claim::No("malformed spec");
  }
  const auto& a = spec.op == v1::OP_LOG_SOFTMAX ? spec.attrs.log_softmax() : spec.attrs.softmax();
  const int64_t rank = static_cast<int64_t>(spec.inputs[0].dims.size());
  const int64_t axis = a.has_axis() ? a.axis() : -1;
  if (axis < -rank || axis >= rank) return Claim::No("cuda softmax: axis out of range");
  return SameFloatDType(spec, "softmax");
}

class SoftmaxKernel final : public CudaKernel {
 public:
  SoftmaxKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, int64_t outer, int64_t n,
                int64_t inner, bool log, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        outer_(outer),
        n_(n),
        inner_(inner),
        log_(log) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    int64_t outer = outer_, n = n_, inner = inner_;
    int log = log_;
    if (inner_ == 1) {
      void* args[] = {&x, &y, &outer, &n, &log};
      const unsigned grid =
          static_cast<unsigned>(std::min<int64_t>(outer_, device_.caps().max_grid_x));
      return LaunchKernel(s, fn_.fn, std::max(grid, 1u), 1, 1, RowBlock(n_), 0, args);
    }
    void* args[] = {&x, &y, &outer, &n, &inner, &log};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), outer_ * inner_, 256), 1, 1, 256, 0,
                        args);
  }

 private:
  LoadedFunction fn_;
  int64_t outer_, n_, inner_;
  bool log_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateSoftmax(CudaDevice& d,
                                                               const KernelSpec& spec,
                                                               backend::PrepareContext& context) {
  const bool log = spec.op == v1::OP_LOG_SOFTMAX;
  const auto& a = log ? spec.attrs.log_softmax() : spec.attrs.softmax();
  const Dims& dims = spec.inputs[0].dims;
  int64_t axis = a.has_axis() ? a.axis() : -1;
  if (axis < 0) axis += static_cast<int64_t>(dims.size());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= dims[k];
  for (size_t k = axis + 1; k < dims.size(); ++k) inner *= dims[k];
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string fn_name = absl::StrCat("kiln_softmax_", inner == 1 ? "rows_" : "cols_", dt);
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "softmax", KernelSource("softmax.cu"), fn_name, context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<SoftmaxKernel>(
      d, spec, std::move(fn), outer, dims[axis], inner, log,
      absl::StrCat("nvrtc:", log ? "log_softmax_" : "softmax_", dt)));
}

const CudaOpRegistration kRegistration({
    {v1::OP_LAYER_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_RMS_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_FUSED_RESIDUAL_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_SOFTMAX, &SupportsSoftmax, &CreateSoftmax},
    {v1::OP_LOG_SOFTMAX, &SupportsSoftmax, &CreateSoftmax},
});

}  // namespace
}  // namespace kiln::cuda
