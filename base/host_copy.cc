#include "base/host_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kiln {

struct HostCopier::Job {
  Job(char* dst, const char* src, int64_t bytes, int64_t pieces)
      : dst(dst), src(src), bytes(bytes), pieces(pieces) {}
  char* const dst;
  const char* const src;
  const int64_t bytes;
  const int64_t pieces;
  std::atomic<int64_t> next{0};      // the next unclaimed piece
  std::atomic<int64_t> finished{0};  // pieces copied
};

HostCopier::HostCopier(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { HelperLoop(); });
}

HostCopier::~HostCopier() {
  {
    absl::MutexLock lock(&jobs_mu_);
    stopping_ = true;
  }
  for (auto& t : helpers_) t.join();
}

HostCopier& HostCopier::Default() {
  static HostCopier* const copier = [] {
    int threads = 0;
    if (const char* env = std::getenv("KILN_HOST_COPY_THREADS"); env != nullptr && *env != '\0') {
      threads = std::atoi(env);
    } else {
      threads = std::min(8, static_cast<int>(std::thread::hardware_concurrency()) / 2);
    }
    return new HostCopier(std::clamp(threads, 1, 64));
  }();
  return *copier;
}

int64_t HostCopier::PiecesFor(int64_t bytes, int threads) {
  if (threads <= 1 || bytes < kMinSplitBytes) return 1;
  // Four pieces per thread, so a caller whose helpers are busy with another
  // copy still finishes in step with them, but none under kMinPieceBytes.
  return std::clamp<int64_t>(bytes / kMinPieceBytes, 1, int64_t{4} * threads);
}

void HostCopier::Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  const int64_t pieces = PiecesFor(bytes, threads());
  if (pieces <= 1) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  auto job =
      std::make_shared<Job>(static_cast<char*>(dst), static_cast<const char*>(src), bytes, pieces);
  {
    absl::MutexLock lock(&jobs_mu_);
    jobs_.push_back(job);
  }
  Work(*job);
  {
    absl::MutexLock lock(&jobs_mu_);
    std::erase(jobs_, job);  // every piece is claimed: no helper takes it up again
  }
  // Pieces a helper claimed may still be copying.
  while (job->finished.load(std::memory_order_acquire) < pieces) std::this_thread::yield();
}

void HostCopier::Work(Job& job) {
  for (int64_t i = job.next.fetch_add(1); i < job.pieces; i = job.next.fetch_add(1)) {
    const int64_t begin = job.bytes * i / job.pieces;
    const int64_t end = job.bytes * (i + 1) / job.pieces;
    std::memcpy(job.dst + begin, job.src + begin, static_cast<size_t>(end - begin));
    job.finished.fetch_add(1, std::memory_order_release);
  }
}

void HostCopier::HelperLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&jobs_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(jobs_mu_) {
        return stopping_ || !jobs_.empty();
      };
      jobs_mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = jobs_.front();
      if (job->next.load() >= job->pieces) {
        jobs_.pop_front();  // all claimed; its caller waits for the last pieces
        continue;
      }
    }
    Work(*job);
  }
}

void HostCopy(void* dst, const void* src, int64_t bytes) {
  HostCopier::Default().Copy(dst, src, bytes);
}

}  // namespace kiln
