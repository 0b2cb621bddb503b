// The compile pipeline driver (DESIGN.md section 3): the stages in order,
//   hir -> transforms -> legalize -> mir -> fuse -> place -> plan_memory -> lir
// (the middle ones are passes::PipelineStages()), each timed in the compile
// report's `stages` with the node count after it. With dumping on
// (CompileOptions::dump_dir, else $KILN_DUMP) the graph's text form is written
// after each stage as <dir>/<graph>.<index>_<stage>.kiln.
//
// The pipeline compiles; it does not cache (executable_cache.h does).
//
// Thread safety: const after construction; Hir and Compile may run on any
// number of threads at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "engine/ir/graph.h"
#include "engine/ir/verifier.h"
#include "engine/runtime/cost_model.h"
#include "engine/runtime/device_registry.h"
#include "engine/runtime/program.h"
#include "kiln/v1/report.pb.h"

namespace kiln::compile {

struct PipelineOptions {
  std::shared_ptr<const runtime::DeviceRegistry> registry;  // required
  // Not owned; must outlive the pipeline. May be null: fixed heuristics.
  const runtime::CostModel* cost_model = nullptr;
  // Kernel binaries for the programs compiled; may be null (no kernel cache).
  std::shared_ptr<backend::KernelBinaryCache> kernel_binaries;
  runtime::ProgramOptions program_options;
  ir::VerifyOptions verify;
};

// The HIR stage's result: the verified, specialized graph and its executable
// key (executable_key.h) as Hex() and Components().
struct HirGraph {
  std::unique_ptr<ir::Graph> graph;
  std::string key;
  std::vector<v1::KeyComponent> key_components;
};

class Pipeline {
 public:
  explicit Pipeline(PipelineOptions options);
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Stage 1 (hir): imports and verifies `graph`, specializes it to `shapes`,
  // checks that `options.device` names a device, and computes the executable
  // key (executable_key.h). Fills the report's compiler version, executable
  // key and its components, and the "hir" stage.
  absl::StatusOr<HirGraph> Hir(const v1::Graph& graph, const CompileOptions& options,
                               const std::vector<std::pair<std::string, Dims>>& shapes,
                               v1::CompileReport& report) const;

  // Stages 2..8 on a graph from Hir, then loads the program (kernels prepared,
  // constants uploaded). `key` becomes the executable's key. Fills the report's
  // stages, memory plans, notes, paths, kernel and copy counts and kernel
  // cache hits and misses.
  absl::StatusOr<std::unique_ptr<runtime::Program>> Compile(std::unique_ptr<ir::Graph> graph,
                                                            const CompileOptions& options,
                                                            const std::string& key,
                                                            v1::CompileReport& report) const;

  // Stages 2..8 without loading: the executable (While steps with their
  // compiled cond and body, LirKernel.subprograms). Fills the report as Compile.
  absl::StatusOr<v1::Executable> CompileToLir(std::unique_ptr<ir::Graph> graph,
                                              const CompileOptions& options, const std::string& key,
                                              v1::CompileReport& report) const;

  // One small compile on the CPU, not cached: pays the process's one-time
  // costs (lazy protobuf and table set-up in the importer and the passes, the
  // CPU kernels' first JIT) at start-up instead of in the first request.
  absl::Status WarmUp() const;

  // The devices part of every key this pipeline computes.
  const std::string& devices_signature() const { return devices_signature_; }

 private:
  // A While's cond or body as its own executable on `device`: its inputs, in
  // node order, bound to the carry types and named c0 .. cN-1. `where` names
  // it in errors ("node 4 \"w\" (while): body").
  absl::StatusOr<v1::Executable> CompileSubgraph(const v1::Graph& subgraph,
                                                 const std::vector<v1::TensorType>& carries,
                                                 const std::string& device,
                                                 const CompileOptions& options,
                                                 const std::string& where) const;
  // Compiles and attaches the cond and body of every While step of `lir`.
  absl::Status CompileWhileSteps(v1::Executable& lir, const CompileOptions& options) const;

  const PipelineOptions options_;
  const std::string devices_signature_;
};

}  // namespace kiln::compile
