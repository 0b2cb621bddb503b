// Quantization-aware training (DESIGN.md sections 3 and 9; issue 9 item 5):
// fake quantization inserted on the operands of the graph's matmuls and
// convs, as a compile-time rewrite (kiln.v1.QatSpec), so that a training step
// learns weights that survive int8 (or int4) rounding.
//
// For each matmul and conv whose result is f32:
//   weight      (matmul operand 1, conv operand 1) -> fake_quantize(w, s[, zp])
//               per output channel (matmul: the N dim, conv: dim 0) when
//               weight_per_channel, else per tensor; symmetric (signed grid,
//               s = max|w| / qmax) or asymmetric (unsigned grid, s = (max -
//               min) / (2^bits - 1) over the range widened to hold 0, zp =
//               round(-min / s)). With `lsq`: fake_quantize_lsq(w, s) with s
//               a new trainable f32 param "<weight>/lsq_scale" (per tensor or per
//               channel) that starts at 0, read as the LSQ initialisation
//               2 * mean|w| / sqrt(qmax) until it holds a value (see
//               LsqScale); symmetric only.
//   activation  (matmul operand 0, conv operand 0) -> fake_quantize per
//               tensor from the value's own range in this run (dynamic
//               quantization, which is what the int8 export computes at
//               inference), symmetric or asymmetric; skipped when
//               weights_only.
// Scales are kept off 0 (max with 2^-30 of the range) so the kernels never
// see a zero scale. A value feeding several such nodes is quantized once.
// Scale and zero-point computations carry no gradient (the straight-through
// estimator of passes/autodiff_rules.cc gives them none).
//
// REQUIRES: the graph is verified and specialized. Thread safety: none.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "kiln/v1/train.pb.h"

namespace kiln::passes {

inline constexpr char kLsqScaleSuffix[] = "/lsq_scale";

// Whether a param is a learned scale the pass adds (a training step starts
// one at 0 when it is not given, as it does optimizer state).
inline bool IsLsqScaleParam(const std::string& name) {
  const size_t n = sizeof(kLsqScaleSuffix) - 1;
  return name.size() > n && name.compare(name.size() - n, n, kLsqScaleSuffix) == 0;
}

// A learned-scale param the pass added: its name and the value it takes
// while the param is 0 (the training step writes it into the param at the
// first update, train_step.h).
struct LsqScale {
  std::string param;
  ir::ValueRef init;
};

// INVALID_ARGUMENT naming the field: bits not 0, 4 or 8; lsq with
// weight_asymmetric.
absl::Status ValidateQat(const v1::QatSpec& spec);

// Applies `spec`; returns whether the graph changed. `lsq_scales` (may be
// null when !spec.lsq()) receives the learned-scale params added.
// REQUIRES: ValidateQat(spec) is OK.
absl::StatusOr<bool> ApplyQat(ir::Graph& graph, const v1::QatSpec& spec,
                              std::vector<LsqScale>* lsq_scales);

}  // namespace kiln::passes
