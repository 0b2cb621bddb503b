// Reductions: Reduce (reduce.comp), Softmax and LogSoftmax (softmax.comp).
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

// The "_<dtype>[_sg]" suffix of a reduction variant.
std::string Variant(const char* shader, DType dt, bool subgroups) {
  return absl::StrCat(shader, "_", DTypeSuffix(dt), subgroups ? "_sg" : "");
}

// ---- Reduce ----

struct ReducePush {
  uint32_t n_out = 0, red_count = 1, kept_rank = 0, red_rank = 0;
  uint32_t kept_dims[4] = {}, kept_strides[4] = {}, red_dims[4] = {}, red_strides[4] = {};
};
static_assert(sizeof(ReducePush) == 80);

// Splits the input into alternating runs of kept and reduced dims.
absl::StatusOr<ReducePush> PlanReduce(const KernelSpec& spec) {
  const Dims& dims = spec.inputs[0].dims;
  const int64_t rank = static_cast<int64_t>(dims.size());
  const auto& a = spec.attrs.reduce();
  std::vector<bool> reduced(rank, a.axes().empty());
  for (int64_t ax : a.axes()) {
    if (ax < -rank || ax >= rank) return absl::InvalidArgumentError("axis out of range");
    reduced[ax < 0 ? ax + rank : ax] = true;
  }
  const std::vector<int64_t> strides = RowMajorStrides(dims);
  struct Run {
    bool red;
    int64_t size, stride;
  };
  std::vector<Run> runs;
  for (int64_t k = 0; k < rank; ++k) {
    if (dims[k] == 1) continue;
    if (!runs.empty() && runs.back().red == reduced[k]) {
      runs.back().size *= dims[k];  // neighbours in a dense tensor are contiguous
      runs.back().stride = strides[k];
      continue;
    }
    runs.push_back({reduced[k], dims[k], strides[k]});
  }
  ReducePush p;
  int64_t n_out = 1, red = 1;
  for (const Run& r : runs) {
    uint32_t& count = r.red ? p.red_rank : p.kept_rank;
    if (count == 4) return absl::InvalidArgumentError("more than 4 runs of kept or reduced dims");
    (r.red ? p.red_dims : p.kept_dims)[count] = static_cast<uint32_t>(r.size);
    (r.red ? p.red_strides : p.kept_strides)[count] = static_cast<uint32_t>(r.stride);
    ++count;
    (r.red ? red : n_out) *= r.size;
  }
  for (int64_t k = 0; k < rank; ++k) {
    if (dims[k] == 0) (reduced[k] ? red : n_out) = 0;
  }
  p.n_out = static_cast<uint32_t>(n_out);
  p.red_count = static_cast<uint32_t>(red);
  return p;
}

Claim SupportsReduce(const VulkanDevice& d, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1) return Claim::No("malformed spec");
  const DType dt = spec.inputs[0].dtype;
  const auto kind = spec.attrs.reduce().kind();
  if (kind < v1::REDUCE_SUM || kind > v1::REDUCE_PROD) return Claim::No("unknown reduce kind");
  switch (dt) {
    case v1::DTYPE_F32:
    case v1::DTYPE_I32:
      break;
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
    case v1::DTYPE_I16:
    case v1::DTYPE_I8:
    case v1::DTYPE_U8:
      if (!StorageOk(d.caps(), dt))
        return Claim::No(absl::StrCat("vulkan reduce: ", StorageMissing(d.caps(), dt)));
      break;
    case v1::DTYPE_I64:
      if (!d.caps().int64) return Claim::No("vulkan reduce: i64 needs shaderInt64");
      break;
    default:
      return Claim::No(absl::StrCat("vulkan reduce does not run ", DTypeName(dt)));
  }
  if (!PlanReduce(spec).ok()) return Claim::No("vulkan reduce: too many alternating axis runs");
  return Claim::Yes();
}

