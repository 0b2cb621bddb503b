// Legalize (DESIGN.md section 3, stage 3): gives every node one path to a
// device — NATIVE (the device claims it), COMMON_IR / REWRITTEN (decomposed
// into primitives that are then legalized in turn), or UNSUPPORTED (the
// compile fails listing every offending node and what each device lacks).
//
// The target: a pinned device, or under `auto` the device the cost model
// estimates fastest for the whole graph (the estimate for every device goes
// into the placement report). Nodes the target cannot run, natively or by
// decomposition, fall back to the CPU (devices[0]); place inserts the copies.
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "engine/passes/decompose.h"
#include "engine/passes/kernel_spec.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"
#include "engine/runtime/cost_model.h"

namespace kiln::passes {
namespace {

// Whether fusion is expected to fold `n` into the kernel of one of its
// operands' producers: an elementwise node fed by another elementwise node
// (one fused region) or by a matmul (its epilogue).
bool FusesIntoProducer(const ir::Graph& g, const ir::Node& n) {
  if (runtime::FamilyOf(n.op) != runtime::OpFamily::kElementwise) return false;
  for (const ir::ValueRef& v : n.operands) {
    const ir::Node* p = g.FindNode(v.node);
    if (p == nullptr || IsSource(*p)) continue;
    const runtime::OpFamily f = runtime::FamilyOf(p->op);
    if (f == runtime::OpFamily::kElementwise || f == runtime::OpFamily::kMatMul) return true;
  }
  return false;
}

// Estimated time of the whole graph on `device`, with nodes it cannot claim
// run on the CPU plus the copies there and back.
double EstimateGraph(const ir::Graph& g, backend::Device& device, backend::Device& cpu,
                     const runtime::CostModel& model, std::string* dominant) {
  double total = 0;
  double worst = 0;
  int team_kernels = 0;  // kernels that split across a host's thread team
  for (const auto& np : g.nodes()) {
    if (IsSource(*np)) continue;
    const backend::KernelSpec spec = SpecOf(g, *np);
    double t;
    if (device.Supports(spec).native) {
      const runtime::Work w = runtime::EstimateWork(spec);
      t = model.KernelMicros(spec, device.info());
      // Fusion (a later stage) folds an elementwise node into the kernel of
      // the elementwise region or matmul epilogue that produces its operand:
      // that node launches nothing of its own.
      if (FusesIntoProducer(g, *np)) {
        t -= model.FixedMicros(w, device.info());
      } else if (runtime::SpansThreadTeam(w)) {
        ++team_kernels;
      }
    } else {
      const runtime::Work w = runtime::EstimateWork(spec);
      t = model.KernelMicros(spec, cpu.info()) + model.CopyMicros(w.bytes, device.info(), cpu.info());
    }
    total += t;
    if (t > worst) {
      worst = t;
      *dominant = ir::NodeLabel(*np);
    }
  }
  // Inputs arrive from the host and outputs return to it, one copy each (as
  // a run makes them: each pays its own fixed cost; empty ones are skipped).
  for (const ir::Node* in : g.Inputs()) {
    const double bytes = static_cast<double>(in->type().num_bytes());
    if (bytes > 0) total += model.CopyMicros(bytes, cpu.info(), device.info());
  }
  for (const auto& o : g.outputs()) {
    const double bytes = static_cast<double>(g.TypeOf(o.value).num_bytes());
    if (bytes > 0) total += model.CopyMicros(bytes, device.info(), cpu.info());
  }
  // Every run submits to the device's queue and waits for it once (and on a
  // host device, kernels of changing team sizes pay for the team's changes).
  total += model.RunMicros(device.info(), team_kernels);
  return total;
}

absl::StatusOr<backend::Device*> ChooseTarget(const ir::Graph& g, PassContext& ctx) {
  if (ctx.devices.empty()) return absl::FailedPreconditionError("no devices to compile for");
  backend::Device* cpu = ctx.devices[0];
  v1::Placement& report = ctx.placement_report;
  report.set_policy(ctx.placement);
  report.clear_estimates();
  const runtime::CostModel default_model;
  const runtime::CostModel& model = ctx.cost_model ? *ctx.cost_model : default_model;
  backend::Device* best = nullptr;
  double best_us = std::numeric_limits<double>::infinity();
  for (backend::Device* d : ctx.devices) {
    std::string dominant;
    const double us = EstimateGraph(g, *d, *cpu, model, &dominant);
    v1::DeviceEstimate* e = report.add_estimates();
    e->set_device(d->info().id);
    e->set_estimate_micros(us);
    e->set_feasible(true);
    e->set_reason(dominant.empty() ? "" : absl::StrCat("dominated by ", dominant));
    if (us < best_us) best_us = us, best = d;
  }
  if (ctx.placement == "auto" || ctx.placement.empty()) {
    report.set_chosen(best->info().id);
    report.set_why(ctx.devices.size() == 1
                       ? "the only device"
                       : absl::StrCat("lowest estimate: ", static_cast<int64_t>(best_us), " us"));
    return best;
  }
  backend::Device* pinned = FindDevice(ctx.devices, ctx.placement);
  if (pinned == nullptr) {
    std::vector<std::string> ids;
    for (backend::Device* d : ctx.devices) ids.push_back(d->info().id);
    return absl::InvalidArgumentError(absl::StrCat("device \"", ctx.placement,
                                                   "\" does not exist; devices: ",
                                                   absl::StrJoin(ids, ", ")));
  }
  report.set_chosen(pinned->info().id);
  report.set_why("pinned by the request");
  return pinned;
}

class LegalizePass final : public Pass {
 public:
  std::string name() const override { return "legalize"; }

