#include "base/openmp_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace kiln {

void UseBoundedOpenMpSpin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  // The variable is set before the exec, so the new image returns above: at
  // most one exec, whatever happens.
  if (::setenv("GOMP_SPINCOUNT", kDefaultOpenMpSpinCount, 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): libgomp keeps the defaults it already read.
}

}  // namespace kiln
