// Terminal progress for kilnctl on stderr: a byte bar for transfers with
// progress events (SetParams uploads) and an elapsed-time spinner for waits
// without them (compiles, runs). Disabled objects draw nothing, so callers
// construct them unconditionally and pass ProgressWanted(...).
//
// Thread safety: ProgressBar is used from one thread. Spinner owns a drawing
// thread that it starts in its constructor and joins in its destructor.
#pragma once

#include <cstdint>
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

}  // namespace kiln
