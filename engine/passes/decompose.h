// Common-IR decompositions and structural rewrites used by legalize: each
// replaces one node with primitives (matmul, reduce, unary, binary, where,
// reshape, transpose, constants) that more backends claim.
#pragma once

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"

namespace kiln::passes {

// Whether `op` (with these attributes) has a decomposition.
bool HasDecomposition(const ir::Node& node);
// The path a decomposition of this node takes (COMMON_IR or REWRITTEN).
v1::Path DecompositionPath(const ir::Node& node);

// Replaces `node`'s uses with a decomposition made of new nodes appended to
// the graph (the caller re-sorts and removes the dead original). Returns the
// ids of the new nodes.
absl::StatusOr<std::vector<int32_t>> Decompose(ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::passes
