// The device worker's side of the process boundary (DESIGN.md section 5,
// "Faults contained"): a child process of kilnd that creates one backend,
// serves one of its devices over proto/kiln/v1/worker.proto, and exits when
// kilnd closes the socket (or dies, which closes it). Each stream gets a
// thread that runs its submitted
// command lists in order; allocations, claims and kernel preparation run on
// a small pool, so a long kernel build never stalls another stream.
//
// kiln-device-worker (engine/runtime/worker/) is this plus argument parsing;
// the tests' fault worker adds a test-only kernel through `wrap`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backends/backend.h"

namespace kiln::runtime::worker {

struct ServeOptions {
  std::string backend;       // the registered backend to create
  int device_index = 0;      // which of its devices this worker serves
  backend::BackendOptions backend_options;
  int64_t cache_max_bytes = int64_t{4} << 30;  // the kernel-binary cache's budget
  int socket_fd = 3;
  int shm_fd = 4;
  int arena_fd = -1;  // kilnd's host arena (base/host_arena.h); -1 = none
  // After a stream's thread ran a command list it polls its queue (yielding)
  // this long before it sleeps: a run that follows at once is picked up
  // without a wake-up (issue 8, bert8). 0 = sleep at once.
  int64_t queue_spin_micros = 0;
};

// Decorates the served device (test-only fault kernels); null = serve as is.
using DeviceWrapper = std::function<std::unique_ptr<backend::Device>(backend::Device& real)>;

// Serves until the socket closes; returns the process exit code.
int Serve(const ServeOptions& options, const DeviceWrapper& wrap = nullptr);

// Parses kiln-device-worker's command line (--backend=, --device=,
// --cache_dir=, --cache_max_bytes=, --cpu_threads=, --socket_fd=, --shm_fd=,
// --arena_fd=, --queue_spin_us=)
// and serves; 2 on a bad command line.
int WorkerMain(int argc, char** argv, const DeviceWrapper& wrap = nullptr);

}  // namespace kiln::runtime::worker
