// Devices in child processes (DESIGN.md section 5, "Faults contained"): kilnd's
// side of the device-worker boundary. An IsolatedDevice is a backend::Device
// whose memory, streams and kernels live in a kiln-device-worker process
// (worker_server.h): buffers, kernels and streams are handles, a stream's
// kernels and copies are queued here and go to the worker as one command list
// when the stream is flushed or synchronized, and host bytes cross through a
// shared-memory region. The engine cannot tell it from an in-process device,
// except that its memory is never host-addressable.
//
// Faults: a worker that crashes (the socket closes), stops answering a
// synchronize within the wait's bound plus a grace period (it is killed), or
// reports a device fault fails every call on it with backend::DeviceFault
// naming the device and what happened. Restart() starts a fresh worker (the
// device health tracker calls it); generation() counts the workers, so
// constants, parameters and run contexts made on an earlier one are made
// again rather than used.
//
// Copies through the host arena (WorkerOptions::host_arena_bytes, res8): a
// CopyToDevice whose source lies in a live block of the arena crosses by
// reference and is read until a Synchronize of the stream passes the copy,
// not before CopyToDevice returns as backend.h says of copies in general: the
// source must stay unchanged until then (it may be freed: the block is held
// until the answer, or until a worker that never answered is gone). Every
// caller in the engine synchronizes before it writes such a source again. A
// CopyToHost into an arena block is written by the worker directly.
//
// Thread safety: as backend.h requires; Restart is thread-safe with respect to
// every other call (calls on the old worker fail as device faults).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "base/host_arena.h"

namespace kiln::runtime::worker {

struct WorkerOptions {
  std::string binary;   // kiln-device-worker (or a test worker)
  std::string backend;  // the backend the worker creates: "vulkan", "cuda"
  backend::BackendOptions backend_options;
  int64_t cache_max_bytes = int64_t{4} << 30;
  // The shared staging region per worker, address space only until touched;
  // copies that do not fit go inline (much slower: through the socket). Freed
  // pages above the first 256 MiB return to the kernel (ShmRegion::Create).
  int64_t staging_bytes = int64_t{4} << 30;
  // A staged upload longer than this crosses in pieces of this size, each sent
  // to the worker as soon as it is in the region, so the worker's DMA of one
  // piece overlaps kilnd's copy of the next (issue 8: 25-64 MiB inputs);
  // 0 = one piece, sent with the stream's next flush (the earlier path).
  // KILN_WORKER_UPLOAD_PIECE_BYTES, when set, overrides it (StartIsolatedBackend).
  int64_t upload_piece_bytes = int64_t{4} << 20;
  // kilnd's host arena (base/host_arena.h), mapped by every worker (a CUDA
  // worker registers it whole, pinning that much host memory): a copy whose
  // host side lies in one of its live blocks crosses as an offset, with no
  // staging copy (issue 8, res8). StartIsolatedBackend makes the process's
  // arena of this size (KILN_HOST_ARENA_BYTES, when set, overrides it; 0 =
  // none, every copy through the staging region as before) and, once a CUDA
  // worker serves a device, lets HostTensor allocate from it.
  int64_t host_arena_bytes = HostArena::kDefaultBytes;
  // Set: this arena instead of the process's (tests; HostTensor does not use it).
  HostArena* host_arena = nullptr;
  // Spin-then-block waits (issue 8, bert8): a waiting end polls, yielding its
  // core, this long before it sleeps, so an answer or a command list that
  // comes within it costs no wake-up of a sleeping thread (~10-50 us each on
  // a virtualized host, four per round trip). reply_spin: kilnd's caller
  // waiting for a synchronize's answer (KILN_WORKER_REPLY_SPIN_US overrides
  // it); queue_spin: the worker's stream thread after each command list, for
  // the next run's (KILN_WORKER_QUEUE_SPIN_US). Zero = sleep at once.
  absl::Duration reply_spin = absl::Milliseconds(2);
  absl::Duration queue_spin = absl::Milliseconds(1);
  // Starting the worker and its backend (driver initialisation).
  absl::Duration start_timeout = absl::Seconds(60);
  // Beyond a synchronize's own bound before the worker counts as hung.
  absl::Duration grace = absl::Seconds(5);
  // Calls other than synchronize (allocate, claims, stream creation).
  absl::Duration call_timeout = absl::Seconds(60);
  // Kernel preparation (may compile shaders or cubins).
  absl::Duration prepare_timeout = absl::Seconds(600);
};

// Where kiln-device-worker is: $KILN_DEVICE_WORKER, else beside the running
// executable, else where this build tree puts it; empty when none exists.
std::string DefaultWorkerBinary();

struct IsolatedBackend {
  std::string name;
  std::string version;
  std::vector<std::unique_ptr<backend::Device>> devices;  // one worker each
};

// Starts a worker for the backend's first device, learns every device its
// backend found, and starts one more worker per further device. Fails when
// the worker cannot start or its backend cannot be created (the message is
// the backend's, as an in-process factory's would be).
absl::StatusOr<IsolatedBackend> StartIsolatedBackend(const WorkerOptions& options);

// How an upload of `bytes` through the staging region is cut
// (WorkerOptions::upload_piece_bytes): consecutive [offset, offset + bytes)
// pieces covering it, every one `piece_bytes` long but the last; one piece
// when piece_bytes <= 0 or bytes <= piece_bytes; none for 0 bytes.
struct UploadPiece {
  int64_t offset;
  int64_t bytes;
};
std::vector<UploadPiece> UploadPieces(int64_t bytes, int64_t piece_bytes);

// The pid of the worker now serving `device` (an IsolatedDevice), else 0.
int64_t WorkerPid(const backend::Device& device);

// Messages kilnd sent to the worker now serving `device` since it started:
// requests it answered (round trips: a synchronize, an allocation, ...) and
// one-way ones (a flushed command list, a free). Zero for other devices.
struct WorkerTraffic {
  int64_t round_trips = 0;
  int64_t one_way = 0;
};
WorkerTraffic WorkerMessages(const backend::Device& device);

// The hops of one synchronizing round trip to a worker (a stream's
// SynchronizeFor), as MonotonicNanos (worker_protocol.h: one clock in both
// processes), in order: kilnd wrote the Submit (`sent`); the worker's reader
// thread read it, its stream's thread took it, handed its commands to the
// device, saw the device finish and wrote the answer; kilnd's reader thread
// read the answer; the waiting caller had it (`woken`). bench/gpu/layers_bf16
// reports their medians (bert8, issue 8).
struct RoundTripTimes {
  int64_t sent = 0;
  int64_t received = 0;
  int64_t started = 0;
  int64_t launched = 0;
  int64_t done = 0;
  int64_t replied = 0;
  int64_t read = 0;
  int64_t woken = 0;
};
// The last one in this process (of any worker); nullopt before the first.
std::optional<RoundTripTimes> LastRoundTrip();

}  // namespace kiln::runtime::worker
