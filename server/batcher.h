// Dynamic batching of session runs (issue 12 item 4; docs/server.md, "Dynamic
// batching"). Concurrent Run requests of one program whose inputs share a
// symbolic leading (batch) dim are concatenated along that dim (up to
// max_batch rows), run once through the device's scheduler, and split back:
// each request gets its own rows of every output and a copy of the batch's
// dispatch report with its BatchInfo.
//
// When a batch goes: a request of a program with no batch in flight (handed
// to the device: compiling, queued or running) goes at once, alone. While a
// batch of its program is in flight, requests gather in the queue and go as
// the next batch the moment the program's last batch in flight ends, or
// sooner when they reach max_batch rows or the first of them has waited
// max_queue_delay (the latter only while one batch of the program is in
// flight: with one running and the next waiting on the device, they wait for
// one of those to end).
// So a lone request never waits for company, and under load each batch
// holds what arrived while the previous one ran.
//
// A batch of several requests runs at a bucket size (1, 2, 3, 4, 6, 8, 12,
// 16, 24, ... rows: powers of two and 1.5x them, up to the queue's cap),
// padded with copies of its last row whose outputs are dropped: a program
// compiles a few batch sizes, not one per size.
//
// A queue holds the runs of one program of one tenant: one session, or the
// sessions of one tenant on one repository model version bound to the same
// shared params, with the same compile options, batching config and
// non-batch input dims. Tenants never share a batch: the device scheduler
// charges a run's device time to one tenant (a shared batch would let one
// tenant's work ride on another's weight and queue quota), and a batch's
// size and timing would tell one tenant about another's traffic.
//
// Each request keeps its own quota charge (its in-flight slot), deadline and
// cancellation: a request that leaves (client gone, deadline passed) while
// queued is removed from the queue; one that leaves while its batch runs is
// answered at once and its rows are dropped when the batch ends; a batch all
// of whose requests left is cancelled on its device.
//
// Thread safety: thread-safe. Callbacks run on the submitting thread, the
// batcher's thread (queue delays, and the next batch of a program whose
// batch ended on a submitting or work-pool thread), a work-pool thread (a
// batch whose executable must be compiled first) or a device thread (which
// also starts its program's next batch).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "kiln/v1/config.pb.h"
#include "kiln/v1/graph.pb.h"
#include "server/work_pool.h"

namespace kiln::server {

// Limits of a DynamicBatching config.
inline constexpr int64_t kMaxBatchRows = 1024;
inline constexpr int64_t kMaxQueueDelayMicros = 1000000;
inline constexpr int64_t kDefaultQueueDelayMicros = 1000;

// A checked v1::DynamicBatching. Immutable value type.
struct BatchingConfig {
  int64_t max_batch = 0;  // rows; batching is on when >= 2
  absl::Duration max_queue_delay = absl::Microseconds(kDefaultQueueDelayMicros);

  bool enabled() const { return max_batch >= 2; }
};

// Checks `proto` against the limits above; INVALID_ARGUMENT names the field
// as `where`.<field> (e.g. "options.batching.max_batch") with its value and
// limit.
absl::StatusOr<BatchingConfig> ToBatchingConfig(const v1::DynamicBatching& proto,
                                                const std::string& where);

// Why runs of a graph with this signature can never join a batch ("" when
// they can): every input needs a symbolic leading dim, one named symbol at
// most among them, and that symbol nowhere else in the inputs.
std::string InputsBatchReason(const GraphSignature& signature);

// Why runs with these inputs cannot join a batch ("" when they can), given
// InputsBatchReason passed: the inputs' leading dims differ, or some output's
// leading dim is not the batch (checked by specializing the graph for batch
// sizes 1 and 2 with the other dims as given).
std::string OutputsBatchReason(const v1::Graph& graph, const std::vector<TensorRef>& inputs,
                               const ir::VerifyOptions& verify);

// The rows a batch of `rows` (>= 1) runs at: the least of 1, 2, 3, 4, 6, 8,
// 12, 16, 24, 32, ... (2^k and 3 * 2^k) that holds them, and at most `cap`
// (>= rows), which is itself a bucket.
int64_t BatchBucketRows(int64_t rows, int64_t cap);

class Batcher {
 public:
  // What one queue batches. Shared by the requests of a queue; immutable.
  struct Program {
    std::string key;  // tenant, program, params and non-batch dims: one queue each
    BatchingConfig config;
    std::string tenant;
    std::shared_ptr<const ParamSet> params;
    RunOptions run;               // tenant, weight and queue quota; the rest is set per batch
    int64_t max_batch_bytes = 0;  // limits.max_tensor_bytes: a bigger batch input splits
    // The executable for a batch's inputs if it is ready (no compile), else
    // null; and the same, compiling when needed (run on the work pool). The
    // compile report is the one the batch's requests are given.
    std::function<std::shared_ptr<Executable>(const std::vector<TensorRef>&, v1::CompileReport*)>
        ready;
    std::function<absl::StatusOr<std::shared_ptr<Executable>>(const std::vector<TensorRef>&,
                                                              v1::CompileReport*)>
        compile;
    std::string compile_account;  // the work pool's account for `compile`
    int max_compiles = 1;
  };

  struct Request {
    std::vector<TensorRef> inputs;  // views, valid while keep_alive is held
    std::shared_ptr<const void> keep_alive;
    int64_t rows = 0;  // the leading dim of every input
    absl::Time deadline = absl::InfiniteFuture();
    int priority = 0;
    std::string request_id;
    double estimated_run_micros = 0;  // of a run of this request alone, if known
  };

  // One request's share of its batch's run.
  struct Outcome {
    RunResult result;  // its rows of every output; the batch's report with its BatchInfo
    v1::CompileReport compile;
  };
  using Done = std::function<void(absl::StatusOr<Outcome>)>;

  class Member;
  using Ticket = std::shared_ptr<Member>;

  // Starts the batcher's thread. Borrows `engine` and `pool`, which must outlive
  // the batcher and every run it started.
  static std::unique_ptr<Batcher> Create(Engine& engine, WorkPool& pool);
  // Stops the batcher's thread; requests still queued are answered UNAVAILABLE.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `request` on `program`'s queue, or starts it at once (on this
  // thread) when no batch of the program is in flight. Returns a ticket, and
  // `done` is called exactly once unless Leave(ticket) returns true first
  // (possibly before Submit returns, on this thread or another). Returns
  // null, with `alone_reason` set, when the request cannot join a batch (it
  // alone exceeds max_batch or the bytes limit, or its deadline would pass
  // in the queue): the caller runs it alone. REQUIRES: request.rows >= 1.
  Ticket Submit(std::shared_ptr<const Program> program, Request request, Done done,
                std::string* alone_reason);

  // The request's client went away or its deadline passed: true when it
  // left (the caller answers it; `done` will not be called), false when its
  // answer is already being delivered. Static: valid after the batcher is
  // destroyed (a batch it started may still run).
  static bool Leave(const Ticket& ticket);

 private:
  struct Core;
  explicit Batcher(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
  std::thread timer_;
};

}  // namespace kiln::server
