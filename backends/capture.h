// Capture and replay of a stream's work (CUDA graphs), as interfaces a
// backend's objects add beside backend.h's (the engine finds them with
// dynamic_cast; objects without them are never captured). Only the CUDA
// backend and the device-worker proxies implement them.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace kiln::backend {

// Work captured from a stream (CapturingStream), replayed as one
// submission. It binds the buffers and kernels it was captured with: the
// owner keeps them (and the events recorded inside it) alive and unchanged
// while it exists, and destroys it first.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Enqueues the captured work again on `stream`, the stream it was captured
  // on. Events recorded inside it are recorded again (their times are this
  // replay's after the next synchronization).
  virtual absl::Status Replay(Stream& stream) = 0;
};

// A Stream that captures: between BeginCapture and EndCapture, launches of
// capturable kernels (CapturableKernel) and Record are captured, not run;
// nothing else may be enqueued. EndCapture returns the captured work (replay
// it to run it) or the capture's failure; either way the capture is over.
class CapturingStream {
 public:
  virtual ~CapturingStream() = default;
  virtual absl::Status BeginCapture() = 0;
  virtual absl::StatusOr<std::unique_ptr<CapturedWork>> EndCapture() = 0;
};

// A Kernel whose launches may be captured and replayed when capturable():
// a launch enqueues only device work that depends on nothing but its views
// (no per-launch host state such as error slots or temporaries).
class CapturableKernel {
 public:
  virtual ~CapturableKernel() = default;
  virtual bool capturable() const = 0;
};

// A Buffer's identity as captured work binds it: equal ids (and offsets)
// mean a replay reads and writes the same memory. Never reused for other
// memory while the buffer lives (a device address, a worker handle).
class CaptureBinding {
 public:
  virtual ~CaptureBinding() = default;
  virtual uint64_t binding_id() const = 0;
};

}  // namespace kiln::backend
