// Run: checked and admitted on arrival (the tenant's in-flight quota), resolved
// and compiled on the work pool's compile account when needed, then queued on
// its device's scheduler in the engine, and answered from there.
#include <algorithm>
#include <atomic>
#include <optional>
#include <cstdint>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "server/config.h"
#include "server/limits.h"
#include "server/rpc_common.h"
#include "server/run_wire.h"
#include "server/shm_run.h"

namespace kiln::server {
namespace {

// The inputs a wire graph declares (read from its Input nodes, before any
// import), so a one-shot run's inputs are checked with the same messages as
// a session's. Nullopt when a declaration is malformed: the verifier then
// names the node.
std::optional<GraphSignature> DeclaredInputs(const v1::Graph& graph) {
  GraphSignature sig;
  for (const v1::Node& n : graph.nodes()) {
    if (n.op() != v1::OP_INPUT) continue;
    if (n.outputs_size() != 1) return std::nullopt;
    const v1::TensorType& t = n.outputs(0);
    if (t.dtype() == v1::DTYPE_UNSPECIFIED || !IsKnownDType(t.dtype())) return std::nullopt;
    for (const v1::Dim& d : t.dims()) {
      if (d.kind_case() == v1::Dim::KIND_NOT_SET || (d.has_size() && d.size() < 0)) {
        return std::nullopt;
      }
    }
    sig.inputs.push_back({n.name(), t});
  }
  return sig;
}

}  // namespace

void MarkReusedReport(v1::CompileReport& report) {
  report.set_executable_cache(v1::CACHE_HIT_MEMORY);
  report.clear_stages();
  report.set_total_micros(0);
  report.add_notes("executable reused by the session");
}

namespace {

// One Run, whichever transport brought it: gRPC's Run (GrpcRunCall) or a
// run message on the shared-memory socket (SocketRunCall, server/shm_regions.h).
// Everything between the request's bytes and the response's is this one
// class: authentication aside (the transport's), every check, quota, limit,
// deadline, cancellation, metric, log line and report is the same code.
class RunCall {
 public:
  RunCall(KilnService& service, const grpc::ByteBuffer& request_bytes,
          grpc::ByteBuffer& response_bytes)
      : service_(service), request_bytes_(request_bytes), response_bytes_(response_bytes) {}
  virtual ~RunCall() = default;
  RunCall(const RunCall&) = delete;
  RunCall& operator=(const RunCall&) = delete;

  // Admits the run and starts it; it is answered (Send) here or later.
  void Start() {
    if (absl::Status s = Admit(); !s.ok()) {
      Complete(s);
      return;
    }
    if (session_ && session_->batching().enabled() && SubmitBatched()) return;
    // A session whose executable is ready goes straight to its device's
    // scheduler (which may run a short run right here, on gRPC's thread);
    // anything to resolve or compile goes to the work pool's compile account
    // first, never to a run slot.
    if (session_) {
      if (std::optional<Session::Compiled> c = session_->FindExecutable(SessionRunKey(*session_, inputs_))) {
        if (session_->value_specialized()) inputs_ = WithoutFixed(inputs_, c->fixed);
        exe_ = c->executable;
        compile_ = std::move(c->report);
        MarkReused();
        absl::Status s = BindSessionParams();
        if (s.ok()) s = StartRun(/*on_caller=*/RunOnCaller());
        if (!s.ok()) Complete(s);
        return;
      }
    }
    Tenant& t = *call_.tenant;
    service_.deps().pool->Post(CompileAccount(t), static_cast<double>(request_bytes_.Length()),
                               t.quota().max_concurrent_compiles(), [this] {
                                 absl::Status s = Prepare();
                                 if (s.ok()) s = StartRun(/*on_caller=*/false);
                                 if (!s.ok()) Complete(s);
                               });
  }

  // The client went away (or the deadline passed): a run still in its
  // device's queue is dropped at once; a running one stops between kernels.
  void CancelRun() {
    cancelled_.store(true);
    std::optional<Engine::RunTicket> ticket;
    Batcher::Ticket member;
    {
      absl::MutexLock lock(&ticket_mu_);
      ticket = ticket_;
      member = member_;
    }
    // A request in a batch leaves it (queued or running) and is answered
    // now; the others go on.
    if (member && Batcher::Leave(member)) {
      // The client's deadline timer cancels the call (RST_STREAM) before the
      // server's own copy of the deadline, which starts when the request
      // arrives: under load by the request's transit time, tens of ms. A
      // cancel that close to the deadline is the deadline.
      Complete(absl::Now() + absl::Milliseconds(250) >= Deadline()
                   ? absl::DeadlineExceededError("the run's deadline passed while it was batched")
                   : absl::CancelledError("the client went away while the run was batched"));
      return;
    }
    // May answer the call (CANCELLED) on this thread; gRPC runs OnDone only
    // after OnCancel returns.
    if (ticket) service_.deps().engine->CancelQueued(*ticket);
  }

