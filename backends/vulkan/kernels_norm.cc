// Normalization: LayerNorm, RmsNorm, FusedResidualNorm and GroupNorm (norm.comp).
// GroupNorm is the LayerNorm of rows of one group's channels times the
// spatial positions ([N, C, spatial...] as [N * groups, C / groups * spatial]),
// its scale and bias read per channel.
#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct NormPush {
  uint32_t rows, n;
  float eps;
  uint32_t groups, spatial;  // GroupNorm: a param's index is (row % groups * n + j) / spatial
};

// The operands a norm spec carries and what it computes.
struct NormPlan {
  bool rms = false, residual = false, emit_sum = false, scale = false, bias = false;
  bool group = false;
  int64_t groups = 1;
  int64_t axis = -1;
  double eps = 0;
};

absl::StatusOr<NormPlan> NormPlanFor(const KernelSpec& spec) {
  NormPlan p;
  bool has_axis = false, has_eps = false;
  switch (spec.op) {
    case v1::OP_LAYER_NORM: {
      const auto& a = spec.attrs.layer_norm();
      has_axis = a.has_axis(), p.axis = a.axis(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      p.scale = spec.inputs.size() > 1;
      p.bias = spec.inputs.size() > 2;
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
      if (spec.outputs.size() != (p.emit_sum ? 2u : 1u)) {
        return absl::InvalidArgumentError("output count does not match emit_sum");
      }
      break;
    }
    case v1::OP_GROUP_NORM: {
      const auto& a = spec.attrs.group_norm();
      p.group = true, p.groups = a.groups(), has_eps = a.has_epsilon(), p.eps = a.epsilon();
      p.scale = spec.inputs.size() > 1;
      p.bias = spec.inputs.size() > 2;
      const Dims& d = spec.inputs[0].dims;
      if (spec.inputs.size() > 3) return absl::InvalidArgumentError("group_norm takes x, scale, bias");
      if (d.size() < 2) return absl::InvalidArgumentError("group_norm needs x [N, C, ...]");
      if (p.groups <= 0 || d[1] % p.groups != 0) {
        return absl::InvalidArgumentError("groups must divide the channels");
      }
      for (size_t i = 1; i < spec.inputs.size(); ++i) {
        if (spec.inputs[i].dims != Dims{d[1]}) {
          return absl::InvalidArgumentError("scale and bias must be [C]");
        }
      }
      has_axis = true, p.axis = 1;  // unused: rows and n come from the groups
      break;
    }
    default:
      return absl::InvalidArgumentError("not a norm");
  }
  if (!has_eps) p.eps = p.rms ? 1e-6 : 1e-5;
  if (!has_axis) p.axis = -1;
  const int64_t rank = static_cast<int64_t>(spec.inputs[0].dims.size());
  if (p.axis < 0) p.axis += rank;
  if (p.axis < 0 || p.axis >= rank) return absl::InvalidArgumentError("axis out of range");
  return p;
}

Claim SupportsNorm(const VulkanDevice& d, const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.outputs.empty()) return Claim::No("malformed spec");
  absl::StatusOr<NormPlan> p = NormPlanFor(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("vulkan norm: ", p.status().message()));
  const DType dt = spec.inputs[0].dtype;
  for (const auto& t : spec.inputs) {
    if (t.dtype != dt) return Claim::No("vulkan norm: operands differ in dtype");
  }
  if (dt == v1::DTYPE_BF16 && d.caps().storage16) return Claim::Yes();
  return FloatKernelDType(d, spec, dt, "norm");
}

class NormKernel final : public VulkanKernel {
 public:
  NormKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
             NormPlan plan, NormPush push, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)), pipeline_(std::move(p)), plan_(plan), push_(push) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    // Bindings: x, residual, scale, bias, y, sum; absent ones get a dummy range.
    const BufferBinding dummy = out[0];  // never read or written when absent
    size_t next = 1;
    BufferBinding b[6] = {in[0], dummy, dummy, dummy, out[0], dummy};
    if (plan_.residual) b[1] = in[next++];
    if (plan_.scale) b[2] = in[next++];
    if (plan_.bias) b[3] = in[next++];
    if (plan_.emit_sum) b[5] = out[1];
    const uint32_t write_mask = plan_.emit_sum ? 0b110000 : 0b010000;
    return s.Dispatch(*pipeline_, b, write_mask, &push_, sizeof(push_),
                      Groups1D(device_.caps(), push_.rows, 1));
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  NormPlan plan_;
  NormPush push_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateNorm(VulkanDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext&) {
  KILN_ASSIGN_OR_RETURN(NormPlan plan, NormPlanFor(spec));
  const Dims& dims = spec.inputs[0].dims;
  NormPush push{1, 1, static_cast<float>(plan.eps), 1, 1};
  if (plan.group) {
    const auto groups = static_cast<uint32_t>(plan.groups);
    for (size_t k = 2; k < dims.size(); ++k) push.spatial *= static_cast<uint32_t>(dims[k]);
    push.groups = groups;
    push.rows = static_cast<uint32_t>(dims[0]) * groups;
    push.n = static_cast<uint32_t>(dims[1]) / groups * push.spatial;
  } else {
    for (int64_t k = 0; k < plan.axis; ++k) push.rows *= static_cast<uint32_t>(dims[k]);
    for (size_t k = plan.axis; k < dims.size(); ++k) push.n *= static_cast<uint32_t>(dims[k]);
  }
  const uint32_t wg = Workgroup1D(d.caps());
  const bool sg = UseSubgroups(d.caps(), wg);
  const DType dt = spec.inputs[0].dtype;
  const std::string variant = absl::StrCat("norm_", DTypeSuffix(dt), sg ? "_sg" : "");
  KILN_ASSIGN_OR_RETURN(auto pipeline, EmbeddedPipeline(d, variant, 6, sizeof(NormPush),
                                                        {wg, plan.rms, plan.residual, plan.emit_sum,
                                                         plan.scale, plan.bias, plan.group}));
  const char* what = plan.group      ? "group_norm_"
                     : plan.residual ? (plan.rms ? "residual_rms_norm_" : "residual_layer_norm_")
                                     : (plan.rms ? "rms_norm_" : "layer_norm_");
  return std::unique_ptr<backend::Kernel>(std::make_unique<NormKernel>(
      d, spec, std::move(pipeline), plan, push, absl::StrCat("spirv:", what, DTypeSuffix(dt))));
}

const VulkanOpRegistration kNormRegistration({
    {v1::OP_LAYER_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_RMS_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_FUSED_RESIDUAL_NORM, &SupportsNorm, &CreateNorm},
    {v1::OP_GROUP_NORM, &SupportsNorm, &CreateNorm},
});

}  // namespace
}  // namespace kiln::vulkan
