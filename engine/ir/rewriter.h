// Rewriter: creates nodes in an existing graph on behalf of a pass, inferring
// each node's types as it is made. Used by decompositions (legalize), folding
// and fusion. Errors are sticky: after the first failure every method returns
// an invalid ValueRef and status() reports the failure, so a decomposition
// reads as straight-line code and checks once at the end.
//
// New nodes inherit the origin node's `origins` (for reports) and get the
// given path and device. The caller restores topological order with
// Graph::SortTopologically() after rewiring uses.
#pragma once

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/ir/graph.h"

namespace kiln::ir {

class Rewriter {
 public:
  // `origin` is the node being replaced or extended; not owned, must outlive
  // the Rewriter.
  Rewriter(Graph& graph, const Node& origin, v1::Path path);

  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  const TensorType& TypeOf(ValueRef v) const { return graph_.TypeOf(v); }
  const Graph& graph() const { return graph_; }

  // Generic node; attrs must be the op's own attribute message.
  ValueRef Add(OpKind op, std::vector<ValueRef> operands, v1::Attrs attrs);
  Node* last() const { return last_; }

  ValueRef Unary(v1::UnaryKind kind, ValueRef x);
  ValueRef Binary(v1::BinaryKind kind, ValueRef a, ValueRef b);
  ValueRef Compare(v1::CompareKind kind, ValueRef a, ValueRef b);
  ValueRef Where(ValueRef cond, ValueRef a, ValueRef b);
  ValueRef Cast(ValueRef x, DType to);
  ValueRef MatMul(ValueRef a, ValueRef b, bool transpose_a = false, bool transpose_b = false);
  ValueRef Reduce(v1::ReduceKind kind, ValueRef x, const std::vector<int64_t>& axes,
                  bool keepdims);
  ValueRef Softmax(ValueRef x, int64_t axis);
  ValueRef Reshape(ValueRef x, const IrDims& shape);
  ValueRef Transpose(ValueRef x, const std::vector<int64_t>& perm);
  ValueRef Constant(HostTensor value);
  // A rank-0 constant of `dtype` holding `value`.
  ValueRef Scalar(double value, DType dtype);

 private:
  Graph& graph_;
  const Node& origin_;
  v1::Path path_;
  absl::Status status_;
  Node* last_ = nullptr;
};

}  // namespace kiln::ir