 protected:
  // The transport's part: names and authenticates the call (KilnService::
  // Begin or BeginLocal).
  virtual absl::Status BeginCall(KilnService::Call& call, int64_t request_bytes) = 0;
  virtual absl::Time Deadline() const = 0;
  // The status the call ends with, from the run's (a transport may say more).
  virtual absl::Status Outcome(absl::Status s) const { return s; }
  // Answers the call with `s` and, when OK, response_bytes_; the last use of
  // `this` (it may be gone after).
  virtual void Send(const absl::Status& s) = 0;
  // The most output bytes the answer may carry in the response (0: no
  // limit). A run whose outputs as bytes would pass it is refused before it
  // runs, with a message starting "nothing ran: ".
  virtual int64_t MaxResponseOutputBytes() const { return 0; }
  // True when the thread that starts the call only waits for its answer (the
  // shared-memory socket's connection thread): a run up to
  // kMaxSocketCallOnCallerMicros then runs on it when its device is idle.
  virtual bool RunOnCaller() const { return false; }

  const KilnService::Call& call() const { return call_; }
  const grpc::ByteBuffer& response_bytes() const { return response_bytes_; }

 private:
  absl::Status Admit() {
    const ServiceDeps& d = service_.deps();
    KILN_RETURN_IF_ERROR(BeginCall(call_, static_cast<int64_t>(request_bytes_.Length())));
    d.metrics->ObserveRequestBytes(call_.tenant->name(), call_.method,
                                   static_cast<int64_t>(request_bytes_.Length()));
    // Large tensors land in aligned memory the engine reads in place.
    KILN_RETURN_IF_ERROR(ParseRunRequest(request_bytes_, *wire_));
    const bool has_session = !request_->session_id().empty();
    const bool has_graph = request_->has_graph() &&
                           request_->graph().kind_case() != v1::GraphSource::KIND_NOT_SET;
    if (has_session && has_graph) {
      return absl::InvalidArgumentError(
          "set session_id (a session's run) or graph (a one-shot run), not both");
    }
    if (request_->options().has_batching()) {
      return absl::InvalidArgumentError(
          "options.batching is a session's: set it in CreateSession's options, not Run's");
    }
    if (!has_session && !has_graph) {
      return absl::InvalidArgumentError(
          "nothing to run: set session_id (a session's run) or graph (a one-shot run)");
    }
    KILN_ASSIGN_OR_RETURN(inputs_, CheckNamedTensors(request_->inputs(), d.config->limits(),
                                                     "input", wire_->input_data,
                                                     /*allow_shm=*/true));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<RunShm> shm,
                          RunShm::Bind(*request_, inputs_, d.shm, *call_.tenant));
    shm_ = std::move(shm);
    KILN_ASSIGN_OR_RETURN(params_, CheckNamedTensors(request_->params(), d.config->limits(),
                                                     "param", wire_->param_data));
    if (has_session) {
      if (!params_.empty()) {
        return absl::InvalidArgumentError(
            "a session's run takes inputs only: bind params with CreateSession or SetParams");
      }
      KILN_ASSIGN_OR_RETURN(session_, d.sessions->Find(*call_.tenant, request_->session_id()));
      call_.detail = absl::StrCat("session=", session_->id());
      KILN_RETURN_IF_ERROR(CheckInputsAgainst(session_->signature(), inputs_));
    }
    // The tenant's in-flight quota: compiling, queued or running.
    KILN_RETURN_IF_ERROR(call_.tenant->AcquireRun());
    holds_run_ = true;
    return absl::OkStatus();
  }

