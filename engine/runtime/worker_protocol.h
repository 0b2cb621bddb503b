// What both ends of the device-worker boundary share (proto/kiln/v1/worker.proto):
// length-framed messages on a socket, the shared-memory staging region and
// its allocator, and conversions between the contract's types and messages.
//
// Thread safety: Channel::Send is thread-safe (one writer at a time under its
// mutex); Channel::Receive is called by one reader thread. ShmRegion's
// allocator is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "kiln/v1/worker.pb.h"

namespace kiln::runtime::worker {

inline constexpr int kProtocol = 1;
// A frame longer than this is a broken peer, not a message (copies that do
// not fit the shared region travel inline, up to this).
inline constexpr uint32_t kMaxFrameBytes = 1u << 30;

// The staging region's first bytes that kilnd never hands back to the kernel
// (ShmRegion::Create's default resident_bytes): the only part whose pages stay
// the same for the region's life, so the only part a worker may have its
// device register (pin) for direct copies.
inline constexpr int64_t kShmResidentBytes = int64_t{256} << 20;

// One end of the socket. Owns the descriptor.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  absl::Status Send(const google::protobuf::MessageLite& message);
  // Blocks for the next frame; UNAVAILABLE at end of stream. With `poll_first`,
  // it first polls the socket (yielding the core) that long before it sleeps
  // in the kernel: a frame that comes meanwhile costs no wake-up of a sleeping
  // thread (issue 8, bert8: the next run's Submit, the next answer).
  absl::Status Receive(google::protobuf::MessageLite* message,
                       absl::Duration poll_first = absl::ZeroDuration());
  // Wakes a blocked Receive (it returns UNAVAILABLE) and fails later Sends.
  void Shutdown();
  int fd() const { return fd_; }

 private:
  const int fd_;
  absl::Mutex send_mu_;
};

// A memfd both processes map, with a first-fit allocator of 64-byte-aligned
// blocks (used by kilnd only; the worker reads and writes where it is told).
class ShmRegion {
 public:
  // kilnd's side: a fresh anonymous region of `bytes` (pages come on touch).
  // Freed pages above `resident_bytes` go back to the kernel (a hole punched
  // in the memfd), so a burst of large copies does not stay resident; below
  // it they stay mapped, so steady traffic pays no page faults.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(int64_t bytes,
                                                           int64_t resident_bytes = kShmResidentBytes);
  // The worker's side: maps an inherited descriptor.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Map(int fd);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  char* at(int64_t offset) const { return base_ + offset; }
  // A block's offset, or nullopt when no free range is large enough.
  std::optional<int64_t> Allocate(int64_t bytes);
  void Free(int64_t offset);
  // Whether [offset, offset + bytes) lies inside the region.
  bool Contains(int64_t offset, int64_t bytes) const;

 private:
  ShmRegion(int fd, char* base, int64_t size, int64_t resident);
  // Returns the pages of the free range [at, at + len) above resident_ to the kernel.
  void Release(int64_t at, int64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const int fd_;
  char* const base_;
  const int64_t size_;
  const int64_t resident_;
  absl::Mutex mu_;
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  std::map<int64_t, int64_t> used_ ABSL_GUARDED_BY(mu_);
};

// Steady-clock nanoseconds: CLOCK_MONOTONIC on Linux, one clock for kilnd and
// its workers, so their timestamps of one round trip compare (SyncTimes).
inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ToProto(const backend::DeviceInfo& in, v1::worker::Info* out);
backend::DeviceInfo FromProto(const v1::worker::Info& in);
void ToProto(const backend::KernelSpec& in, v1::worker::Spec* out);
backend::KernelSpec FromProto(const v1::worker::Spec& in);
void SetStatus(const absl::Status& status, v1::worker::Reply* reply);
// The reply's status; a device fault keeps its payload naming `device`.
absl::Status StatusOf(const v1::worker::Reply& reply, const std::string& device);

}  // namespace kiln::runtime::worker
