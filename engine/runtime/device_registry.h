// The device registry (DESIGN.md section 5): creates every registered backend
// at start and lists their devices, the CPU first. A backend whose factory
// fails (no driver) is logged and skipped; it never stops the engine.
//
// Thread safety: immutable after Create; safe to share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/backend.h"

namespace kiln::runtime {

// Where a backend's devices run (DESIGN.md section 5, "Faults contained").
// kProcess: each device in a kiln-device-worker child process
// (runtime/worker_client.h), so a crash or hang there takes down only that
// worker. kThread: in this process. kAuto: every backend but the CPU's in
// worker processes, falling back to this process (with a warning) when no
// worker executable is found; under kProcess the backend is then unavailable.
// The CPU backend always runs in this process: it is the fallback device.
enum class DeviceIsolation { kAuto, kThread, kProcess };

struct RegistryOptions {
  backend::BackendOptions backend;
  std::vector<std::string> disabled;  // backend names to skip
  DeviceIsolation isolation = DeviceIsolation::kAuto;
  std::string worker_binary;  // empty = worker::DefaultWorkerBinary()
  int64_t cache_max_bytes = int64_t{4} << 30;  // the workers' kernel-cache budget
  // Beyond a device wait's own bound before a worker counts as hung.
  absl::Duration worker_grace = absl::Seconds(5);
};

class DeviceRegistry {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceRegistry>> Create(const RegistryOptions& options);

  // CPU first, then other backends in registration priority order.
  const std::vector<backend::Device*>& devices() const { return devices_; }
  backend::Device* Find(const std::string& id) const;
  backend::Device* cpu() const { return devices_.front(); }
  const std::vector<std::string>& unavailable() const { return unavailable_; }
  // Whether `id` runs in a worker process, and that worker's pid (0 if not).
  bool isolated(const std::string& id) const;
  int64_t worker_pid(const std::string& id) const;
  // "cpu=kiln-cpu-1;vulkan=..." — part of cache keys.
  std::string BackendVersions() const;

 private:
  DeviceRegistry() = default;
  std::vector<std::unique_ptr<backend::Backend>> backends_;
  std::vector<std::unique_ptr<backend::Device>> isolated_;  // devices in worker processes
  std::vector<std::pair<std::string, std::string>> versions_;  // backend name, version
  std::vector<backend::Device*> devices_;
  std::vector<std::string> unavailable_;  // "vulkan: no driver"
};

}  // namespace kiln::runtime
