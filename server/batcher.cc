#include "server/batcher.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/ir/verifier.h"
#include "server/limits.h"

namespace kiln::server {

absl::StatusOr<BatchingConfig> ToBatchingConfig(const v1::DynamicBatching& proto,
                                                const std::string& where) {
  BatchingConfig c;
  if (proto.max_batch() < 0 || proto.max_batch() > kMaxBatchRows) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".max_batch is ", proto.max_batch(),
                                                   "; it must be 0 or 1 (off) or 2..",
                                                   kMaxBatchRows, " rows"));
  }
  if (proto.max_queue_delay_micros() < 0 || proto.max_queue_delay_micros() > kMaxQueueDelayMicros) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".max_queue_delay_micros is ", proto.max_queue_delay_micros(), "; it must be 0 (",
        kDefaultQueueDelayMicros, ") to ", kMaxQueueDelayMicros, " microseconds"));
  }
  c.max_batch = proto.max_batch();
  if (proto.max_queue_delay_micros() > 0) {
    c.max_queue_delay = absl::Microseconds(proto.max_queue_delay_micros());
  }
  return c;
}

std::string InputsBatchReason(const GraphSignature& signature) {
  if (signature.inputs.empty()) return "the graph has no inputs";
  std::string symbol;  // the one named leading symbol, if any
  for (const GraphSignature::Entry& in : signature.inputs) {
    const auto& dims = in.type.dims();
    if (dims.empty()) return absl::StrCat("input \"", in.name, "\" is a scalar (no batch dim)");
    if (dims[0].has_size()) {
      return absl::StrCat("input \"", in.name, "\" has a fixed leading dim (", dims[0].size(),
                          "), not a symbolic batch dim");
    }
    const std::string& s = dims[0].symbol();
    if (s == "?") continue;
    if (symbol.empty()) symbol = s;
    if (s != symbol) {
      return absl::StrCat("the inputs' leading dims are different symbols (", symbol, ", ", s, ")");
    }
  }
  if (symbol.empty()) return "";
  for (const GraphSignature::Entry& in : signature.inputs) {
    for (int j = 1; j < in.type.dims_size(); ++j) {
      if (in.type.dims(j).symbol() == symbol) {
        return absl::StrCat("the batch symbol ", symbol, " also names dim ", j, " of input \"",
                            in.name, "\"");
      }
    }
  }
  return "";
}

std::string OutputsBatchReason(const v1::Graph& graph, const std::vector<TensorRef>& inputs,
                               const ir::VerifyOptions& verify) {
  for (const TensorRef& in : inputs) {
    if (in.dims.empty() || in.dims[0] != inputs[0].dims[0]) {
      return absl::StrCat("its inputs' leading dims differ (", inputs[0].name, ": ",
                          DimsToString(inputs[0].dims), ", ", in.name, ": ", DimsToString(in.dims),
                          ")");
    }
  }
  absl::StatusOr<std::unique_ptr<ir::Graph>> g = ir::ImportGraph(graph, verify);
  if (!g.ok()) return absl::StrCat("the graph does not verify: ", g.status().message());
  // Specialized for 1 and 2 rows, every output must have 1 and 2 rows and
  // otherwise the same dims: its leading dim is the batch.
  std::vector<ir::IrDims> rest;
  for (int64_t rows : {1, 2}) {
    std::unique_ptr<ir::Graph> c = (*g)->Clone();
    std::vector<std::pair<std::string, Dims>> shapes;
    for (const TensorRef& in : inputs) {
      Dims d = in.dims;
      d[0] = rows;
      shapes.emplace_back(in.name, std::move(d));
    }
    if (absl::Status s = ir::Specialize(*c, shapes, verify); !s.ok()) {
      return absl::StrCat("the graph does not specialize for ", rows, " rows: ", s.message());
    }
    for (size_t i = 0; i < c->outputs().size(); ++i) {
      const ir::GraphOutput& o = c->outputs()[i];
      const ir::Node* n = c->FindNode(o.value.node);
      if (n == nullptr) return absl::StrCat("output \"", o.name, "\" names no node");
      const ir::TensorType& t = n->type(o.value.output);
      if (t.rank() < 1 || t.dims[0] != rows) {
        return absl::StrCat("output \"", o.name, "\" is ", DimsToString(t.dims_vector()),
                            " for a batch of ", rows, ": its leading dim is not the batch");
      }
      ir::IrDims r(t.dims.begin() + 1, t.dims.end());
      if (rows == 1) {
        rest.push_back(std::move(r));
      } else if (rest[i] != r) {
        return absl::StrCat("output \"", o.name,
                            "\" changes more than its leading dim with the batch");
      }
    }
  }
  return "";
}

