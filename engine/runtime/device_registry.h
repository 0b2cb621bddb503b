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
#include "backends/backend.h"

namespace kiln::runtime {

struct RegistryOptions {
  backend::BackendOptions backend;
  std::vector<std::string> disabled;  // backend names to skip
};

class DeviceRegistry {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceRegistry>> Create(const RegistryOptions& options);

  // CPU first, then other backends in registration priority order.
  const std::vector<backend::Device*>& devices() const { return devices_; }
  backend::Device* Find(const std::string& id) const;
  backend::Device* cpu() const { return devices_.front(); }
  const std::vector<std::string>& unavailable() const { return unavailable_; }
  // "cpu=kiln-cpu-1;vulkan=..." — part of cache keys.
  std::string BackendVersions() const;

 private:
  DeviceRegistry() = default;
  std::vector<std::unique_ptr<backend::Backend>> backends_;
  std::vector<backend::Device*> devices_;
  std::vector<std::string> unavailable_;  // "vulkan: no driver"
};

}  // namespace kiln::runtime
