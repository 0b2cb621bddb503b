#include "clients/cpp/report_format.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/dtype.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

// Enum value names without their common prefix: PATH_NATIVE -> NATIVE.
std::string PathName(v1::Path p) {
  std::string s = v1::Path_Name(p);
  return s.rfind("PATH_", 0) == 0 ? s.substr(5) : s;
}

std::string OpName(v1::OpKind op) {
  std::string s = v1::OpKind_Name(op);
  if (s.rfind("OP_", 0) == 0) s = s.substr(3);
  std::transform(s.begin(), s.end(), s.begin(), [](char c) { return std::tolower(c); });
  return s;
}

std::string StepNodes(const v1::DispatchStep& s) {
  std::vector<std::string> parts;
  for (int i = 0; i < s.node_ids_size(); ++i) {
    const std::string& name = i < s.node_names_size() ? s.node_names(i) : std::string();
    parts.push_back(name.empty() ? absl::StrCat("%", s.node_ids(i)) : name);
  }
  std::string out = absl::StrJoin(parts, ",");
  constexpr size_t kMax = 36;
  if (out.size() > kMax) out = absl::StrCat(out.substr(0, kMax - 3), "...");
  return out;
}

// One row per device estimate (`*` marks the chosen one), then the server's
// reason for the choice, with the runner-up's estimate when there is one.
std::string FormatPlacement(const v1::Placement& p) {
  std::vector<std::vector<std::string>> rows;
  const v1::DeviceEstimate* chosen = nullptr;
  const v1::DeviceEstimate* runner_up = nullptr;
  for (const v1::DeviceEstimate& e : p.estimates()) {
    const bool is_chosen = e.device() == p.chosen();
    if (is_chosen) {
      chosen = &e;
    } else if (e.feasible() &&
               (runner_up == nullptr || e.estimate_micros() < runner_up->estimate_micros())) {
      runner_up = &e;
    }
    rows.push_back({is_chosen ? "*" : "", e.device(),
                    e.feasible() ? absl::StrFormat("%.1f", e.estimate_micros()) : "-",
                    e.feasible() ? "yes" : "no", e.reason()});
  }
  std::string out =
      absl::StrCat("placement (policy ", p.policy().empty() ? "auto" : p.policy(), ")\n");
  if (!rows.empty()) {
    absl::StrAppend(&out, FormatTable({"", "device", "estimate us", "feasible", "reason"},
                                      {false, false, true, false, false}, rows));
  }
  absl::StrAppend(&out, "chosen: ", p.chosen().empty() ? "-" : p.chosen());
  if (!p.why().empty()) absl::StrAppend(&out, " - ", p.why());
  if (chosen != nullptr && runner_up != nullptr) {
    absl::StrAppend(&out, absl::StrFormat(" (%.1f us vs %.1f us on %s)", chosen->estimate_micros(),
                                          runner_up->estimate_micros(), runner_up->device()));
  }
  return out + "\n";
}

nlohmann::json PlacementJson(const v1::Placement& p) {
  nlohmann::json estimates = nlohmann::json::array();
  for (const v1::DeviceEstimate& e : p.estimates()) {
    estimates.push_back({{"device", e.device()},
                         {"estimate_micros", e.estimate_micros()},
                         {"feasible", e.feasible()},
                         {"reason", e.reason()}});
  }
  return {
      {"policy", p.policy()}, {"chosen", p.chosen()}, {"why", p.why()}, {"estimates", estimates}};
}

}  // namespace

std::string FormatTable(const std::vector<std::string>& header, const std::vector<bool>& numeric,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      if (c > 0) out += "  ";
      out += numeric[c] ? pad + cells[c] : (c + 1 == cells.size() ? cells[c] : cells[c] + pad);
    }
    // Empty trailing cells would leave blanks at the end of the line.
    out.erase(out.find_last_not_of(' ') + 1);
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string HumanCount(double v) {
  static constexpr const char* kUnits[] = {"", " k", " M", " G", " T", " P"};
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f", v) : absl::StrFormat("%.2f%s", v, kUnits[u]);
}

