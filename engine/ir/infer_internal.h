// Shared helpers of the per-family inference files (infer_*.cc). Internal.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "engine/ir/graph.h"
#include "engine/ir/infer.h"

namespace kiln::ir::infer_internal {

// The node being inferred, its graph, and error formatting.
struct Ctx {
  const Graph& graph;
  Node& node;
  const InferLimits& limits;
  int depth;

  int num_operands() const { return static_cast<int>(node.operands.size()); }
  const TensorType& in(int i) const { return graph.TypeOf(node.operands[i]); }

  template <typename... Args>
  absl::Status Error(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(NodeLabel(node), ": ", args...));
  }
  // For a CheckedInt formula that did not fit: `args` say what was computed
  // from which attributes and dims; the message adds the limit.
  template <typename... Args>
  absl::Status Overflow(const Args&... args) const {
    return Error(args..., " overflows int64 (max ", kInt64Max, ")");
  }
  absl::Status Arity(int min, int max) const;
  absl::Status NeedFloat(int operand) const;
  absl::Status SameDType(int a, int b) const;
  absl::Status Rank(int operand, int64_t min, int64_t max) const;
  absl::Status Axis(int64_t axis, int64_t rank, const char* field, int64_t* out) const;
  absl::Status Set(TensorType t);  // single output
  std::string T(int operand) const { return TypeToString(in(operand), graph.symbols()); }
};

// Equal-or-unknown: two dims agree unless both are concrete and differ.
inline bool DimsCompatible(int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; }

absl::Status InferElementwise(Ctx& c);  // unary, binary, compare, where, cast, clamp
absl::Status InferLinalg(Ctx& c);       // matmul, dot_general, dense_solve
absl::Status InferNorms(Ctx& c);        // softmax, log_softmax, norms, rope, attention
absl::Status InferShapeOps(Ctx& c);     // reshape .. topk
absl::Status InferVision(Ctx& c);       // conv, conv_transpose2d, pool, ffts
// The result type of a convolution of x [N, C, spatial...] by w with `a`
// (shared by Conv and FusedConv); errors name c's node.
absl::Status ConvResultType(Ctx& c, const TensorType& x, const TensorType& w,
                            const TensorType* bias, const v1::ConvAttrs& a, TensorType* result);
absl::Status InferMisc(Ctx& c);         // quantization, control flow, losses, collectives,
                                        // custom, internal fused ops, copy

}  // namespace kiln::ir::infer_internal
