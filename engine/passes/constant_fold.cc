// Constant folding: a node whose operands are all constants is evaluated at
// compile time by the CPU backend's own kernel (so folded values equal what
// the device computes) and replaced by a constant. Results above a size limit
// stay unfolded, so folding never bloats an executable (an expand of a scalar
// is cheaper to run than to store).
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/passes/kernel_spec.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"
#include "engine/runtime/evaluate.h"

namespace kiln::passes {
namespace {

constexpr int64_t kMaxFoldedBytes = 256 * 1024;

class ConstantFoldPass final : public Pass {
 public:
  std::string name() const override { return "constant_fold"; }

  absl::Status Run(ir::Graph& g, PassContext& ctx) const override {
    if (ctx.devices.empty()) return absl::OkStatus();
    backend::Device& cpu = *ctx.devices[0];
    // In node order, so a node whose operands were folded earlier in this
    // sweep folds too.
    std::vector<ir::Node*> order;
    for (const auto& np : g.nodes()) order.push_back(np.get());
    int folded_count = 0;
    for (ir::Node* n : order) {
      if (n->op == v1::OP_INPUT || n->op == v1::OP_PARAM || n->op == v1::OP_CONSTANT) continue;
      if (n->op == v1::OP_COPY || n->outputs.size() != 1 || n->operands.empty()) continue;
      bool all_const = true;
      for (const ir::ValueRef& v : n->operands) {
        all_const = all_const && g.FindNode(v.node)->op == v1::OP_CONSTANT;
      }
      if (!all_const || n->outputs[0].num_bytes() > kMaxFoldedBytes) continue;
      const backend::KernelSpec spec = SpecOf(g, *n);
      if (!cpu.Supports(spec).native) continue;
      std::vector<const HostTensor*> inputs;
      for (const ir::ValueRef& v : n->operands) inputs.push_back(g.FindNode(v.node)->value.get());
      auto result = runtime::EvaluateKernel(cpu, spec, inputs);
      if (!result.ok()) {
        // A data-dependent failure (an out-of-range gather index in constant
        // data) would fail every run: report it now, naming the node.
        if (absl::IsOutOfRange(result.status()) || absl::IsInvalidArgument(result.status())) {
          return result.status();
        }
        continue;
      }
      auto folded = std::make_unique<ir::Node>();
      folded->id = g.NextId();
      folded->op = v1::OP_CONSTANT;
      folded->attrs.mutable_constant();
      folded->outputs = n->outputs;
      folded->value = std::make_shared<const HostTensor>(std::move((*result)[0]));
      folded->path = v1::PATH_NATIVE;
      folded->device = n->device;
      folded->origins = n->origins;
      ir::Node* made = g.AddNode(std::move(folded));
      g.ReplaceAllUses(n->out(), made->out());
      ++folded_count;
    }
    if (folded_count > 0) {
      g.RemoveDeadNodes();
      KILN_RETURN_IF_ERROR(g.SortTopologically());
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeConstantFoldPass() { return std::make_unique<ConstantFoldPass>(); }

}  // namespace kiln::passes
