#include "engine/passes/kernel_spec.h"

#include "absl/strings/str_cat.h"

namespace kiln::passes {

backend::TensorDesc DescOf(const ir::TensorType& type) {
  return backend::TensorDesc{type.dtype, type.dims_vector()};
}

backend::KernelSpec SpecOf(const ir::Graph& graph, const ir::Node& node) {
  backend::KernelSpec spec;
  spec.name = absl::StrCat(ir::OpName(node.op), "_", node.id);
  spec.label = ir::NodeLabel(node);
  spec.op = node.op;
  spec.attrs = node.attrs;
  for (const ir::ValueRef& v : node.operands) spec.inputs.push_back(DescOf(graph.TypeOf(v)));
  for (const ir::TensorType& t : node.outputs) spec.outputs.push_back(DescOf(t));
  return spec;
}

backend::Device* FindDevice(const std::vector<backend::Device*>& devices, const std::string& id) {
  for (backend::Device* d : devices) {
    if (d->info().id == id) return d;
  }
  return nullptr;
}

}  // namespace kiln::passes
