// Reduce (Sum, Mean, Max, Min, Prod) over axes that form one contiguous
// block once size-1 dims are dropped (kernels/reduce.cu), for f32, f16 and
// bf16. Other axis patterns are not claimed (they run where claimed, or on
// the CPU).
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct ReducePlan {
  int64_t outer = 1, r = 1, inner = 1;
  int kind = 0;  // reduce.cu's: 0 sum, 1 mean, 2 max, 3 min, 4 prod
};

absl::StatusOr<ReducePlan> PlanReduce(const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("malformed spec");
  }
  const auto& a = spec.attrs.reduce();
  ReducePlan p;
  switch (a.kind()) {
    case v1::REDUCE_SUM:
      p.kind = 0;
      break;
    case v1::REDUCE_MEAN:
      p.kind = 1;
      break;
    case v1::REDUCE_MAX:
      p.kind = 2;
      break;
    case v1::REDUCE_MIN:
      p.kind = 3;
      break;
    case v1::REDUCE_PROD:
      p.kind = 4;
      break;
    default:
      return absl::InvalidArgumentError("unknown reduce kind");
  }
  const Dims& dims = spec.inputs[0].dims;
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<bool> reduced(rank, a.axes().empty());
  for (int64_t ax : a.axes()) {
    if (ax < 0) ax += rank;
    if (ax < 0 || ax >= rank) return absl::InvalidArgumentError("axis out of range");
    reduced[ax] = true;
  }
  // 0 = before the reduced block, 1 = in it, 2 = after it.
  int phase = 0;
  for (int64_t k = 0; k < rank; ++k) {
    if (dims[k] == 1) continue;
    if (reduced[k]) {
      if (phase == 2) return absl::InvalidArgumentError("the reduced axes are not contiguous");
      phase = 1;
      p.r *= dims[k];
    } else {
      if (phase == 1) phase = 2;
      (phase == 0 ? p.outer : p.inner) *= dims[k];
    }
  }
  if (dims.empty() || std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d == 0; })) {
    return absl::InvalidArgumentError("an empty tensor");
  }
  return p;
}

Claim SupportsReduce(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<ReducePlan> p = PlanReduce(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda reduce: ", p.status().message()));
  if (spec.outputs[0].dtype != spec.inputs[0].dtype) {
    return Claim::No("cuda reduce: the result dtype differs from the input's");
  }
  if (spec.outputs[0].num_elements() != p->outer * p->inner) {
    return Claim::No("cuda reduce: the result shape does not match the axes");
  }
  return FloatDType(spec.inputs[0].dtype, "reduce");
}

class ReduceKernel final : public CudaKernel {
 public:
  ReduceKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, ReducePlan plan,
               std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), plan_(plan) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0];
    int64_t outer = plan_.outer, r = plan_.r, inner = plan_.inner;
    int kind = plan_.kind;
    if (inner == 1) {
      void* args[] = {&x, &y, &outer, &r, &kind};
      const unsigned block =
          static_cast<unsigned>(std::clamp<int64_t>((r + 31) / 32 * 32, 32, 256));
      const unsigned block_pow2 = 1u << (31 - __builtin_clz(block));  // the tree needs 2^k
      const unsigned grid =
          static_cast<unsigned>(std::min<int64_t>(outer, device_.caps().max_grid_x));
      return LaunchKernel(s, fn_.fn, grid, 1, 1, std::max(32u, block_pow2), 0, args);
    }
    void* args[] = {&x, &y, &outer, &r, &inner, &kind};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), outer * inner, 256), 1, 1, 256, 0, args);
  }

 private:
  LoadedFunction fn_;
  ReducePlan plan_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateReduce(CudaDevice& d, const KernelSpec& spec,
                                                              backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce(spec));
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  const std::string fn_name = absl::StrCat("kiln_reduce_", plan.inner == 1 ? "rows_" : "cols_", dt);
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "reduce", KernelSource("reduce.cu"), fn_name, context));
  const std::string kind =
      absl::AsciiStrToLower(v1::ReduceKind_Name(spec.attrs.reduce().kind()).substr(7));
  return std::unique_ptr<backend::Kernel>(std::make_unique<ReduceKernel>(
      d, spec, std::move(fn), plan, absl::StrCat("nvrtc:reduce_", kind, "_", dt)));
}

const CudaOpRegistration kRegistration({
    {v1::OP_REDUCE, &SupportsReduce, &CreateReduce},
});

}  // namespace
}  // namespace kiln::cuda
