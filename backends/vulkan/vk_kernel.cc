#include "backends/vulkan/vk_kernel.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "backends/vulkan/embedded_shaders.h"
#include "backends/vulkan/vk_shader_compiler.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

absl::flat_hash_map<int, VulkanOpEntry>& OpTable() {
  static auto* table = new absl::flat_hash_map<int, VulkanOpEntry>();
  return *table;
}

}  // namespace

VulkanOpRegistration::VulkanOpRegistration(std::initializer_list<VulkanOpEntry> entries) {
  for (const VulkanOpEntry& e : entries) OpTable()[e.op] = e;
}

const VulkanOpEntry* FindVulkanOp(v1::OpKind op) {
  auto it = OpTable().find(op);
  return it == OpTable().end() ? nullptr : &it->second;
}

absl::Status VulkanKernel::Launch(backend::Stream& stream,
                                  std::span<const backend::BufferView> inputs,
                                  std::span<const backend::BufferView> outputs) {
  KILN_ASSIGN_OR_RETURN(VulkanStream * vs, AsVulkanStream(stream, device_));
  if (inputs.size() != spec_.inputs.size() || outputs.size() != spec_.outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec_.label, ": ", implementation_, " takes ", spec_.inputs.size(), " inputs and ",
        spec_.outputs.size(), " outputs, got ", inputs.size(), " and ", outputs.size()));
  }
  std::vector<BufferBinding> in(inputs.size()), out(outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(in[i], device_.Resolve(inputs[i], spec_.inputs[i].num_bytes(),
                                                 absl::StrCat(spec_.label, ": input ", i)));
  }
  bool empty = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(out[i], device_.Resolve(outputs[i], spec_.outputs[i].num_bytes(),
                                                  absl::StrCat(spec_.label, ": output ", i)));
    empty = empty && spec_.outputs[i].num_elements() == 0;
  }
  if (!empty || outputs.empty()) {
    KILN_RETURN_IF_ERROR(Record(*vs, in, out)) << spec_.label;
  }
  return vs->MaybeFlush();
}

bool StorageOk(const DeviceCaps& caps, DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
    case v1::DTYPE_I32:
    case v1::DTYPE_F64:
    case v1::DTYPE_I64:
      return true;
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
    case v1::DTYPE_I16:
      return caps.storage16;
    case v1::DTYPE_I8:
    case v1::DTYPE_U8:
    case v1::DTYPE_BOOL:
      return caps.storage8;
    default:
      return false;
  }
}

std::string StorageMissing(const DeviceCaps& caps, DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
    case v1::DTYPE_I16:
      return absl::StrCat(DTypeName(dtype), " tensors need storageBuffer16BitAccess");
    case v1::DTYPE_I8:
    case v1::DTYPE_U8:
    case v1::DTYPE_BOOL:
      return absl::StrCat(DTypeName(dtype), " tensors need storageBuffer8BitAccess");
    default:
      return absl::StrCat(DTypeName(dtype), " is not a dense type the vulkan backend stores");
  }
}

backend::Claim FloatKernelDType(const VulkanDevice& device, const backend::KernelSpec& spec,
                                DType dtype, const char* what) {
  if (dtype == v1::DTYPE_F32) return backend::Claim::Yes();
  if (dtype == v1::DTYPE_F16) {
    if (device.caps().storage16) return backend::Claim::Yes();
    return backend::Claim::No(
        absl::StrCat("vulkan ", what, ": f16 needs storageBuffer16BitAccess"));
  }
  return backend::Claim::No(
      absl::StrCat("vulkan ", what, " runs f32 and f16 only, not ", DTypeName(dtype)));
}

absl::StatusOr<std::shared_ptr<const Pipeline>> EmbeddedPipeline(
    VulkanDevice& device, const std::string& variant, uint32_t bindings, uint32_t push_bytes,
    std::vector<uint32_t> specialization) {
  const EmbeddedShader* shader = FindEmbeddedShader(variant);
  if (shader == nullptr) {
    return absl::InternalError(absl::StrCat("vulkan: no embedded shader ", variant));
  }
  PipelineDesc desc;
  desc.name = variant;
  desc.module_key = absl::StrCat("embedded:", variant);
  desc.spirv = std::span<const uint32_t>(shader->words, shader->word_count);
  desc.bindings = bindings;
  desc.push_bytes = push_bytes;
  desc.specialization = std::move(specialization);
  return device.pipelines().Get(desc);
}

absl::StatusOr<std::shared_ptr<const Pipeline>> GeneratedPipeline(
    VulkanDevice& device, const std::string& name, const std::string& source, uint32_t bindings,
    uint32_t push_bytes, std::vector<uint32_t> specialization, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const Spirv> spirv,
                        device.shaders().Get(name, source, context));
  PipelineDesc desc;
  desc.name = name;
  desc.module_key = absl::StrCat("gen:", device.shaders().CacheKey(source));
  desc.spirv = *spirv;
  desc.bindings = bindings;
  desc.push_bytes = push_bytes;
  desc.specialization = std::move(specialization);
  return device.pipelines().Get(desc);
}

uint32_t Workgroup1D(const DeviceCaps& caps) {
  const uint32_t limit =
      std::min<uint32_t>({256, caps.max_workgroup_invocations, caps.max_workgroup_size[0]});
  return uint32_t{1} << (31 - __builtin_clz(std::max<uint32_t>(limit, 1)));  // a power of two
}

bool UseSubgroups(const DeviceCaps& caps, uint32_t workgroup) {
  return caps.subgroup_basic && caps.subgroup_shuffle && caps.subgroup_size > 1 &&
         workgroup % caps.subgroup_size == 0;
}

uint32_t Groups1D(const DeviceCaps& caps, uint64_t count, uint32_t per_group) {
  const uint64_t groups = (count + per_group - 1) / per_group;
  return static_cast<uint32_t>(std::clamp<uint64_t>(groups, 1, caps.max_workgroup_count[0]));
}

std::string DTypeSuffix(DType dtype) { return DTypeName(dtype); }

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i)
    s[i] = s[i + 1] * dims[i + 1];
  return s;
}

}  // namespace kiln::vulkan
