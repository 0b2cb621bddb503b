// TrainStep: one step of a training session (DESIGN.md section 9). A
// training session is CreateSession with options.transforms.training: its
// training step is one executable (engine/train/train_step.h) whose params
// and optimizer state live in a training param set on the step's device and
// are updated there by each step, with no host round trip; only the loss and
// the learning rate come back. Steps of one session run one at a time (the
// set's step lock); Run on the session runs the forward graph over the same
// params; GetParams reads the params and the optimizer state ("opt/...").
//
// TrainSteps streams many steps of one session through one call.
//
// Like Run, a step is admitted on arrival (the tenant's in-flight quota),
// prepared on the work pool's compile account (the executable, and the
// training set on the first step, whose optimizer-state bytes are charged to
// the tenant's param and device quotas), then queued on its device's
// scheduler and answered from there.
#include <deque>
#include <optional>

#include <grpc/support/time.h>
#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "engine/train/train_step.h"
#include "server/limits.h"
#include "server/rpc_common.h"
#include "server/shm_run.h"
#include "server/train_stream.h"

namespace kiln::server {
namespace {

// One training step of a session: admitted (inputs checked, the tenant's
// in-flight quota taken), prepared on the work pool (the executable, the
// training set), run on its device's scheduler, answered. Shared by TrainStep
// (one step a call) and TrainSteps (a stream of them). Not thread-safe: one
// step at a time, its phases in order.
class StepWork {
 public:
  StepWork(KilnService& service, KilnService::Call& call) : service_(service), call_(call) {}
  ~StepWork() {
    Account();  // a step that ran counts even when its answer was never written
    ReleaseRun();
  }
  StepWork(const StepWork&) = delete;
  StepWork& operator=(const StepWork&) = delete;

