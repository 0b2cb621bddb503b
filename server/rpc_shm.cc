// ConnectSharedMemory: a ticket for kilnd's shared-memory socket
// (server/shm_regions.h), answered inline.
#include "server/rpc_common.h"

namespace kiln::server {

grpc::ServerUnaryReactor* KilnService::ConnectSharedMemory(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* request_bytes,
                                                           grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::ConnectSharedMemoryRequest, v1::ConnectSharedMemoryResponse>(
      *this, ctx, "ConnectSharedMemory", request_bytes, response_bytes, /*offload=*/false,
      [this](Call& call, const v1::ConnectSharedMemoryRequest&,
             v1::ConnectSharedMemoryResponse& response) -> absl::Status {
        if (deps().shm == nullptr) {
          return absl::UnavailableError(
              "kilnd runs without shared memory (shm_socket \"off\"): send tensors as bytes");
        }
        response = deps().shm->NewTicket(*call.tenant);
        return absl::OkStatus();
      });
}

}  // namespace kiln::server
