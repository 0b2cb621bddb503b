// HostArena: large host buffers in one shared-memory region (a memfd) that
// device worker processes map too, so a copy between such a buffer and device
// memory crosses the process boundary as an (offset, bytes) instead of a host
// copy into the worker's staging region and back out of it (issue 8, res8;
// docs/cuda.md "Where an isolated run's time goes").
//
// Why: a run on cuda:0 in its device worker paid, for x and y of 25-64 MiB, a
// memcpy of x into the shared staging region and one of y out of it, on
// kilnd's side of the boundary. With x and y in this arena, which the CUDA
// worker registers (pins) once, the worker's DMA reads x where the caller
// wrote it and writes y where the caller reads it: no host copy either way.
//
// Who uses it: HostTensor takes buffers of at least kMinBytes from the
// process's arena once one is active (device workers serve devices from it:
// runtime/worker_client.h, StartIsolatedBackend), and falls back to the heap
// when it is full (counted as a miss). A run's fresh output HostTensors, a
// caller's input HostTensors and a RunOptions::output_destinations buffer
// allocated as a HostTensor all qualify; other memory takes the staging path
// as before.
//
// Blocks: first fit, kAlignment-aligned, sizes rounded up to it. A block has
// an owner's reference (Allocate / Release) and holds (Hold / Unhold): the
// transport holds a block while a worker may still read or write it, so a
// block freed by its owner in the meantime (a failed run's output) is not
// handed out again until the copy is known finished or its worker is gone.
// Pages stay resident once touched (never punched out: a worker may have
// them registered), which bounds the arena's memory by its size, like
// HostBufferPool's limit.
//
// Thread safety: thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kiln {

// A fresh memfd (close-on-exec) of `bytes`, mapped shared read-write: the
// memory a process hands to its device workers (HostArena, the workers'
// staging ShmRegion). `what` names it in errors and in /proc/<pid>/maps.
struct SharedMemfd {
  int fd = -1;
  char* base = nullptr;
};
absl::StatusOr<SharedMemfd> CreateSharedMemfd(const char* what, int64_t bytes);

class HostArena {
 public:
  static constexpr int64_t kMinBytes = int64_t{1} << 20;
  static constexpr int64_t kAlignment = 4096;
  static constexpr int64_t kDefaultBytes = int64_t{1} << 30;

  // A fresh arena of `bytes` (rounded up to kAlignment; pages come on touch).
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(int64_t bytes);
  // REQUIRES: no block is out or held.
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // The process's arena, made by the first call (never destroyed; later calls
  // return it whatever their `bytes`): KILN_HOST_ARENA_BYTES bytes when set,
  // else `bytes`; nullptr when that is 0 (no arena: every copy through a
  // worker's staging region, the earlier path) or it could not be made.
  static HostArena* Process(int64_t bytes);
  // The process's arena once Activate() was called on it, else nullptr:
  // where HostTensor takes its large buffers from.
  static HostArena* ForHostTensors();
  // The process's arena if one was made (active or not): where a HostTensor
  // gives a buffer back to.
  static HostArena* Made();
  // Lets HostTensor allocate from this arena when it is the process's (a
  // device worker maps it; another arena is left alone). Called once a CUDA
  // worker serves a device from it.
  void Activate();
  // Stops HostTensor allocating from the process's arena (buffers already
  // out still go back to it). For tests that activate it for a while.
  static void Deactivate();

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  char* base() const { return base_; }
  bool Contains(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + size_;
  }

  // A block of at least `bytes` (> 0), kAlignment-aligned, with its owner's
  // reference; nullptr when no free range is large enough (a miss).
  void* Allocate(int64_t bytes);
  // Drops the owner's reference of the block at `p` (as Allocate returned
  // it): free once no hold remains. False (nothing done) when `p` is not the
  // start of a block of this arena owned by its caller, so a deleter may try
  // any pointer.
  bool Release(void* p);

  // When [p, p + bytes) lies inside one live block: adds a hold on it and
  // returns where it is (`block` for Unhold, `offset` of p in the region).
  struct Span {
    int64_t block;
    int64_t offset;
  };
  std::optional<Span> Hold(const void* p, int64_t bytes);
  void Unhold(int64_t block);

  struct Stats {
    int64_t size = 0;
    int64_t in_use_bytes = 0;   // live blocks: owned or held
    int64_t peak_bytes = 0;
    int64_t allocations = 0;
    int64_t misses = 0;         // Allocate found no room (the caller fell back)
    int64_t direct_bytes = 0;   // crossed to or from a device by reference (CountDirect)
    int64_t direct_copies = 0;
  };
  Stats stats() const;
  // The transport counts a copy it sent by reference.
  void CountDirect(int64_t bytes) {
    direct_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    direct_copies_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  HostArena(int fd, char* base, int64_t size);
  struct Block {
    int64_t bytes;
    bool owned;
    int holds;
  };
  void FreeBlock(std::map<int64_t, Block>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  char* const base_;
  const int64_t size_;
  mutable absl::Mutex mu_;
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  std::map<int64_t, Block> used_ ABSL_GUARDED_BY(mu_);    // offset -> block
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> direct_bytes_{0};
  std::atomic<int64_t> direct_copies_{0};
};

}  // namespace kiln
