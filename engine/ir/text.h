// The `.kiln` text form of the IR (DESIGN.md section 2): a printer and a
// parser that round-trip, used for hand-written graphs, pass tests (text in,
// checked text out) and KILN_DUMP.
//
//   graph "attn_out"
//   input q: f32[?, 12, 128, 64]          # `?` is an anonymous symbolic dim
//   input k: f32[batch, 4, 128, 64]       # named symbols: one size per run
//   param w_o: f32[768, 768]
//   param w_frozen: f32[3] frozen
//   const c: f32[3] = [1, 2, 3]           # or hex"..." (little-endian bytes)
//   let a = attention(q, k, v, heads=12, kv_heads=4, mask=causal)
//   let y = reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 128, 768]) @ w_o + b_o
//   let (vals, idx) = topk(y, k=5)
//   out y
//   out logits = vals
//
// Expressions: infix `+ - * /` (binary add/sub/mul/div), `@` (matmul), unary
// `-` (neg), comparisons `== != < <= > >=` (compare; loosest, never chained),
// with Python precedence and parentheses; calls `op(operands..., attr=value, ...)`
// where `op` is an OpKind name (`layer_norm`), a unary/binary/compare kind
// (`relu`, `max`, `lt`), `reduce_<kind>` or `<kind>_pool`. A scalar literal
// operand (`x * 0.5`) becomes a scalar Constant of the other operand's dtype.
// Attributes are the fields of the op's attribute message in graph.proto, read
// and written through protobuf reflection: numbers, `true`/`false`, strings,
// enums by lower-case value name without the enum's common prefix
// (`mask=causal`), dtypes by name (`to=f16`), lists `[...]`, messages
// `{field=value, ...}`, subgraphs `body=graph "name" { ... }`.
//
// Values are named by their `let` name; a node without a unique name prints as
// `%<id>`, and output k of a multi-output node is `name#k`. `#` elsewhere starts
// a comment to the end of the line.
//
// Round trip: the parser creates nodes in source order (nested expressions in
// post-order) with ids 0, 1, 2, ...; the printer writes one line per node in
// the graph's (topological) node order, sources as declarations where they
// occur, so parse(print(parse(t))) equals parse(t) node for node, ids included.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/infer.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::ir {

struct PrintOptions {
  // Appends compiler annotations after each node that has any:
  // `{path=common_ir, device="cpu:0", offset=4096}` (Node::path, device,
  // offset; only those set). Pass tests print with annotations.
  bool annotations = false;
};

// Prints `graph` in the text form. Never fails: every IR graph has a text form
// (a subgraph attribute that does not verify prints as a comment naming why).
std::string PrintGraph(const Graph& graph, const PrintOptions& options = {});

struct ParseOptions {
  // Accept internal ops (fused kernels, copies) as pass tests print them;
  // client text may not contain them.
  bool allow_internal_ops = false;
  // Limits the graph must respect, checked while it is built (before a
  // constant's storage is allocated); kilnd passes its configured limits.
  InferLimits limits;
  int64_t max_nodes = 1 << 20;
};

// Parses `text` into a verified graph. Every node's types are inferred as it
// is created; a `: type` annotation is checked against the inferred type.
// Errors are INVALID_ARGUMENT and start with `line:col: ` of the offending
// token, then say what was expected or which node failed and why.
absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(std::string_view text,
                                                  const ParseOptions& options = {});

// ParseGraph, then ExportGraph: the wire form of a text graph.
absl::StatusOr<v1::Graph> ParseGraphProto(std::string_view text, const ParseOptions& options = {});

}  // namespace kiln::ir
