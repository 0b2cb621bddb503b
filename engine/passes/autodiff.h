// Autodiff (DESIGN.md section 3, stage 2): reverse mode (vjp) and forward
// mode (jvp) as graph-to-graph transforms on ir::Graph. Both append nodes made
// of existing ops (no backward kernels yet) to the graph they are given and
// leave the forward nodes in place; the caller wires the results to outputs
// and restores topological order (Graph::SortTopologically).
//
// Composite ops on the differentiated path that have a common-IR form
// (Attention with every mask kind, LayerNorm, RmsNorm, DotGeneral) are first
// replaced by their decomposition (passes/decompose.h), and the primitives are
// differentiated; every other rule is written directly (autodiff_rules.cc).
//
// A node on the path (its result float, depending on a differentiated value,
// and feeding the differentiated result) whose op has no rule fails the
// transform with UNIMPLEMENTED naming the node (id, name, op). Integer and
// bool results (Compare, ArgMax, Cast to an integer, indices) carry no
// gradient and stop the path, as in JAX.
//
// REQUIRES: the graph is verified and specialized (every dim concrete).
// Thread safety: none; the graph belongs to one compile.
#pragma once

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "kiln/v1/train.pb.h"

namespace kiln::passes {

// The vector-Jacobian product: for each value of `wrt`, d<y, dy>/dx, where
// `dy` has y's type. A value y does not depend on gets zeros.
absl::StatusOr<std::vector<ir::ValueRef>> BuildVjp(ir::Graph& graph, ir::ValueRef y,
                                                   ir::ValueRef dy,
                                                   std::span<const ir::ValueRef> wrt);

// The Jacobian-vector product: the tangent of each of `ys` given tangents
// `dxs` (one per value of `xs`, same types). A y that does not depend on any x
// gets zeros.
absl::StatusOr<std::vector<ir::ValueRef>> BuildJvp(ir::Graph& graph,
                                                   std::span<const ir::ValueRef> xs,
                                                   std::span<const ir::ValueRef> dxs,
                                                   std::span<const ir::ValueRef> ys);

// The params or inputs named `names` (unique, float): INVALID_ARGUMENT naming
// the unknown, repeated or non-float ones and listing the candidates.
absl::StatusOr<std::vector<ir::ValueRef>> FindDifferentiable(const ir::Graph& graph,
                                                             std::span<const std::string> names);

// The graph output named `name`; INVALID_ARGUMENT listing the outputs.
absl::StatusOr<ir::ValueRef> FindOutput(const ir::Graph& graph, const std::string& name);

// Applies `spec` (train.proto: grad, grad_with_loss, vjp, jvp, hvp) to the
// graph: adds the inputs and replaces the outputs it describes. Returns false
// when the mode is AUTODIFF_NONE (nothing done).
absl::StatusOr<bool> ApplyAutodiff(ir::Graph& graph, const v1::AutodiffSpec& spec);

// Adds an Input node named `name` of type `type` (used for cotangents,
// tangents and batches).
ir::ValueRef AddInput(ir::Graph& graph, const std::string& name, const ir::TensorType& type);

}  // namespace kiln::passes