  // Parses `bytes` as a TrainStepRequest for `session` (found from the
  // request's session_id when null) and admits the step.
  absl::Status Admit(const grpc::ByteBuffer& bytes, std::shared_ptr<Session> session) {
    const ServiceDeps& d = service_.deps();
    KILN_RETURN_IF_ERROR(ParseMessage(bytes, request_, "the request"));
    KILN_ASSIGN_OR_RETURN(inputs_, CheckNamedTensors(request_.inputs(), d.config->limits(),
                                                     "input", {}, /*allow_shm=*/true));
    // The batch may sit in the tenant's shared memory (as Run's inputs do):
    // bound here, held until the step is answered.
    KILN_ASSIGN_OR_RETURN(shm_, RunShm::BindInputs(request_.inputs(), inputs_, d.shm,
                                                   *call_.tenant));
    if (!session) {
      KILN_ASSIGN_OR_RETURN(session, d.sessions->Find(*call_.tenant, request_.session_id()));
    } else if (!request_.session_id().empty() && request_.session_id() != session->id()) {
      return absl::InvalidArgumentError(absl::StrCat("a TrainSteps stream trains one session (\"",
                                                     session->id(), "\"); a message names ",
                                                     QuoteClientString(request_.session_id())));
    }
    session_ = std::move(session);
    if (!session_->training()) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", session_->id(),
                       " is not a training session: create it with options.transforms.training"));
    }
    KILN_RETURN_IF_ERROR(CheckInputsAgainst(session_->signature(), inputs_));
    return absl::OkStatus();
  }

  // Takes the tenant's in-flight quota for the step (held until it is
  // answered). REQUIRES: Admit succeeded.
  absl::Status Acquire() {
    KILN_RETURN_IF_ERROR(call_.tenant->AcquireRun());
    holds_run_ = true;
    start_ = absl::Now();
    return absl::OkStatus();
  }

  // Takes the session's remembered training executable and its training
  // set when both exist (every step after the first): then nothing needs the
  // work pool, and the step goes from gRPC's thread straight to its device's
  // scheduler (one cross-thread wake fewer per step). False: Prepare.
  bool PrepareIfReady() {
    std::shared_ptr<ParamSet> params = session_->params();
    if (!params || !params->training()) return false;
    std::optional<Session::Compiled> c = RememberedSessionExecutable(*session_, inputs_, true);
    if (!c) return false;
    exe_ = std::move(c->executable);
    compile_ = std::move(c->report);
    params_ = std::move(params);
    return true;
  }

  // On the work pool.
  absl::Status Prepare() {
    bool reused = false;
    KILN_ASSIGN_OR_RETURN(Session::Compiled c,
                          SessionExecutable(service_, *session_, inputs_, &reused, true));
    exe_ = c.executable;
    compile_ = std::move(c.report);
    // The compile stages are the first step's: not copied into every report.
    if (reused) MarkReusedReport(compile_);
    KILN_ASSIGN_OR_RETURN(params_, TrainingParams(*service_.deps().engine, *session_, *exe_));
    return absl::OkStatus();
  }

  // Queues the step; `done` gets its outcome (the response filled) exactly
  // once, maybe before this returns, unless this returns an error. With
  // `account`, the step is accounted (Account) before `done`; else the
  // caller does it before writing the answer. With `on_caller` (the calling
  // thread would only wait for the answer: the shared-memory socket's
  // connection thread), a step the cost model puts at most
  // kMaxSocketCallOnCallerMicros runs on this thread when its device is idle
  // (RunOptions::on_caller_when_idle): no hand-off to the device's thread
  // and back. Longer ones still go to the device's thread, where a client's
  // hang-up or kilnd's shutdown stops them between kernels.
  absl::Status Start(absl::Time deadline, const std::atomic<bool>* cancelled, bool account,
                     std::function<void(absl::Status)> done, bool on_caller = false) {
    RunOptions options;
    const double estimate = exe_->estimated_run_micros();
    options.on_caller_when_idle =
        on_caller && estimate > 0 && estimate <= kMaxSocketCallOnCallerMicros;
    options.report = true;
    options.request_id = call_.request_id;
    options.tenant = call_.tenant->name();
    options.tenant_weight = call_.tenant->weight();
    options.tenant_max_queue = call_.tenant->quota().max_queue();
    options.deadline = deadline;
    options.cancelled = cancelled;
    return service_.deps()
        .engine
        ->RunAsync(exe_, inputs_, params_, options,
                   [this, account, done = std::move(done)](absl::StatusOr<RunResult> r) {
                     absl::Status s = Finish(std::move(r));
                     if (account) Account();
                     ReleaseRun();
                     done(s);
                   })
        .status();
  }

  const std::shared_ptr<Session>& session() const { return session_; }
  const v1::TrainStepResponse& response() const { return response_; }
  // Counts a step that ran in the tenant's metrics and keeps its dispatch
  // report (GetReport); once, before its answer is written. A TrainSteps
  // stream does it on gRPC's thread, not between the device's steps.
  void Account() {
    if (!finished_ || accounted_) return;
    accounted_ = true;
    const ServiceDeps& d = service_.deps();
    d.metrics->ObserveRun(call_.tenant->name(), report_);
    d.metrics->ObserveTrainStep(call_.tenant->name(), took_);
    d.reports->Add(call_.tenant->name(), std::move(report_));
  }
  void ReleaseRun() {
    if (!holds_run_) return;
    holds_run_ = false;
    call_.tenant->ReleaseRun();
  }

 private:
  // On the thread that ended the run: the answer (loss, lr, step). The
  // step's metrics and report wait for Account.
  absl::Status Finish(absl::StatusOr<RunResult> result) {
    KILN_RETURN_IF_ERROR(result.status());
    took_ = absl::Now() - start_;
    report_ = std::move(result->report);
    *report_.mutable_compile() = std::move(compile_);
    response_.Clear();
    for (const auto& [name, tensor] : result->outputs) {
      if (name == session_->training()->loss()) response_.set_loss(tensor.GetAsDouble(0));
      if (name == train::kLrOutput) response_.set_lr(tensor.GetAsDouble(0));
    }
    KILN_ASSIGN_OR_RETURN(HostTensor step, params_->Read(train::kStepParam));
    response_.set_step(static_cast<int64_t>(step.GetAsDouble(0)));
    if (request_.report()) *response_.mutable_report() = report_;
    response_.set_request_id(call_.request_id);
    finished_ = true;
    return absl::OkStatus();
  }

  KilnService& service_;
  KilnService::Call& call_;
  v1::TrainStepRequest request_;
  v1::TrainStepResponse response_;
  std::vector<TensorRef> inputs_;  // views into request_ or shm_'s regions
  std::unique_ptr<RunShm> shm_;    // the batch's shared memory; null when in the request
  std::shared_ptr<Session> session_;
  std::shared_ptr<Executable> exe_;
  std::shared_ptr<ParamSet> params_;
  v1::CompileReport compile_;
  v1::DispatchReport report_;  // the run's, from Finish until Account
  absl::Duration took_;        // queue + run
  bool finished_ = false;      // Finish succeeded: the step ran
  bool accounted_ = false;
  bool holds_run_ = false;  // counted in the tenant's runs in flight
  absl::Time start_;
};