int64_t BatchBucketRows(int64_t rows, int64_t cap) {
  for (int64_t p = 1;; p *= 2) {  // 1, 2, 3, 4, 6, 8, 12, ...
    if (p >= rows) return std::min(p, cap);
    if (p >= 2 && p + p / 2 >= rows) return std::min(p + p / 2, cap);
  }
}

struct BatchRun;

class Batcher::Member {
 public:
  enum class State { kQueued, kRunning, kLeft, kAnswered };
  Member(std::shared_ptr<Core> c, std::shared_ptr<const Program> p, Request r, Done d)
      : core(std::move(c)), program(std::move(p)), request(std::move(r)), done(std::move(d)) {}

  const std::shared_ptr<Core> core;
  const std::shared_ptr<const Program> program;
  const Request request;
  const Done done;
  const absl::Time arrived = absl::Now();
  // Guarded by Core::mu (one mutex for every queue and member).
  State state = State::kQueued;
  std::weak_ptr<BatchRun> batch;  // while running
};

// One run of a queue's requests.
struct BatchRun {
  std::shared_ptr<const Batcher::Program> program;
  std::vector<Batcher::Ticket> members;
  std::vector<int64_t> offsets;  // each member's first row
  int64_t rows = 0;
  int64_t cap = 0;                 // the queue's: the bucket never exceeds it
  int64_t run_rows = 0;            // rows the run has: `rows` padded to a bucket
  std::vector<HostTensor> inputs;  // concatenated (none for one member: its own views)
  std::vector<TensorRef> refs;
  std::atomic<bool> cancelled = false;  // every member left
  absl::Time flushed;
  v1::CompileReport compile;
  // Guarded by Core::mu.
  int live = 0;  // members not left
  std::optional<Engine::RunTicket> ticket;
};

struct Batcher::Core : std::enable_shared_from_this<Core> {
  Core(Engine& e, WorkPool& p) : engine(e), pool(p) {}

  // Batches of a program in flight beyond which max_queue_delay sends no
  // more: one running, the next waiting on the device.
  static constexpr int kMaxInFlightForDelay = 2;

  // A program's queue, kept while it has members or batches in flight.
  struct Queue {
    std::shared_ptr<const Program> program;  // the first queued member's
    std::vector<Ticket> members;
    int64_t rows = 0;
    int64_t cap = 0;                               // rows this queue's batch may hold
    absl::Time flush_at = absl::InfiniteFuture();  // while members wait
    // Batches of this program handed on (compiling, on the device's queue
    // or running) and not yet finished. Members wait only while it is > 0:
    // a request of an idle program starts at once.
    int in_flight = 0;
  };

  Engine& engine;
  WorkPool& pool;
  absl::Mutex mu;
  absl::CondVar cv;
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<std::string, Queue> queues ABSL_GUARDED_BY(mu);
  // Batches for the batcher's thread to start: the next batch of a program
  // whose batch ended on a submitting thread (which answers its own call
  // first).
  std::vector<std::shared_ptr<BatchRun>> ready ABSL_GUARDED_BY(mu);

  // Set while this thread starts batches: a batch that ends inline (its run
  // on this very thread) leaves the next one here, so batches that keep
  // ending inline form a loop, not a recursion.
  static thread_local std::vector<std::pair<std::shared_ptr<Core>, std::shared_ptr<BatchRun>>>*
      t_pending;
  // Set inside Submit (the thread answers its own call next) and on the
  // batcher's thread (which flushes queues on time between batches): the
  // next batch of a program whose batch ended here goes to `ready`.
  static thread_local bool t_defer_next;

