// Large host buffers kept for reuse instead of going back to the system.
//
// Why: glibc serves allocations above its mmap threshold (at most 32 MiB) with
// fresh mappings and unmaps them on free, so a caller that runs a graph in a
// loop gets new pages for every large output: each 4 KiB page is faulted in and
// zeroed by the first write (the copy out of the device), ~1/4 to 1 us per page
// on the GPU machine's host, 15 us here; 25-64 MiB outputs (issue 8's bf16 layers)
// pay thousands of faults per run. HostTensor takes buffers of at least
// kMinBytes from the pool and gives every buffer it frees to Release first
// (which takes back only its own).
//
// A buffer goes back to the pool only while the pool holds at most its limit;
// the oldest buffers are freed first to make room. Sizes are rounded up to
// kGranule, and a request takes a kept buffer of exactly its rounded size
// (a run repeats its shapes). Memory kept here is not in use by anyone but
// stays resident: the limit bounds it.
//
// Thread safety: HostBufferPool is thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kiln {

class HostBufferPool {
 public:
  static constexpr size_t kMinBytes = size_t{4} << 20;
  static constexpr size_t kGranule = size_t{1} << 20;
  static constexpr size_t kDefaultLimit = size_t{1} << 30;

  explicit HostBufferPool(size_t limit) : limit_(limit) {}
  ~HostBufferPool();  // frees what it keeps; REQUIRES: none of its buffers is out
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // The process's pool, never destroyed: KILN_HOST_BUFFER_POOL_BYTES bytes
  // when set (0 = keep nothing), else kDefaultLimit.
  static HostBufferPool& Default();

  // The size a request of `bytes` (>= kMinBytes) is allocated at.
  static size_t Rounded(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

  // A 64-byte aligned buffer of Rounded(bytes) bytes: a kept one of that size
  // (its old contents) or a fresh one; nullptr when the system has no memory.
  // REQUIRES: bytes >= kMinBytes.
  void* Allocate(size_t bytes);
  // Takes back a buffer from Allocate: kept, or freed when keeping it would
  // pass the limit. False (and nothing done) when `p` is not one of this
  // pool's buffers, so a deleter may call it for any pointer first.
  bool Release(void* p);

  size_t kept_bytes() const {
    absl::MutexLock lock(&mu_);
    return kept_bytes_;
  }
  size_t limit() const { return limit_; }

 private:
  const size_t limit_;
  mutable absl::Mutex mu_;
  // Handed out and not yet released (size by pointer); its size, read without
  // the lock, lets Release return at once while none is out.
  absl::flat_hash_map<void*, size_t> out_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> out_count_{0};
  std::list<std::pair<size_t, void*>> kept_ ABSL_GUARDED_BY(mu_);  // oldest first
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln
