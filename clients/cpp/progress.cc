#include "clients/cpp/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace kiln {
namespace {

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f", bytes / 1048576.0); }

void Emit(const std::string& line) {
  // \r returns to the line start; \033[K clears what a longer line left.
  std::fputs(("\r" + line + "\033[K").c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace

bool ProgressWanted(bool forced) { return forced || isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, int64_t total_bytes, bool enabled)
    : label_(std::move(label)), total_(total_bytes), enabled_(enabled) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(int64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  const absl::Time now = absl::Now();
  if (done < total_ && now - last_draw_ < absl::Milliseconds(100)) return;
  last_draw_ = now;
  Draw(done);
}

void ProgressBar::Draw(int64_t done) {
  drawn_ = done;
  constexpr int kWidth = 30;
  const double frac = total_ > 0 ? std::clamp(static_cast<double>(done) / total_, 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  const double secs = std::max(absl::ToDoubleSeconds(absl::Now() - start_), 1e-6);
  Emit(absl::StrFormat("%s [%s%s] %3.0f%% %s/%s MiB %.1f MiB/s", label_, std::string(filled, '#'),
                       std::string(kWidth - filled, '-'), frac * 100, Mib(done), Mib(total_),
                       done / 1048576.0 / secs));
}

void ProgressBar::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  if (drawn_ != done_) Draw(done_);
  std::fputs("\n", stderr);
}

Spinner::Spinner(std::string label, bool enabled) : label_(std::move(label)) {
  if (enabled) thread_ = std::thread([this] { Loop(); });
}

Spinner::~Spinner() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  thread_.join();
  const absl::Duration elapsed = absl::Now() - start_;
  if (elapsed <= absl::Milliseconds(300)) return;  // never drawn
  Emit(absl::StrFormat("%s: %.2f s", label_, absl::ToDoubleSeconds(elapsed)));
  std::fputs("\n", stderr);
}

void Spinner::Loop() {
  static constexpr char kFrames[] = {'|', '/', '-', '\\'};
  absl::MutexLock lock(&stop_mu_);
  for (int frame = 0; !stop_; ++frame) {
    // Quiet for the first moment: fast calls should not flash a spinner.
    const absl::Duration elapsed = absl::Now() - start_;
    if (elapsed > absl::Milliseconds(300)) {
      Emit(absl::StrFormat("%s %c %.1f s", label_, kFrames[frame % 4],
                           absl::ToDoubleSeconds(elapsed)));
    }
    stop_mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
  }
}

std::string FormatTrainLine(const TrainStepFigures& f) {
  std::string eta = "?";
  if (f.eta_seconds >= 0) eta = absl::StrFormat("%.0f s", f.eta_seconds);
  return absl::StrFormat("step %d/%d  epoch %d  loss %.9g  lr %.6g  %.1f steps/s  eta %s", f.step,
                         f.total, f.epoch, f.loss, f.lr, f.steps_per_second, eta);
}

TrainProgress::TrainProgress(int64_t first_step, int64_t total, bool bar, int64_t every,
                             std::FILE* lines)
    : first_step_(first_step),
      total_(total),
      bar_(bar),
      every_(every > 0 ? every : std::max<int64_t>(1, (total - first_step) / 20)),
      lines_above_(bar && every > 0),
      lines_(lines) {}

TrainProgress::~TrainProgress() { Break(); }

TrainStepFigures TrainProgress::Figures(int64_t step, int64_t epoch, double loss, double lr) const {
  TrainStepFigures f{step, total_, epoch, loss, lr};
  const double secs = absl::ToDoubleSeconds(absl::Now() - start_);
  const int64_t done = step - first_step_;
  if (secs > 0 && done > 0) {
    f.steps_per_second = static_cast<double>(done) / secs;
    f.eta_seconds = static_cast<double>(total_ - step) / f.steps_per_second;
  }
  return f;
}

void TrainProgress::Update(int64_t step, int64_t epoch, double loss, double lr) {
  const bool periodic = step % every_ == 0 || step == total_;
  if (!bar_) {
    if (!periodic) return;
    std::fprintf(lines_, "%s\n", FormatTrainLine(Figures(step, epoch, loss, lr)).c_str());
    std::fflush(lines_);
    return;
  }
  const absl::Time now = absl::Now();
  const TrainStepFigures f = Figures(step, epoch, loss, lr);
  if (lines_above_ && step % every_ == 0) {
    Emit(FormatTrainLine(f));  // over the bar, which redraws below
    std::fputs("\n", stderr);
    drawn_ = false;
    last_draw_ = absl::InfinitePast();
  }
  if (step != total_ && now - last_draw_ < absl::Milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 24;
  const double frac =
      total_ > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_), 0.0, 1.0)
                 : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string eta = "?";
  if (f.eta_seconds >= 0) {
    const int64_t s = static_cast<int64_t>(f.eta_seconds + 0.5);
    eta = s >= 3600 ? absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60)
                    : absl::StrFormat("%d:%02d", s / 60, s % 60);
  }
  Emit(absl::StrFormat("[%s%s] %d/%d  epoch %d  loss %.4f  lr %.3g  %.1f steps/s  ETA %s",
                       std::string(filled, '#'), std::string(kWidth - filled, '-'), step, total_,
                       epoch, loss, lr, f.steps_per_second, eta));
  drawn_ = true;
}

void TrainProgress::Break() {
  if (!drawn_) return;
  drawn_ = false;
  std::fputs("\n", stderr);
  std::fflush(stderr);
}

}  // namespace kiln
