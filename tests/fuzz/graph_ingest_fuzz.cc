// The graph ingest path of kilnd on arbitrary bytes: a binary kiln.v1.Graph
// (what Compile and Run receive), imported and verified (Engine::Inspect), and
// compiled on the CPU backend when it verifies, with every symbolic input dim
// bound to a small size. Every stage answers with a status, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace {

kiln::Engine& GetEngine() {
  static kiln::Engine* engine = [] {
    kiln::EngineOptions options;
    options.cpu_threads = 1;
    options.calibration = kiln::EngineOptions::Calibration::kNever;
    options.disabled_backends = {"vulkan", "cuda"};
    options.max_memory_executables = 8;
    // kilnd's limits, with tensors small enough that a compile stays quick.
    options.verify.max_nodes = 4096;
    options.verify.limits.max_rank = 8;
    options.verify.limits.max_tensor_elements = int64_t{1} << 16;
    options.verify.limits.max_tensor_bytes = int64_t{1} << 20;
    options.verify.limits.max_subgraph_depth = 8;
    auto created = kiln::Engine::Create(options);
    if (!created.ok()) {
      std::fprintf(stderr, "Engine::Create: %s\n", created.status().ToString().c_str());
      std::abort();
    }
    return created->release();
  }();
  return *engine;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::v1::Graph graph;
  if (!graph.ParseFromArray(data, static_cast<int>(size))) return 0;
  kiln::Engine& engine = GetEngine();
  absl::StatusOr<kiln::GraphSignature> signature = engine.Inspect(graph);
  if (!signature.ok()) return 0;
  std::vector<std::pair<std::string, kiln::Dims>> shapes;
  for (const kiln::GraphSignature::Entry& input : signature->inputs) {
    kiln::Dims dims;
    bool symbolic = false;
    for (const kiln::v1::Dim& dim : input.type.dims()) {
      symbolic = symbolic || !dim.has_size();
      dims.push_back(dim.has_size() ? dim.size() : 2);
    }
    if (symbolic) shapes.emplace_back(input.name, std::move(dims));
  }
  kiln::CompileOptions options;
  options.device = "cpu:0";
  (void)engine.Compile(graph, options, shapes);
  return 0;
}