  // Turns a queue's members into a batch (members now running).
  std::shared_ptr<BatchRun> TakeLocked(Queue& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto b = std::make_shared<BatchRun>();
    b->program = q.program;
    b->cap = q.cap;
    for (Ticket& m : q.members) {
      b->offsets.push_back(b->rows);
      b->rows += m->request.rows;
      m->state = Member::State::kRunning;
      m->batch = b;
      b->members.push_back(std::move(m));
    }
    b->live = static_cast<int>(b->members.size());
    q.members.clear();
    q.rows = 0;
    q.flush_at = absl::InfiniteFuture();
    ++q.in_flight;
    return b;
  }

  // Starts `batches` on this thread, and the batches that end on it meanwhile
  // leave for their programs' next ones.
  void StartAll(std::vector<std::shared_ptr<BatchRun>> batches) {
    std::vector<std::pair<std::shared_ptr<Core>, std::shared_ptr<BatchRun>>> pending;
    for (auto& b : batches) pending.emplace_back(shared_from_this(), std::move(b));
    if (t_pending != nullptr) {  // an outer StartAll on this thread runs them
      for (auto& p : pending) t_pending->push_back(std::move(p));
      return;
    }
    t_pending = &pending;
    while (!pending.empty()) {
      auto [core, b] = std::move(pending.front());
      pending.erase(pending.begin());
      core->Start(std::move(b));
    }
    t_pending = nullptr;
  }

  // `b` finished (answered or failed): when no other batch of its program is
  // in flight, the requests that gathered while it ran go now as the next
  // batch.
  void Ended(const std::shared_ptr<BatchRun>& b) {
    std::shared_ptr<BatchRun> next;
    {
      absl::MutexLock lock(&mu);
      auto it = queues.find(b->program->key);
      if (it == queues.end()) return;  // the batcher stopped
      Queue& q = it->second;
      --q.in_flight;
      if (q.in_flight == 0) {
        // The program is idle: what gathered goes now, all of it.
        if (!q.members.empty()) {
          next = TakeLocked(q);
        } else {
          queues.erase(it);
        }
      } else if (!q.members.empty()) {
        // Another batch (sent on by max_batch or max_queue_delay) is still in
        // flight: the requests keep gathering until it ends, or until their
        // delay, which the batcher's thread may now apply (one in flight).
        cv.Signal();
      }
      if (next && t_defer_next) {
        ready.push_back(std::move(next));
        cv.Signal();
        return;
      }
    }
    if (next) StartAll({std::move(next)});
  }

  // The batcher's thread: flushes queues whose max_queue_delay passed, and
  // starts the batches left in `ready`.
  void TimerLoop() {
    t_defer_next = true;
    absl::MutexLock lock(&mu);
    while (!stop) {
      const absl::Time now = absl::Now();
      absl::Time next = absl::InfiniteFuture();
      std::vector<std::shared_ptr<BatchRun>> batches = std::move(ready);
      ready.clear();
      for (auto& [key, q] : queues) {
        // A queue whose program has a batch running and the next one waiting
        // on the device goes when one of them ends: a third batch would only
        // wait behind them, and the requests still coming would join it.
        if (q.members.empty() || q.in_flight >= kMaxInFlightForDelay) continue;
        if (q.flush_at <= now) {
          batches.push_back(TakeLocked(q));
        } else {
          next = std::min(next, q.flush_at);
        }
      }
      if (batches.empty()) {
        cv.WaitWithDeadline(&mu, next);
        continue;
      }
      mu.Unlock();
      StartAll(std::move(batches));
      mu.Lock();
    }
  }

