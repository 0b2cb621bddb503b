// Helpers shared by the RPC handler files (rpc_*.cc); not a public API.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <utility>

#include <grpcpp/grpcpp.h>

#include <climits>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "kiln/v1/service.pb.h"
#include "server/service.h"

namespace kiln::server {

// v1::CompileOptions -> the engine's ("" device = auto).
CompileOptions ToEngineOptions(const v1::CompileOptions& options);
void SignatureToProto(const GraphSignature& signature, v1::Signature* out);
// Sum of the memory plan's arenas over devices.
int64_t ArenaBytes(const v1::CompileReport& report);
// "x:[2, 784];" for each input, by name (empty for none): the key of a
// session's executable for these input shapes.
std::string ShapeKey(const std::vector<TensorRef>& inputs);

// OK for "auto" or the id of a device the engine has; else INVALID_ARGUMENT
// listing the devices.
absl::Status CheckDevice(const Engine& engine, const std::string& device);
// "x: f32[?, 784], y: i32[4]" (or "none").
std::string InputList(const GraphSignature& signature);
// "miss", "hit_disk", ...
std::string CacheOutcomeName(v1::CacheOutcome outcome);

// A param's name, dtype and dims against the graph's declaration.
absl::Status CheckParamAgainst(const GraphSignature& signature, const std::string& name,
                               DType dtype, const Dims& dims);
// An optimizer-state tensor set on a training session (a checkpoint's
// restore): "opt/step" must be i64[]; "opt/<param>/<m|v|momentum>" must name a
// param of the graph and have its dtype and dims. Which of them the optimizer
// keeps is checked when the next step builds its training set. With
// `lsq_scales` (the session trains with QAT's learned scales), <param> may
// also be a learned scale "<param of the graph>/lsq_scale" (f32; its dims are
// the training step's to check).
absl::Status CheckOptimizerStateAgainst(const GraphSignature& signature, const std::string& name,
                                        DType dtype, const Dims& dims, bool lsq_scales = false);
// Whether `name` is the learned QAT scale of a param of the graph
// ("<param>/lsq_scale", engine/passes/qat.h); a session training with
// QatSpec.lsq takes it as it takes its params (f32, dims checked by the step).
bool IsLsqScaleOf(const GraphSignature& signature, std::string_view name);
// A run's inputs against the graph's: every input given once, no others,
// dtypes equal, ranks equal, concrete dims equal.
absl::Status CheckInputsAgainst(const GraphSignature& signature,
                                const std::vector<TensorRef>& inputs);

// Binds `updates` over the session's current params (the others are kept),
// atomically. REQUIRES: the updates' bytes are already charged to the
// tenant; on success they become the session's charge and the bytes of the
// params they replace are released; on failure the caller releases them.
// (rpc_params.cc)
absl::Status BindParams(Engine& engine, Session& session, std::span<const TensorRef> updates);

// The key a session remembers the executable for these inputs by: their
// shapes when the session is symbolic, plus the value inputs' values on a
// value-specialised model (ModelVersion::specializer). (rpc_run.cc)
std::string SessionRunKey(const Session& session, const std::vector<TensorRef>& inputs);

// The session's executable for these inputs' shapes: remembered, or
// compiled (its arena charged to the tenant's device memory). `reused` is
// set to whether it was remembered. `training`: the training step of a
// training session instead of its forward graph. (rpc_run.cc)
absl::StatusOr<Session::Compiled> SessionExecutable(KilnService& service, Session& session,
                                                    const std::vector<TensorRef>& inputs,
                                                    bool* reused, bool training = false);

// The session's executable for these inputs' shapes if it is remembered
// (nothing compiles: callers on gRPC's threads use it to skip the work pool),
// its report marked reused (MarkReusedReport). (rpc_run.cc)
std::optional<Session::Compiled> RememberedSessionExecutable(const Session& session,
                                                             const std::vector<TensorRef>& inputs,
                                                             bool training);

// A remembered executable's compile report as a run reports it: a memory
// hit, its compile stages dropped (they were the first run's). (rpc_run.cc)
void MarkReusedReport(v1::CompileReport& report);

// Every param of `set` (none when null) read back to the host: `values` owns
// the bytes, `refs` names them and points into `values`. (rpc_train.cc)
absl::Status ReadAllParams(const ParamSet* set, std::vector<HostTensor>& values,
                           std::vector<TensorRef>& refs);

// A training session's params as a training set for `step` (rpc_train.cc):
// the bound set converted on the first step (optimizer state zero unless
// bound), its state bytes charged to the tenant; the same set afterwards.
absl::StatusOr<std::shared_ptr<ParamSet>> TrainingParams(Engine& engine, Session& session,
                                                         const Executable& step);

// Checks a stateful session's bindings (CreateSessionRequest.state) against
// its graph's signature and sets options.state_updates; INVALID_ARGUMENT
// naming the binding: an output or param the graph lacks, dtypes or shapes
// that differ (or are not fixed), a param or output bound twice. Bound
// outputs are removed from `signature` (runs do not return them).
// (rpc_state.cc)
absl::Status ApplyStateBindings(const google::protobuf::RepeatedPtrField<v1::StateBinding>& state,
                                GraphSignature& signature, CompileOptions& options);

// A stateful session's params as a state set for `executable` (rpc_state.cc):
// the bound set converted on the first run (a repository model's shared
// params are copied, and the copy charged to the tenant); the same set
// afterwards, until SetParams binds a new one.
absl::StatusOr<std::shared_ptr<const ParamSet>> StateParams(Engine& engine, Session& session,
                                                            const Executable& executable);

// Checks a training session's spec against its graph's signature and the
// optimizer's ranges (rpc_train.cc); INVALID_ARGUMENT naming what is wrong.
absl::Status CheckTrainingSpec(const GraphSignature& signature, const v1::TrainingSpec& spec);

// Parses a raw request or stream message; INVALID_ARGUMENT naming `what`
// (and the message type) when the bytes are not that message.
absl::Status ParseMessage(const grpc::ByteBuffer& bytes, google::protobuf::Message& message,
                          const std::string& what);

// Serializes a response or stream message; RESOURCE_EXHAUSTED when it is
// past protobuf's 2 GiB message limit (outputs that large cannot be sent).
template <typename M>
absl::Status SerializeMessage(const M& message, grpc::ByteBuffer* out) {
  const size_t bytes = message.ByteSizeLong();
  if (bytes > static_cast<size_t>(INT32_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the ", message.GetTypeName(), " would be ", bytes,
        " bytes, over protobuf's 2 GiB message limit; return fewer or smaller outputs"));
  }
  bool own_buffer = false;
  grpc::Status s = grpc::SerializationTraits<M>::Serialize(message, out, &own_buffer);
  if (!s.ok()) return absl::InternalError(absl::StrCat("cannot serialize the ", message.GetTypeName()));
  return absl::OkStatus();
}

