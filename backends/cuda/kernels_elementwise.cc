// Elementwise kernels: FusedElementwise and the single ops Unary, Binary,
// Compare, Where, Cast and Clamp, all decoded by backends/common and
// generated as CUDA C++ by codegen_elementwise (compiled by NVRTC at prepare
// time, cubins cached through the KernelBinaryCache).
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/cuda/codegen_elementwise.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

constexpr unsigned kBlock = 256;

Claim SupportsElementwise(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<backend::ElementwiseRegion> region = backend::DecodeSpec(spec);
  if (!region.ok()) return Claim::No(absl::StrCat("cuda: ", region.status().message()));
  const std::string why = ElementwiseUnsupported(spec, *region);
  if (!why.empty()) return Claim::No(absl::StrCat("cuda elementwise: ", why));
  return Claim::Yes();
}

class ElementwiseKernel final : public CudaKernel {
 public:
  ElementwiseKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    std::vector<CUdeviceptr> ptrs(in.begin(), in.end());
    ptrs.insert(ptrs.end(), out.begin(), out.end());
    std::vector<void*> args;
    args.reserve(ptrs.size());
    for (CUdeviceptr& p : ptrs) args.push_back(&p);
    const int64_t total = spec_.outputs[0].num_elements();
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), total, kBlock), 1, 1, kBlock, 0,
                        args.data());
  }

 private:
  LoadedFunction fn_;
};

// "unary_gelu_f32", "binary_add_f16", "cast_f32_to_i8", "fused_ew_<hash>".
std::string KernelName(const KernelSpec& spec, const std::string& cache_key) {
  const std::string dt = DTypeSuffix(spec.outputs[0].dtype);
  auto lower = [](const std::string& s) { return absl::AsciiStrToLower(s); };
  switch (spec.op) {
    case v1::OP_UNARY:
      return absl::StrCat("unary_", lower(v1::UnaryKind_Name(spec.attrs.unary().kind()).substr(6)),
                          "_", dt);
    case v1::OP_BINARY:
      return absl::StrCat(
          "binary_", lower(v1::BinaryKind_Name(spec.attrs.binary().kind()).substr(7)), "_", dt);
    case v1::OP_COMPARE:
      return absl::StrCat("compare_",
                          lower(v1::CompareKind_Name(spec.attrs.compare().kind()).substr(8)), "_",
                          DTypeSuffix(spec.inputs[0].dtype));
    case v1::OP_WHERE:
      return absl::StrCat("where_", dt);
    case v1::OP_CAST:
      return absl::StrCat("cast_", DTypeSuffix(spec.inputs[0].dtype), "_to_", dt);
    case v1::OP_CLAMP:
      return absl::StrCat("clamp_", dt);
    default:
      return absl::StrCat("fused_ew_", cache_key.substr(cache_key.size() - 12));
  }
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateElementwise(
    CudaDevice& d, const KernelSpec& spec, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(backend::ElementwiseRegion region, backend::DecodeSpec(spec));
  const std::string source = GenerateElementwise(spec, region);
  KILN_RETURN_IF_ERROR(LoadNvrtc());
  const std::string name = KernelName(spec, CubinCacheKey(source, d.caps().arch));
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, name, source, kElementwiseEntry, context));
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<ElementwiseKernel>(d, spec, std::move(fn), absl::StrCat("nvrtc:", name)));
}

const CudaOpRegistration kElementwiseRegistration({
    {v1::OP_UNARY, &SupportsElementwise, &CreateElementwise},
    {v1::OP_BINARY, &SupportsElementwise, &CreateElementwise},
    {v1::OP_COMPARE, &SupportsElementwise, &CreateElementwise},
    {v1::OP_WHERE, &SupportsElementwise, &CreateElementwise},
    {v1::OP_CAST, &SupportsElementwise, &CreateElementwise},
    {v1::OP_CLAMP, &SupportsElementwise, &CreateElementwise},
    {v1::OP_FUSED_ELEMENTWISE, &SupportsElementwise, &CreateElementwise},
});

}  // namespace
}  // namespace kiln::cuda
