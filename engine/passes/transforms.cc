// Transforms (DESIGN.md section 3, stage 2): the graph-to-graph transforms a
// compile asks for (grad, jvp, vmap, AMP, QAT, optimizer updates). None is
// requestable yet (they arrive with the training work), so this stage checks
// that the graph carries nothing it would have to transform and passes it on;
// it keeps its place and timing in the pipeline.
#include "absl/strings/str_cat.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"

namespace kiln::passes {
namespace {

class TransformsPass final : public Pass {
 public:
  std::string name() const override { return "transforms"; }
  absl::Status Run(ir::Graph&, PassContext&) const override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Pass> MakeTransformsPass() { return std::make_unique<TransformsPass>(); }

}  // namespace kiln::passes