  // Hands the run to the session's batcher unless it cannot join a batch
  // (alone_reason_ then says why, and the run goes on alone). True when the
  // batcher took it.
  bool SubmitBatched() {
    const ServiceDeps& d = service_.deps();
    if (d.batcher == nullptr) return false;
    alone_reason_ = session_->inputs_batch_reason();
    if (alone_reason_.empty()) {
      alone_reason_ =
          session_->OutputsBatchReasonFor(inputs_, VerifyOptionsFrom(d.config->limits()));
    }
    if (alone_reason_.empty() && inputs_[0].dims[0] < 1) alone_reason_ = "it has no rows";
    if (!alone_reason_.empty()) return false;
    auto program = std::make_shared<Batcher::Program>();
    program->config = session_->batching();
    program->tenant = call_.tenant->name();
    program->params = session_->params();
    // One queue per program: a session on a repository model's shared params
    // batches with the tenant's other sessions on them; any other session
    // only with itself (its params are its own).
    const CompileOptions& co = session_->options();
    std::vector<TensorRef> rest = inputs_;  // the non-batch dims
    for (TensorRef& t : rest) t.dims[0] = 0;
    program->key = absl::StrCat(
        call_.tenant->name().size(), ":", call_.tenant->name(), "|",
        session_->params_shared()
            ? absl::StrCat("model ", session_->model(), " ",
                           reinterpret_cast<uintptr_t>(program->params.get()))
            : absl::StrCat("session ", session_->id()),
        "|", co.device, ",", co.prefer_common_ir, ",", co.enable_fusion, ",",
        co.transforms.SerializeAsString(), "|", program->config.max_batch, ",",
        absl::ToInt64Microseconds(program->config.max_queue_delay), "|", ShapeKey(rest));
    program->run.tenant = call_.tenant->name();
    program->run.tenant_weight = call_.tenant->weight();
    program->run.tenant_max_queue = call_.tenant->quota().max_queue();
    program->max_batch_bytes = d.config->limits().max_tensor_bytes();
    std::shared_ptr<Session> session = session_;
    program->ready = [session](const std::vector<TensorRef>& in,
                               v1::CompileReport* report) -> std::shared_ptr<Executable> {
      std::optional<Session::Compiled> c = session->FindExecutable(ShapeKey(in));
      if (!c) return nullptr;
      *report = std::move(c->report);
      MarkReusedReport(*report);
      return c->executable;
    };
    KilnService& service = service_;
    program->compile = [&service, session](const std::vector<TensorRef>& in,
                                           v1::CompileReport* report)
        -> absl::StatusOr<std::shared_ptr<Executable>> {
      bool reused = false;
      KILN_ASSIGN_OR_RETURN(Session::Compiled c, SessionExecutable(service, *session, in, &reused));
      *report = std::move(c.report);
      if (reused) MarkReusedReport(*report);
      return c.executable;
    };
    program->compile_account = CompileAccount(*call_.tenant);
    program->max_compiles = call_.tenant->quota().max_concurrent_compiles();

    Batcher::Request r;
    r.inputs = inputs_;
    r.keep_alive = request_;
    if (shm_) {  // the inputs' regions too
      r.keep_alive = std::make_shared<
          std::pair<std::shared_ptr<v1::RunRequest>, std::shared_ptr<const RunShm>>>(request_, shm_);
    }
    r.rows = inputs_[0].dims[0];
    r.deadline = Deadline();
    r.priority = request_->priority();
    r.request_id = call_.request_id;
    r.estimated_run_micros = session_->EstimatedRunMicros(ShapeKey(inputs_)).value_or(0);
    // The answer may come before Submit returns (a batch filled by this
    // request that ran inline): kept and given below, as in StartRun.
    std::optional<absl::Status> answered_inline;
    Batcher::Ticket member;
    {
      absl::MutexLock lock(&ticket_mu_);
      submitter_.store(std::this_thread::get_id());
      inline_outcome_ = &answered_inline;
      const size_t detail_before = call_.detail.size();
      absl::StrAppend(&call_.detail, " batched");
      member = d.batcher->Submit(
          std::move(program), std::move(r),
          [this](absl::StatusOr<Batcher::Outcome> outcome) {
            if (submitter_.load() == std::this_thread::get_id()) {
              *inline_outcome_ = BuildBatchedResponse(std::move(outcome));
              return;
            }
            { absl::MutexLock wait_for_ticket(&ticket_mu_); }
            Complete(BuildBatchedResponse(std::move(outcome)));
          },
          &alone_reason_);
      submitter_.store(std::thread::id());
      inline_outcome_ = nullptr;
      member_ = member;
      // Before the lock is released: then another thread may answer the call
      // (its batch ended there) and `this` be gone.
      if (!member) call_.detail.resize(detail_before);
    }
    if (!member) return false;
    if (answered_inline) Complete(*answered_inline);
    return true;
  }