  // Concatenates the inputs, padded to the batch's bucket size with copies
  // of its last row, and runs the batch (compiling its executable on the
  // work pool first when needed). A batch of one request runs its own
  // inputs, at its own size, as it would without batching.
  void Start(std::shared_ptr<BatchRun> b) {
    b->flushed = absl::Now();
    const Request& first = b->members[0]->request;
    if (b->members.size() == 1) {
      b->run_rows = b->rows;
      b->refs = first.inputs;
    } else {
      b->run_rows = BatchBucketRows(b->rows, std::max(b->cap, b->rows));
      for (const TensorRef& in : first.inputs) {
        Dims dims = in.dims;
        dims[0] = b->run_rows;
        absl::StatusOr<HostTensor> t = HostTensor::CreateUninitialized(in.dtype, dims);
        if (!t.ok()) return Finish(b, t.status());
        char* out = static_cast<char*>(t->data());
        for (const Ticket& m : b->members) {
          // Every member has the same input names and non-batch dims (the
          // queue key), so its bytes are rows x the same row size.
          for (const TensorRef& own : m->request.inputs) {
            if (own.name != in.name) continue;
            if (own.bytes > 0) std::memcpy(out, own.data, static_cast<size_t>(own.bytes));
            out += own.bytes;
          }
        }
        // The padding: copies of the last row (real data: no value the
        // graph could trip on), run and dropped.
        const int64_t row_bytes = in.bytes / first.rows;
        for (int64_t r = b->rows; r < b->run_rows && row_bytes > 0; ++r) {
          std::memcpy(out, out - row_bytes, static_cast<size_t>(row_bytes));
          out += row_bytes;
        }
        b->refs.push_back(TensorRef::Of(in.name, *t));
        b->inputs.push_back(std::move(*t));
      }
    }
    std::shared_ptr<Executable> exe = b->program->ready(b->refs, &b->compile);
    if (exe) return Run(std::move(b), std::move(exe));
    const Program& p = *b->program;
    pool.Post(p.compile_account, 1, p.max_compiles, [core = shared_from_this(), b] {
      // A pool thread compiles; the program's next batch goes to the
      // batcher's thread, not here.
      const bool defer = std::exchange(t_defer_next, true);
      absl::StatusOr<std::shared_ptr<Executable>> e = b->program->compile(b->refs, &b->compile);
      if (e.ok()) {
        core->Run(b, std::move(*e));
      } else {
        core->Finish(b, e.status());
      }
      t_defer_next = defer;
    });
  }

  void Run(std::shared_ptr<BatchRun> b, std::shared_ptr<Executable> exe) {
    RunOptions o = b->program->run;
    o.report = true;
    o.request_id = b->members[0]->request.request_id;
    o.deadline = absl::InfinitePast();
    o.priority = b->members[0]->request.priority;
    for (const Ticket& m : b->members) {
      o.deadline = std::max(o.deadline, m->request.deadline);
      o.priority = std::max(o.priority, m->request.priority);
    }
    o.cancelled = &b->cancelled;
    absl::StatusOr<Engine::RunTicket> ticket =
        engine.RunAsync(std::move(exe), b->refs, b->program->params, std::move(o),
                        [core = shared_from_this(), b](absl::StatusOr<RunResult> r) {
                          core->Finish(b, std::move(r));
                        });
    if (!ticket.ok()) return Finish(b, ticket.status());
    if (ticket->id == 0) return;
    bool cancel = false;
    {
      absl::MutexLock lock(&mu);
      b->ticket = *ticket;
      cancel = b->live == 0;
    }
    if (cancel) engine.CancelQueued(*ticket);
  }

  // Answers the batch's members, then starts its program's next batch.
  void Finish(const std::shared_ptr<BatchRun>& b, absl::StatusOr<RunResult> r) {
    Answer(b, std::move(r));
    Ended(b);
  }

