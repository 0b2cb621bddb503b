// The int8 inference form of a graph trained with QAT (passes/qat.h; issue 9
// item 5): what the fake quantization simulated, computed in integers.
//
// Each f32 matmul whose weight (operand 1) is a rank-2 param used by that
// matmul alone becomes
//   x -> quantize(x, s_x[, zp_x]) -> matmul(i8/u8, i8) -> i32 -> f32 * (s_x * s_w)
// (minus zp_x * colsum(w_q) for an asymmetric activation): the weight is
// quantized once here with the rule the QAT pass applied while training
// (per tensor or per output channel, symmetric; LSQ's learned scales where
// they are positive), and becomes an i8 param of the same name with its
// scale in "<name>/scale" (f32, [] or [N]); the activation's scale comes
// from its range in each run (dynamic quantization, as the QAT graph
// computed it). With weights_only the weight is stored in i8 and
// dequantized before an f32 matmul. Everything else (convs included) stays
// f32, named in `notes`.
//
// The result is the fake-quantized model up to f32 rounding: the integer
// product is exact, and w_q * s_w equals fake_quantize(w) bit for bit.
//
// Linked by the clients (kilnctl train --export-int8) as well as the engine:
// it needs only the IR.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"
#include "kiln/v1/graph.pb.h"
#include "kiln/v1/train.pb.h"

namespace kiln::quant {

struct Int8Model {
  v1::Graph graph;
  // Every param of `graph`: the quantized weights (i8), their scales, and the
  // other trained params as given.
  std::map<std::string, HostTensor> params;
  std::vector<std::string> notes;  // what was and was not converted
};

// `graph` is the user's graph (before any transform), `qat` the spec it was
// trained with, `trained` its trained params (and any "<w>/lsq_scale").
// INVALID_ARGUMENT for a missing or mistyped param; UNIMPLEMENTED for a spec
// the export does not cover (4 bits, asymmetric weights).
absl::StatusOr<Int8Model> ExportInt8(const v1::Graph& graph, const v1::QatSpec& qat,
                                     const std::map<std::string, HostTensor>& trained);

}  // namespace kiln::quant