  absl::Status BuildBatchedResponse(absl::StatusOr<Batcher::Outcome> outcome) {
    if (!outcome.ok()) return BuildResponse(outcome.status());
    compile_ = std::move(outcome->compile);
    const v1::BatchInfo& b = outcome->result.report.batch();
    // Once per batch (its first request's answer): the batch's size and
    // its kernels; every request: its own wait.
    service_.deps().metrics->ObserveBatch(call_.tenant->name(), b.row_offset() == 0 ? b.batch_rows() : 0,
                                          absl::Microseconds(b.queue_wait_micros()));
    count_kernels_ = b.row_offset() == 0;
    absl::StrAppend(&call_.detail, " batch_rows=", b.batch_rows(),
                    " batch_wait_ms=", b.queue_wait_micros() / 1000);
    return BuildResponse(std::move(outcome->result));
  }

  void MarkReused() {
    call_.tenant->CountCacheOutcome(v1::CACHE_HIT_MEMORY);  // the tenant's own session
    MarkReusedReport(compile_);
  }

  // The session's params for exe_: its state set when it is stateful.
  absl::Status BindSessionParams() {
    if (!session_->stateful()) {
      params_set_ = session_->params();
      return absl::OkStatus();
    }
    KILN_ASSIGN_OR_RETURN(params_set_, StateParams(*service_.deps().engine, *session_, *exe_));
    return absl::OkStatus();
  }

  // On the work pool: resolve and compile what the run needs.
  absl::Status Prepare() {
    const ServiceDeps& d = service_.deps();
    if (cancelled_.load()) {
      return absl::Now() >= Deadline()
                 ? absl::DeadlineExceededError("the run's deadline passed before it started")
                 : absl::CancelledError("the client went away before the run started");
    }
    if (session_) {
      bool reused = false;
      KILN_ASSIGN_OR_RETURN(Session::Compiled c,
                            SessionExecutable(service_, *session_, inputs_, &reused));
      if (session_->value_specialized()) inputs_ = WithoutFixed(inputs_, c.fixed);
      exe_ = c.executable;
      compile_ = std::move(c.report);
      if (reused) MarkReused();
      return BindSessionParams();
    }
    KILN_ASSIGN_OR_RETURN(v1::Graph graph, ResolveGraph(request_->graph(), d.config->limits()));
    const CompileOptions options = ToEngineOptions(request_->options());
    // vjp, jvp and hvp add inputs (cotangent/..., tangent/...): the compiled
    // executable checks those runs' inputs instead.
    const v1::AutodiffMode mode = options.transforms.autodiff().mode();
    // vmap batches them: the same.
    const bool adds_inputs = mode == v1::AUTODIFF_VJP || mode == v1::AUTODIFF_JVP ||
                             mode == v1::AUTODIFF_HVP || options.transforms.has_vmap();
    if (std::optional<GraphSignature> declared = DeclaredInputs(graph); declared && !adds_inputs) {
      KILN_RETURN_IF_ERROR(CheckInputsAgainst(*declared, inputs_));
    }
    KILN_RETURN_IF_ERROR(CheckDevice(*d.engine, options.device));
    std::vector<std::pair<std::string, Dims>> shapes;
    for (const TensorRef& t : inputs_) shapes.emplace_back(t.name, t.dims);
    const absl::Time t0 = absl::Now();
    KILN_ASSIGN_OR_RETURN(CompileResult compiled, d.engine->Compile(graph, options, shapes));
    d.metrics->ObserveCompile(call_.tenant->name(), compiled.executable->lir().placement().chosen(),
                              compiled.report.executable_cache(), absl::Now() - t0);
    ScopeCacheReport(*d.tenants, *call_.tenant, compiled.report);
    exe_ = std::move(compiled.executable);
    compile_ = std::move(compiled.report);
    for (const TensorRef& p : params_) {
      KILN_RETURN_IF_ERROR(CheckParamAgainst(exe_->signature(), p.name, p.dtype, p.dims));
    }
    if (!params_.empty()) {
      KILN_ASSIGN_OR_RETURN(std::shared_ptr<ParamSet> p, d.engine->CreateParams(params_));
      params_set_ = std::move(p);
    }
    return absl::OkStatus();
  }

