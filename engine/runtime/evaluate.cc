#include "engine/runtime/evaluate.h"

#include "base/status.h"

namespace kiln::runtime {

absl::StatusOr<std::vector<HostTensor>> EvaluateKernel(backend::Device& device,
                                                       const backend::KernelSpec& spec,
                                                       std::span<const HostTensor* const> inputs) {
  backend::PrepareContext ctx;
  KILN_ASSIGN_OR_RETURN(auto kernel, device.PrepareKernel(spec, ctx));
  KILN_ASSIGN_OR_RETURN(auto stream, device.CreateStream());
  std::vector<std::unique_ptr<backend::Buffer>> buffers;
  std::vector<backend::BufferView> ins, outs;
  for (const HostTensor* t : inputs) {
    KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(t->num_bytes()));
    backend::BufferView v{buf.get(), 0, t->num_bytes()};
    if (t->num_bytes() > 0) KILN_RETURN_IF_ERROR(device.CopyToDevice(*stream, t->data(), v));
    ins.push_back(v);
    buffers.push_back(std::move(buf));
  }
  for (const backend::TensorDesc& d : spec.outputs) {
    KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(d.num_bytes()));
    outs.push_back(backend::BufferView{buf.get(), 0, d.num_bytes()});
    buffers.push_back(std::move(buf));
  }
  KILN_RETURN_IF_ERROR(kernel->Launch(*stream, ins, outs));
  std::vector<HostTensor> results;
  for (size_t i = 0; i < outs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(spec.outputs[i].dtype, spec.outputs[i].dims));
    if (t.num_bytes() > 0) KILN_RETURN_IF_ERROR(device.CopyToHost(*stream, outs[i], t.data()));
    results.push_back(std::move(t));
  }
  KILN_RETURN_IF_ERROR(stream->Synchronize());
  return results;
}

}  // namespace kiln::runtime
