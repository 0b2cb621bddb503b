#include "engine/ir/rewriter.h"

#include "engine/ir/infer.h"

namespace kiln::ir {

Rewriter::Rewriter(Graph& graph, const Node& origin, v1::Path path)
    : graph_(graph), origin_(origin), path_(path) {}

ValueRef Rewriter::Add(OpKind op, std::vector<ValueRef> operands, v1::Attrs attrs) {
  if (!status_.ok()) return ValueRef{};
  for (const ValueRef& v : operands) {
    if (v.node < 0 || graph_.FindNode(v.node) == nullptr) {
      status_ = absl::InternalError("rewriter: operand of a new node is invalid");
      return ValueRef{};
    }
  }
  auto node = std::make_unique<Node>();
  node->id = graph_.NextId();
  node->op = op;
  node->operands.assign(operands.begin(), operands.end());
  node->attrs = std::move(attrs);
  node->path = path_;
  node->device = origin_.device;
  node->origins = origin_.origins;
  if (auto s = InferNode(graph_, *node); !s.ok()) {
    status_ = absl::InternalError(std::string("rewriting ") + NodeLabel(origin_) + ": " +
                                  std::string(s.message()));
    return ValueRef{};
  }
  last_ = graph_.AddNode(std::move(node));
  return last_->out();
}

ValueRef Rewriter::Unary(v1::UnaryKind kind, ValueRef x) {
  v1::Attrs a;
  a.mutable_unary()->set_kind(kind);
  return Add(v1::OP_UNARY, {x}, std::move(a));
}

ValueRef Rewriter::Binary(v1::BinaryKind kind, ValueRef x, ValueRef y) {
  v1::Attrs a;
  a.mutable_binary()->set_kind(kind);
  return Add(v1::OP_BINARY, {x, y}, std::move(a));
}

ValueRef Rewriter::Compare(v1::CompareKind kind, ValueRef x, ValueRef y) {
  v1::Attrs a;
  a.mutable_compare()->set_kind(kind);
  return Add(v1::OP_COMPARE, {x, y}, std::move(a));
}

ValueRef Rewriter::Where(ValueRef cond, ValueRef x, ValueRef y) {
  v1::Attrs a;
  a.mutable_where();
  return Add(v1::OP_WHERE, {cond, x, y}, std::move(a));
}

ValueRef Rewriter::Cast(ValueRef x, DType to) {
  v1::Attrs a;
  a.mutable_cast()->set_to(to);
  return Add(v1::OP_CAST, {x}, std::move(a));
}

ValueRef Rewriter::MatMul(ValueRef x, ValueRef y, bool transpose_a, bool transpose_b) {
  v1::Attrs a;
  a.mutable_matmul()->set_transpose_a(transpose_a);
  a.mutable_matmul()->set_transpose_b(transpose_b);
  return Add(v1::OP_MATMUL, {x, y}, std::move(a));
}

ValueRef Rewriter::Reduce(v1::ReduceKind kind, ValueRef x, const std::vector<int64_t>& axes,
                          bool keepdims) {
  v1::Attrs a;
  a.mutable_reduce()->set_kind(kind);
  for (int64_t ax : axes) a.mutable_reduce()->add_axes(ax);
  a.mutable_reduce()->set_keepdims(keepdims);
  return Add(v1::OP_REDUCE, {x}, std::move(a));
}

ValueRef Rewriter::Softmax(ValueRef x, int64_t axis) {
  v1::Attrs a;
  a.mutable_softmax()->set_axis(axis);
  return Add(v1::OP_SOFTMAX, {x}, std::move(a));
}

ValueRef Rewriter::Reshape(ValueRef x, const IrDims& shape) {
  v1::Attrs a;
  for (int64_t d : shape) a.mutable_reshape()->add_shape(d);
  return Add(v1::OP_RESHAPE, {x}, std::move(a));
}

ValueRef Rewriter::Transpose(ValueRef x, const std::vector<int64_t>& perm) {
  v1::Attrs a;
  for (int64_t p : perm) a.mutable_transpose()->add_perm(p);
  return Add(v1::OP_TRANSPOSE, {x}, std::move(a));
}

ValueRef Rewriter::Constant(HostTensor value) {
  if (!status_.ok()) return ValueRef{};
  auto node = std::make_unique<Node>();
  node->id = graph_.NextId();
  node->op = v1::OP_CONSTANT;
  node->attrs.mutable_constant();
  node->outputs.push_back(
      TensorType(value.dtype(), IrDims(value.dims().begin(), value.dims().end())));
  node->value = std::make_shared<const HostTensor>(std::move(value));
  node->path = v1::PATH_NATIVE;
  node->device = origin_.device;
  node->origins = origin_.origins;
  last_ = graph_.AddNode(std::move(node));
  return last_->out();
}

ValueRef Rewriter::Scalar(double value, DType dtype) {
  auto t = HostTensor::Create(dtype, {});
  if (!t.ok()) {
    status_ = t.status();
    return ValueRef{};
  }
  t->SetFromDouble(0, value);
  return Constant(std::move(t).value());
}

}  // namespace kiln::ir
