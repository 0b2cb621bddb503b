// ONNX -> Kiln IR (DESIGN.md section 1, engine/io): one ModelProto in, one
// verified kiln.v1.Graph out.
//
// Reads opsets 9 through 21 of the default domain ("" / "ai.onnx"); imports of
// other domains that no node uses are ignored. Each ONNX node becomes one or a
// few Kiln ops; attributes that moved to inputs across opsets (Squeeze,
// Unsqueeze, Reduce*, Clip, Resize, Split, Pad, Slice) are read from whichever
// form the model's opset uses, and an input that must be known at import (axes,
// pads, a reshape target) must be a constant or computable from constants and
// input shapes: shape subgraphs (Shape -> Gather -> Concat -> Reshape) are
// folded here, once the input shapes are known (OnnxImportOptions::input_shapes
// pins them; otherwise the model's dims are used, dim_params as named symbols).
//
// Initializers and Constant nodes become Kiln constants, except those the caller
// names as params (OnnxImportOptions::params), which become params whose values
// come back in OnnxModel::params.
//
// The bytes are untrusted: every length, dim and count is checked (base/
// checked_int.h) before use, and every failure is an INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED for a configured limit) that says what is wrong. A model
// with ops Kiln cannot import fails with one error that lists every such node:
// op type, domain, opset and node name.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"
#include "engine/ir/infer.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::io {

struct OnnxImportOptions {
  // Initializers (or Constant node outputs) that become params instead of
  // constants, by ONNX name. Naming one the model does not have is an error.
  std::vector<std::string> params;
  // Every initializer becomes a param (Constant nodes stay constants).
  bool all_initializers_as_params = false;
  // Concrete shapes for graph inputs, by name; inputs not listed keep the
  // model's dims (unknown dims become symbolic).
  std::vector<std::pair<std::string, Dims>> input_shapes;
  // Graph inputs whose values are fixed at import, by name: they become
  // constants (and leave the graph's inputs), so what they feed folds (a
  // reshape target, pads or axes fed as inputs). Not owned; must outlive the call.
  std::vector<std::pair<std::string, const HostTensor*>> input_values;
  // Limits: the model's size, its node count, and each tensor's (InferLimits
  // also bounds every intermediate result).
  int64_t max_model_bytes = int64_t{2} << 30;
  int64_t max_nodes = 1 << 20;
  ir::InferLimits limits;
  // Constants computed at import (folded shape arithmetic) above this many
  // elements are left to the graph instead.
  int64_t max_folded_elements = 1 << 16;
  // A Loop whose trip count is known at import (and so becomes a Scan) may
  // run at most this many iterations (RESOURCE_EXHAUSTED past it); kilnd
  // passes its limits.max_while_iterations, the bound its While runs have.
  int64_t max_loop_iterations = 1000000;
  // A Loop with scan outputs whose body computes its cond (a while loop: the
  // trip count is known only at run time) stacks each scan output into a
  // buffer of this many rows (or M's, when M is known and smaller); the graph
  // returns the buffer and its run-time length (TrimStackedOutputs below), and
  // a run that needs more rows fails RESOURCE_EXHAUSTED there. Each iteration
  // rewrites the buffers: its cost is this bound times a step's output.
  int64_t max_while_scan_length = 1024;
  // Import PyTorch's decomposed LayerNorm and exact GELU as Kiln's layer_norm
  // and gelu, and Pow(x, 2) as x * x (onnx_patterns.cc). Off: every node is
  // converted alone (what a benchmark compares against).
  bool patterns = true;
};

struct OnnxModel {
  v1::Graph graph;
  // Values of the initializers that became params, in graph param order.
  std::vector<std::pair<std::string, HostTensor>> params;
};

// A while loop's stacked output `y` (see max_while_scan_length) is the graph
// output `y`, [bound, ...], beside the i64 scalar output
// kStackedLengthPrefix + "y": the rows the loop wrote, or bound + 1 when it
// wanted more than bound. TrimStackedOutputs turns a run's outputs into the
// ONNX model's: each such `y` cut to its length (an error past the bound)
// and the length outputs removed. Outputs without a length output are left
// as they are, so it may be applied to any graph's outputs.
inline constexpr char kStackedLengthPrefix[] = "kiln.length.";
absl::Status TrimStackedOutputs(std::vector<std::pair<std::string, HostTensor>>& outputs);

// Parses and imports a serialized onnx.ModelProto.
absl::StatusOr<OnnxModel> ImportOnnxModel(std::string_view bytes, const OnnxImportOptions& options);

// ImportOnnxModel without the param values (what a fuzzer or a graph loader
// that keeps every initializer a constant needs).
absl::StatusOr<v1::Graph> ImportOnnx(std::string_view bytes, const OnnxImportOptions& options);

// A serialized onnx.TensorProto (the backend tests' input_*.pb / output_*.pb)
// as a host tensor; `name` receives its name when not null.
absl::StatusOr<HostTensor> ParseOnnxTensor(std::string_view bytes, std::string* name = nullptr);

// The ONNX op types this importer converts (for reports and docs).
std::vector<std::string> SupportedOnnxOps();

}  // namespace kiln::io
