// Human and tool views of kilnd's reports (DESIGN.md section 6): an aligned
// text table for terminals and Chrome trace-event JSON for Perfetto and
// chrome://tracing. Client-side on purpose: clients depend on the protos only,
// never on the engine (whose runtime has its own single-report exporter).
// Pure functions; thread-safe.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kiln/v1/report.pb.h"
#include "kiln/v1/service.pb.h"

namespace kiln {

// A summary line (request, executable key, cache outcome, placement, run
// time); the placement: one row per device estimate (estimate, feasible,
// reason; `*` marks the chosen device), then a `chosen:` line with the
// server's reason; one row per step: kernel, implementation, path, device,
// nodes, flops, bytes, start, duration; then per-device totals.
std::string FormatReportTable(const v1::DispatchReport& report);

// Cache outcome, stage timings, memory plan and notes of a compile.
std::string FormatCompileReport(const v1::CompileReport& report);

// Inputs, params and outputs with their types: `x: f32[batch, 784]`.
std::string FormatSignature(const v1::Signature& signature);
std::string FormatTensorType(const v1::TensorType& type);

// Chrome trace-event JSON: one process per report (named by request id), one
// thread per device, one complete event per step; the request's event carries
// the placement (policy, chosen, why, estimates) in its args. Reports are
// placed on one time axis by their start_unix_micros (the first at 0).
std::string ReportsToChromeTrace(std::span<const v1::DispatchReport> reports);

// An aligned text table: columns separated by two spaces, `numeric` ones
// right-aligned, no trailing blanks.
std::string FormatTable(const std::vector<std::string>& header, const std::vector<bool>& numeric,
                        const std::vector<std::vector<std::string>>& rows);

// "1.50 G", "12.3 k" (SI) and "1.5 MiB" (binary) for table cells.
std::string HumanCount(double v);
std::string HumanBytes(double v);

}  // namespace kiln
