// Device calibration (DESIGN.md section 5): micro-benchmarks through the
// device's own kernels measure peak FLOP/s per dtype (matmul), memory
// bandwidth (a large elementwise add; on a host device past its last-level
// cache, with the cache's own bandwidth beside it), launch overhead (tiny
// kernels back to back), the fixed cost of a synchronizing run, and on a
// multi-threaded CPU the cost of its thread team (runtime::HostProfile).
// Results are cached on disk keyed by the device's identity and a machine
// fingerprint (CalibrationFingerprint), so a restart reuses them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "engine/runtime/cost_model.h"

namespace kiln::runtime {

// Bumped when the procedure changes; older cached profiles are re-measured.
// 4: a device's copy rates are timed from and into HostTensor buffers.
inline constexpr int kCalibrationVersion = 4;

struct CalibrationResult {
  backend::DeviceProfile profile;
  HostProfile host;  // all zero but on a multi-threaded host device
  bool from_cache = false;
  double seconds = 0;  // time spent measuring (0 from the cache)
  // The host was busy while measuring (load average above twice the cores):
  // the profile is used by this process but not cached, so the next start
  // measures again instead of keeping a slow reading for good.
  bool contended = false;
};

// The host's 1-minute load average per online core (0 when unknown).
double HostLoadPerCore();

// Size of the host's last-level data cache as the OS reports it (sysfs, then
// sysconf); 0 when unknown.
int64_t LastLevelCacheBytes();

// What a calibration is valid for: the device's identity plus the machine
// around it (driver, online cores, memory, last-level cache, kernel release).
// A cached calibration under another fingerprint is not used.
std::string CalibrationFingerprint(const backend::DeviceInfo& info);

// The copy rates of a device with its own memory (host_to_device_gbps,
// device_to_host_gbps in `p`), timed from and into a HostTensor: the memory a
// run's inputs come from and its outputs go to, so the same path (the host
// arena's direct DMA where a CUDA worker serves the device, the staging path
// elsewhere). Nothing to do for a host-memory device. Part of Calibrate.
absl::Status MeasureCopyRates(backend::Device& device, backend::DeviceProfile* p);

// Measures `device` (from_cache false, seconds 0). Takes a fraction of a
// second to a few seconds.
absl::StatusOr<CalibrationResult> Calibrate(backend::Device& device);

// The cached profile for `device` under `cache_dir`, or a fresh measurement
// that is then stored unless the host's load average per core exceeded
// `max_load_per_core` around it. An unreadable, incomplete or foreign cache
// file (another fingerprint or calibration version) is measured over and
// rewritten. `refresh` measures without reading the cache (and stores).
absl::StatusOr<CalibrationResult> CalibrateCached(backend::Device& device,
                                                  const std::string& cache_dir,
                                                  double max_load_per_core = 2.0,
                                                  bool refresh = false);

}  // namespace kiln::runtime
