// Transforms (DESIGN.md section 3, stage 2): the graph-to-graph transforms a
// compile asks for through CompileOptions::transforms (kiln/v1/train.proto):
// autodiff (grad, grad_with_loss, vjp, jvp, hvp: passes/autodiff.h) or a
// training step (the backward graph plus the optimizer's updates:
// train/train_step.h), then vmap (passes/vmap.h), so that vmap of a gradient
// gives per-example gradients. QAT (passes/qat.h) or AMP (passes/amp.h)
// rewrite the forward graph first, so the gradients are those of the
// quantized or mixed-precision forward; a training step takes AMP's loss
// scaling and QAT's learned scales. A graph that asks for none passes through.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/passes/amp.h"
#include "engine/passes/autodiff.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"
#include "engine/passes/qat.h"
#include "engine/passes/vmap.h"
#include "engine/train/train_step.h"

namespace kiln::passes {
namespace {

class TransformsPass final : public Pass {
 public:
  std::string name() const override { return "transforms"; }
  absl::Status Run(ir::Graph& graph, PassContext& ctx) const override {
    const v1::TransformSpec& spec = ctx.transforms;
    const bool training = spec.has_training();
    if (training && spec.autodiff().mode() != v1::AUTODIFF_NONE) {
      return absl::InvalidArgumentError(
          "the compile options ask for both a training step and an autodiff transform; a "
          "training step takes its gradients itself");
    }
    if (training && spec.has_vmap()) {
      return absl::InvalidArgumentError(
          "the compile options ask for both a training step and vmap; a training step batches "
          "through its graph's own batch dim");
    }
    const bool amp = AmpRequested(spec.amp());
    if (amp && spec.has_qat()) {
      return absl::InvalidArgumentError(
          "the compile options ask for both AMP and QAT; quantization-aware training runs in f32");
    }
    train::StepExtras extras;
    if (spec.has_qat()) {
      KILN_RETURN_IF_ERROR(ValidateQat(spec.qat()));
      KILN_ASSIGN_OR_RETURN(bool changed, ApplyQat(graph, spec.qat(), &extras.lsq_scales));
      ctx.notes.push_back(changed ? absl::StrCat("transforms: qat int",
                                                 spec.qat().bits() == 0 ? 8 : spec.qat().bits(),
                                                 " fake quantization")
                                  : "transforms: qat found no f32 matmul or conv");
    }
    if (amp) {
      KILN_RETURN_IF_ERROR(ValidateAmp(spec.amp()));
      KILN_ASSIGN_OR_RETURN(bool changed, ApplyAmp(graph, spec.amp()));
      ctx.notes.push_back(
          changed ? absl::StrCat("transforms: amp ", DTypeName(spec.amp().compute()), " compute")
                  : "transforms: amp found no f32 matmul, attention or conv");
      extras.amp = &spec.amp();
    }
    if (training) {
      if (spec.training().loss().empty()) {
        return absl::InvalidArgumentError("the training spec names no loss output");
      }
      KILN_RETURN_IF_ERROR(
          train::AppendTrainStep(graph, spec.training(), &ctx.param_updates, extras));
      ctx.notes.push_back(absl::StrCat("transforms: training step on loss \"",
                                       spec.training().loss(), "\" with ", ctx.param_updates.size(),
                                       " param updates"));
      return absl::OkStatus();
    }
    KILN_ASSIGN_OR_RETURN(bool changed, ApplyAutodiff(graph, spec.autodiff()));
    if (changed) {
      ctx.notes.push_back(
          absl::StrCat("transforms: ", v1::AutodiffMode_Name(spec.autodiff().mode()), " of \"",
                       spec.autodiff().output(), "\""));
    }
    if (spec.has_vmap()) {
      KILN_RETURN_IF_ERROR(ApplyVmap(graph, spec.vmap()).status());
      ctx.notes.push_back(absl::StrCat("transforms: vmap of size ", spec.vmap().size(), " at axis ",
                                       spec.vmap().axis()));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeTransformsPass() { return std::make_unique<TransformsPass>(); }

}  // namespace kiln::passes