absl::Time DeadlineOf(const grpc::CallbackServerContext* ctx) {
  const auto deadline = ctx->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

absl::Status NotStarted(const grpc::CallbackServerContext* ctx) {
  return absl::Now() >= DeadlineOf(ctx)
             ? absl::DeadlineExceededError("the step's deadline passed before it started")
             : absl::CancelledError("the client went away before the step started");
}

// One TrainStep, whichever transport brought it: gRPC's TrainStep
// (TrainStepReactor) or a train_step message on kilnd's shared-memory socket
// (SocketTrainStepCall, server/shm_regions.h), as RunCall is for Run.
// Authentication aside (the transport's), every check, quota, deadline,
// cancellation, metric, log line and report is this code.
class TrainStepCall {
 public:
  TrainStepCall(KilnService& service, const grpc::ByteBuffer& request_bytes,
                grpc::ByteBuffer& response_bytes)
      : service_(service), request_bytes_(request_bytes), response_bytes_(response_bytes),
        step_(service, call_) {}
  virtual ~TrainStepCall() = default;
  TrainStepCall(const TrainStepCall&) = delete;
  TrainStepCall& operator=(const TrainStepCall&) = delete;

  // Admits the step and starts it; it is answered (Send) here or later.
  void Start() {
    const auto bytes = static_cast<int64_t>(request_bytes_.Length());
    absl::Status s = BeginCall(call_, bytes);
    if (s.ok()) {
      service_.deps().metrics->ObserveRequestBytes(call_.tenant->name(), call_.method, bytes);
      s = step_.Admit(request_bytes_, nullptr);
    }
    if (s.ok()) s = step_.Acquire();
    if (step_.session()) call_.detail = absl::StrCat("session=", step_.session()->id());
    if (!s.ok()) {
      Complete(s);
      return;
    }
    if (step_.PrepareIfReady()) {
      // On success the step's outcome answers the call, maybe already (on
      // this thread when StepOnCaller).
      s = step_.Start(Deadline(), &cancelled_, true, [this](absl::Status r) { Complete(r); },
                      StepOnCaller());
      if (!s.ok()) Complete(s);
      return;
    }
    Tenant& t = *call_.tenant;
    service_.deps().pool->Post(
        CompileAccount(t), static_cast<double>(bytes), t.quota().max_concurrent_compiles(),
        [this] {
          absl::Status s = cancelled_.load() ? NotStarted() : step_.Prepare();
          // On success the step's outcome answers the
          // call, maybe already: `this` may be gone.
          if (s.ok()) {
            s = step_.Start(Deadline(), &cancelled_, true,
                            [this](absl::Status r) { Complete(r); });
          }
          if (!s.ok()) Complete(s);
        });
  }

  // The client went away (or the deadline passed): a step still queued is
  // not run; a running one stops between kernels (its params unchanged).
  void CancelStep() { cancelled_.store(true); }

 protected:
  // The transport's part: names and authenticates the call (KilnService::
  // Begin or BeginLocal).
  virtual absl::Status BeginCall(KilnService::Call& call, int64_t request_bytes) = 0;
  virtual absl::Time Deadline() const = 0;
  // Whether the thread that calls Start only waits for the answer after it
  // (StepWork::Start's `on_caller`): not gRPC's threads, which serve others.
  virtual bool StepOnCaller() const { return false; }
  // The status the call ends with, from the step's (a transport may say more).
  virtual absl::Status Outcome(absl::Status s) const { return s; }
  // Answers the call with `s` and, when OK, response_bytes(); the last use
  // of `this` (it may be gone after).
  virtual void Send(const absl::Status& s) = 0;

  const KilnService::Call& call() const { return call_; }
  grpc::ByteBuffer& response_bytes() { return response_bytes_; }

 private:
  absl::Status NotStarted() const {
    return absl::Now() >= Deadline()
               ? absl::DeadlineExceededError("the step's deadline passed before it started")
               : absl::CancelledError("the client went away before the step started");
  }

  // Last use of `this` before the transport may delete it.
  void Complete(absl::Status s) {
    s = Outcome(std::move(s));
    if (s.ok()) {
      s = SerializeMessage(step_.response(), &response_bytes_);
      absl::StrAppend(&call_.detail, " step=", step_.response().step(),
                      " loss=", step_.response().loss());
    }
    service_.End(call_, s);
    step_.ReleaseRun();
    Send(s);
  }

  KilnService& service_;
  const grpc::ByteBuffer& request_bytes_;
  grpc::ByteBuffer& response_bytes_;
  KilnService::Call call_;
  StepWork step_;
  std::atomic<bool> cancelled_ = false;
};

class TrainStepReactor final : public grpc::ServerUnaryReactor, public TrainStepCall {
 public:
  TrainStepReactor(KilnService& service, grpc::CallbackServerContext* ctx,
                   const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes)
      : TrainStepCall(service, *request_bytes, *response_bytes), service_(service), ctx_(ctx) {}

  void OnCancel() override { CancelStep(); }
  void OnDone() override { delete this; }

 private:
  absl::Status BeginCall(KilnService::Call& call, int64_t request_bytes) override {
    return service_.Begin(ctx_, "TrainStep", request_bytes, call);
  }
  absl::Time Deadline() const override { return DeadlineOf(ctx_); }
  void Send(const absl::Status& s) override { Finish(ToGrpc(s)); }

  KilnService& service_;
  grpc::CallbackServerContext* const ctx_;
};

// A train_step message on the shared-memory socket (ShmRunRequest with
// train_step): its request bytes in a grpc::ByteBuffer, parsed as gRPC's
// are; its response serialized as gRPC's, then sent as
// ShmServerMessage.train_step_response. Holds itself until it is answered;
// the connection's thread holds it to cancel it.
class SocketTrainStepCall final : private SocketCallBuffers,
                                  public TrainStepCall,
                                  public ShmRunCall {
 public:
  SocketTrainStepCall(KilnService& service, ShmRunRequest r)
      : SocketCallBuffers(std::move(r.run)),
        TrainStepCall(service, SocketCallBuffers::request, SocketCallBuffers::response),
        svc_(service), tenant_(r.tenant), deadline_(r.deadline),
        request_id_(std::move(r.request_id)), answer_(std::move(r.answer)) {}

  static std::shared_ptr<SocketTrainStepCall> Create(KilnService& service, ShmRunRequest r) {
    auto call = std::make_shared<SocketTrainStepCall>(service, std::move(r));
    call->self_ = call;
    return call;
  }

  void Cancel() override { CancelStep(); }

 private:
  absl::Status BeginCall(KilnService::Call& call, int64_t request_bytes) override {
    return svc_.BeginLocal(tenant_, "ShmTrainStep", request_bytes, request_id_, call);
  }
  absl::Time Deadline() const override { return deadline_; }
  // The connection's thread waits for this answer (ShmRegistry::RunMessage)
  // and reads the connection's next message only after it.
  bool StepOnCaller() const override { return true; }
  absl::Status Outcome(absl::Status s) const override {
    return SocketOutcome(std::move(s), deadline_, "step");
  }
  void Send(const absl::Status& s) override {
    v1::ShmServerMessage a =
        SocketAnswer(s, call().request_id, response_bytes(), &v1::ShmServerMessage::mutable_train_step_response);
    // The last use of `this`: the answer may let the connection's thread
    // drop its reference, and `keep` is the other.
    std::shared_ptr<SocketTrainStepCall> keep = std::move(self_);
    std::function<void(v1::ShmServerMessage)> answer = std::move(answer_);
    answer(std::move(a));
  }

  KilnService& svc_;
  Tenant* const tenant_;
  const absl::Time deadline_;
  const std::string request_id_;
  std::function<void(v1::ShmServerMessage)> answer_;
  std::shared_ptr<SocketTrainStepCall> self_;  // until answered
};

// TrainSteps: a stream of steps of one session. Steps run one at a time and
// are answered in order, each holding the tenant's in-flight quota while it
// runs; the first failed step (or refused message) ends the call with its
// status after the steps before it were answered (they stay applied).
//
// Pipelined: while step N runs, message N+1 is read and checked, and when N
// ends N+1 is started right there, on the thread that ended N (the
// device's); N's answer, the read of N+2 and the call's end are handed to one
// of gRPC's threads (server/train_stream.h says why), so the device goes from
// step to step without waiting for the write, the read or the parse. At most
// one step runs and one more waits.
//
// Threads: gRPC's reactions (OnReadDone, OnWriteDone) and hand-offs, the
// device thread that ends a step, and the work pool (a step whose executable
// is not ready) all change the stream's state under its lock, and one of
// them at a time (the pump) turns the state into actions.
class TrainStepsReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  TrainStepsReactor(KilnService& service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx), stream_(std::make_shared<Stream>()) {
    if (absl::Status s = service_.Begin(ctx, "TrainSteps", 0, call_); !s.ok()) {
      {
        absl::MutexLock lock(&stream_->mu);
        stream_->ended = true;
      }
      absl::StrAppend(&call_.detail, " steps=0");
      service_.End(call_, s);
      Finish(ToGrpc(s));
      return;
    }
    {
      absl::MutexLock lock(&stream_->mu);
      stream_->reading = true;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    std::unique_ptr<StepWork> step;
    absl::Status s;
    if (ok) {  // checked outside the lock: a step may be running meanwhile
      const int64_t bytes = static_cast<int64_t>(in_.Length());
      step = std::make_unique<StepWork>(service_, call_);
      s = call_.tenant->CheckRequestBytes(bytes, "TrainSteps message");
      if (s.ok()) {
        service_.deps().metrics->ObserveRequestBytes(call_.tenant->name(), "TrainSteps", bytes);
        s = step->Admit(in_, session_);
      }
      if (s.ok() && !session_) {  // the first message: nothing runs or ends meanwhile
        session_ = step->session();
        call_.detail = absl::StrCat("session=", session_->id());
      }
    }
    const bool cancelled = !ok && ctx_->IsCancelled();
    Update([&](Stream& st) {
      st.reading = false;
      if (st.ended || st.failed) return;  // a message past the end: dropped
      if (!ok) {
        st.reads_done = true;
        if (cancelled) st.failed = absl::CancelledError("the client went away");
        return;
      }
      const int64_t index = ++st.received;
      if (!s.ok()) {
        st.failed = absl::Status(StatusBuilder(s) << "at step " << index << " of the stream");
        st.failed_index = index;
        return;
      }
      st.next = std::move(step);
      st.next_index = index;
    });
  }

  void OnWriteDone(bool ok) override {
    Update([&](Stream& st) {
      st.writing = false;
      st.answers.pop_front();
      if (ok) return;
      st.broken = true;
      st.answers.clear();
      if (!st.failed) st.failed = absl::CancelledError("the client stopped reading the answers");
    });
  }

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }

 private:
  // Shared with the callbacks of its running step so that it outlives the
  // reactor (which gRPC deletes once the call is finished).
  using Stream = TrainStream<StepWork>;
  using Action = Stream::Action;
  using Thread = Stream::Thread;

  // Applies `change` to the state (on a gRPC thread), then pumps unless
  // another thread does (that one sees the change). Touches nothing of the
  // reactor after the state's lock is released unless this thread became
  // the pump.
  template <typename Change>
  void Update(Change change) {
    const std::shared_ptr<Stream> st = stream_;
    {
      absl::MutexLock lock(&st->mu);
      change(*st);
      if (st->pumping || st->ended) return;
      st->pumping = true;
    }
    Pump(Thread::kGrpc);
  }

  // The running step ended (on its device's thread, the work pool, or inline
  // in Start on the pump's own thread).
  static void StepEnded(TrainStepsReactor* self, const std::shared_ptr<Stream>& st,
                        absl::Status outcome) {
    {
      absl::MutexLock lock(&st->mu);
      st->running_outcome = std::move(outcome);
      if (st->pumping || st->ended) return;
      st->pumping = true;
    }
    self->Pump(Thread::kStepEnded);  // alive: the call does not end while a step runs
  }

  // REQUIRES: this thread set `pumping` (which a hand-off passes on to the
  // gRPC thread that pumps next, so the call cannot end meanwhile).
  void Pump(Thread thread) {
    const std::shared_ptr<Stream> st = stream_;
    for (;;) {
      Action action = Action::kNone;
      StepWork* start = nullptr;
      Stream::Answer* write = nullptr;
      absl::Status end;
      {
        absl::MutexLock lock(&st->mu);
        action = st->NextLocked(thread, start, write, end, call_.detail);
        if (action == Action::kNone) {
          st->pumping = false;
          return;
        }
      }
      switch (action) {
        case Action::kStart:
          StartStep(st, *start);
          break;
        case Action::kWrite:
          // The step's metrics and report before its answer, off the device.
          write->step->Account();
          StartWrite(&write->bytes);
          break;
        case Action::kRead:
          in_.Clear();
          StartRead(&in_);
          break;
        case Action::kEnd:
          service_.End(call_, end);
          Finish(ToGrpc(end));
          return;  // the reactor may be gone; `pumping` stays set
        case Action::kHandOff:
          // Onto gRPC's executor: an alarm due now runs its callback there.
          // Only the pump touches hand_off_, and the one before has fired.
          hand_off_ = std::make_unique<grpc::Alarm>();
          hand_off_->Set(gpr_now(GPR_CLOCK_MONOTONIC), [this](bool) { Pump(Thread::kGrpc); });
          return;
        case Action::kNone:
          break;
      }
    }
  }

  // Starts `step` (st->running): straight to its device's scheduler when its
  // executable is ready, else prepared on the work pool first. Its outcome
  // comes back through StepEnded, maybe before this returns.
  void StartStep(const std::shared_ptr<Stream>& st, StepWork& step) {
    auto ended = [this, st](absl::Status r) { StepEnded(this, st, std::move(r)); };
    absl::Status s = step.Acquire();
    if (s.ok() && step.PrepareIfReady()) {
      s = step.Start(DeadlineOf(ctx_), &cancelled_, false, ended);
    } else if (s.ok()) {
      Tenant& t = *call_.tenant;
      service_.deps().pool->Post(CompileAccount(t), 1, t.quota().max_concurrent_compiles(),
                                 [this, &step, ended] {
                                   absl::Status s =
                                       cancelled_.load() ? NotStarted(ctx_) : step.Prepare();
                                   if (s.ok()) {
                                     s = step.Start(DeadlineOf(ctx_), &cancelled_, false, ended);
                                   }
                                   if (!s.ok()) ended(s);
                                 });
      return;
    }
    if (!s.ok()) ended(s);
  }

  KilnService& service_;
  grpc::CallbackServerContext* const ctx_;
  KilnService::Call call_;
  grpc::ByteBuffer in_;  // the message being read
  std::shared_ptr<Session> session_;  // set by the first message
  const std::shared_ptr<Stream> stream_;
  std::unique_ptr<grpc::Alarm> hand_off_;  // the last hand-off to gRPC's executor
  std::atomic<bool> cancelled_ = false;
};

}  // namespace

