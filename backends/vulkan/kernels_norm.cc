// Normalization: LayerNorm, RmsNorm, FusedResidualNorm and GroupNorm (norm.comp).
// GroupNorm is the LayerNorm of rows of one group's channels times the
// spatial positions ([N, C, spatial...] as [N * groups, C / groups * spatial]),
// its scale and bias read per channel. Fewer rows than kGroupNormSplitRows,
// each longer than one chunk (a workgroup's invocations times 16 elements):
// group_norm.comp's split path, a workgroup per (chunk, row) for the
// statistics (partial mean and M2 per chunk, in a scratch range), then a
// workgroup per (chunk, row) that combines its row's partials and normalizes
// its chunk: the device's compute units all busy, x read twice instead of
// three times. KILN_GROUP_NORM_SPLIT=0 / 1 forces the workgroup-per-row form /
// the split path wherever it applies (benchmarks compare the two).
#include <cstdlib>

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

struct GroupNormSplitPush {
  uint32_t n, spatial, groups, splits;
  float eps;
};

// Vulkan reports no compute-unit count: the split path serves up to this
// many rows (a few per compute unit on a large GPU).
constexpr int64_t kGroupNormSplitRows = 1024;
constexpr int64_t kGroupNormPer = 16;  // PER in group_norm.comp

// The split path's chunks per row, or 0 for norm.comp's workgroup per row.
int64_t GroupNormSplits(const DeviceCaps& caps, int64_t rows, int64_t n, uint32_t wg) {
  const int64_t chunk = int64_t{wg} * kGroupNormPer;
  const int64_t splits = (n + chunk - 1) / chunk;
  if (splits < 2 || rows > caps.max_workgroup_count[1] || splits > caps.max_workgroup_count[0] ||
      rows * n > int64_t{UINT32_MAX} - chunk) {
    return 0;
  }
  const char* force = std::getenv("KILN_GROUP_NORM_SPLIT");
  if (force != nullptr && (force[0] == '0' || force[0] == '1') && force[1] == '\0') {
    return force[0] == '1' ? splits : 0;
  }
  return rows < kGroupNormSplitRows ? splits : 0;
}

class GroupNormSplitKernel final : public VulkanKernel {
 public:
  GroupNormSplitKernel(VulkanDevice& d, const KernelSpec& spec,
                       std::shared_ptr<const Pipeline> stats, std::shared_ptr<const Pipeline> apply,
                       bool scale, bool bias, uint32_t rows, GroupNormSplitPush push,
                       std::string impl)
      : VulkanKernel(d, spec, std::move(impl)),
        stats_(std::move(stats)),
        apply_(std::move(apply)),
        scale_(scale),
        bias_(bias),
        rows_(rows),
        push_(push) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    KILN_ASSIGN_OR_RETURN(BufferBinding part,
                          s.Scratch(uint64_t{rows_} * push_.splits * 2 * sizeof(float)));
    // Bindings: x, scale, bias, y, partials; absent ones get a dummy range.
    const BufferBinding dummy = out[0];
    BufferBinding b[5] = {in[0], dummy, dummy, out[0], part};
    size_t next = 1;
    if (scale_) b[1] = in[next++];
    if (bias_) b[2] = in[next++];
    // The statistics pass leaves y alone: bind the dummy range read-only.
    BufferBinding sb[5] = {in[0], in[0], in[0], in[0], part};
    KILN_RETURN_IF_ERROR(
        s.Dispatch(*stats_, sb, 0b10000, &push_, sizeof(push_), push_.splits, rows_));
    return s.Dispatch(*apply_, b, 0b01000, &push_, sizeof(push_), push_.splits, rows_);
  }

 private:
  std::shared_ptr<const Pipeline> stats_, apply_;
  bool scale_, bias_;
  uint32_t rows_;
  GroupNormSplitPush push_;
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
  if (const int64_t splits = plan.group ? GroupNormSplits(d.caps(), push.rows, push.n, wg) : 0;
      splits > 0) {
    const std::string variant = absl::StrCat("group_norm_", DTypeSuffix(dt), sg ? "_sg" : "");
    KILN_ASSIGN_OR_RETURN(auto stats, EmbeddedPipeline(d, variant, 5, sizeof(GroupNormSplitPush),
                                                       {wg, 0u, plan.scale, plan.bias}));
    KILN_ASSIGN_OR_RETURN(auto apply, EmbeddedPipeline(d, variant, 5, sizeof(GroupNormSplitPush),
                                                       {wg, 1u, plan.scale, plan.bias}));
    const GroupNormSplitPush gp{push.n, push.spatial, push.groups, static_cast<uint32_t>(splits),
                                push.eps};
    return std::unique_ptr<backend::Kernel>(std::make_unique<GroupNormSplitKernel>(
        d, spec, std::move(stats), std::move(apply), plan.scale, plan.bias, push.rows, gp,
        absl::StrCat("spirv:group_norm_split", splits, "_", DTypeSuffix(dt))));
  }
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
