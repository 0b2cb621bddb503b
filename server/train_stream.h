// The state of one TrainSteps call (server/rpc_train.cc) and the rule that
// turns it into the next thing to do: start a step, write an answer, read the
// next message, end the call.
//
// Steps run one at a time and are answered in order; while step N runs,
// message N+1 is read and admitted (`next`). When N ends, the thread that
// ended it (the device's scheduler thread) must get the device going again
// at once: it only starts N+1 there, and hands every gRPC action (N's answer,
// the read of N+2, the call's end) to one of gRPC's threads (kHandOff). A
// write from the device's thread runs gRPC's send inline (the loopback
// sendmsg, and the client's receive in its softirq: ~0.3 ms of a 5 ms MLP
// step, docs/benchmarks.md "step9"), and a read may run the next message's
// parse there too; either would hold the device idle between steps.
//
// Thread safety: the fields are guarded by `mu`; NextLocked requires it.
// `Step` is the call's step type: `const v1::TrainStepResponse& response()`,
// `void ReleaseRun()` (its in-flight quota) and `void Account()` (its metrics
// and report, which the pump calls on gRPC's thread before writing its
// answer: also kept off the device's thread).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "server/rpc_common.h"

namespace kiln::server {

template <typename Step>
struct TrainStream {
  enum class Action {
    kNone,     // nothing to do now
    kStart,    // start `start` (now `running`)
    kWrite,    // write `write` (answers.front())
    kRead,     // read the next message
    kEnd,      // finish the call with `end`
    kHandOff,  // gRPC work waits, and this thread may not do it: pump on a gRPC thread
  };

  // Where NextLocked runs: on one of gRPC's threads (its reactions, or a
  // hand-off) every action may be taken; on the thread that ended a step
  // only kStart, else kHandOff when gRPC work waits.
  enum class Thread { kGrpc, kStepEnded };

  // A step's answer, and the step (until the answer is written).
  struct Answer {
    grpc::ByteBuffer bytes;
    std::unique_ptr<Step> step;
  };

  absl::Mutex mu;
  bool pumping ABSL_GUARDED_BY(mu) = false;  // a thread is turning state into actions
  bool ended ABSL_GUARDED_BY(mu) = false;    // Finish was called (or is being called)
  bool reading ABSL_GUARDED_BY(mu) = false;  // a read is outstanding
  bool reads_done ABSL_GUARDED_BY(mu) = false;
  bool writing ABSL_GUARDED_BY(mu) = false;  // answers.front() is being written
  std::deque<Answer> answers ABSL_GUARDED_BY(mu);
  std::unique_ptr<Step> running ABSL_GUARDED_BY(mu);  // started, not yet answered
  int64_t running_index ABSL_GUARDED_BY(mu) = 0;
  std::optional<absl::Status> running_outcome ABSL_GUARDED_BY(mu);
  std::unique_ptr<Step> next ABSL_GUARDED_BY(mu);  // admitted, waits for `running`
  int64_t next_index ABSL_GUARDED_BY(mu) = 0;
  std::optional<absl::Status> failed ABSL_GUARDED_BY(mu);  // the call ends with it
  int64_t failed_index ABSL_GUARDED_BY(mu) = 0;  // the step it names; 0: none (the client)
  bool broken ABSL_GUARDED_BY(mu) = false;       // a write failed: no more answers
  int64_t received ABSL_GUARDED_BY(mu) = 0;      // messages read
  int64_t answered ABSL_GUARDED_BY(mu) = 0;

  // The next thing to do on `thread`, the state updated as if it were done.
  // A step that ended is answered first (its answer queued, its quota
  // released), then the next step starts before any gRPC work. kEnd appends
  // " steps=<answered>" to `detail`. `write` stays put (answers.front())
  // until OnWriteDone pops it.
  Action NextLocked(Thread thread, Step*& start, Answer*& write, absl::Status& end,
                    std::string& detail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ended) return Action::kNone;
    if (running && running_outcome) {  // the running step ended: its answer
      absl::Status s = *std::move(running_outcome);
      running_outcome.reset();
      // A step that ran is answered even when the message after it was
      // refused meanwhile: the refusal ends the call after this answer.
      bool queued = false;
      if (s.ok() && !broken) {
        s = SerializeMessage(running->response(), &answers.emplace_back().bytes);
        if (s.ok()) {
          ++answered;
          queued = true;
        } else {
          answers.pop_back();
        }
      }
      // This step's failure comes before a refused later message's.
      if (!s.ok() && (!failed || failed_index > running_index)) {
        failed = absl::Status(StatusBuilder(s) << "at step " << running_index << " of the stream");
        failed_index = running_index;
        next.reset();
      }
      running->ReleaseRun();
      if (queued) {
        answers.back().step = std::move(running);
      } else {
        running.reset();
      }
    }
    if (!running && next && !failed) {
      running = std::move(next);
      running_index = next_index;
      start = running.get();
      return Action::kStart;
    }
    const bool write_waits = !writing && !answers.empty();
    const bool read_waits = !reading && !reads_done && !next && !failed;
    const bool idle = !running && !writing && answers.empty();
    const bool end_waits = idle && (failed || (reads_done && !next));
    if (thread == Thread::kStepEnded) {
      return write_waits || read_waits || end_waits ? Action::kHandOff : Action::kNone;
    }
    if (write_waits) {
      writing = true;
      write = &answers.front();  // deque: stays put while others are added
      return Action::kWrite;
    }
    if (read_waits) {
      reading = true;
      return Action::kRead;
    }
    if (end_waits) {
      ended = true;
      next.reset();
      end = failed.value_or(absl::OkStatus());
      absl::StrAppend(&detail, " steps=", answered);
      return Action::kEnd;
    }
    return Action::kNone;
  }
};

}  // namespace kiln::server
