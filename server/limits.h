// Checks on what arrives over the wire, made before anything is allocated
// for it (DESIGN.md section 7, "Limits"): tensor headers against the element,
// byte and rank limits and their data length; graphs against the node count
// and subgraph depth, constants included; `.kiln` text parsed under the same
// limits. Every error names the field, node or tensor and the limit.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/host_tensor.h"
#include "engine/engine.h"
#include "kiln/v1/config.pb.h"
#include "kiln/v1/service.pb.h"
#include "server/client_string.h"

namespace kiln::server {

// Checks a tensor's dtype and dims (`what` names it: `input "x"`) and returns
// its byte size. Elements and bytes are computed from dims with overflow
// checks, then compared with the limits.
absl::StatusOr<int64_t> CheckTensorHeader(DType dtype, std::span<const int64_t> dims,
                                          const v1::Limits& limits, const std::string& what);

// CheckTensorHeader, then the data length must equal the byte size.
absl::StatusOr<int64_t> CheckTensor(const v1::Tensor& tensor, const v1::Limits& limits,
                                    const std::string& what);

// Named tensors of a request (`kind` = "input" or "param"): names non-empty
// and unique, each tensor checked. Returns views over the request's bytes.
// `moved`, when not empty, has one entry per tensor: a non-null view there is
// that tensor's data, received outside the message (base/tensor_wire.h), and
// stands for its (empty) `data` field.
// With `allow_shm`, a tensor may name shared memory instead (NamedTensor.shm:
// header checked, no data, shm.bytes its size); its view's data is then null
// for the caller to bind (Run's inputs: server/shm_run.h). Without it such
// a tensor is INVALID_ARGUMENT.
absl::StatusOr<std::vector<TensorRef>> CheckNamedTensors(
    const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors, const v1::Limits& limits,
    const std::string& kind, std::span<const std::string_view> moved = {}, bool allow_shm = false);

// Node count (subgraphs included), subgraph depth and constants of a wire graph.
absl::Status CheckGraph(const v1::Graph& graph, const v1::Limits& limits);

// The graph of a GraphSource: the proto (checked by CheckGraph) or the
// `.kiln` text parsed under `limits`. INVALID_ARGUMENT when neither is set.
absl::StatusOr<v1::Graph> ResolveGraph(const v1::GraphSource& source, const v1::Limits& limits);

// "f32[?, 784]"
std::string TypeString(const v1::TensorType& type);

// The longest status message kilnd sends (bytes); ToGrpc cuts longer ones.
// gRPC carries the message in a header, and clients refuse headers past 8 KiB
// by default.
inline constexpr size_t kMaxStatusMessageBytes = 2048;

}  // namespace kiln::server
