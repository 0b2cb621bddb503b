// Run: checked on arrival, admitted to the Scheduler, executed on one of its
// workers (compile cached, then the engine's run), answered from there.
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/base/status.h"
#include "server/limits.h"
#include "server/rpc_common.h"

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

class RunReactor final : public grpc::ServerUnaryReactor {
 public:
  RunReactor(KilnService& service, grpc::CallbackServerContext* ctx,
             const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes)
      : service_(service), ctx_(ctx), request_bytes_(*request_bytes),
        response_bytes_(*response_bytes) {
    {
      // Held until the job is admitted and its ticket stored: a worker that
      // starts the job at once waits here before it may finish the call.
      absl::MutexLock lock(&admit_mu_);
      if (absl::Status s = Admit(); !s.ok()) {
        Complete(s);
        return;
      }
      if (!run_inline_) return;
    }
    // A small session run with a free slot runs here, on gRPC's thread; the
    // call may be over (and `this` gone) when TryRunInline returns true.
    Scheduler& scheduler = *service_.deps().scheduler;
    if (scheduler.TryRunInline(policy_, job_)) return;
    absl::MutexLock lock(&admit_mu_);
    if (absl::Status s = Submit(); !s.ok()) Complete(s);
  }

  void OnCancel() override {
    cancelled_.store(true);
    Scheduler::Ticket ticket = 0;
    {
      absl::MutexLock lock(&admit_mu_);
      ticket = ticket_;
    }
    if (ticket != 0) service_.deps().scheduler->Cancel(ticket);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Admit() {
    const ServiceDeps& d = service_.deps();
    KILN_RETURN_IF_ERROR(
        service_.Begin(ctx_, "Run", static_cast<int64_t>(request_bytes_.Length()), call_));
    KILN_RETURN_IF_ERROR(ParseMessage(request_bytes_, request_, "the request"));
    const bool has_session = !request_.session_id().empty();
    const bool has_graph = request_.has_graph() &&
                           request_.graph().kind_case() != v1::GraphSource::KIND_NOT_SET;
    if (has_session && has_graph) {
      return absl::InvalidArgumentError(
          "set session_id (a session's run) or graph (a one-shot run), not both");
    }
    if (!has_session && !has_graph) {
      return absl::InvalidArgumentError(
          "nothing to run: set session_id (a session's run) or graph (a one-shot run)");
    }
    KILN_ASSIGN_OR_RETURN(inputs_, CheckNamedTensors(request_.inputs(), d.config->limits(), "input"));
    KILN_ASSIGN_OR_RETURN(params_, CheckNamedTensors(request_.params(), d.config->limits(), "param"));
    if (has_session) {
      if (!params_.empty()) {
        return absl::InvalidArgumentError(
            "a session's run takes inputs only: bind params with CreateSession or SetParams");
      }
      KILN_ASSIGN_OR_RETURN(session_, d.sessions->Find(*call_.tenant, request_.session_id()));
      call_.detail = absl::StrCat("session=", session_->id());
      KILN_RETURN_IF_ERROR(CheckInputsAgainst(session_->signature(), inputs_));
    }
    const Tenant& t = *call_.tenant;
    policy_ = TenantPolicy{t.name(), t.weight(), t.quota().max_in_flight(), t.quota().max_queue()};
    Scheduler::Job& job = job_;
    job.priority = request_.priority();
    job.deadline = Deadline();
    job.run = [this](absl::Duration queued) { outcome_ = Execute(queued); };
    job.finish = [this] { Complete(std::move(outcome_)); };
    job.drop = [this](absl::Status why) {
      { absl::MutexLock lock(&admit_mu_); }
      // gRPC cancels a call whose deadline passed; say which it was.
      if (why.code() == absl::StatusCode::kCancelled && absl::Now() >= Deadline()) {
        why = absl::DeadlineExceededError(
            "the run's deadline passed while it waited in the queue; it was not started");
      }
      Complete(why);
    };
    run_inline_ = session_ && SmallSessionRun();
    if (run_inline_) return absl::OkStatus();
    return Submit();
  }

  absl::Status Submit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(admit_mu_) {
    KILN_ASSIGN_OR_RETURN(ticket_, service_.deps().scheduler->Submit(policy_, std::move(job_)));
    return absl::OkStatus();
  }

  // The session already has an executable for these inputs, and the cost
  // model rates it short enough to run on gRPC's thread without holding up
  // other calls (a thread hand-off would cost more than the run).
  bool SmallSessionRun() const {
    static constexpr double kInlineRunMicros = 250;
    const std::optional<double> estimate =
        session_->EstimatedRunMicros(session_->symbolic() ? ShapeKey(inputs_) : "");
    return estimate && *estimate <= kInlineRunMicros;
  }

  absl::Time Deadline() const {
    const auto deadline = ctx_->deadline();
    if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
    return absl::FromChrono(deadline);
  }

  // The run's outcome; the scheduler's finish callback sends it.
  absl::Status Execute(absl::Duration queued) {
    { absl::MutexLock lock(&admit_mu_); }
    if (cancelled_.load() || ctx_->IsCancelled()) {
      return absl::Now() >= Deadline()
                 ? absl::DeadlineExceededError("the run's deadline passed before it started")
                 : absl::CancelledError("the client went away before the run started");
    }
    service_.deps().metrics->ObserveQueue(call_.tenant->name(), queued);
    return RunNow(queued);
  }

  absl::Status RunNow(absl::Duration queued) {
    const ServiceDeps& d = service_.deps();
    std::shared_ptr<Executable> exe;
    std::shared_ptr<ParamSet> params;
    v1::CompileReport compile;
    if (session_) {
      bool reused = false;
      KILN_ASSIGN_OR_RETURN(Session::Compiled c,
                            SessionExecutable(service_, *session_, inputs_, &reused));
      exe = c.executable;
      compile = std::move(c.report);
      if (reused) {
        compile.set_executable_cache(v1::CACHE_HIT_MEMORY);
        compile.clear_stages();
        compile.set_total_micros(0);
        compile.add_notes("executable reused by the session");
      }
      params = session_->params();
    } else {
      KILN_ASSIGN_OR_RETURN(v1::Graph graph, ResolveGraph(request_.graph(), d.config->limits()));
      if (std::optional<GraphSignature> declared = DeclaredInputs(graph)) {
        KILN_RETURN_IF_ERROR(CheckInputsAgainst(*declared, inputs_));
      }
      const CompileOptions options = ToEngineOptions(request_.options());
      KILN_RETURN_IF_ERROR(CheckDevice(*d.engine, options.device));
      std::vector<std::pair<std::string, Dims>> shapes;
      for (const TensorRef& t : inputs_) shapes.emplace_back(t.name, t.dims);
      const absl::Time t0 = absl::Now();
      KILN_ASSIGN_OR_RETURN(CompileResult compiled, d.engine->Compile(graph, options, shapes));
      d.metrics->ObserveCompile(compiled.report.executable_cache(), absl::Now() - t0);
      exe = std::move(compiled.executable);
      compile = std::move(compiled.report);
      for (const TensorRef& p : params_) {
        KILN_RETURN_IF_ERROR(CheckParamAgainst(exe->signature(), p.name, p.dtype, p.dims));
      }
      if (!params_.empty()) {
        KILN_ASSIGN_OR_RETURN(params, d.engine->CreateParams(params_));
      }
    }
    absl::StrAppend(&call_.detail, call_.detail.empty() ? "" : " ",
                    "cache=", CacheOutcomeName(compile.executable_cache()));

    RunOptions options;
    options.report = true;  // kept for GetReport whether or not the caller asked
    options.request_id = call_.request_id;
    options.tenant = call_.tenant->name();
    const absl::Time t0 = absl::Now();
    absl::StatusOr<RunResult> result = d.engine->Run(*exe, inputs_, params.get(), options);
    if (!result.ok()) {
      if (session_ && result.status().code() == absl::StatusCode::kFailedPrecondition) {
        return StatusBuilder(result.status()) << "bind the session's params with SetParams";
      }
      return result.status();
    }
    const absl::Duration ran = absl::Now() - t0;
    d.metrics->ObserveRun(call_.tenant->name(), ran);
    v1::DispatchReport& report = result->report;
    d.metrics->CountKernels(report);
    *report.mutable_compile() = std::move(compile);
    report.set_queue_micros(absl::ToDoubleMicroseconds(queued));
    report.set_start_unix_micros(absl::ToUnixMicros(absl::Now() - ran));
    d.reports->Add(call_.tenant->name(), report);
    for (auto& [name, tensor] : result->outputs) {
      v1::NamedTensor* out = response_.add_outputs();
      out->set_name(name);
      tensor.ToProto(out->mutable_tensor());
    }
    if (request_.report()) *response_.mutable_report() = std::move(report);
    response_.set_request_id(call_.request_id);
    absl::StrAppend(&call_.detail, " queue_ms=", absl::ToDoubleMilliseconds(queued),
                    " run_ms=", absl::ToDoubleMilliseconds(ran));
    return absl::OkStatus();
  }

  // Last use of `this` before OnDone may delete it.
  void Complete(absl::Status s) {
    if (s.ok()) s = SerializeMessage(response_, &response_bytes_);
    service_.End(call_, s);
    Finish(ToGrpc(s));
  }

  KilnService& service_;
  grpc::CallbackServerContext* const ctx_;
  const grpc::ByteBuffer& request_bytes_;
  grpc::ByteBuffer& response_bytes_;
  v1::RunRequest request_;
  v1::RunResponse response_;
  KilnService::Call call_;
  std::vector<TensorRef> inputs_;  // views into request_
  std::vector<TensorRef> params_;
  std::shared_ptr<Session> session_;
  std::atomic<bool> cancelled_ = false;
  absl::Status outcome_;  // set by the scheduler's run, sent by its finish
  TenantPolicy policy_;
  Scheduler::Job job_;       // until handed to the scheduler
  bool run_inline_ = false;  // try TryRunInline before queueing

  absl::Mutex admit_mu_;
  Scheduler::Ticket ticket_ ABSL_GUARDED_BY(admit_mu_) = 0;
};

}  // namespace

absl::StatusOr<Session::Compiled> SessionExecutable(KilnService& service, Session& session,
                                                    const std::vector<TensorRef>& inputs,
                                                    bool* reused) {
  const ServiceDeps& d = service.deps();
  const std::string key = session.symbolic() ? ShapeKey(inputs) : "";
  if (std::optional<Session::Compiled> c = session.FindExecutable(key)) {
    if (reused) *reused = true;
    return *c;
  }
  if (reused) *reused = false;
  std::vector<std::pair<std::string, Dims>> shapes;
  if (session.symbolic()) {
    for (const TensorRef& t : inputs) shapes.emplace_back(t.name, t.dims);
  }
  const absl::Time t0 = absl::Now();
  KILN_ASSIGN_OR_RETURN(CompileResult r, d.engine->Compile(session.graph(), session.options(), shapes));
  d.metrics->ObserveCompile(r.report.executable_cache(), absl::Now() - t0);
  Session::Compiled c{std::move(r.executable), std::move(r.report), 0};
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
  return new RunReactor(*this, ctx, request, response);
}

}  // namespace kiln::server
