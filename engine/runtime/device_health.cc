#include "engine/runtime/device_health.h"

#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "spdlog/spdlog.h"

namespace kiln::runtime {

DeviceHealth::DeviceHealth(const DeviceRegistry& registry, absl::Duration interval,
                           absl::Duration probe_timeout)
    : registry_(registry), interval_(interval), probe_timeout_(probe_timeout) {
  {
    absl::MutexLock lock(&mu_);
    for (backend::Device* d : registry_.devices()) states_[d->info().id];
  }
  prober_ = std::thread([this] { Loop(); });
}

DeviceHealth::~DeviceHealth() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  prober_.join();
}

void DeviceHealth::NoteFault(const std::string& device, const absl::Status& status,
                             std::optional<uint64_t> generation) {
  backend::Device* d = registry_.Find(device);
  const bool stale = generation && d != nullptr && d->generation() != *generation;
  absl::MutexLock lock(&mu_);
  State& s = states_[device];
  if (!s.healthy || stale) {
    spdlog::debug("{}: fault of the same incident or an earlier worker: {}", device,
                  std::string(status.message()));
    return;
  }
  s.healthy = false;
  s.fault = std::string(status.message());
  ++s.faults;
  spdlog::error("{}: marked unhealthy: {}", device, s.fault);
}

absl::Status DeviceHealth::Check(const std::string& device) const {
  absl::MutexLock lock(&mu_);
  auto it = states_.find(device);
  if (it == states_.end() || it->second.healthy) return absl::OkStatus();
  return backend::DeviceFault(
      device, absl::StrCat("the device is unhealthy and being restarted after: ", it->second.fault));
}

DeviceHealth::State DeviceHealth::Get(const std::string& device) const {
  absl::MutexLock lock(&mu_);
  auto it = states_.find(device);
  return it == states_.end() ? State{} : it->second;
}

void DeviceHealth::Loop() {
  for (;;) {
    std::vector<std::string> unhealthy;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_);
      if (stopping_) return;
      for (const auto& [id, s] : states_) {
        if (!s.healthy) unhealthy.push_back(id);
      }
    }
    for (const std::string& id : unhealthy) {
      backend::Device* d = registry_.Find(id);
      if (d == nullptr) continue;
      // A device in a worker process comes back as a fresh worker (its
      // memory and kernels are gone: device generation); then, as for one in
      // this process, the probe says whether it answers.
      absl::Status probe = d->Restart();
      if (probe.ok()) probe = Probe(*d);
      if (!probe.ok()) {
        spdlog::warn("{}: restart failed: {}", id, std::string(probe.message()));
      }
      absl::MutexLock lock(&mu_);
      State& s = states_[id];
      if (!probe.ok()) continue;  // still faulted: try again next round
      s.healthy = true;
      ++s.restarts;
      spdlog::info("{}: healthy again after restart {} (last fault: {})", id, s.restarts, s.fault);
    }
  }
}

absl::Status DeviceHealth::Probe(backend::Device& device) const {
  KILN_ASSIGN_OR_RETURN(auto stream, device.CreateStream());
  KILN_ASSIGN_OR_RETURN(auto buf, device.Allocate(256));
  std::array<uint8_t, 256> out{}, back{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i);
  const backend::BufferView v{buf.get(), 0, 256};
  KILN_RETURN_IF_ERROR(device.CopyToDevice(*stream, out.data(), v));
  KILN_RETURN_IF_ERROR(device.CopyToHost(*stream, v, back.data()));
  if (absl::Status s = stream->SynchronizeFor(probe_timeout_); !s.ok()) {
    // The device may still write the probe's buffer (and `back`, through the
    // stream's read-back): abandon both rather than free them under it.
    (void)buf.release();
    (void)stream.release();
    return s;
  }
  if (back != out) return absl::DataLossError("probe read back wrong bytes");
  return absl::OkStatus();
}

}  // namespace kiln::runtime