  // Hands the run to its device's scheduler; its outcome answers the call.
  // `on_caller`: this thread is the caller's, which only waits for the answer
  // (RunOnCaller), and not the work pool's.
  absl::Status StartRun(bool on_caller) {
    const ServiceDeps& d = service_.deps();
    absl::StrAppend(&call_.detail, call_.detail.empty() ? "" : " ",
                    "cache=", CacheOutcomeName(compile_.executable_cache()));
    RunOptions options;
    options.report = true;  // kept for GetReport whether or not the caller asked
    options.request_id = call_.request_id;
    options.tenant = call_.tenant->name();
    // The device's scheduler orders runs by tenant weight, then priority; the
    // run stops between kernels once the client goes away or the deadline passes.
    options.tenant_weight = call_.tenant->weight();
    options.tenant_max_queue = call_.tenant->quota().max_queue();
    options.priority = request_->priority();
    options.deadline = Deadline();
    options.cancelled = &cancelled_;
    if (on_caller) {
      const double estimate = exe_->estimated_run_micros();
      options.on_caller_when_idle = estimate > 0 && estimate <= kMaxSocketCallOnCallerMicros;
    }
    if (shm_) {
      std::vector<RunShm::OutputType> types;
      for (const GraphSignature::Entry& e : exe_->signature().outputs) {
        Dims dims;
        for (const v1::Dim& dim : e.type.dims()) dims.push_back(dim.has_size() ? dim.size() : -1);
        types.push_back({e.name, e.type.dtype(), std::move(dims)});
      }
      KILN_RETURN_IF_ERROR(shm_->PlanOutputs(types));
      options.output_destinations = shm_->Destinations();
    }
    if (const int64_t limit = MaxResponseOutputBytes(); limit > 0) {
      KILN_RETURN_IF_ERROR(CheckResponseOutputBytes(limit));
    }
    // The run may end before RunAsync returns: inline here (its outcome is
    // kept and the call answered below, after the lock), or on a device
    // thread, whose callback waits until the ticket is stored.
    std::optional<absl::Status> ran_inline;
    {
      absl::MutexLock lock(&ticket_mu_);
      submitter_.store(std::this_thread::get_id());
      inline_outcome_ = &ran_inline;
      absl::StatusOr<Engine::RunTicket> ticket = d.engine->RunAsync(
          exe_, inputs_, params_set_, options, [this](absl::StatusOr<RunResult> r) {
            if (submitter_.load() == std::this_thread::get_id()) {
              *inline_outcome_ = BuildResponse(std::move(r));
              return;
            }
            { absl::MutexLock wait_for_ticket(&ticket_mu_); }
            Complete(BuildResponse(std::move(r)));
          });
      submitter_.store(std::thread::id());
      inline_outcome_ = nullptr;
      if (!ticket.ok()) return ticket.status();
      if (ticket->id != 0) ticket_ = *ticket;
    }
    if (ran_inline) Complete(*ran_inline);
    return absl::OkStatus();
  }

