// Shared by autodiff.cc (the sweeps) and autodiff_rules.cc (one VJP and one
// JVP rule per op). Not part of the passes' interface.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/rewriter.h"

namespace kiln::passes::ad {

using ir::IrDims;
using ir::TensorType;
using ir::ValueRef;

inline bool Valid(ValueRef v) { return v.node >= 0; }

// Node-building helpers over ir::Rewriter (errors are sticky: check status()).
class Builder {
 public:
  Builder(ir::Graph& graph, const ir::Node& origin, v1::Path path = v1::PATH_UNSPECIFIED)
      : graph_(graph), r_(graph, origin, path) {}

  ir::Rewriter& r() { return r_; }
  ir::Graph& graph() { return graph_; }
  const absl::Status& status() const { return r_.status(); }
  const TensorType& T(ValueRef v) const { return graph_.TypeOf(v); }

  ValueRef Add(ValueRef a, ValueRef b) { return r_.Binary(v1::BINARY_ADD, a, b); }
  ValueRef Sub(ValueRef a, ValueRef b) { return r_.Binary(v1::BINARY_SUB, a, b); }
  ValueRef Mul(ValueRef a, ValueRef b) { return r_.Binary(v1::BINARY_MUL, a, b); }
  ValueRef Div(ValueRef a, ValueRef b) { return r_.Binary(v1::BINARY_DIV, a, b); }
  ValueRef Un(v1::UnaryKind k, ValueRef x) { return r_.Unary(k, x); }
  ValueRef Neg(ValueRef x) { return r_.Unary(v1::UNARY_NEG, x); }
  // A rank-0 constant of `dtype`.
  ValueRef Sc(double v, DType dtype) { return r_.Scalar(v, dtype); }
  // `x` times the constant `v` (x's dtype).
  ValueRef Scale(ValueRef x, double v);
  // Cast(Compare(kind, a, b)) to `dtype`: 1 where it holds, else 0.
  ValueRef Mask(v1::CompareKind kind, ValueRef a, ValueRef b, DType dtype);
  ValueRef Zeros(const TensorType& t);
  // Expand to `dims` (NumPy broadcast); `x` itself when it already has them.
  ValueRef BroadcastTo(ValueRef x, const IrDims& dims);
  // The adjoint of broadcasting to x's shape: sums the broadcast dims of `x`
  // so that the result has `dims`.
  ValueRef SumTo(ValueRef x, const IrDims& dims);
  ValueRef Reshape(ValueRef x, const IrDims& dims);
  // Sum over `axes` (normalized, ascending) keeping them as size-1 dims.
  ValueRef SumKeep(ValueRef x, const std::vector<int64_t>& axes) {
    return r_.Reduce(v1::REDUCE_SUM, x, axes, true);
  }
  // An rank-1 constant 0..n-1 of an integer `dtype`.
  ValueRef Iota(int64_t n, DType dtype);
  ValueRef Slice(ValueRef x, int64_t axis, int64_t start, int64_t stop);
  ValueRef Pad(ValueRef x, const std::vector<int64_t>& low, const std::vector<int64_t>& high);
  // The node's own op with new operands and the same attributes.
  ValueRef Same(const ir::Node& n, std::vector<ValueRef> operands) {
    return r_.Add(n.op, std::move(operands), n.attrs);
  }

 private:
  ir::Graph& graph_;
  ir::Rewriter r_;
};

// Max pool's derivative dx of y = max_pool(x) (`attrs` of kind POOL_MAX) for
// the cotangent g, made of pads, strided slices, compares and (windows that
// tile x) one interleaving transpose: the first maximum of each window in
// row-major order takes g. What kiln.max_pool_backward computes in one pass
// (base/custom_ops.h) and what legalize decomposes it into.
ValueRef MaxPoolVjpComposition(Builder& b, ValueRef x, ValueRef y, const v1::PoolAttrs& attrs,
                               ValueRef g);
// Max pool's JVP for the tangent t of x: t at each window's first maximum.
// Also the adjoint, in g, of the derivative above.
ValueRef MaxPoolJvpComposition(Builder& b, ValueRef x, ValueRef y, const v1::PoolAttrs& attrs,
                               ValueRef t);

// A 2-D conv's weight gradient (groups 1, `attrs` its geometry) for the
// cotangent g of y = conv(x, w), as transposes and a conv of x with g as the
// kernel: what kiln.conv2d_backward_weights computes in one kernel
// (base/custom_ops.h) and what legalize decomposes it into.
ValueRef ConvWeightGradComposition(Builder& b, ValueRef x, ValueRef g, ValueRef w,
                                   const v1::ConvAttrs& attrs);

// Reverse rule: `g` is the cotangent of n's (single) result. Sets grads[i]
// for every operand i with need[i] (an invalid ref means zero).
// UNIMPLEMENTED when the op (or this use of it) has no rule.
absl::Status VjpRule(Builder& b, const ir::Node& n, ValueRef g, const std::vector<bool>& need,
                     std::vector<ValueRef>& grads);

// Forward rule: `tangents[i]` of each operand (invalid = zero; at least one
// valid); returns the tangent of n's result.
absl::StatusOr<ValueRef> JvpRule(Builder& b, const ir::Node& n,
                                 const std::vector<ValueRef>& tangents);

// Whether the op passes derivatives at all (false: its results are a
// function of no float operand's value, or it has no rule: see HasRule).
bool HasRule(const ir::Node& n);

}  // namespace kiln::passes::ad
