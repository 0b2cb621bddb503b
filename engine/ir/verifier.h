// Wire graph -> IR import, verification, specialization, and IR -> wire export.
//
// Every rejection is INVALID_ARGUMENT (RESOURCE_EXHAUSTED for configured limits)
// and names the node by id, name and op, and the reason. A graph that fails
// never reaches a pass.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/infer.h"

namespace kiln::ir {

// The newest graph.proto revision this compiler understands.
inline constexpr int32_t kIrVersion = 1;
// The largest node id a client may send: the ids above it (to INT32_MAX) are
// left for the nodes the compiler adds (Graph::AddNode numbers them after the
// largest id).
inline constexpr int32_t kMaxClientNodeId = (int32_t{1} << 30) - 1;

struct VerifyOptions {
  InferLimits limits;
  int64_t max_nodes = 1 << 20;
  // Internal ops (fused kernels, copies) are made by passes; client graphs
  // may not contain them.
  bool allow_internal_ops = false;
};

// Converts `proto` (any node order) into an IR graph and verifies it: structure,
// cycles, operands, attributes, dtypes and shapes.
absl::StatusOr<std::unique_ptr<Graph>> ImportGraph(const v1::Graph& proto,
                                                   const VerifyOptions& options = {},
                                                   int depth = 0);

// Sorts, checks operands, and (re)infers every node's types in place.
absl::Status VerifyGraph(Graph& graph, const VerifyOptions& options = {}, int depth = 0);

// Binds the inputs' symbolic dims to concrete sizes and re-infers every node.
// Every input must appear in `shapes`, with its declared rank; concrete dims
// must match and each named symbol must get one size. A shape list that fails
// those checks leaves the graph unchanged; one that fails re-inference leaves
// it partly specialized (specialize a Clone() to keep the original).
absl::Status Specialize(Graph& graph, const std::vector<std::pair<std::string, Dims>>& shapes,
                        const VerifyOptions& options = {});

struct ExportOptions {
  bool strip_names = false;   // drop debug names of non-source nodes (cache keys)
  bool with_constants = true; // false: constant payloads are left out (digests elsewhere)
};
void ExportGraph(const Graph& graph, v1::Graph* proto, const ExportOptions& options = {});

// Verifies a subgraph body whose inputs, in node order, take `args`' types,
// and returns the types of its outputs.
absl::StatusOr<std::vector<TensorType>> InferSubgraph(const v1::Graph& body,
                                                      const std::vector<TensorType>& args,
                                                      const InferLimits& limits, int depth);

bool IsInternalOp(OpKind op);

}  // namespace kiln::ir
