// Shape and dtype inference: one rule per op, over concrete or symbolic dims.
//
// InferNode computes `node.outputs` from its operands' types and attributes,
// and fails with INVALID_ARGUMENT naming the node (id, name, op) and the reason
// when the operands or attributes do not fit. With symbolic dims a check that
// needs a concrete size is deferred (the dim stays symbolic); specialization
// re-runs inference with concrete dims, where every check applies.
#pragma once

#include "absl/status/status.h"
#include "engine/ir/graph.h"

namespace kiln::ir {

struct InferLimits {
  int64_t max_rank = 8;
  int64_t max_tensor_elements = int64_t{1} << 34;
  int64_t max_tensor_bytes = int64_t{1} << 36;
  int max_subgraph_depth = 8;
};

// REQUIRES: every operand of `node` exists in `graph` with inferred outputs.
absl::Status InferNode(const Graph& graph, Node& node, const InferLimits& limits = {},
                       int depth = 0);

// Broadcast of two dims lists in NumPy rules; symbolic dims are kept where
// they could match. Returns false when two concrete sizes conflict.
bool BroadcastDims(const IrDims& a, const IrDims& b, IrDims* out);

// Normalizes a possibly negative axis against `rank`; false when out of range.
bool NormalizeAxis(int64_t axis, int64_t rank, int64_t* out);

}  // namespace kiln::ir
