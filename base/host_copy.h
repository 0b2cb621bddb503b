// Large host-to-host copies split over a few threads.
//
// Why: one thread's memcpy moves ~5-10 GB/s on the GPU machine's host, a
// fraction of what its memory does, and the host side of a device run copies
// whole tensors (a device worker's staging region in and out, a CUDA stream's
// pinned staging): 25-64 MiB per run for the bf16 layers of issue 8, several
// ms each way on one thread. Copies below kMinSplitBytes are one memcpy.
//
// Thread safety: HostCopier is thread-safe. Concurrent callers share the
// helper threads; a caller copies pieces of its own copy too, so it never
// waits for helpers that are busy elsewhere before its copy starts, and it
// returns only after every piece of its copy is done.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kiln {

class HostCopier {
 public:
  // Copies shorter than this are one memcpy on the calling thread.
  static constexpr int64_t kMinSplitBytes = int64_t{2} << 20;
  // No piece is shorter than this (a helper's wake-up costs ~10-50 us).
  static constexpr int64_t kMinPieceBytes = int64_t{1} << 20;

  // `threads` copy a large copy, the caller included (so threads - 1 helper
  // threads start now); threads <= 1 makes Copy one memcpy.
  explicit HostCopier(int threads);
  ~HostCopier();  // joins the helpers; REQUIRES: no Copy in progress
  HostCopier(const HostCopier&) = delete;
  HostCopier& operator=(const HostCopier&) = delete;

  // The process's copier, created at first use and never destroyed (helpers
  // outlive static destructors): KILN_HOST_COPY_THREADS threads when set
  // (1 = plain memcpy), else min(8, hardware threads / 2), at least 1.
  static HostCopier& Default();

  // memcpy(dst, src, bytes). REQUIRES: the ranges do not overlap.
  void Copy(void* dst, const void* src, int64_t bytes);
  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // How Copy splits `bytes` among `threads` threads: the number of pieces
  // (1 = one memcpy). Piece i is [bytes * i / n, bytes * (i + 1) / n).
  static int64_t PiecesFor(int64_t bytes, int threads);

 private:
  struct Job;
  // Copies pieces of `job` until none is left unclaimed.
  void Work(Job& job);
  void HelperLoop();

  absl::Mutex jobs_mu_;
  std::deque<std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(jobs_mu_);  // with pieces left
  bool stopping_ ABSL_GUARDED_BY(jobs_mu_) = false;
  std::vector<std::thread> helpers_;
};

// HostCopier::Default().Copy(dst, src, bytes).
void HostCopy(void* dst, const void* src, int64_t bytes);

}  // namespace kiln
