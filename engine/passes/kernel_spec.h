// The KernelSpec a node asks a backend for: op, attributes, concrete operand
// and result types, and the node's label for messages.
#pragma once

#include "backends/backend.h"
#include "engine/ir/graph.h"

namespace kiln::passes {

// REQUIRES: the graph is specialized (every type concrete).
backend::KernelSpec SpecOf(const ir::Graph& graph, const ir::Node& node);
backend::TensorDesc DescOf(const ir::TensorType& type);

// The device with `id` among `devices`, or nullptr.
backend::Device* FindDevice(const std::vector<backend::Device*>& devices, const std::string& id);

}  // namespace kiln::passes
