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
};

// Measures `device`. Takes a fraction of a second to a few seconds.
absl::StatusOr<backend::DeviceProfile> Calibrate(backend::Device& device);

// The cached profile for `device` under `cache_dir`, or a fresh measurement
// that is then stored. An unreadable or foreign cache file is measured over.
absl::StatusOr<CalibrationResult> CalibrateCached(backend::Device& device,
                                                  const std::string& cache_dir);

}  // namespace kiln::runtime
