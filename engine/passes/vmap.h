// vmap (DESIGN.md section 3, transforms): the graph mapped over a new batch
// axis, as a compile-time rewrite (kiln.v1.VmapSpec).
//
// Each batched input (VmapSpec.inputs; empty = every input) gains a dim of
// VmapSpec.size at VmapSpec.axis; every output has it at the same axis of its
// own type (an output that depends on no batched input is broadcast to it);
// params are never batched. Slice i of every output equals the un-vmapped
// graph run on slice i of every batched input.
//
// Inside, a batched value carries the batch at dim 0; each node with a batched
// operand is re-emitted to act on it: elementwise ops (unary, binary,
// compare, where, cast, clamp) with the per-example operands aligned as NumPy
// broadcasting would (ones inserted after the batch dim), matmul through its
// batch dims (rank-1 operands promoted, as numpy.matmul does, and the result
// reshaped back), reduce, softmax and log_softmax with their axes shifted,
// expand and reshape with the batch prepended, transpose with its perm shifted. Any other
// op with a batched operand fails with UNIMPLEMENTED naming the node; nodes
// that do not depend on a batched input are left as they are.
//
// REQUIRES: the graph is verified and specialized (static per-example dims).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "kiln/v1/train.pb.h"

namespace kiln::passes {

// Applies `spec` to `graph`. INVALID_ARGUMENT for a size < 1 or over 2^31, an
// axis out of range for an input or output (named), an unknown or repeated
// input name; UNIMPLEMENTED naming a node with no batching rule. Returns
// true (the graph changed).
absl::StatusOr<bool> ApplyVmap(ir::Graph& graph, const v1::VmapSpec& spec);

// A compile given the batched shapes of a run's inputs (Engine::Compile):
// removes the batch axis from the shapes of the batched inputs, so the graph
// specializes per example, and takes `spec.size` from them when it is 0.
// INVALID_ARGUMENT naming an input whose rank has no room for the axis or
// whose batch differs from the size (or the other inputs').
absl::Status UnbatchShapes(v1::VmapSpec& spec, std::vector<std::pair<std::string, Dims>>& shapes);

}  // namespace kiln::passes