  // The outputs that would come back as bytes (not planned into shared
  // memory), by the executable's signature, against `limit`.
  absl::Status CheckResponseOutputBytes(int64_t limit) const {
    int64_t total = 0;
    for (const GraphSignature::Entry& e : exe_->signature().outputs) {
      if (shm_ && shm_->Planned(e.name)) continue;
      int64_t n = ElementSize(e.type.dtype());
      for (const v1::Dim& dim : e.type.dims()) {
        if (!dim.has_size()) continue;  // not known before the run
        n = dim.size() > 0 && n > limit / dim.size() ? limit + 1 : n * dim.size();
      }
      total = std::min(limit + 1, total + n);
    }
    if (total <= limit) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "nothing ran: the run's outputs as bytes would pass ", limit,
        " bytes, what an answer on kilnd's shared-memory socket can carry (max_run_message_bytes"
        "): give shm_output_area or shm_outputs room for them, or run it over gRPC"));
  }

  absl::Status BuildResponse(absl::StatusOr<RunResult> result) {
    const ServiceDeps& d = service_.deps();
    if (!result.ok()) {
      if (session_ && result.status().code() == absl::StatusCode::kFailedPrecondition) {
        return StatusBuilder(result.status()) << "bind the session's params with SetParams";
      }
      return result.status();
    }
    v1::DispatchReport& report = result->report;
    const absl::Duration queued = absl::Microseconds(report.queue_micros());
    const absl::Duration ran = absl::Microseconds(report.run_micros());
    if (!alone_reason_.empty()) {
      report.mutable_batch()->set_alone_reason(alone_reason_);
      report.mutable_batch()->set_rows(inputs_.empty() || inputs_[0].dims.empty() ? 0 : inputs_[0].dims[0]);
      report.mutable_batch()->set_batch_rows(report.batch().rows());
      report.mutable_batch()->set_batch_requests(1);
    }
    d.metrics->ObserveRun(call_.tenant->name(), report, count_kernels_);
    CountInputBytes(report);
    *report.mutable_compile() = std::move(compile_);
    d.reports->Add(call_.tenant->name(), report);
    if (!shm_) {
      // Serialized in Complete, large ones as slices of these very buffers.
      outputs_ = std::make_shared<NamedHostTensors>(std::move(result->outputs));
    } else {
      if (result->in_destination.empty()) {
        // A batched run's outputs (split from the batch's): placed now.
        std::vector<RunShm::OutputType> types;
        for (const auto& [name, tensor] : result->outputs) {
          types.push_back({name, tensor.dtype(), tensor.dims()});
        }
        KILN_RETURN_IF_ERROR(shm_->PlanOutputs(types));
      }
      const GraphSignature* signature = exe_ ? &exe_->signature() : nullptr;
      for (size_t i = 0; i < result->outputs.size(); ++i) {
        auto& [name, tensor] = result->outputs[i];
        v1::NamedTensor* out = response_.add_outputs();
        const bool in_destination = i < result->in_destination.size() && result->in_destination[i];
        if (!in_destination) {
          shm_->Answer(name, tensor.dtype(), tensor.dims(), &tensor, out);
          continue;
        }
        // Written by the engine: the header from the executable's signature.
        Dims dims;
        DType dtype = v1::DTYPE_UNSPECIFIED;
        if (signature != nullptr && i < signature->outputs.size()) {
          dtype = signature->outputs[i].type.dtype();
          for (const v1::Dim& dim : signature->outputs[i].type.dims()) dims.push_back(dim.size());
        }
        shm_->Answer(name, dtype, dims, nullptr, out);
      }
    }
    if (request_->report()) *response_.mutable_report() = std::move(report);
    response_.set_request_id(call_.request_id);
    absl::StrAppend(&call_.detail, " queue_ms=", absl::ToDoubleMilliseconds(queued),
                    " run_ms=", absl::ToDoubleMilliseconds(ran));
    return absl::OkStatus();
  }

  // Input bytes by path: bound in place (aligned host memory on the run's
  // device: engine/runtime/program.cc binds those where they lie), copied
  // once (unaligned, or to device memory), or concatenated into a batch.
  void CountInputBytes(const v1::DispatchReport& report) {
    const ServiceDeps& d = service_.deps();
    const bool batched = report.batch().batched() && report.batch().batch_requests() > 1;
    const backend::DeviceInfo* device = nullptr;
    for (const backend::DeviceInfo* info : d.engine->Devices()) {
      if (info->id == report.placement().chosen()) device = info;
    }
    for (const TensorRef& t : inputs_) {
      std::string path = "copied";
      if (batched) {
        path = "batched";
      } else if (device != nullptr && device->host_memory &&
                 reinterpret_cast<uintptr_t>(t.data) %
                         static_cast<uintptr_t>(std::max<int64_t>(1, device->buffer_alignment)) ==
                     0) {
        path = "in_place";
      }
      d.metrics->CountRunTensorBytes(call_.tenant->name(), "input", path, t.bytes);
    }
    output_path_ = batched ? "batched" : "";
  }

  // Last use of `this` before OnDone may delete it. The in-flight slot is
  // free before the answer leaves: a client answered may submit again at once.
  void Complete(absl::Status s) {
    s = Outcome(std::move(s));
    if (s.ok()) {
      if (!outputs_) outputs_ = std::make_shared<NamedHostTensors>();
      absl::StatusOr<WireOutputBytes> sent =
          SerializeRunResponse(response_, outputs_, &response_bytes_);
      s = sent.status();
      if (sent.ok()) {
        Metrics& m = *service_.deps().metrics;
        const std::string& tenant = call_.tenant->name();
        if (!output_path_.empty()) {
          m.CountRunTensorBytes(tenant, "output", output_path_, sent->sliced + sent->copied);
        } else {
          if (sent->sliced > 0) m.CountRunTensorBytes(tenant, "output", "sliced", sent->sliced);
          if (sent->copied > 0) m.CountRunTensorBytes(tenant, "output", "copied", sent->copied);
        }
      }
    }
    // Logged and counted before the slot frees: whoever sees the tenant's
    // in-flight count drop also finds the call's log line and request count.
    service_.End(call_, s);
    if (holds_run_) {
      holds_run_ = false;
      call_.tenant->ReleaseRun();
    }
    Send(s);
  }

  KilnService& service_;
  const grpc::ByteBuffer& request_bytes_;
  grpc::ByteBuffer& response_bytes_;
  // Shared with a batch this run joins: its inputs are views into it (the
  // message, or the aligned buffers its large tensors were received into).
  std::shared_ptr<WireRunRequest> wire_ = std::make_shared<WireRunRequest>();
  std::shared_ptr<v1::RunRequest> request_{wire_, &wire_->message};
  v1::RunResponse response_;  // the report and request id; outputs_ go beside it
  std::shared_ptr<NamedHostTensors> outputs_;
  std::string output_path_;  // "batched" for a batch's split outputs
  KilnService::Call call_;
  std::vector<TensorRef> inputs_;  // views into request_
  std::vector<TensorRef> params_;
  // The request's shared memory (null: none), holding its regions mapped
  // until the call ends (shared with a batch this run joins).
  std::shared_ptr<RunShm> shm_;
  std::shared_ptr<Session> session_;
  std::shared_ptr<Executable> exe_;
  std::shared_ptr<const ParamSet> params_set_;
  v1::CompileReport compile_;
  std::atomic<bool> cancelled_ = false;
  bool holds_run_ = false;  // counted in the tenant's runs in flight
  // The thread inside RunAsync, while it is (a run that ends on it ran inline).
  std::atomic<std::thread::id> submitter_;
  std::optional<absl::Status>* inline_outcome_ = nullptr;  // StartRun's, while in RunAsync
  std::string alone_reason_;  // a batching session's run that could not join a batch: why
  bool count_kernels_ = true;  // false for a batch's requests but its first

  absl::Mutex ticket_mu_;
  std::optional<Engine::RunTicket> ticket_ ABSL_GUARDED_BY(ticket_mu_);  // queued on a device
  Batcher::Ticket member_ ABSL_GUARDED_BY(ticket_mu_);  // in the session's batcher
};

