// Custom ops: the CPU kernel a plugin loaded by kilnd provides
// (include/kiln/plugin.h, base/custom_ops.h). The CPU claims exactly the
// custom ops of loaded plugins; the spec's types are the ones the plugin's
// shape function gave at compile time, so the kernel sees concrete dims.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/conv_wgrad.h"
#include "backends/cpu/cpu_backend.h"
#include "base/custom_ops.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;

absl::StatusOr<KilnTensorType> PluginType(const backend::TensorDesc& d, const KernelSpec& spec) {
  if (d.rank() > KILN_PLUGIN_MAX_RANK) {
    return absl::InvalidArgumentError(absl::StrCat(spec.label, ": rank ", d.rank(), " exceeds the plugin limit ",
                                                   KILN_PLUGIN_MAX_RANK));
  }
  KilnTensorType t{};
  t.dtype = static_cast<int32_t>(d.dtype);
  t.rank = static_cast<int32_t>(d.rank());
  for (int64_t i = 0; i < d.rank(); ++i) t.dims[i] = d.dims[i];
  return t;
}

class CustomKernel final : public CpuKernel {
 public:
  CustomKernel(const CustomOp& op, const KernelSpec& spec) : op_(op), spec_(spec) {}

  std::string implementation() const override {
    return absl::StrCat("plugin:", op_.plugin, "/", op_.name);
  }

  absl::Status Run(std::span<const backend::BufferView> inputs,
                   std::span<const backend::BufferView> outputs) override {
    std::vector<KilnTensor> ins(inputs.size()), outs(outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(ins[i].type, PluginType(spec_.inputs[i], spec_));
      ins[i].data = inputs[i].host();
      ins[i].bytes = spec_.inputs[i].num_bytes();
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(outs[i].type, PluginType(spec_.outputs[i], spec_));
      outs[i].data = outputs[i].host();
      outs[i].bytes = spec_.outputs[i].num_bytes();
    }
    absl::Status s = CallCpuKernel(op_, spec_.attrs.custom().payload(), ins, outs);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(spec_.label, ": ", s.message()));
    return absl::OkStatus();
  }

 private:
  const CustomOp& op_;  // registered ops live as long as the process
  const KernelSpec spec_;
};

Claim SupportsCustom(const KernelSpec& spec) {
  const CustomOp* op = CustomOpRegistry::Global().Find(spec.attrs.custom().name());
  if (op == nullptr) {
    return Claim::No(absl::StrCat("no plugin loaded by kilnd provides custom op ",
                                  QuotePluginString(spec.attrs.custom().name())));
  }
  for (const auto& d : spec.inputs) {
    if (d.rank() > KILN_PLUGIN_MAX_RANK) return Claim::No("an operand's rank exceeds the plugin limit");
  }
  return Claim::Yes();
}

KernelOr CreateCustom(const KernelSpec& spec) {
  // A built-in op with a kernel of the backend's own (state across runs:
  // oneDNN primitives), not through the plugin ABI.
  if (spec.attrs.custom().name() == kConvBackwardWeightsOp) return CreateConvBackwardWeights(spec);
  const CustomOp* op = CustomOpRegistry::Global().Find(spec.attrs.custom().name());
  if (op == nullptr) {
    return absl::UnimplementedError(absl::StrCat(spec.label, ": no plugin provides custom op ",
                                                 QuotePluginString(spec.attrs.custom().name())));
  }
  return std::make_unique<CustomKernel>(*op, spec);
}

const CpuOpRegistration kRegistration({{v1::OP_CUSTOM, SupportsCustom, CreateCustom}});

}  // namespace
}  // namespace kiln::cpu
