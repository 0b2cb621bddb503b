// Dispatch reports as Chrome trace-event JSON (opens in Perfetto and
// chrome://tracing): one "complete" event per step, one track per device.
#pragma once

#include <string>

#include "kiln/v1/report.pb.h"

namespace kiln::runtime {

std::string ToChromeTrace(const v1::DispatchReport& report);

}  // namespace kiln::runtime
