// The pass interface and the named stages of the compile pipeline
// (DESIGN.md section 3). One pass per file in engine/passes/.
//
// A pass transforms an ir::Graph in place. Passes are stateless objects; all
// per-compile state lives in PassContext. Not thread-safe: one compile owns its
// graph and context.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "engine/ir/graph.h"
#include "kiln/v1/report.pb.h"
#include "kiln/v1/train.pb.h"

namespace kiln::runtime {
class CostModel;
}

namespace kiln::passes {

// Where plan_memory put each value: arena values have an offset in their
// device's arena; sources (inputs, params, constants) live in their own
// buffers and have none.
struct ValuePlacement {
  std::string device;
  bool arena = false;
  int64_t offset = -1;
  int64_t bytes = 0;
  bool in_place = false;  // reuses an operand's buffer
  bool alias = false;     // a view of its operand (reshape)
};

struct MemoryPlan {
  absl::flat_hash_map<ir::ValueRef, ValuePlacement> values;
  absl::flat_hash_map<std::string, int64_t> arena_bytes;  // per device
};

struct PassContext {
  // Devices the graph may run on, in preference order; the first is the
  // guaranteed fallback (the CPU). Not owned.
  std::vector<backend::Device*> devices;
  // Placement policy: "auto" or a device id ("cpu:0", "vulkan:0").
  std::string placement = "auto";
  // Legalize decomposes ops with a common-IR form even when a device claims
  // them natively (exercises decompositions on every backend).
  bool prefer_common_ir = false;
  bool enable_fusion = true;
  const runtime::CostModel* cost_model = nullptr;  // may be null: fixed heuristics
  // What the transforms stage applies (autodiff, training step).
  v1::TransformSpec transforms;

  // Set by transforms for a training step: graph outputs that are the new
  // values of params (output name -> param name). Lowering makes them the
  // executable's param updates instead of outputs.
  std::vector<std::pair<std::string, std::string>> param_updates;

  // Filled by passes for the compile report.
  std::vector<std::string> notes;
  std::vector<v1::MemoryPlanSummary> memory;
  v1::Placement placement_report;
  MemoryPlan memory_plan;  // set by plan_memory, read by lowering
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  virtual absl::Status Run(ir::Graph& graph, PassContext& context) const = 0;
};

// The pipeline's graph stages, in order: transforms, legalize, canonicalize,
// fuse, place, plan_memory. (HIR is import + verify; LIR is lowering.)
std::vector<std::string> PipelineStages();
// Creates a pass by name: any pipeline stage, or one of the canonicalize
// sub-passes ("cse", "dce", "constant_fold") for pass tests.
absl::StatusOr<std::unique_ptr<Pass>> CreatePass(std::string_view name);

}  // namespace kiln::passes