std::string HumanBytes(double v) {
  static constexpr const char* kUnits[] = {" B", " KiB", " MiB", " GiB", " TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f%s", v, kUnits[u]) : absl::StrFormat("%.1f%s", v, kUnits[u]);
}

std::string FormatTensorType(const v1::TensorType& type) {
  std::vector<std::string> dims;
  for (const v1::Dim& d : type.dims()) {
    dims.push_back(d.has_symbol() ? d.symbol() : absl::StrCat(d.size()));
  }
  return absl::StrCat(DTypeName(type.dtype()), "[", absl::StrJoin(dims, ", "), "]");
}

std::string FormatSignature(const v1::Signature& sig) {
  std::string out;
  auto section = [&](const char* title, const auto& entries) {
    for (const v1::SignatureEntry& e : entries) {
      absl::StrAppend(&out, title, " ", e.name(), ": ", FormatTensorType(e.type()), "\n");
    }
  };
  section("input ", sig.inputs());
  section("param ", sig.params());
  section("output", sig.outputs());
  return out;
}

std::string FormatCompileReport(const v1::CompileReport& r) {
  std::string out = absl::StrCat(
      "executable ", r.executable_key().empty() ? "(none: verified only)" : r.executable_key(),
      "\ncache      ", v1::CacheOutcome_Name(r.executable_cache()),
      " (kernels: ", r.kernel_cache_hits(), " hits, ", r.kernel_cache_misses(), " misses)\n",
      absl::StrFormat("compile    %.1f us, %d kernels, %d copies\n", r.total_micros(), r.kernels(),
                      r.copies()));
  if (!r.compiler_version().empty())
    absl::StrAppend(&out, "compiler   ", r.compiler_version(), "\n");
  if (r.stages_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const v1::StageTiming& s : r.stages()) {
      rows.push_back(
          {s.stage(), absl::StrFormat("%.1f", s.micros()), absl::StrCat(s.nodes_after())});
    }
    absl::StrAppend(&out, "\n", FormatTable({"stage", "us", "nodes"}, {false, true, true}, rows));
  }
  if (r.paths_size() > 0) {
    std::vector<std::string> parts;
    for (const v1::PathCount& p : r.paths()) {
      parts.push_back(absl::StrCat(PathName(p.path()), " ", p.nodes()));
    }
    absl::StrAppend(&out, "\npaths      ", absl::StrJoin(parts, ", "), "\n");
  }
  for (const v1::MemoryPlanSummary& m : r.memory()) {
    absl::StrAppend(&out, "memory     ", m.device(), ": arena ", HumanBytes(m.arena_bytes()),
                    " (naive ", HumanBytes(m.naive_bytes()), ", lower bound ",
                    HumanBytes(m.lower_bound_bytes()), "), ", m.in_place(), " in place, ",
                    m.aliases(), " aliases\n");
  }
  for (const std::string& n : r.notes()) absl::StrAppend(&out, "note       ", n, "\n");
  return out;
}

