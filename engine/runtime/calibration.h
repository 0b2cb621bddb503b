// Device calibration (DESIGN.md section 5): micro-benchmarks through the
// device's own kernels measure peak FLOP/s per dtype (matmul), memory
// bandwidth (a large elementwise add), launch overhead (tiny kernels back to
// back) and the fixed cost of a synchronizing run. Results are cached on disk
// by device identity, so a restart reuses them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace kiln::runtime {

// Bumped when the procedure changes; older cached profiles are re-measured.
inline constexpr int kCalibrationVersion = 2;

struct CalibrationResult {
  backend::DeviceProfile profile;
  bool from_cache = false;
  double seconds = 0;  // time spent measuring (0 from the cache)
  // The host was busy while measuring (load average above twice the cores):
  // the profile is used by this process but not cached, so the next start
  // measures again instead of keeping a slow reading for good.
  bool contended = false;
};

// The host's 1-minute load average per online core (0 when unknown).
double HostLoadPerCore();

// Measures `device`. Takes a fraction of a second to a few seconds.
absl::StatusOr<backend::DeviceProfile> Calibrate(backend::Device& device);

// The cached profile for `device` under `cache_dir`, or a fresh measurement
// that is then stored unless the host's load average per core exceeded
// `max_load_per_core` around it. An unreadable or foreign cache file is
// measured over.
absl::StatusOr<CalibrationResult> CalibrateCached(backend::Device& device,
                                                  const std::string& cache_dir,
                                                  double max_load_per_core = 2.0);

}  // namespace kiln::runtime
