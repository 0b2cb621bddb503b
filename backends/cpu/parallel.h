// Parallel loops for CPU kernels over OpenMP (the pool oneDNN also uses, so
// kernels and oneDNN primitives never oversubscribe the cores).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace kiln::cpu {

// Bytes a memory-bound loop (copies, transposes) moves per chunk at least:
// below ~1 MiB a thread, a second thread cost more than it saved on this
// project's 2-core VMs (ParallelMemcpy's grain since issue 12; the encoder
// layer's 384 KiB head transposes took 110-119 us p50 on two threads and
// 46-81 us on one, under load, docs/benchmarks.md, enc12b).
inline constexpr int64_t kCopyGrainBytes = int64_t{1} << 20;

// Calls fn(begin, end) over [0, n) in chunks of at least `grain` items, in
// parallel when there is more than one chunk. fn must be thread-safe.
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_threads = omp_get_max_threads();
  const int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, max_threads);
  if (chunks <= 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(chunks))
  {
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    const int64_t begin = n * t / nt;
    const int64_t end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
}

}  // namespace kiln::cpu