// Kiln.Run: gRPC's callback API; gRPC deletes it (OnDone) after Finish.
class GrpcRunCall final : public grpc::ServerUnaryReactor, public RunCall {
 public:
  GrpcRunCall(KilnService& service, grpc::CallbackServerContext* ctx,
              const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes)
      : RunCall(service, *request_bytes, *response_bytes), ctx_(ctx), svc_(service) {}

  void OnCancel() override { CancelRun(); }
  void OnDone() override { delete this; }

 private:
  absl::Status BeginCall(KilnService::Call& call, int64_t request_bytes) override {
    return svc_.Begin(ctx_, "Run", request_bytes, call);
  }
  absl::Time Deadline() const override {
    const auto deadline = ctx_->deadline();
    if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
    return absl::FromChrono(deadline);
  }
  void Send(const absl::Status& s) override { Finish(ToGrpc(s)); }

  grpc::CallbackServerContext* const ctx_;
  KilnService& svc_;
};

// A run message on the shared-memory socket (ShmRunRequest). Its request
// bytes are the message's `run` field in a grpc::ByteBuffer, so that it is
// parsed exactly as gRPC's (large tensors into aligned memory), and its
// response serialized as gRPC's, then sent as ShmServerMessage.run_response.
// Holds itself until it is answered; the connection's thread holds it to
// cancel it.
class SocketRunCall final : private SocketCallBuffers, public RunCall, public ShmRunCall {
 public:
  SocketRunCall(KilnService& service, ShmRunRequest r)
      : SocketCallBuffers(std::move(r.run)),
        RunCall(service, SocketCallBuffers::request, SocketCallBuffers::response),
        svc_(service), tenant_(r.tenant), deadline_(r.deadline),
        request_id_(std::move(r.request_id)), answer_(std::move(r.answer)) {}

  static std::shared_ptr<SocketRunCall> Create(KilnService& service, ShmRunRequest r) {
    auto call = std::make_shared<SocketRunCall>(service, std::move(r));
    call->self_ = call;
    return call;
  }

  void Cancel() override { CancelRun(); }

 private:
  absl::Status BeginCall(KilnService::Call& call, int64_t request_bytes) override {
    return svc_.BeginLocal(tenant_, "ShmRun", request_bytes, request_id_, call);
  }
  absl::Time Deadline() const override { return deadline_; }
  // Room for the response's other fields (report, names, headers) in a datagram.
  int64_t MaxResponseOutputBytes() const override {
    return ShmRegistry::kMaxRunMessageBytes - (int64_t{8} << 10);
  }
  bool RunOnCaller() const override { return true; }
  absl::Status Outcome(absl::Status s) const override {
    return SocketOutcome(std::move(s), deadline_, "run");
  }
  void Send(const absl::Status& s) override {
    v1::ShmServerMessage a =
        SocketAnswer(s, call().request_id, response_bytes(), &v1::ShmServerMessage::mutable_run_response);
    // The last use of `this`: the answer may let the connection's thread
    // drop its reference, and `keep` is the other.
    std::shared_ptr<SocketRunCall> keep = std::move(self_);
    std::function<void(v1::ShmServerMessage)> answer = std::move(answer_);
    answer(std::move(a));
  }

  KilnService& svc_;
  Tenant* const tenant_;
  const absl::Time deadline_;
  const std::string request_id_;
  std::function<void(v1::ShmServerMessage)> answer_;
  std::shared_ptr<SocketRunCall> self_;  // until answered
};

}  // namespace