class ReduceKernel final : public VulkanKernel {
 public:
  ReduceKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
               ReducePush push, bool per_thread, uint32_t wg, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)),
        pipeline_(std::move(p)),
        push_(push),
        per_thread_(per_thread),
        wg_(wg) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const BufferBinding b[2] = {in[0], out[0]};
    const uint32_t groups = per_thread_ ? Groups1D(device_.caps(), push_.n_out, wg_)
                                        : Groups1D(device_.caps(), push_.n_out, 1);
    return s.Dispatch(*pipeline_, b, 0b10, &push_, sizeof(push_), groups);
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  ReducePush push_;
  bool per_thread_;
  uint32_t wg_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateReduce(VulkanDevice& d,
                                                              const KernelSpec& spec,
                                                              backend::PrepareContext&) {
  KILN_ASSIGN_OR_RETURN(ReducePush push, PlanReduce(spec));
  const uint32_t wg = Workgroup1D(d.caps());
  // An invocation per output when there are many outputs and the innermost
  // input dim is kept (adjacent invocations then read adjacent elements).
  const bool inner_kept = push.kept_rank > 0 && push.kept_strides[push.kept_rank - 1] == 1;
  const bool per_thread = inner_kept && push.n_out >= 4 * wg;
  const DType dt = spec.inputs[0].dtype;
  const bool sg = !per_thread && dt != v1::DTYPE_I64 && UseSubgroups(d.caps(), wg);
  const auto kind = spec.attrs.reduce().kind();
  KILN_ASSIGN_OR_RETURN(auto pipeline,
                        EmbeddedPipeline(d, Variant("reduce", dt, sg), 2, sizeof(ReducePush),
                                         {wg, static_cast<uint32_t>(kind), per_thread ? 1u : 0u}));
  const std::string kname = absl::AsciiStrToLower(v1::ReduceKind_Name(kind).substr(7));
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<ReduceKernel>(d, spec, std::move(pipeline), push, per_thread, wg,
                                     absl::StrCat("spirv:reduce_", kname, "_", DTypeSuffix(dt))));
}

// ---- Softmax / LogSoftmax ----

struct SoftmaxPush {
  uint32_t outer, n, inner;
};

Claim SupportsSoftmax(const VulkanDevice& d, const KernelSpec& spec) {
  if (spec.inputs.size() != 1 || spec.outputs.size() != 1 || spec.inputs[0].dims.empty()) {
    return Claim::No("malformed spec");
  }
  const DType dt = spec.inputs[0].dtype;
  if (dt == v1::DTYPE_BF16 && d.caps().storage16) return Claim::Yes();
  return FloatKernelDType(d, spec, dt, "softmax");
}

class SoftmaxKernel final : public VulkanKernel {
 public:
  SoftmaxKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
                SoftmaxPush push, uint32_t wg, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)), pipeline_(std::move(p)), push_(push), wg_(wg) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const BufferBinding b[2] = {in[0], out[0]};
    const uint32_t groups =
        push_.inner == 1 ? Groups1D(device_.caps(), push_.outer, 1)
                         : Groups1D(device_.caps(), uint64_t{push_.outer} * push_.inner, wg_);
    return s.Dispatch(*pipeline_, b, 0b10, &push_, sizeof(push_), groups);
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  SoftmaxPush push_;
  uint32_t wg_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateSoftmax(VulkanDevice& d,
                                                               const KernelSpec& spec,
                                                               backend::PrepareContext&) {
  const bool log = spec.op == v1::OP_LOG_SOFTMAX;
  const auto& a = log ? spec.attrs.log_softmax() : spec.attrs.softmax();
  const Dims& dims = spec.inputs[0].dims;
  int64_t axis = a.has_axis() ? a.axis() : -1;
  if (axis < 0) axis += static_cast<int64_t>(dims.size());
  SoftmaxPush push{1, static_cast<uint32_t>(dims[axis]), 1};
  for (int64_t k = 0; k < axis; ++k) push.outer *= static_cast<uint32_t>(dims[k]);
  for (size_t k = axis + 1; k < dims.size(); ++k) push.inner *= static_cast<uint32_t>(dims[k]);
  const uint32_t wg = Workgroup1D(d.caps());
  const bool rows = push.inner == 1;
  const bool sg = rows && UseSubgroups(d.caps(), wg);
  const DType dt = spec.inputs[0].dtype;
  KILN_ASSIGN_OR_RETURN(auto pipeline,
                        EmbeddedPipeline(d, Variant("softmax", dt, sg), 2, sizeof(SoftmaxPush),
                                         {wg, log ? 1u : 0u, rows ? 1u : 0u}));
  return std::unique_ptr<backend::Kernel>(std::make_unique<SoftmaxKernel>(
      d, spec, std::move(pipeline), push, wg,
      absl::StrCat("spirv:", log ? "log_softmax_" : "softmax_", DTypeSuffix(dt))));
}

const VulkanOpRegistration kReduceRegistration({
    {v1::OP_REDUCE, &SupportsReduce, &CreateReduce},
    {v1::OP_SOFTMAX, &SupportsSoftmax, &CreateSoftmax},
    {v1::OP_LOG_SOFTMAX, &SupportsSoftmax, &CreateSoftmax},
});

}  // namespace
}  // namespace kiln::vulkan
