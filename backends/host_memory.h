// Host memory registration, an optional device capability beside backend.h's
// interfaces (as capture.h's: the caller finds it with dynamic_cast; a device
// without it, such as the CPU or a Vulkan device, copies through its own
// staging as before). Only the CUDA backend implements it; the device worker
// registers its shared staging region with the device it serves
// (engine/runtime/worker_server.cc), so copies through the region are DMA.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace kiln::backend {

// A registered host range (HostMemoryRegistrar::RegisterHostMemory).
// Destroying it ends the registration. REQUIRES before destruction: no copy
// into or out of the range is in flight (the streams that copied were
// synchronized or destroyed).
class HostRegistration {
 public:
  virtual ~HostRegistration() = default;
};

// A Device that copies to and from registered host memory directly.
// Thread-safe, as the Device it belongs to.
class HostMemoryRegistrar {
 public:
  virtual ~HostMemoryRegistrar() = default;
  // Pins [base, base + bytes) (mapped readable and writable, and staying
  // mapped while registered) for the device's direct access. While the
  // registration lives, Device::CopyToDevice from a source and
  // Device::CopyToHost to a destination lying wholly inside the range copy
  // straight between it and device memory, asynchronously, with no staging
  // copy: such a source must stay unchanged, and such a destination unread,
  // until a Synchronize of the stream passes the copy (for them CopyToDevice
  // does NOT read the source before it returns). Whoever registers a range
  // takes that contract for every copy through it. ALREADY_EXISTS when the
  // range overlaps a live registration.
  virtual absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHostMemory(void* base,
                                                                               int64_t bytes) = 0;
};

}  // namespace kiln::backend
