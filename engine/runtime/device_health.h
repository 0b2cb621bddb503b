// DeviceHealth: which devices are serving (DESIGN.md section 5, "Faults
// contained"). A device fault (backend::DeviceFault: a wait timed out, the
// device was lost, its worker process died) marks its device unhealthy; runs
// placed on it then fail fast with UNAVAILABLE. A background thread restarts
// unhealthy devices: Device::Restart (a fresh worker process for an isolated
// device, nothing for one in kilnd's process), then a probe, a small copy
// round trip on a fresh stream with a generous bound of its own; once it
// succeeds the device is healthy again.
//
// Thread safety: every method is thread-safe. The destructor stops and joins
// the probing thread. The registry (and its devices) must outlive this object.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/runtime/device_registry.h"

namespace kiln::runtime {

class DeviceHealth {
 public:
  struct State {
    bool healthy = true;
    std::string fault;  // the last fault's message
    int64_t faults = 0;
    int64_t restarts = 0;  // times the device came back
  };

  // Probes every `interval`; each probe waits at most `probe_timeout`.
  DeviceHealth(const DeviceRegistry& registry, absl::Duration interval,
               absl::Duration probe_timeout);
  ~DeviceHealth();
  DeviceHealth(const DeviceHealth&) = delete;
  DeviceHealth& operator=(const DeviceHealth&) = delete;

  // `status` is the fault (its message is kept for reports and logs).
  // `generation` is the device's (backend::Device::generation) when the
  // faulting work began. One incident counts once: faults noted while the
  // device is already unhealthy (other runs failing of the same worker
  // death), or from work begun before the device last restarted, are not
  // counted and mark nothing.
  void NoteFault(const std::string& device, const absl::Status& status,
                 std::optional<uint64_t> generation = std::nullopt);
  // OK, or the device fault that runs on the unhealthy device get.
  absl::Status Check(const std::string& device) const;
  State Get(const std::string& device) const;

 private:
  void Loop();
  // A copy round trip on a fresh stream; OK when the device answered in time.
  absl::Status Probe(backend::Device& device) const;

  const DeviceRegistry& registry_;
  const absl::Duration interval_;
  const absl::Duration probe_timeout_;

  mutable absl::Mutex mu_;
  std::map<std::string, State> states_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread prober_;
};

}  // namespace kiln::runtime
