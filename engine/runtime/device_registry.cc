#include "engine/runtime/device_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kiln::runtime {

absl::StatusOr<std::unique_ptr<DeviceRegistry>> DeviceRegistry::Create(
    const RegistryOptions& options) {
  auto r = std::unique_ptr<DeviceRegistry>(new DeviceRegistry());
  for (const auto& reg : backend::RegisteredBackends()) {
    if (std::find(options.disabled.begin(), options.disabled.end(), reg.name) !=
        options.disabled.end()) {
      r->unavailable_.push_back(absl::StrCat(reg.name, ": disabled"));
      continue;
    }
    auto b = reg.factory(options.backend);
    if (!b.ok()) {
      spdlog::warn("backend {} unavailable: {}", reg.name, std::string(b.status().message()));
      r->unavailable_.push_back(absl::StrCat(reg.name, ": ", b.status().message()));
      continue;
    }
    for (backend::Device* d : (*b)->devices()) r->devices_.push_back(d);
    if ((*b)->devices().empty()) r->unavailable_.push_back(absl::StrCat(reg.name, ": no devices"));
    r->backends_.push_back(std::move(b).value());
  }
  if (r->devices_.empty() || r->devices_.front()->info().backend != "cpu") {
    return absl::FailedPreconditionError(
        "the CPU backend is not available; kiln needs it as the fallback device");
  }
  return r;
}

backend::Device* DeviceRegistry::Find(const std::string& id) const {
  for (backend::Device* d : devices_) {
    if (d->info().id == id) return d;
  }
  return nullptr;
}

std::string DeviceRegistry::BackendVersions() const {
  std::string out;
  for (const auto& b : backends_) absl::StrAppend(&out, b->name(), "=", b->version(), ";");
  return out;
}

}  // namespace kiln::runtime
