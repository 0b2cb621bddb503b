// TopK (shaders/topk.comp): the k largest or smallest values along an axis
// and their indices, for f32, i32, and f16/bf16 where the device has 16-bit
// storage; i32 or i64 indices. The order is the CPU's (backends/cpu/
// kernels_select.cc): by value, ties by the lower index, NaN above +inf.
// An invocation per row, O(n k) comparisons per row.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct TopKPush {
  uint32_t outer = 0, n = 0, inner = 0, k = 0;
};

struct TopKPlan {
  TopKPush push;
  bool smallest = false, index64 = true;
};

absl::StatusOr<TopKPlan> PlanTopK(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 2) {
    return absl::InvalidArgumentError("topk takes one input and gives values and indices");
  }
  const backend::TensorDesc& x = spec.inputs[0];
  const auto& a = spec.attrs.topk();
  const int64_t rank = x.rank();
  int64_t axis = a.has_axis() ? a.axis() : -1;
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank) {
    return absl::InvalidArgumentError("topk axis out of range");
  }
  const int64_t n = x.dims[axis], k = a.k();
  if (k < 0 || k > n) return absl::InvalidArgumentError(absl::StrCat("k=", k, " is outside [0, ", n, "]"));
  const DType index = a.index_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : a.index_dtype();
  if (index != v1::DTYPE_I32 && index != v1::DTYPE_I64) {
    return absl::InvalidArgumentError("topk indices are i32 or i64");
  }
  Dims out = x.dims;
  out[axis] = k;
  if (spec.outputs[0].dtype != x.dtype || spec.outputs[0].dims != out ||
      spec.outputs[1].dtype != index || spec.outputs[1].dims != out) {
    return absl::InvalidArgumentError("topk results do not match the input and attributes");
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.dims[d];
  // The shader indexes in 32 bits (i64 indices take two words each).
  constexpr int64_t kMax = int64_t{1} << 31;
  if (x.num_elements() >= kMax || outer * inner * k >= kMax / 2) {
    return absl::InvalidArgumentError("topk: 2^31 or more elements");
  }
  TopKPlan p;
  p.push = {static_cast<uint32_t>(outer), static_cast<uint32_t>(n), static_cast<uint32_t>(inner),
            static_cast<uint32_t>(k)};
  p.smallest = a.smallest();
  p.index64 = index == v1::DTYPE_I64;
  return p;
}

Claim SupportsTopK(const VulkanDevice& d, const KernelSpec& spec) {
  absl::StatusOr<TopKPlan> p = PlanTopK(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("vulkan topk: ", p.status().message()));
  const DType dt = spec.inputs[0].dtype;
  if (dt == v1::DTYPE_F32 || dt == v1::DTYPE_I32) return Claim::Yes();
  if (dt == v1::DTYPE_F16 || dt == v1::DTYPE_BF16) {
    if (d.caps().storage16) return Claim::Yes();
    return Claim::No(absl::StrCat("vulkan topk: ", StorageMissing(d.caps(), dt)));
  }
  return Claim::No(absl::StrCat("vulkan topk takes f32, f16, bf16 and i32, not ", DTypeName(dt)));
}

class TopKKernel final : public VulkanKernel {
 public:
  TopKKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
             TopKPlan plan, uint32_t workgroup, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)),
        pipeline_(std::move(p)),
        plan_(plan),
        workgroup_(workgroup) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    if (plan_.push.k == 0) return absl::OkStatus();
    const BufferBinding b[3] = {in[0], out[0], out[1]};
    const uint64_t rows = uint64_t{plan_.push.outer} * plan_.push.inner;
    return s.Dispatch(*pipeline_, b, 0b110, &plan_.push, sizeof(plan_.push),
                      Groups1D(device_.caps(), rows, workgroup_));
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  TopKPlan plan_;
  uint32_t workgroup_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateTopK(VulkanDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext&) {
  KILN_ASSIGN_OR_RETURN(TopKPlan plan, PlanTopK(spec));
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  // Rows are few and each does O(n k) work: small workgroups spread them.
  const uint32_t wg = std::min<uint32_t>(64, Workgroup1D(d.caps()));
  KILN_ASSIGN_OR_RETURN(auto pipeline,
                        EmbeddedPipeline(d, absl::StrCat("topk_", dt), 3, sizeof(TopKPush),
                                         {wg, plan.smallest, plan.index64}));
  return std::unique_ptr<backend::Kernel>(std::make_unique<TopKKernel>(
      d, spec, std::move(pipeline), plan, wg, absl::StrCat("spirv:topk_", dt)));
}

const VulkanOpRegistration kTopkRegistration({
    {v1::OP_TOPK, &SupportsTopK, &CreateTopK},
});

}  // namespace
}  // namespace kiln::vulkan