  absl::Status Run(ir::Graph& g, PassContext& ctx) const override {
    KILN_ASSIGN_OR_RETURN(backend::Device * target, ChooseTarget(g, ctx));
    backend::Device* cpu = ctx.devices[0];
    std::vector<int32_t> work;
    for (const auto& n : g.nodes()) work.push_back(n->id);
    std::vector<std::string> unsupported;
    for (size_t i = 0; i < work.size(); ++i) {
      ir::Node* n = g.FindNode(work[i]);
      if (n == nullptr) continue;
      if (IsSource(*n)) {
        n->path = v1::PATH_NATIVE;
        n->device = target->info().id;
        continue;
      }
      // Nodes a decomposition made keep their COMMON_IR / REWRITTEN path.
      const bool made = n->path == v1::PATH_COMMON_IR || n->path == v1::PATH_REWRITTEN;
      const backend::KernelSpec spec = SpecOf(g, *n);
      const backend::Claim on_target = target->Supports(spec);
      // The device did not answer (its worker died): a device fault, not an
      // unsupported op.
      KILN_RETURN_IF_ERROR(on_target.fault) << "while asking " << target->info().id << " about "
                                            << ir::NodeLabel(*n);
      if (HasDecomposition(*n) && (ctx.prefer_common_ir || !on_target.native)) {
        KILN_ASSIGN_OR_RETURN(std::vector<int32_t> fresh, Decompose(g, *n));
        work.insert(work.end(), fresh.begin(), fresh.end());
        continue;
      }
      if (on_target.native) {
        if (!made) n->path = v1::PATH_NATIVE;
        n->device = target->info().id;
        continue;
      }
      const backend::Claim on_cpu = cpu->Supports(spec);
      if (on_cpu.native && cpu != target) {
        if (!made) n->path = v1::PATH_NATIVE;
        n->device = cpu->info().id;
        ctx.notes.push_back(absl::StrCat(ir::NodeLabel(*n), " runs on ", cpu->info().id, ": ",
                                         on_target.reason));
        continue;
      }
      std::string why = absl::StrCat(target->info().id, ": ", on_target.reason);
      if (cpu != target) absl::StrAppend(&why, "; ", cpu->info().id, ": ", on_cpu.reason);
      unsupported.push_back(absl::StrCat(ir::NodeLabel(*n), " [", why, "]"));
      n->path = v1::PATH_UNSUPPORTED;
    }
    if (!unsupported.empty()) {
      return absl::UnimplementedError(absl::StrCat(
          "unsupported: ", unsupported.size(), " node(s) have no kernel on any device: ",
          absl::StrJoin(unsupported, "; ")));
    }
    g.RemoveDeadNodes();
    return g.SortTopologically();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeLegalizePass() { return std::make_unique<LegalizePass>(); }

}  // namespace kiln::passes
