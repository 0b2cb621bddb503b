#include "server/run_wire.h"

#include <climits>

#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "base/tensor_wire.h"

namespace kiln::server {
namespace {

// RunRequest.inputs, RunRequest.params, RunResponse.outputs
// (proto/kiln/v1/service.proto).
constexpr int kRequestInputs = 4;
constexpr int kRequestParams = 5;
constexpr int kResponseOutputs = 1;

absl::Status NotARunRequest(const grpc::ByteBuffer& bytes, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the request is not a valid kiln.v1.RunRequest: its ", bytes.Length(),
      " bytes do not parse as that protobuf message (", why, ")"));
}

void ReleaseOutputs(void* holder) {
  delete static_cast<std::shared_ptr<const NamedHostTensors>*>(holder);
}

}  // namespace

absl::Status ParseRunRequest(const grpc::ByteBuffer& bytes, WireRunRequest& out) {
  grpc::ByteBuffer view(bytes);  // shares the slices
  grpc::ProtoBufferReader reader(&view);
  if (!reader.status().ok()) return NotARunRequest(bytes, "unreadable");
  constexpr int kFields[] = {kRequestInputs, kRequestParams};
  std::vector<SplitData> moved;
  absl::StatusOr<std::string> rest = SplitTensorData(
      reader, static_cast<int64_t>(bytes.Length()), kFields, kWireTensorMinBytes,
      [&out](int, int, const v1::Tensor&, int64_t n) -> absl::StatusOr<char*> {
        // 64-byte aligned: what the CPU device asks of its buffers.
        absl::StatusOr<HostTensor> t = HostTensor::CreateUninitialized(v1::DTYPE_U8, {n});
        if (!t.ok()) return t.status();
        out.buffers.push_back(std::move(*t));
        return static_cast<char*>(out.buffers.back().data());
      },
      &moved);
  if (!rest.ok()) return NotARunRequest(bytes, rest.status().message());
  if (!out.message.ParseFromString(*rest)) return NotARunRequest(bytes, "a bad field");
  out.input_data.assign(out.message.inputs_size(), std::string_view());
  out.param_data.assign(out.message.params_size(), std::string_view());
  for (const SplitData& d : moved) {
    std::vector<std::string_view>& views =
        d.field == kRequestInputs ? out.input_data : out.param_data;
    if (d.index >= static_cast<int>(views.size())) {
      return NotARunRequest(bytes, "a tensor outside its field");
    }
    views[d.index] = std::string_view(d.data, static_cast<size_t>(d.bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<WireOutputBytes> SerializeRunResponse(
    const v1::RunResponse& response, std::shared_ptr<const NamedHostTensors> outputs,
    grpc::ByteBuffer* out) {
  WirePieces pieces;
  WireOutputBytes counts;
  for (const auto& [name, t] : *outputs) {
    const bool sliced = AppendNamedTensor(kResponseOutputs, name, t.dtype(), t.dims(), t.data(),
                                          t.num_bytes(), kWireTensorMinBytes, pieces);
    (sliced ? counts.sliced : counts.copied) += t.num_bytes();
  }
  // The report and request id: fields after the outputs.
  pieces.Append(response.SerializeAsString());
  if (pieces.size() > static_cast<uint64_t>(INT32_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the kiln.v1.RunResponse would be ", pieces.size(),
        " bytes, over protobuf's 2 GiB message limit; return fewer or smaller outputs"));
  }
  std::vector<grpc::Slice> slices;
  slices.reserve(pieces.pieces().size());
  for (const WirePieces::Piece& p : pieces.pieces()) {
    if (p.data == nullptr) {
      slices.emplace_back(p.owned);
      continue;
    }
    slices.emplace_back(const_cast<char*>(p.data), p.size, &ReleaseOutputs,
                        new std::shared_ptr<const NamedHostTensors>(outputs));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
  return counts;
}

}  // namespace kiln::server