absl::Status CheckTrainingSpec(const GraphSignature& signature, const v1::TrainingSpec& spec) {
  KILN_RETURN_IF_ERROR(train::ValidateOptimizer(spec.optimizer()));
  const GraphSignature::Entry* loss = nullptr;
  std::string outputs;
  for (const auto& o : signature.outputs) {
    if (o.name == spec.loss()) loss = &o;
    absl::StrAppend(&outputs, outputs.empty() ? "" : ", ", o.name);
  }
  if (loss == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training spec's loss ", QuoteClientString(spec.loss()),
        " is no output of the graph; its outputs: ", outputs.empty() ? "none" : outputs));
  }
  if (!IsFloat(loss->type.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the loss \"", spec.loss(), "\" is not a float tensor"));
  }
  for (const v1::Dim& d : loss->type.dims()) {
    if (d.has_size() && d.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the loss \"", spec.loss(), "\" must be a scalar, but it has a dim of ", d.size()));
    }
  }
  for (const std::string& p : spec.params()) {
    bool found = false;
    for (const auto& e : signature.params) found = found || e.name == p;
    if (found) continue;
    bool input = false;
    for (const auto& e : signature.inputs) input = input || e.name == p;
    return absl::InvalidArgumentError(
        input ? absl::StrCat("\"", p, "\" is an input; only params can be trained")
              : absl::StrCat("the training spec names param ", QuoteClientString(p),
                             ", which the graph does not have"));
  }
  return absl::OkStatus();
}

