// Automatic mixed precision (DESIGN.md section 3, transforms; issue 9 item
// 5): the graph's heavy products computed in bf16 or f16 from f32 values, as
// torch.autocast does, as a compile-time rewrite (kiln.v1.AmpSpec).
//
// Each matmul, dot_general, attention, conv and conv_transpose2d whose result
// is f32 is re-emitted with its float operands cast to `spec.compute` (a
// value feeding several such nodes is cast once) and its result cast back to
// f32, so params stay f32 (the master weights: a training step's gradients
// and updates are f32) and every other op (norms, softmax, losses,
// elementwise, reductions) computes in f32 as before. Boolean masks and
// integer operands are left alone; nodes already in a low precision are not
// touched.
//
// Postconditions: the graph's inputs, params and outputs keep their types;
// the rewritten nodes are gone (their uses read the f32 cast).
//
// REQUIRES: the graph is verified and specialized. Thread safety: none.
#pragma once

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "kiln/v1/train.pb.h"

namespace kiln::passes {

// Whether `spec` asks for AMP (its compute dtype is set).
inline bool AmpRequested(const v1::AmpSpec& spec) {
  return spec.compute() != v1::DTYPE_UNSPECIFIED;
}

// INVALID_ARGUMENT naming the field: compute not bf16 or f16, an unknown
// loss-scale mode, or a loss-scaling setting out of range (init_scale finite
// and > 0, growth_factor > 1, backoff_factor in (0, 1), growth_interval in
// [1, 2^40]).
absl::Status ValidateAmp(const v1::AmpSpec& spec);

// Applies `spec` to `graph`; returns whether any node changed. REQUIRES:
// ValidateAmp(spec) is OK.
absl::StatusOr<bool> ApplyAmp(ir::Graph& graph, const v1::AmpSpec& spec);

}  // namespace kiln::passes
