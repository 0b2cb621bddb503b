// Run's request and response on the wire without copies of tensor data that
// kilnd can avoid (issue 12 item 2; docs/server.md, "Tensor bytes on the
// wire"): base/tensor_wire.h applied to kiln.v1.RunRequest / RunResponse.
//
// A request's large tensors are received from gRPC's slices straight into
// 64-byte aligned memory (one copy, where the generated parser would make a
// std::string and the engine another aligned copy of it); the engine binds
// them as its input buffers in place. A response's large outputs go out as
// gRPC slices over the engine's own result buffers (no copy), held until
// gRPC has sent them.
//
// Thread-compatible functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "base/host_tensor.h"
#include "kiln/v1/service.pb.h"

namespace kiln::server {

// Tensors whose data is at least this long skip the protobuf string on the
// way in and are sent as slices of the engine's buffer on the way out.
inline constexpr int64_t kWireTensorMinBytes = int64_t{64} << 10;

// A RunRequest whose large input and param data was received outside the
// message. Not copyable (views point into `buffers`).
struct WireRunRequest {
  v1::RunRequest message;  // the large tensors' `data` fields are empty
  // One entry per element of message.inputs() / params(): the data received
  // outside the message, or a null view (the data is in the message).
  std::vector<std::string_view> input_data;
  std::vector<std::string_view> param_data;
  std::vector<HostTensor> buffers;  // owns the data the views show

  WireRunRequest() = default;
  WireRunRequest(const WireRunRequest&) = delete;
  WireRunRequest& operator=(const WireRunRequest&) = delete;
};

// Parses a Run request; INVALID_ARGUMENT, as ParseMessage's, when the bytes
// are not a RunRequest.
absl::Status ParseRunRequest(const grpc::ByteBuffer& bytes, WireRunRequest& out);

// Byte counts of a serialized response's output data.
struct WireOutputBytes {
  int64_t sliced = 0;  // sent from the outputs' own buffers
  int64_t copied = 0;  // copied into the message
};

// Serializes `response` with `outputs` as its `outputs` field (first, as
// protobuf orders fields): the bytes are exactly response.SerializeAsString()
// had the outputs been added to it. Outputs of at least kWireTensorMinBytes
// are slices that hold `outputs` alive until gRPC releases them.
// REQUIRES: response.outputs() is empty. RESOURCE_EXHAUSTED past protobuf's
// 2 GiB message limit.
using NamedHostTensors = std::vector<std::pair<std::string, HostTensor>>;
absl::StatusOr<WireOutputBytes> SerializeRunResponse(
    const v1::RunResponse& response, std::shared_ptr<const NamedHostTensors> outputs,
    grpc::ByteBuffer* out);

}  // namespace kiln::server
