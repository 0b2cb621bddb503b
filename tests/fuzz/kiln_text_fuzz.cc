// The `.kiln` text parser (engine/ir/text.h) on arbitrary text. An error or a
// verified graph, never a crash; a graph it accepts keeps the round-trip promise
// of text.h: print(parse(print(g))) == print(g). Text starting with "#!internal"
// is parsed as pass tests are (internal ops allowed), the rest as client text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/ir/text.h"

namespace {

kiln::ir::ParseOptions FuzzOptions(bool internal) {
  kiln::ir::ParseOptions options;
  options.allow_internal_ops = internal;
  // kilnd's default limits (server/config.h), smaller tensors so that a
  // constant the fuzzer declares stays cheap.
  options.limits.max_rank = 8;
  options.limits.max_tensor_elements = int64_t{1} << 20;
  options.limits.max_tensor_bytes = int64_t{1} << 22;
  options.limits.max_subgraph_depth = 8;
  options.max_nodes = 100000;
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool internal = text.substr(0, 10) == "#!internal";
  const kiln::ir::ParseOptions options = FuzzOptions(internal);
  auto graph = kiln::ir::ParseGraph(text, options);
  if (!graph.ok()) return 0;
  const std::string printed = kiln::ir::PrintGraph(**graph);
  auto again = kiln::ir::ParseGraph(printed, options);
  if (!again.ok()) {
    std::fprintf(stderr, "printed graph does not parse: %s\n--- printed:\n%s\n",
                 again.status().ToString().c_str(), printed.c_str());
    std::abort();
  }
  const std::string reprinted = kiln::ir::PrintGraph(**again);
  if (reprinted != printed) {
    std::fprintf(stderr, "round trip changed the graph\n--- first:\n%s\n--- second:\n%s\n",
                 printed.c_str(), reprinted.c_str());
    std::abort();
  }
  return 0;
}