  // Splits the batch's outputs and answers each member still waiting.
  void Answer(const std::shared_ptr<BatchRun>& b, absl::StatusOr<RunResult> r) {
    if (!r.ok()) {
      for (const Ticket& m : b->members) Deliver(m, r.status());
      return;
    }
    const bool split = b->members.size() > 1;
    for (const auto& [name, t] : r->outputs) {
      if (split && (t.rank() < 1 || t.dims()[0] != b->run_rows)) {
        const absl::Status s = absl::InternalError(
            absl::StrCat("the batched run's output \"", name, "\" is ", DimsToString(t.dims()),
                         ", not split by its ", b->run_rows, " batch rows"));
        for (const Ticket& m : b->members) Deliver(m, s);
        return;
      }
    }
    for (size_t i = 0; i < b->members.size(); ++i) {
      const Ticket& m = b->members[i];
      Outcome out;
      out.compile = b->compile;
      for (auto& [name, t] : r->outputs) {
        if (!split) {
          // A batch of one: its outputs are the request's own, passed on
          // without a copy (this loop runs once).
          out.result.outputs.emplace_back(name, std::move(t));
          continue;
        }
        const int64_t row_bytes = t.num_bytes() / b->run_rows;
        Dims dims = t.dims();
        dims[0] = m->request.rows;
        absl::StatusOr<HostTensor> own = HostTensor::FromBytes(
            t.dtype(), dims,
            t.bytes().substr(static_cast<size_t>(b->offsets[i] * row_bytes),
                             static_cast<size_t>(m->request.rows * row_bytes)));
        if (!own.ok()) {
          Deliver(m, own.status());
          continue;
        }
        out.result.outputs.emplace_back(name, std::move(*own));
      }
      out.result.report = r->report;
      out.result.report.set_request_id(m->request.request_id);
      v1::BatchInfo* info = out.result.report.mutable_batch();
      info->set_batched(split);
      info->set_batch_rows(b->rows);
      info->set_batch_requests(static_cast<int32_t>(b->members.size()));
      info->set_rows(m->request.rows);
      info->set_row_offset(b->offsets[i]);
      info->set_queue_wait_micros(absl::ToDoubleMicroseconds(b->flushed - m->arrived));
      Deliver(m, std::move(out));
    }
  }

  void Deliver(const Ticket& m, absl::StatusOr<Outcome> outcome) {
    {
      absl::MutexLock lock(&mu);
      if (m->state != Member::State::kRunning && m->state != Member::State::kQueued) return;
      m->state = Member::State::kAnswered;
    }
    if (outcome.ok() && absl::Now() >= m->request.deadline) {
      outcome = absl::DeadlineExceededError("the run's deadline passed while its batch ran");
    }
    m->done(std::move(outcome));
  }
};

thread_local std::vector<std::pair<std::shared_ptr<Batcher::Core>, std::shared_ptr<BatchRun>>>*
    Batcher::Core::t_pending = nullptr;
thread_local bool Batcher::Core::t_defer_next = false;

std::unique_ptr<Batcher> Batcher::Create(Engine& engine, WorkPool& pool) {
  auto b = std::unique_ptr<Batcher>(new Batcher(std::make_shared<Core>(engine, pool)));
  b->timer_ = std::thread([core = b->core_] { core->TimerLoop(); });
  return b;
}

Batcher::Batcher(std::shared_ptr<Core> core) : core_(std::move(core)) {}

Batcher::~Batcher() {
  std::vector<Ticket> left;
  {
    absl::MutexLock lock(&core_->mu);
    core_->stop = true;
    for (auto& [key, q] : core_->queues) {
      for (Ticket& m : q.members) left.push_back(std::move(m));
    }
    core_->queues.clear();
    for (const std::shared_ptr<BatchRun>& b : core_->ready) {
      for (const Ticket& m : b->members) left.push_back(m);
    }
    core_->ready.clear();
    core_->cv.Signal();
  }
  timer_.join();
  for (const Ticket& m : left) {
    core_->Deliver(m, absl::UnavailableError("kilnd is shutting down; the run was not started"));
  }
}

