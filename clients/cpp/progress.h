// Terminal progress for kilnctl on stderr: a byte bar for transfers with
// progress events (SetParams uploads), an elapsed-time spinner for waits
// without them (compiles, runs) and a step bar for training (TrainProgress,
// which writes plain periodic lines instead when there is no terminal).
// Disabled objects draw nothing, so callers construct them unconditionally
// and pass ProgressWanted(...).
//
// Thread safety: ProgressBar and TrainProgress are used from one thread.
// Spinner owns a drawing thread that it starts in its constructor and joins in
// its destructor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln {

// True when stderr is a terminal, or when `forced` (--progress).
bool ProgressWanted(bool forced);

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total_bytes, bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Redraws at most 10 times a second, and always at `done == total`.
  void Update(int64_t done);
  // Draws the final state and ends the line; later calls do nothing.
  void Finish();

 private:
  void Draw(int64_t done);

  const std::string label_;
  const int64_t total_;
  const bool enabled_;
  const absl::Time start_ = absl::Now();
  absl::Time last_draw_ = absl::InfinitePast();
  int64_t done_ = 0;
  int64_t drawn_ = -1;  // `done` of the last draw
  bool finished_ = false;
};

class Spinner {
 public:
  Spinner(std::string label, bool enabled);
  // Stops the thread; a spinner that was drawn becomes "<label>: <elapsed>".
  ~Spinner();
  Spinner(const Spinner&) = delete;
  Spinner& operator=(const Spinner&) = delete;

 private:
  void Loop();

  const std::string label_;
  const absl::Time start_ = absl::Now();
  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

// One training step's figures, as TrainProgress shows them.
struct TrainStepFigures {
  int64_t step = 0;   // steps taken, counting those before a resume
  int64_t total = 0;  // the step the run ends at
  int64_t epoch = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double steps_per_second = 0;  // over this process's steps
  double eta_seconds = -1;      // < 0: unknown yet
};

// "step 120/1404  epoch 1  loss 0.512345676  lr 0.002  35.1 steps/s  eta 36 s":
// the plain line (logs, pipes); fixed fields, two spaces apart, so a log
// stays greppable and `sscanf("step %ld/%ld  epoch %ld  loss %lf ...")` reads
// it back. The loss has 9 significant digits: an f32 loss exactly.
std::string FormatTrainLine(const TrainStepFigures& f);

// kilnctl train's progress. With `bar` (a terminal on stderr, or
// --progress): one line on stderr redrawn at most 10 times a second and at the
// last step, "[#######---------] 120/1404  epoch 1  loss 0.5123  lr 0.002
// 35.1 steps/s  ETA 0:36"; a step that is a multiple of `every` (> 0) also
// leaves a plain line above the bar. Without: a plain line on `lines` (stdout)
// every `every` steps and at the last step.
class TrainProgress {
 public:
  // `first_step`: the steps already taken (a resumed run), `total`: the step
  // the run ends at. `every` <= 0 picks about 20 lines over the run.
  TrainProgress(int64_t first_step, int64_t total, bool bar, int64_t every, std::FILE* lines);
  ~TrainProgress();
  TrainProgress(const TrainProgress&) = delete;
  TrainProgress& operator=(const TrainProgress&) = delete;

  void Update(int64_t step, int64_t epoch, double loss, double lr);
  // Ends the bar's line, so that what is printed next starts a line of its
  // own (the bar redraws below at the next Update).
  void Break();

 private:
  TrainStepFigures Figures(int64_t step, int64_t epoch, double loss, double lr) const;

  const int64_t first_step_;
  const int64_t total_;
  const bool bar_;
  const int64_t every_;
  const bool lines_above_;  // bar mode with an explicit `every`
  std::FILE* const lines_;
  const absl::Time start_ = absl::Now();
  absl::Time last_draw_ = absl::InfinitePast();
  bool drawn_ = false;  // a bar line is on screen, not yet ended
};

}  // namespace kiln