// The work pool's fair-share account for a tenant's compiles.
inline std::string CompileAccount(const Tenant& tenant) {
  return absl::StrCat(tenant.name(), "/compile");
}

// A unary call: Begin, parse the request, then `fn(call, request, response)`
// (on the work pool when `offload`, else inline), then End and Finish with
// the serialized response. `fn` returns absl::Status and may set call.detail.
template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* UnaryCall(KilnService& service, grpc::CallbackServerContext* ctx,
                                    const char* method, const grpc::ByteBuffer* request_bytes,
                                    grpc::ByteBuffer* response_bytes, bool offload, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  KilnService::Call call;
  auto messages = std::make_shared<std::pair<Request, Response>>();
  absl::Status s =
      service.Begin(ctx, method, static_cast<int64_t>(request_bytes->Length()), call);
  if (s.ok()) {
    service.deps().metrics->ObserveRequestBytes(call.tenant->name(), method,
                                                static_cast<int64_t>(request_bytes->Length()));
  }
  if (s.ok()) s = ParseMessage(*request_bytes, messages->first, "the request");
  if (!s.ok()) {
    service.End(call, s);
    reactor->Finish(ToGrpc(s));
    return reactor;
  }
  // Offloaded calls are compiles: their own account, capped by the quota.
  const std::string account = call.tenant ? CompileAccount(*call.tenant) : "";
  const int max_compiles = call.tenant ? call.tenant->quota().max_concurrent_compiles() : 0;
  auto work = [&service, reactor, response_bytes, call = std::move(call), messages,
               fn = std::move(fn)]() mutable {
    absl::Status s = fn(call, messages->first, messages->second);
    if (s.ok()) s = SerializeMessage(messages->second, response_bytes);
    service.End(call, s);
    reactor->Finish(ToGrpc(s));
  };
  if (offload) {
    // Fair across tenants; a request's bytes stand in for its cost.
    service.deps().pool->Post(account, static_cast<double>(request_bytes->Length()),
                              max_compiles, std::move(work));
  } else {
    work();
  }
  return reactor;
}

}  // namespace kiln::server
