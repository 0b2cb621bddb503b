#include "engine/runtime/trace.h"

#include <map>

#include "nlohmann/json.hpp"

namespace kiln::runtime {

std::string ToChromeTrace(const v1::DispatchReport& report) {
  nlohmann::json events = nlohmann::json::array();
  std::map<std::string, int> tid;
  for (const v1::DispatchStep& s : report.steps()) {
    if (!tid.contains(s.device())) tid[s.device()] = static_cast<int>(tid.size()) + 1;
  }
  for (const auto& [device, id] : tid) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", id},
                      {"args", {{"name", device}}}});
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1},
                    {"args", {{"name", "kiln " + report.executable_key().substr(0, 12)}}}});
  for (const v1::DispatchStep& s : report.steps()) {
    nlohmann::json nodes = nlohmann::json::array();
    for (int i = 0; i < s.node_ids_size(); ++i) {
      nodes.push_back({{"id", s.node_ids(i)},
                       {"name", i < s.node_names_size() ? s.node_names(i) : ""}});
    }
    events.push_back({{"name", s.kernel()},
                      {"cat", v1::Path_Name(s.path())},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", tid[s.device()]},
                      {"ts", s.start_micros()},
                      {"dur", s.duration_micros()},
                      {"args",
                       {{"implementation", s.implementation()},
                        {"device", s.device()},
                        {"flops", s.flops()},
                        {"bytes", s.bytes()},
                        {"nodes", nodes}}}});
  }
  nlohmann::json doc = {{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"request_id", report.request_id()},
                          {"tenant", report.tenant()},
                          {"executable_key", report.executable_key()},
                          {"run_micros", report.run_micros()}}}};
  return doc.dump(1);
}

}  // namespace kiln::runtime
