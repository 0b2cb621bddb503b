#include "base/openmp_policy.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace kiln {

void UseBoundedOpenMpSpin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  // Under valgrind /proc/self/exe is the tool's own binary, which refuses to
  // be run directly (valgrind's preload library names it in LD_PRELOAD): keep
  // libgomp's defaults there rather than fail to start.
  if (const char* preload = std::getenv("LD_PRELOAD");
      preload != nullptr && std::strstr(preload, "vgpreload") != nullptr) {
    return;
  }
  // The variable is set before the exec, so the new image returns above: at
  // most one exec, whatever happens.
  if (::setenv("GOMP_SPINCOUNT", kDefaultOpenMpSpinCount, 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): libgomp keeps the defaults it already read.
}

}  // namespace kiln
