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

}  // namespace kiln
