// Unary, Binary, Compare, Where, Cast, Clamp and FusedElementwise: one
// kernel class, each spec compiled into an elementwise Program (elementwise.h).
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/elementwise.h"
#include "backends/cpu/kernel_util.h"

namespace kiln::cpu {
namespace {

class ElementwiseKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const backend::KernelSpec& spec) {
    auto program = ew::ProgramFromSpec(spec);
    if (!program.ok()) return SpecError(spec, program.status().message());
    auto dims = BroadcastShapes(spec, spec.inputs);
    if (!dims.ok()) return dims.status();
    std::vector<DType> out_dtypes;
    for (size_t k = 0; k < spec.outputs.size(); ++k) {
      if (auto s = CheckOutput(spec, k, spec.outputs[k].dtype, *dims); !s.ok()) return s;
      out_dtypes.push_back(spec.outputs[k].dtype);
    }
    std::vector<Dims> in_dims;
    for (const auto& t : spec.inputs) in_dims.push_back(t.dims);
    std::string name = ew::ProgramName(*program);
    auto ex = ew::Executor::Create(*std::move(program), in_dims, *dims, std::move(out_dtypes));
    if (!ex.ok()) return SpecError(spec, ex.status().message());
    return std::unique_ptr<backend::Kernel>(
        new ElementwiseKernel(spec, std::move(name), *std::move(ex)));
  }

  std::string implementation() const override { return "cpu:" + name_; }

  absl::Status Run(std::span<const backend::BufferView> inputs,
                   std::span<const backend::BufferView> outputs) override {
    if (auto s = CheckViews(spec_, inputs, outputs); !s.ok()) return s;
    std::vector<const void*> in(inputs.size());
    std::vector<void*> out(outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) in[i] = HostPtr(inputs[i]);
    for (size_t i = 0; i < outputs.size(); ++i) out[i] = HostPtr(outputs[i]);
    executor_->Run(in, out);
    return absl::OkStatus();
  }

 private:
  ElementwiseKernel(const backend::KernelSpec& spec, std::string name,
                    std::unique_ptr<ew::Executor> executor)
      : spec_(spec), name_(std::move(name)), executor_(std::move(executor)) {}

  backend::KernelSpec spec_;
  std::string name_;
  std::unique_ptr<ew::Executor> executor_;
};

backend::Claim Supports(const backend::KernelSpec& spec) {
  auto program = ew::ProgramFromSpec(spec);
  if (!program.ok()) return backend::Claim::No(std::string(program.status().message()));
  return backend::Claim::Yes();
}

const CpuOpRegistration kRegistration({
    {v1::OP_UNARY, Supports, ElementwiseKernel::Create},
    {v1::OP_BINARY, Supports, ElementwiseKernel::Create},
    {v1::OP_COMPARE, Supports, ElementwiseKernel::Create},
    {v1::OP_WHERE, Supports, ElementwiseKernel::Create},
    {v1::OP_CAST, Supports, ElementwiseKernel::Create},
    {v1::OP_CLAMP, Supports, ElementwiseKernel::Create},
    {v1::OP_FUSED_ELEMENTWISE, Supports, ElementwiseKernel::Create},
});

}  // namespace
}  // namespace kiln::cpu
