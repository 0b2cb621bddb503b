// TopK on CUDA (kernels/topk.cu): the k largest or smallest values along an
// axis and their i32 or i64 indices, for f32, f16, bf16 and the integer
// types, in the CPU's order (ties by the lower index, NaN above +inf). A
// thread per (outer, inner) row, O(n k) comparisons per row.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct TopKPlan {
  int64_t outer = 1, n = 1, inner = 1, k = 0;
  bool smallest = false;
  DType index = v1::DTYPE_I64;
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
  if (rank == 0 || axis < 0 || axis >= rank) return absl::InvalidArgumentError("axis out of range");
  TopKPlan p;
  p.n = x.dims[axis];
  p.k = a.k();
  if (p.k < 0 || p.k > p.n) {
    return absl::InvalidArgumentError(absl::StrCat("k=", p.k, " is outside [0, ", p.n, "]"));
  }
  p.index = a.index_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : a.index_dtype();
  if (p.index != v1::DTYPE_I32 && p.index != v1::DTYPE_I64) {
    return absl::InvalidArgumentError("indices are i32 or i64");
  }
  Dims out = x.dims;
  out[axis] = p.k;
  if (spec.outputs[0].dtype != x.dtype || spec.outputs[0].dims != out ||
      spec.outputs[1].dtype != p.index || spec.outputs[1].dims != out) {
    return absl::InvalidArgumentError("the results do not match the input and attributes");
  }
  for (int64_t d = 0; d < axis; ++d) p.outer *= x.dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) p.inner *= x.dims[d];
  p.smallest = a.smallest();
  return p;
}

Claim SupportsTopK(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<TopKPlan> p = PlanTopK(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda topk: ", p.status().message()));
  const DType dt = spec.inputs[0].dtype;
  if (IsFloat(dt) || dt == v1::DTYPE_I8 || dt == v1::DTYPE_U8 || dt == v1::DTYPE_I16 ||
      dt == v1::DTYPE_I32 || dt == v1::DTYPE_I64) {
    return Claim::Yes();
  }
  return Claim::No(absl::StrCat("cuda topk runs f32, f16, bf16 and the integer types, not ",
                                DTypeName(dt)));
}

class TopKKernel final : public CudaKernel {
 public:
  TopKKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, TopKPlan plan,
             std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), plan_(plan) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], v = out[0], idx = out[1];
    int64_t outer = plan_.outer, n = plan_.n, inner = plan_.inner, k = plan_.k;
    int smallest = plan_.smallest;
    void* args[] = {&x, &v, &idx, &outer, &n, &inner, &k, &smallest};
    // Rows are few and each is long work: small blocks spread them over the SMs.
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), outer * inner, 64), 1, 1, 64, 0, args);
  }

 private:
  LoadedFunction fn_;
  TopKPlan plan_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateTopK(CudaDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(TopKPlan plan, PlanTopK(spec));
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  KILN_ASSIGN_OR_RETURN(
      LoadedFunction fn,
      LoadFunction(d, "topk", KernelSource("topk.cu"),
                   absl::StrCat("kiln_topk_", dt, "_", DTypeName(plan.index)), context));
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<TopKKernel>(d, spec, std::move(fn), plan, absl::StrCat("nvrtc:topk_", dt)));
}

const CudaOpRegistration kTopkRegistration({
    {v1::OP_TOPK, &SupportsTopK, &CreateTopK},
});

}  // namespace
}  // namespace kiln::cuda
