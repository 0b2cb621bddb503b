// The Vulkan backend's kernel plumbing: the per-op registry that kernel
// family files fill at static init (VulkanOpRegistration, like the CPU
// backend's), the VulkanKernel base that validates and resolves a launch's
// views, and helpers shared by the families (dtype claims, embedded pipelines).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_memory.h"
#include "backends/vulkan/vk_pipeline.h"
#include "backends/vulkan/vk_stream.h"

namespace kiln::vulkan {

// One op kind's entry: the honest claim and the kernel factory. `create` is
// only called after `supports` said yes.
struct VulkanOpEntry {
  v1::OpKind op;
  backend::Claim (*supports)(const VulkanDevice& device, const backend::KernelSpec& spec);
  absl::StatusOr<std::unique_ptr<backend::Kernel>> (*create)(VulkanDevice& device,
                                                             const backend::KernelSpec& spec,
                                                             backend::PrepareContext& context);
};

struct VulkanOpRegistration {
  explicit VulkanOpRegistration(std::initializer_list<VulkanOpEntry> entries);
};

// The entry for `op`, or nullptr.
const VulkanOpEntry* FindVulkanOp(v1::OpKind op);

// A kernel of one spec on one device. Launch checks the views against the
// spec, resolves them to bindings and calls Record; then lets the stream
// flush if its batch grew large (never in the middle of a kernel).
class VulkanKernel : public backend::Kernel {
 public:
  VulkanKernel(VulkanDevice& device, const backend::KernelSpec& spec, std::string implementation)
      : device_(device), spec_(spec), implementation_(std::move(implementation)) {}
  std::string implementation() const override { return implementation_; }
  absl::Status Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                      std::span<const backend::BufferView> outputs) final;

 protected:
  // Records the kernel's commands. `in`/`out` follow the spec's order; a
  // zero-sized tensor has a small dummy binding.
  virtual absl::Status Record(VulkanStream& stream, std::span<const BufferBinding> in,
                              std::span<const BufferBinding> out) = 0;

  VulkanDevice& device_;
  const backend::KernelSpec spec_;

 private:
  std::string implementation_;
};

// ---- helpers for the families ----

// Whether the device can hold `dtype` in a storage buffer (bytes moved, no
// arithmetic), and if not what it lacks.
bool StorageOk(const DeviceCaps& caps, DType dtype);
std::string StorageMissing(const DeviceCaps& caps, DType dtype);

// f32, or f16 where the device has 16-bit storage: the float types the
// hand-written float kernels (matmul, norms, reductions, attention) serve.
backend::Claim FloatKernelDType(const VulkanDevice& device, const backend::KernelSpec& spec,
                                DType dtype, const char* what);

// A pipeline of an embedded (build-time) shader variant.
absl::StatusOr<std::shared_ptr<const Pipeline>> EmbeddedPipeline(
    VulkanDevice& device, const std::string& variant, uint32_t bindings, uint32_t push_bytes,
    std::vector<uint32_t> specialization);

// A pipeline of generated GLSL, compiled through the device's ShaderCompiler.
absl::StatusOr<std::shared_ptr<const Pipeline>> GeneratedPipeline(
    VulkanDevice& device, const std::string& name, const std::string& source, uint32_t bindings,
    uint32_t push_bytes, std::vector<uint32_t> specialization, backend::PrepareContext& context);

// The workgroup size a 1-D kernel uses on this device: 256 capped by the
// limits, rounded down to a power of two.
uint32_t Workgroup1D(const DeviceCaps& caps);
// Whether the "_sg" shader variants (subgroup shuffles) serve `workgroup`.
bool UseSubgroups(const DeviceCaps& caps, uint32_t workgroup);
// Groups for `count` items at `per_group` items each, capped to the device's
// x limit (kernels loop over the rest).
uint32_t Groups1D(const DeviceCaps& caps, uint64_t count, uint32_t per_group);

// "f32", "f16", ... for implementation names.
std::string DTypeSuffix(DType dtype);

// Row-major element strides of `dims`.
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims);

}  // namespace kiln::vulkan
