#include "engine/runtime/device_registry.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/runtime/worker_client.h"
#include "spdlog/spdlog.h"

namespace kiln::runtime {
namespace {

// "cuda: no NVIDIA driver library (...)" stays as it is; a reason that does
// not name its backend gets the name in front ("vulkan: no devices").
std::string UnavailableNote(const std::string& backend, absl::string_view reason) {
  if (absl::StartsWith(reason, absl::StrCat(backend, ": "))) return std::string(reason);
  return absl::StrCat(backend, ": ", reason);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceRegistry>> DeviceRegistry::Create(
    const RegistryOptions& options) {
  auto r = std::unique_ptr<DeviceRegistry>(new DeviceRegistry());
  for (const auto& reg : backend::RegisteredBackends()) {
    if (std::find(options.disabled.begin(), options.disabled.end(), reg.name) !=
        options.disabled.end()) {
      r->unavailable_.push_back(absl::StrCat(reg.name, ": disabled"));
      continue;
    }
    if (reg.name != "cpu" && options.isolation != DeviceIsolation::kThread) {
      worker::WorkerOptions wo;
      wo.binary = options.worker_binary.empty() ? worker::DefaultWorkerBinary() : options.worker_binary;
      wo.backend = reg.name;
      wo.backend_options = options.backend;
      wo.cache_max_bytes = options.cache_max_bytes;
      wo.grace = options.worker_grace;
      if (!wo.binary.empty() || options.isolation == DeviceIsolation::kProcess) {
        auto iso = worker::StartIsolatedBackend(wo);
        if (!iso.ok()) {
          spdlog::warn("backend {} unavailable: {}", reg.name, std::string(iso.status().message()));
          r->unavailable_.push_back(UnavailableNote(reg.name, iso.status().message()));
          continue;
        }
        for (auto& d : iso->devices) {
          spdlog::info("{}: runs in device worker process {}", d->info().id, worker::WorkerPid(*d));
          r->devices_.push_back(d.get());
          r->isolated_.push_back(std::move(d));
        }
        if (iso->devices.empty()) r->unavailable_.push_back(absl::StrCat(reg.name, ": no devices"));
        r->versions_.emplace_back(iso->name, iso->version);
        continue;
      }
      spdlog::warn("backend {}: no kiln-device-worker executable found; its devices run in this "
                   "process (a crash there takes kilnd down)", reg.name);
    }
    auto b = reg.factory(options.backend);
    if (!b.ok()) {
      spdlog::warn("backend {} unavailable: {}", reg.name, std::string(b.status().message()));
      r->unavailable_.push_back(UnavailableNote(reg.name, b.status().message()));
      continue;
    }
    for (backend::Device* d : (*b)->devices()) r->devices_.push_back(d);
    if ((*b)->devices().empty()) r->unavailable_.push_back(absl::StrCat(reg.name, ": no devices"));
    r->versions_.emplace_back((*b)->name(), (*b)->version());
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
  for (const auto& [name, version] : versions_) absl::StrAppend(&out, name, "=", version, ";");
  return out;
}

bool DeviceRegistry::isolated(const std::string& id) const { return worker_pid(id) != 0; }

int64_t DeviceRegistry::worker_pid(const std::string& id) const {
  backend::Device* d = Find(id);
  return d == nullptr ? 0 : worker::WorkerPid(*d);
}

}  // namespace kiln::runtime
