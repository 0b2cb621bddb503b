// The clock of the compile reports' stage and lookup times (pipeline.cc,
// executable_cache.cc): one definition, so that the unity build's batches
// see no duplicate.
#pragma once

#include <chrono>

namespace kiln::compile {

using Clock = std::chrono::steady_clock;

// Microseconds from `t` to now.
inline double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

}  // namespace kiln::compile
