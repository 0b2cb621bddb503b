// ListModels, LoadModel, UnloadModel: the model repository (server/models.h).
// Any tenant lists; loading and unloading change what every tenant sees, so
// they are for admin tenants (TenantConfig.admin; the open tenant is one).
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "server/limits.h"
#include "server/rpc_common.h"

namespace kiln::server {
namespace {

absl::Status NeedRepository(const ServiceDeps& d) {
  if (d.models != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError("this kilnd has no model repository (start it with --model_repository=DIR)");
}

absl::Status NeedAdmin(const ServiceDeps& d, const Tenant& tenant, const char* what) {
  if (d.tenants->IsAdmin(tenant)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(what, " changes the models every tenant sees: tenant \"",
                                                  tenant.name(), "\" is not an admin (TenantConfig.admin)"));
}

}  // namespace

grpc::ServerUnaryReactor* KilnService::ListModels(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request_bytes,
                                                  grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::ListModelsRequest, v1::ListModelsResponse>(
      *this, ctx, "ListModels", request_bytes, response_bytes, /*offload=*/false,
      [this](Call&, const v1::ListModelsRequest& request, v1::ListModelsResponse& response) -> absl::Status {
    const ServiceDeps& d = deps();
    if (d.models == nullptr) return absl::OkStatus();  // an empty list, repository ""
    response.set_repository(d.models->root());
    for (v1::ModelVersionInfo& m : d.models->List(request.name())) *response.add_models() = std::move(m);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::LoadModel(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request_bytes,
                                                 grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::LoadModelRequest, v1::LoadModelResponse>(
      *this, ctx, "LoadModel", request_bytes, response_bytes, /*offload=*/true,
      [this](Call& call, const v1::LoadModelRequest& request, v1::LoadModelResponse& response) -> absl::Status {
    const ServiceDeps& d = deps();
    KILN_RETURN_IF_ERROR(NeedRepository(d));
    KILN_RETURN_IF_ERROR(NeedAdmin(d, *call.tenant, "LoadModel"));
    call.detail = absl::StrCat("model=", QuoteClientString(request.name(), 128), " version=", request.version());
    KILN_ASSIGN_OR_RETURN(*response.mutable_model(), d.models->Load(request.name(), request.version()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::UnloadModel(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request_bytes,
                                                   grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::UnloadModelRequest, v1::UnloadModelResponse>(
      *this, ctx, "UnloadModel", request_bytes, response_bytes, /*offload=*/false,
      [this](Call& call, const v1::UnloadModelRequest& request, v1::UnloadModelResponse& response) -> absl::Status {
    const ServiceDeps& d = deps();
    KILN_RETURN_IF_ERROR(NeedRepository(d));
    KILN_RETURN_IF_ERROR(NeedAdmin(d, *call.tenant, "UnloadModel"));
    call.detail = absl::StrCat("model=", QuoteClientString(request.name(), 128), " version=", request.version());
    KILN_ASSIGN_OR_RETURN(std::vector<v1::ModelVersionInfo> gone,
                          d.models->Unload(request.name(), request.version()));
    for (v1::ModelVersionInfo& m : gone) *response.add_unloaded() = std::move(m);
    return absl::OkStatus();
  });
}

}  // namespace kiln::server