Batcher::Ticket Batcher::Submit(std::shared_ptr<const Program> program, Request request, Done done,
                                std::string* alone_reason) {
  const BatchingConfig& config = program->config;
  // Rows a batch may hold: max_batch, and no concatenated input over the
  // tensor bytes limit (a division: no product of client numbers to overflow).
  int64_t cap = config.max_batch;
  for (const TensorRef& in : request.inputs) {
    const int64_t row_bytes = in.bytes / request.rows;
    if (row_bytes > 0) cap = std::min(cap, program->max_batch_bytes / row_bytes);
  }
  if (request.rows > cap) {
    *alone_reason =
        request.rows > config.max_batch
            ? absl::StrCat("its ", request.rows, " rows exceed max_batch = ", config.max_batch)
            : absl::StrCat("its ", request.rows, " rows leave no room for another request's under",
                           " limits.max_tensor_bytes = ", program->max_batch_bytes);
    return nullptr;
  }
  std::vector<std::shared_ptr<BatchRun>> full;
  Ticket member;
  {
    absl::MutexLock lock(&core_->mu);
    if (core_->stop) {
      *alone_reason = "kilnd is shutting down";
      return nullptr;
    }
    const absl::Time now = absl::Now();
    auto it = core_->queues.find(program->key);
    if (it != core_->queues.end() && !it->second.members.empty() &&
        it->second.rows + request.rows > it->second.cap) {
      // No room left: the queued requests go now, this one waits for the next batch.
      full.push_back(core_->TakeLocked(it->second));
    }
    // A request of an idle program runs at once; while a batch of it is in
    // flight, requests gather until that batch ends (or max_batch rows, or
    // max_queue_delay after the first of them came).
    const bool idle = it == core_->queues.end() || it->second.in_flight == 0;
    const bool opens = it == core_->queues.end() || it->second.members.empty();
    const absl::Time flush_at =
        idle ? now : (opens ? now + config.max_queue_delay : it->second.flush_at);
    const absl::Duration estimate = absl::Microseconds(request.estimated_run_micros);
    if (request.deadline < flush_at + estimate) {
      *alone_reason = absl::StrCat(
          "its deadline is ", absl::FormatDuration(request.deadline - now),
          " away, within the batch's queue wait (", absl::FormatDuration(flush_at - now),
          ") plus its estimated run (", absl::FormatDuration(estimate), ")");
    } else {
      Core::Queue& q = core_->queues[program->key];
      if (opens) {
        q.program = program;
        q.cap = cap;
        q.flush_at = flush_at;
      }
      member =
          std::make_shared<Member>(core_, std::move(program), std::move(request), std::move(done));
      q.rows += member->request.rows;
      q.members.push_back(member);
      if (idle || q.rows >= q.cap) {
        full.push_back(core_->TakeLocked(q));
      } else if (opens) {
        core_->cv.Signal();  // a new flush time for the batcher's thread
      }
    }
  }
  if (full.empty()) return member;
  // The batches go on this thread; one that ends here answers this call,
  // and its program's next batch goes to the batcher's thread.
  const bool defer = std::exchange(Core::t_defer_next, true);
  core_->StartAll(std::move(full));
  Core::t_defer_next = defer;
  return member;
}

bool Batcher::Leave(const Ticket& m) {
  std::optional<Engine::RunTicket> cancel;
  Core* core = m->core.get();
  {
    absl::MutexLock lock(&core->mu);
    switch (m->state) {
      case Member::State::kQueued: {
        auto it = core->queues.find(m->program->key);
        if (it != core->queues.end()) {
          auto& members = it->second.members;
          members.erase(std::remove(members.begin(), members.end(), m), members.end());
          it->second.rows -= m->request.rows;
          if (members.empty()) {
            it->second.flush_at = absl::InfiniteFuture();
            if (it->second.in_flight == 0) core->queues.erase(it);
          }
        }
        m->state = Member::State::kLeft;
        return true;
      }
      case Member::State::kRunning: {
        m->state = Member::State::kLeft;
        if (std::shared_ptr<BatchRun> b = m->batch.lock()) {
          if (--b->live == 0) {
            b->cancelled.store(true);
            cancel = b->ticket;
          }
        }
        break;
      }
      case Member::State::kLeft:
      case Member::State::kAnswered:
        return false;
    }
  }
  if (cancel) core->engine.CancelQueued(*cancel);
  return true;
}

}  // namespace kiln::server