absl::Status ReadAllParams(const ParamSet* set, std::vector<HostTensor>& values,
                           std::vector<TensorRef>& refs) {
  const std::vector<std::string> names = set ? set->names() : std::vector<std::string>();
  values.reserve(values.size() + names.size());  // refs point into values
  for (const std::string& name : names) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, set->Read(name));
    values.push_back(std::move(t));
    refs.push_back(TensorRef::Of(name, values.back()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ParamSet>> TrainingParams(Engine& engine, Session& session,
                                                         const Executable& step) {
  absl::MutexLock lock(&session.update_mu());
  std::shared_ptr<ParamSet> current = session.params();
  if (current && current->training()) return current;
  std::vector<HostTensor> values;
  std::vector<TensorRef> refs;
  KILN_RETURN_IF_ERROR(ReadAllParams(current.get(), values, refs));
  absl::StatusOr<std::shared_ptr<ParamSet>> set = engine.CreateTrainingParams(step, refs);
  if (!set.ok()) {
    return StatusBuilder(set.status())
           << "bind the session's params with CreateSession or SetParams";
  }
  // The optimizer state is the session's from now on: charged like params.
  std::map<std::string, int64_t> bytes = session.param_bytes();
  int64_t added = 0;
  for (const auto& e : step.signature().params) {
    if (bytes.contains(e.name)) continue;
    Dims dims;
    for (const v1::Dim& d : e.type.dims()) dims.push_back(d.size());
    KILN_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(dims));
    const std::optional<int64_t> b = BytesFor(e.type.dtype(), n);
    if (!b) return absl::InternalError(absl::StrCat("param \"", e.name, "\" has no byte size"));
    bytes[e.name] = *b;
    added += *b;
  }
  // The set keeps a second buffer of each value a step updates (ParamSetImpl::
  // Spare, made by the first step; the in-place updates): device memory for
  // as long as the set is the session's, whatever executables the session
  // remembers or forgets meanwhile.
  int64_t second = 0;
  for (const v1::LirNamedSlot& u : step.lir().param_updates()) {
    second += step.lir().slots(u.slot()).bytes();
  }
  KILN_RETURN_IF_ERROR(session.owner().AcquireBytes(added, added + second))
      << "for the " << added << " bytes of optimizer state of session " << session.id()
      << " and the " << second << " bytes of the second buffers its steps update in place";
  if (absl::Status s = session.SetParams(*set, std::move(bytes), second); !s.ok()) {
    session.owner().ReleaseBytes(added, added + second);
    return s;
  }
  return *set;
}

grpc::ServerUnaryReactor* KilnService::TrainStep(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  auto* call = new TrainStepReactor(*this, ctx, request, response);
  call->Start();  // gRPC calls OnDone only after this handler returns
  return call;
}

std::shared_ptr<ShmRunCall> KilnService::TrainStepOnSocket(ShmRunRequest request) {
  std::shared_ptr<SocketTrainStepCall> call =
      SocketTrainStepCall::Create(*this, std::move(request));
  call->Start();
  return call;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KilnService::TrainSteps(
    grpc::CallbackServerContext* ctx) {
  return new TrainStepsReactor(*this, ctx);
}

}  // namespace kiln::server
