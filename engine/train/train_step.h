// The training step transform (DESIGN.md section 9): appends to a graph the
// backward graph of its loss (passes/autodiff.h) and the optimizer's update
// ops, so one executable takes a batch, returns the loss, and writes the new
// params and optimizer state back into its param set on the device.
//
// After the transform the graph has:
//   params   the graph's own, plus the optimizer state (all frozen):
//              opt/step                 i64 scalar, steps taken
//              opt/<param>/m, /v        Adam, AdamW, Muon's AdamW part
//              opt/<param>/momentum     SGD (momentum > 0), Lion, Muon
//   outputs  <loss> (the loss before the step's update), metrics/lr (the
//            learning rate the step used), then update/<name> for every
//            trained param and state tensor: the param-update outputs that
//            `param_updates` lists (lowering turns them into the
//            executable's param writes; they never reach the host).
//
// The optimizers follow PyTorch 1.13's torch.optim formulas (SGD with
// momentum, dampening and Nesterov; Adam with L2 weight decay; AdamW with
// decoupled decay), Lion (Chen et al. 2023) and Muon (K. Jordan 2024:
// momentum, Nesterov, 5 Newton-Schulz steps with (3.4445, -4.7750, 2.0315),
// scaled by sqrt(max(1, rows / cols)); params that are not matrices take
// AdamW). docs/training.md has the formulas and defaults.
//
// REQUIRES: the graph is verified and specialized.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/ir/graph.h"
#include "engine/passes/qat.h"
#include "kiln/v1/train.pb.h"

namespace kiln::train {

inline constexpr char kStatePrefix[] = "opt/";
inline constexpr char kStepParam[] = "opt/step";
inline constexpr char kUpdatePrefix[] = "update/";
inline constexpr char kLrOutput[] = "metrics/lr";
// Loss scaling (AmpSpec, DYNAMIC): the scale the step used (0 in the state
// means "not started": the step reads init_scale), the good steps since the
// scale last changed, and the steps skipped for inf/nan gradients.
inline constexpr char kLossScaleParam[] = "opt/loss_scale";
inline constexpr char kGoodStepsParam[] = "opt/loss_scale_good_steps";
inline constexpr char kSkippedStepsParam[] = "opt/skipped_steps";
inline constexpr char kLossScaleOutput[] = "metrics/loss_scale";

// What the transforms stage adds to a step besides the optimizer.
struct StepExtras {
  // Mixed precision (null or compute unset: none). Its loss scaling, when on:
  // the backward pass starts from the loss scale instead of 1 and the
  // gradients are divided by it before clipping and the update. DYNAMIC
  // follows torch.cuda.amp.GradScaler: a step whose gradients hold an inf or
  // a NaN changes no param and no optimizer state (opt/step included), counts
  // in opt/skipped_steps and multiplies the scale by backoff_factor; after
  // growth_interval good steps in a row the scale grows by growth_factor.
  // The step outputs metrics/loss_scale (the scale it used).
  const v1::AmpSpec* amp = nullptr;
  // QAT's learned scales (passes/qat.h): each update writes `init` into a
  // scale param that is not positive.
  std::vector<passes::LsqScale> lsq_scales;
};

// Checks the optimizer's hyper-parameters; INVALID_ARGUMENT naming the field.
absl::Status ValidateOptimizer(const v1::OptimizerSpec& spec);

// Rewrites `graph` into its training step. `param_updates` receives
// (output name, param name) for each update output. INVALID_ARGUMENT for an
// unknown or frozen trained param, a loss that is missing or not a scalar
// float, bad hyper-parameters; UNIMPLEMENTED for a non-differentiable node on
// the path (named).
absl::Status AppendTrainStep(ir::Graph& graph, const v1::TrainingSpec& spec,
                             std::vector<std::pair<std::string, std::string>>* param_updates,
                             const StepExtras& extras = {});

// Whether a param of the step's graph is optimizer state (zero at the start).
inline bool IsOptimizerState(const std::string& name) { return name.rfind(kStatePrefix, 0) == 0; }

}  // namespace kiln::train
