// Compile, CreateSession, CloseSession.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "server/limits.h"
#include "server/rpc_common.h"

namespace kiln::server {
namespace {

// The graph a request names: sent (ResolveGraph), or a repository model's,
// whose version is returned in `model`.
absl::StatusOr<v1::Graph> GraphOf(const ServiceDeps& d, const v1::GraphSource& source,
                                  std::shared_ptr<const ModelVersion>* model) {
  if (!source.has_model()) return ResolveGraph(source, d.config->limits());
  if (d.models == nullptr) {
    return absl::FailedPreconditionError(
        "graph.model names a repository model, but this kilnd has no model repository "
        "(start it with --model_repository=DIR)");
  }
  KILN_ASSIGN_OR_RETURN(*model, d.models->Acquire(source.model().name(), source.model().version()));
  return (*model)->graph;
}

// A new session's dynamic batching: its options', else its model's config
// (checked at start), else off.
absl::StatusOr<BatchingConfig> SessionBatching(const ServiceDeps& d,
                                               const v1::CreateSessionRequest& request,
                                               const ModelVersion* model) {
  if (request.options().has_batching()) {
    return ToBatchingConfig(request.options().batching(), "options.batching");
  }
  if (model == nullptr) return BatchingConfig{};
  const auto& models = d.config->model_repository().models();
  for (int i = 0; i < models.size(); ++i) {
    if (models[i].name() != model->name) continue;
    return ToBatchingConfig(models[i].batching(),
                            absl::StrCat("model_repository.models[", i, "].batching"));
  }
  return BatchingConfig{};
}

}  // namespace

grpc::ServerUnaryReactor* KilnService::Compile(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* request_bytes,
                                               grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::CompileRequest, v1::CompileResponse>(
      *this, ctx, "Compile", request_bytes, response_bytes, /*offload=*/true,
      [this](Call& call, const v1::CompileRequest& request,
             v1::CompileResponse& response) -> absl::Status {
    const ServiceDeps& d = deps();
    std::shared_ptr<const ModelVersion> model;
    KILN_ASSIGN_OR_RETURN(v1::Graph graph, GraphOf(d, request.graph(), &model));
    if (model && model->specializer) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model ", model->name, " version ", model->version,
          " is value-specialised (its shapes depend on input values): it compiles per value on a "
          "session's runs; open a session on it and Run"));
    }
    if (request.options().has_batching()) {
      return absl::InvalidArgumentError(
          "options.batching is a session's: set it in CreateSession's options, not Compile's");
    }
    const CompileOptions options = ToEngineOptions(request.options());
    KILN_RETURN_IF_ERROR(CheckDevice(*d.engine, options.device));
    KILN_ASSIGN_OR_RETURN(GraphSignature sig, d.engine->Inspect(graph));
    std::vector<std::pair<std::string, Dims>> shapes;
    for (const v1::InputShape& s : request.input_shapes()) {
      const std::string what = absl::StrCat("input_shapes ", QuoteClientString(s.name()));
      bool known = false;
      for (const auto& in : sig.inputs) known = known || in.name == s.name();
      if (!known) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " names no input of the graph; its inputs: ", InputList(sig)));
      }
      Dims dims(s.dims().begin(), s.dims().end());
      // Shapes are checked like tensors (any dtype of the input will do).
      for (const auto& in : sig.inputs) {
        if (in.name != s.name()) continue;
        KILN_RETURN_IF_ERROR(
            CheckTensorHeader(in.type.dtype(), dims, d.config->limits(), what).status());
      }
      shapes.emplace_back(s.name(), std::move(dims));
    }
    bool symbolic = false;
    for (const auto& in : sig.inputs) {
      for (const v1::Dim& dim : in.type.dims()) symbolic = symbolic || !dim.has_size();
    }
    if (symbolic && shapes.empty()) {  // verify only
      SignatureToProto(sig, response.mutable_signature());
      call.detail = "verified";
      return absl::OkStatus();
    }
    const absl::Time t0 = absl::Now();
    KILN_ASSIGN_OR_RETURN(CompileResult compiled, d.engine->Compile(graph, options, shapes));
    d.metrics->ObserveCompile(call.tenant->name(), compiled.executable->lir().placement().chosen(),
                              compiled.report.executable_cache(), absl::Now() - t0);
    ScopeCacheReport(*d.tenants, *call.tenant, compiled.report);
    SignatureToProto(compiled.executable->signature(), response.mutable_signature());
    response.set_executable_key(compiled.executable->key());
    *response.mutable_report() = std::move(compiled.report);
    call.detail = absl::StrCat("cache=", CacheOutcomeName(response.report().executable_cache()),
                               " key=", response.executable_key().substr(0, 16));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::CreateSession(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* request_bytes,
                                                     grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::CreateSessionRequest, v1::CreateSessionResponse>(
      *this, ctx, "CreateSession", request_bytes, response_bytes, /*offload=*/true,
      [this](Call& call, const v1::CreateSessionRequest& request,
             v1::CreateSessionResponse& response) -> absl::Status {
    const ServiceDeps& d = deps();
    std::shared_ptr<const ModelVersion> model;
    KILN_ASSIGN_OR_RETURN(v1::Graph graph, GraphOf(d, request.graph(), &model));
    CompileOptions options = ToEngineOptions(request.options());
    KILN_RETURN_IF_ERROR(CheckDevice(*d.engine, options.device));
    KILN_ASSIGN_OR_RETURN(GraphSignature sig, model ? model->signature : d.engine->Inspect(graph));
    if (model && model->specializer &&
        (request.state_size() > 0 || options.transforms.has_training() ||
         options.transforms.autodiff().mode() != v1::AUTODIFF_NONE)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model->name, " version ", model->version,
          " is value-specialised (its graph is imported per input value on the runs): a session on it "
          "runs it forward only (no state bindings, training or autodiff)"));
    }
    KILN_RETURN_IF_ERROR(ApplyStateBindings(request.state(), sig, options));
    if (options.transforms.has_vmap()) {
      // A session checks its runs against the graph's own signature.
      return absl::InvalidArgumentError(
          "vmap is for one-shot runs and Compile; a session cannot take it yet");
    }
    KILN_ASSIGN_OR_RETURN(BatchingConfig batching, SessionBatching(d, request, model.get()));
    if (!options.state_updates.empty() && batching.enabled()) {
      // Each run of a stateful session reads the state the one before wrote.
      return absl::InvalidArgumentError(
          "a session with state bindings cannot batch its runs (options.batching, or its "
          "model's batching config): each run reads the state the previous one wrote");
    }
    if (options.transforms.has_training()) {
      if (options.transforms.autodiff().mode() != v1::AUTODIFF_NONE) {
        return absl::InvalidArgumentError(
            "a training session takes a training spec, not an autodiff transform");
      }
      KILN_RETURN_IF_ERROR(CheckTrainingSpec(sig, options.transforms.training()));
    }
    KILN_ASSIGN_OR_RETURN(std::vector<TensorRef> params,
                          CheckNamedTensors(request.params(), d.config->limits(), "param"));
    for (const TensorRef& p : params) {
      KILN_RETURN_IF_ERROR(CheckParamAgainst(sig, p.name, p.dtype, p.dims));
    }
    KILN_RETURN_IF_ERROR(call.tenant->AcquireSession());
    auto session = std::make_shared<Session>(SessionStore::NewId(), *call.tenant, std::move(graph),
                                             sig, options);
    if (model) session->AttachModel(std::make_unique<ModelLease>(model));
    session->SetBatching(batching, model && model->specializer
                                       ? "its model is value-specialised (each run's graph depends on its "
                                         "input values)"
                                       : InputsBatchReason(sig));
    absl::Status bound = [&]() -> absl::Status {
      if (!params.empty()) {
        int64_t bytes = 0;
        for (const TensorRef& p : params) bytes += p.bytes;
        KILN_RETURN_IF_ERROR(call.tenant->AcquireBytes(bytes, bytes));
        if (absl::Status s = BindParams(*d.engine, *session, params); !s.ok()) {
          call.tenant->ReleaseBytes(bytes, bytes);
          return s;
        }
      }
      // A graph without symbolic inputs compiles now: its errors surface here.
      if (!session->symbolic()) {
        KILN_RETURN_IF_ERROR(SessionExecutable(*this, *session, {}, nullptr).status());
        if (session->training()) {
          KILN_RETURN_IF_ERROR(SessionExecutable(*this, *session, {}, nullptr, true).status());
        }
      }
      return absl::OkStatus();
    }();
    if (!bound.ok()) {
      const Session::Charge c = session->Close();
      call.tenant->ReleaseBytes(c.param_bytes, c.device_bytes);
      call.tenant->ReleaseSession();
      return bound;
    }
    d.sessions->Add(session);
    response.set_session_id(session->id());
    SignatureToProto(sig, response.mutable_signature());
    call.detail = absl::StrCat("session=", session->id(), model ? " model=" : "", session->model());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::CloseSession(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request_bytes,
                                                    grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::CloseSessionRequest, v1::CloseSessionResponse>(
      *this, ctx, "CloseSession", request_bytes, response_bytes, /*offload=*/false,
      [this](Call& call, const v1::CloseSessionRequest& request,
             v1::CloseSessionResponse&) -> absl::Status {
    call.detail = absl::StrCat("session=", request.session_id().substr(0, 64));
    return deps().sessions->Remove(*call.tenant, request.session_id());
  });
}

}  // namespace kiln::server
