// A Run call's shared memory (kiln/v1/shm.proto, server/shm_regions.h):
// inputs named by (region, offset, bytes) bound to the region's bytes, and
// the places outputs go (RunRequest.shm_outputs and shm_output_area). A
// TrainStep's batch binds its inputs the same way (BindInputs; its outputs,
// the loss and the learning rate, come back in the response).
//
// Float inputs are read in place; inputs of other dtypes (indices, masks,
// shapes) are copied first, because the client may write its region while
// the run reads it, and a kernel that checks an index and then reads it
// again must see the same value twice.
//
// Thread safety: thread-compatible. Holds the regions it uses (they stay
// mapped while it lives, even when unregistered meanwhile).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/host_tensor.h"
#include "engine/engine.h"
#include "kiln/v1/service.pb.h"
#include "kiln/v1/shm.pb.h"
#include "server/shm_regions.h"
#include "server/tenants.h"

#include <grpcpp/support/byte_buffer.h>

namespace kiln::server {

class RunShm {
 public:
  // Binds the inputs of `request` that name shared memory (their views in
  // `inputs`, from CheckNamedTensors with allow_shm, have null data) and
  // resolves the regions outputs go to. Null when the request names no
  // shared memory. NOT_FOUND for a region the tenant does not have,
  // OUT_OF_RANGE for bytes outside it, UNAVAILABLE when `shm` is null.
  static absl::StatusOr<std::unique_ptr<RunShm>> Bind(const v1::RunRequest& request,
                                                      std::vector<TensorRef>& inputs,
                                                      const ShmRegistry* shm, const Tenant& tenant);
  // As Bind, for requests whose outputs come back as bytes (TrainStep's
  // batch): binds the entries of `named` that name shared memory, with the
  // same bounds checks and the tenant's own regions only. Null when none
  // does. PlanOutputs must not be called on the result.
  static absl::StatusOr<std::unique_ptr<RunShm>> BindInputs(
      const google::protobuf::RepeatedPtrField<v1::NamedTensor>& named,
      std::vector<TensorRef>& inputs, const ShmRegistry* shm, const Tenant& tenant);
  RunShm(const RunShm&) = delete;
  RunShm& operator=(const RunShm&) = delete;

  struct OutputType {
    std::string name;
    DType dtype;
    Dims dims;
  };
  // Decides where each output goes, in graph order: its shm_outputs entry
  // (whose size must match), else the output area while it fits, else
  // nowhere (bytes in the response). REQUIRES: made by Bind (a RunRequest).
  // INVALID_ARGUMENT for an shm_outputs
  // name that is no output, a size that does not match, or outputs that
  // overlap each other or an input in shared memory.
  absl::Status PlanOutputs(const std::vector<OutputType>& outputs);
  // The planned outputs as the engine's destinations.
  std::vector<RunOptions::OutputDestination> Destinations() const;

  // Fills `out` for output `name`: when it was planned, its header and shm
  // (copying `value` there unless the engine wrote it: `value` null), else
  // `value` as bytes. REQUIRES: `value` non-null for an output not planned.
  void Answer(const std::string& name, DType dtype, const Dims& dims, const HostTensor* value,
              v1::NamedTensor* out) const;
  bool Planned(const std::string& name) const { return Find(name) != nullptr; }

 private:
  struct Span {
    const ShmRegion* region;
    int64_t offset;
    int64_t bytes;
  };
  struct Output {
    std::string name;
    char* data;
    int64_t bytes;
    v1::SharedMemoryRef ref;
  };
  explicit RunShm(const v1::RunRequest* request) : request_(request) {}
  absl::Status BindNamed(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& named,
                         std::vector<TensorRef>& inputs, const ShmRegistry* shm,
                         const Tenant& tenant);
  absl::StatusOr<const ShmRegion*> Region(const ShmRegistry* shm, const Tenant& tenant,
                                          const std::string& id);
  const Output* Find(const std::string& name) const;

  const v1::RunRequest* request_;  // outlives this (the call's); null from BindInputs
  std::vector<std::shared_ptr<const ShmRegion>> regions_;
  std::vector<std::unique_ptr<char[]>> copies_;  // non-float inputs
  std::vector<std::pair<std::string, Span>> input_spans_;  // inputs read in place or copied
  const ShmRegion* area_ = nullptr;                         // shm_output_area's region
  std::vector<const ShmRegion*> output_regions_;            // shm_outputs[i]'s region
  std::vector<Output> planned_;
};

// The request and response bytes of a call over kilnd's shared-memory socket
// (a Run's or a TrainStep's), a base of the call so that they outlive the
// gRPC call classes that read and write them: the request is the datagram's
// serialized message, taken without a copy.
struct SocketCallBuffers {
  explicit SocketCallBuffers(std::string request_bytes) {
    grpc::Slice slice(std::move(request_bytes));
    request = grpc::ByteBuffer(&slice, 1);
  }
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
};

// The answer a call over kilnd's shared-memory socket sends (a Run's or a
// TrainStep's): `s` as code and message, the request id ("-" when none) and,
// when `s` is OK, the serialized response `bytes` in the field `field` of the
// message returns (mutable_run_response, mutable_train_step_response).
v1::ShmServerMessage SocketAnswer(const absl::Status& s, const std::string& request_id,
                                  const grpc::ByteBuffer& bytes,
                                  std::string* (v1::ShmServerMessage::*field)());
// A socket call's outcome: a cancel at or past `deadline` is the connection's
// thread ending the call (`what`: "run", "step") at its deadline, which a gRPC
// client's own deadline would have said itself.
absl::Status SocketOutcome(absl::Status s, absl::Time deadline, absl::string_view what);

// The longest run or training step (by the cost model's estimate) that a
// socket call runs on the connection's own thread when its device is idle
// (RunOptions::on_caller_when_idle): that thread only waits for the answer,
// so the hand-off to the device's thread and the wake back are saved. While
// it runs there, nothing watches the client's socket: its hang-up cancels the
// call only after it, hence the bound. Longer ones go to the device's thread.
inline constexpr double kMaxSocketCallOnCallerMicros = 100'000;

}  // namespace kiln::server