std::string SessionRunKey(const Session& session, const std::vector<TensorRef>& inputs) {
  if (session.value_specialized()) {
    const std::shared_ptr<const ModelVersion> m = session.specialized();
    return m ? absl::StrCat("values|", ValueKey(*m, inputs), "|", ShapeKey(inputs)) : "closed";
  }
  return session.symbolic() ? ShapeKey(inputs) : "";
}

namespace {

// The key a session remembers an executable under: the training step's apart
// from the forward graph's, per shape when an input's dim is symbolic, and per
// value for a value-specialised model.
std::string SessionExecutableKey(const Session& session, const std::vector<TensorRef>& inputs,
                                 bool training) {
  return absl::StrCat(training ? "train|" : "", SessionRunKey(session, inputs));
}

}  // namespace

std::optional<Session::Compiled> RememberedSessionExecutable(const Session& session,
                                                             const std::vector<TensorRef>& inputs,
                                                             bool training) {
  std::optional<Session::Compiled> c =
      session.FindExecutable(SessionExecutableKey(session, inputs, training));
  if (c) MarkReusedReport(c->report);
  return c;
}

absl::StatusOr<Session::Compiled> SessionExecutable(KilnService& service, Session& session,
                                                    const std::vector<TensorRef>& inputs,
                                                    bool* reused, bool training) {
  const ServiceDeps& d = service.deps();
  std::string key = SessionExecutableKey(session, inputs, training);
  if (std::optional<Session::Compiled> c = session.FindExecutable(key)) {
    if (reused) *reused = true;
    return *c;
  }
  if (reused) *reused = false;
  // A value-specialised model's graph for these values (imported now, or
  // found among the model's recent imports).
  std::optional<Specialization> spec;
  if (session.value_specialized()) {
    const std::shared_ptr<const ModelVersion> m = session.specialized();
    if (m == nullptr) return absl::NotFoundError("the session was closed");
    KILN_ASSIGN_OR_RETURN(spec, SpecializeFor(*m, inputs));
    key = SessionExecutableKey(session, inputs, training);  // the value inputs may narrow
    // Its params must be the model's (by name, dtype and shape).
    KILN_ASSIGN_OR_RETURN(GraphSignature sig, d.engine->Inspect(*spec->graph));
    for (const GraphSignature::Entry& p : sig.params) {
      Dims dims;
      for (const v1::Dim& dim : p.type.dims()) dims.push_back(dim.has_size() ? dim.size() : -1);
      KILN_RETURN_IF_ERROR(CheckParamAgainst(session.signature(), p.name, p.type.dtype(), dims))
          << "model " << m->name << " version " << m->version << " imported for these values";
    }
  }
  std::vector<std::pair<std::string, Dims>> shapes;
  if (session.symbolic()) {
    for (const TensorRef& t : spec ? WithoutFixed(inputs, spec->fixed) : inputs) {
      shapes.emplace_back(t.name, t.dims);
    }
  }
  const absl::Time t0 = absl::Now();
  KILN_ASSIGN_OR_RETURN(CompileResult r,
                        d.engine->Compile(spec ? *spec->graph : session.graph(),
                                          training ? session.training_options() : session.options(),
                                          shapes));
  d.metrics->ObserveCompile(session.owner().name(), r.executable->lir().placement().chosen(),
                            r.report.executable_cache(), absl::Now() - t0);
  ScopeCacheReport(*d.tenants, session.owner(), r.report);
  Session::Compiled c{std::move(r.executable), std::move(r.report), 0, {}};
  if (spec) c.fixed = spec->fixed;
  // A training step's second buffers (its updates' new values) are its
  // training set's, charged with the set (TrainingParams), not here.
  c.arena_bytes = ArenaBytes(c.report);
  KILN_RETURN_IF_ERROR(session.owner().AcquireBytes(0, c.arena_bytes));
  if (const int64_t release = session.AddExecutable(key, c); release > 0) {
    session.owner().ReleaseBytes(0, release);
  }
  return c;
}

grpc::ServerUnaryReactor* KilnService::Run(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  auto* call = new GrpcRunCall(*this, ctx, request, response);
  call->Start();  // gRPC calls OnDone only after this handler returns
  return call;
}

std::shared_ptr<ShmRunCall> KilnService::RunOnSocket(ShmRunRequest request) {
  std::shared_ptr<SocketRunCall> call = SocketRunCall::Create(*this, std::move(request));
  call->Start();
  return call;
}

}  // namespace kiln::server