std::string FormatReportTable(const v1::DispatchReport& r) {
  std::string out = absl::StrCat("request ", r.request_id().empty() ? "-" : r.request_id());
  if (!r.tenant().empty()) absl::StrAppend(&out, "  tenant ", r.tenant());
  absl::StrAppend(&out, "  executable ",
                  r.executable_key().empty() ? "-" : r.executable_key().substr(0, 16));
  if (r.has_compile()) {
    absl::StrAppend(&out, " (", v1::CacheOutcome_Name(r.compile().executable_cache()), ")");
  }
  if (r.has_placement() && !r.placement().chosen().empty()) {
    absl::StrAppend(&out, "  placed on ", r.placement().chosen());
  }
  absl::StrAppend(&out, absl::StrFormat("\nrun %.1f us, queue %.1f us, %d steps\n\n",
                                        r.run_micros(), r.queue_micros(), r.steps_size()));
  if (r.has_placement()) absl::StrAppend(&out, FormatPlacement(r.placement()), "\n");
  std::vector<std::vector<std::string>> rows;
  for (const v1::DispatchStep& s : r.steps()) {
    std::string kernel = s.kernel();
    if (kernel.empty()) kernel = s.kind() == v1::STEP_COPY ? "copy" : "?";
    rows.push_back({kernel, s.implementation(), PathName(s.path()), s.device(), StepNodes(s),
                    HumanCount(s.flops()), HumanBytes(s.bytes()),
                    absl::StrFormat("%.1f", s.start_micros()),
                    absl::StrFormat("%.1f", s.duration_micros())});
  }
  absl::StrAppend(
      &out, FormatTable({"kernel", "implementation", "path", "device", "nodes", "flops", "bytes",
                         "start us", "duration us"},
                        {false, false, false, false, false, true, true, true, true}, rows));
  for (const v1::DeviceTotals& t : r.totals()) {
    absl::StrAppend(&out,
                    absl::StrFormat("\n%s: busy %.1f us, %d kernels, peak %s", t.device(),
                                    t.busy_micros(), t.kernels(), HumanBytes(t.peak_bytes())));
  }
  if (r.totals_size() > 0) out += "\n";
  return out;
}

std::string ReportsToChromeTrace(std::span<const v1::DispatchReport> reports) {
  int64_t origin = 0;
  for (const v1::DispatchReport& r : reports) {
    if (r.start_unix_micros() > 0 && (origin == 0 || r.start_unix_micros() < origin)) {
      origin = r.start_unix_micros();
    }
  }
  nlohmann::json events = nlohmann::json::array();
  int pid = 0;
  for (const v1::DispatchReport& r : reports) {
    ++pid;
    const double base =
        r.start_unix_micros() > 0 ? static_cast<double>(r.start_unix_micros() - origin) : 0.0;
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args", {{"name", absl::StrCat("kiln request ", r.request_id())}}}});
    // Track 0 holds the request as a whole; devices get tracks 1, 2, ...
    std::map<std::string, int> tid;
    for (const v1::DispatchStep& s : r.steps()) {
      if (!tid.contains(s.device())) tid.emplace(s.device(), static_cast<int>(tid.size()) + 1);
    }
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", "request"}}}});
    for (const auto& [device, id] : tid) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", id},
                        {"args", {{"name", device}}}});
    }
    events.push_back(
        {{"name", "run"},
         {"cat", "request"},
         {"ph", "X"},
         {"pid", pid},
         {"tid", 0},
         {"ts", base},
         {"dur", r.run_micros()},
         {"args",
          {{"request_id", r.request_id()},
           {"tenant", r.tenant()},
           {"executable_key", r.executable_key()},
           {"queue_micros", r.queue_micros()},
           {"cache", r.has_compile() ? v1::CacheOutcome_Name(r.compile().executable_cache())
                                     : std::string()},
           {"placement", PlacementJson(r.placement())}}}});
    for (const v1::DispatchStep& s : r.steps()) {
      nlohmann::json nodes = nlohmann::json::array();
      for (int i = 0; i < s.node_ids_size(); ++i) {
        nodes.push_back(
            {{"id", s.node_ids(i)}, {"name", i < s.node_names_size() ? s.node_names(i) : ""}});
      }
      nlohmann::json ops = nlohmann::json::array();
      for (int op : s.ops()) ops.push_back(OpName(static_cast<v1::OpKind>(op)));
      events.push_back({{"name", s.kernel().empty() ? std::string("copy") : s.kernel()},
                        {"cat", PathName(s.path())},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", tid[s.device()]},
                        {"ts", base + s.start_micros()},
                        {"dur", s.duration_micros()},
                        {"args",
                         {{"implementation", s.implementation()},
                          {"device", s.device()},
                          {"flops", s.flops()},
                          {"bytes", s.bytes()},
                          {"queue_wait_micros", s.queue_wait_micros()},
                          {"ops", ops},
                          {"nodes", nodes}}}});
    }
  }
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump(1);
}

}  // namespace kiln
