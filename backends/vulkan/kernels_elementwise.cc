// Elementwise kernels: FusedElementwise and the single ops Unary, Binary,
// Compare, Where, Cast and Clamp, all decoded by backends/common and compiled
// through codegen_elementwise (GLSL generated at prepare time, SPIR-V cached
// through the KernelBinaryCache).
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/vulkan/codegen_elementwise.h"
#include "backends/vulkan/vk_kernel.h"
#include "backends/vulkan/vk_shader_compiler.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

Claim SupportsElementwise(const VulkanDevice& d, const KernelSpec& spec) {
  absl::StatusOr<backend::ElementwiseRegion> region = backend::DecodeSpec(spec);
  if (!region.ok()) return Claim::No(absl::StrCat("vulkan: ", region.status().message()));
  const std::string why = ElementwiseUnsupported(d.caps(), spec, *region);
  if (!why.empty()) return Claim::No(absl::StrCat("vulkan elementwise: ", why));
  return Claim::Yes();
}

class ElementwiseKernel final : public VulkanKernel {
 public:
  ElementwiseKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
                    uint32_t workgroup, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)), pipeline_(std::move(p)), workgroup_(workgroup) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    std::vector<BufferBinding> bindings(in.begin(), in.end());
    bindings.insert(bindings.end(), out.begin(), out.end());
    const uint32_t write_mask = ((1u << out.size()) - 1) << in.size();
    const int64_t total = spec_.outputs[0].num_elements();
    return s.Dispatch(*pipeline_, bindings, write_mask, nullptr, 0,
                      Groups1D(device_.caps(), total, workgroup_));
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  uint32_t workgroup_;
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
    VulkanDevice& d, const KernelSpec& spec, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(backend::ElementwiseRegion region, backend::DecodeSpec(spec));
  const uint32_t wg = Workgroup1D(d.caps());
  const std::string source = GenerateElementwise(d.caps(), spec, region, wg);
  const std::string name = KernelName(spec, d.shaders().CacheKey(source));
  const uint32_t bindings = static_cast<uint32_t>(spec.inputs.size() + spec.outputs.size());
  KILN_ASSIGN_OR_RETURN(auto pipeline,
                        GeneratedPipeline(d, name, source, bindings, 0, {}, context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<ElementwiseKernel>(
      d, spec, std::move(pipeline), wg, absl::StrCat("spirv:", name)));
}

const VulkanOpRegistration kElementwiseRegistration({
    {v1::OP_UNARY, &SupportsElementwise, &CreateElementwise},
    {v1::OP_BINARY, &SupportsElementwise, &CreateElementwise},
    {v1::OP_COMPARE, &SupportsElementwise, &CreateElementwise},
    {v1::OP_WHERE, &SupportsElementwise, &CreateElementwise},
    {v1::OP_CAST, &SupportsElementwise, &CreateElementwise},
    {v1::OP_CLAMP, &SupportsElementwise, &CreateElementwise},
    {v1::OP_FUSED_ELEMENTWISE, &SupportsElementwise, &CreateElementwise},
});

}  // namespace
}  // namespace kiln::vulkan
