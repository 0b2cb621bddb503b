#include "engine/passes/amp.h"

#include <cmath>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/ir/rewriter.h"

namespace kiln::passes {
namespace {

bool ComputesInLowPrecision(v1::OpKind op) {
  switch (op) {
    case v1::OP_MATMUL:
    case v1::OP_DOT_GENERAL:
    case v1::OP_ATTENTION:
    case v1::OP_CONV:
    case v1::OP_CONV_TRANSPOSE2D:
      return true;
    default:
      return false;
  }
}

absl::Status Bad(absl::string_view field, double v, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("amp ", field, " = ", v, " is out of range: it must be ", want));
}

}  // namespace

absl::Status ValidateAmp(const v1::AmpSpec& s) {
  if (s.compute() != v1::DTYPE_BF16 && s.compute() != v1::DTYPE_F16) {
    return absl::InvalidArgumentError(absl::StrCat("amp compute dtype ", DTypeName(s.compute()),
                                                   " is not supported; use bf16 or f16"));
  }
  if (!v1::LossScaleMode_IsValid(s.loss_scale())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown amp loss_scale mode ", static_cast<int>(s.loss_scale())));
  }
  if (s.has_init_scale() && !(std::isfinite(s.init_scale()) && s.init_scale() > 0)) {
    return Bad("init_scale", s.init_scale(), "finite and > 0");
  }
  if (s.has_growth_factor() && !(std::isfinite(s.growth_factor()) && s.growth_factor() > 1)) {
    return Bad("growth_factor", s.growth_factor(), "finite and > 1");
  }
  if (s.has_backoff_factor() && !(s.backoff_factor() > 0 && s.backoff_factor() < 1)) {
    return Bad("backoff_factor", s.backoff_factor(), "in (0, 1)");
  }
  if (s.has_growth_interval() &&
      (s.growth_interval() < 1 || s.growth_interval() > (int64_t{1} << 40))) {
    return Bad("growth_interval", static_cast<double>(s.growth_interval()), "in [1, 2^40]");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ApplyAmp(ir::Graph& g, const v1::AmpSpec& spec) {
  const DType low = spec.compute();
  std::vector<int32_t> targets;
  for (const auto& n : g.nodes()) {
    if (ComputesInLowPrecision(n->op) && n->outputs.size() == 1 &&
        n->type().dtype == v1::DTYPE_F32) {
      targets.push_back(n->id);
    }
  }
  absl::flat_hash_map<ir::ValueRef, ir::ValueRef> cast_of;  // f32 value -> its low cast
  for (int32_t id : targets) {
    const ir::Node& n = *g.FindNode(id);
    ir::Rewriter r(g, n, n.path);
    std::vector<ir::ValueRef> operands;
    for (ir::ValueRef v : n.operands) {
      if (g.TypeOf(v).dtype != v1::DTYPE_F32) {
        operands.push_back(v);
        continue;
      }
      auto [it, fresh] = cast_of.try_emplace(v);
      if (fresh) it->second = r.Cast(v, low);
      operands.push_back(it->second);
    }
    ir::ValueRef low_out = r.Add(n.op, std::move(operands), n.attrs);
    if (r.ok() && g.TypeOf(low_out).dtype != low) {
      return absl::InternalError(absl::StrCat("amp: ", ir::NodeLabel(n), " in ", DTypeName(low),
                                              " inferred ", DTypeName(g.TypeOf(low_out).dtype)));
    }
    ir::ValueRef back = r.Cast(low_out, v1::DTYPE_F32);
    KILN_RETURN_IF_ERROR(r.status())
        << "while casting " << ir::NodeLabel(n) << " to " << DTypeName(low) << " for amp";
    r.last()->name = n.name;  // the f32 value keeps the user's name
    g.ReplaceAllUses(n.out(), back);
  }
  if (targets.empty()) return false;
  g.RemoveDeadNodes();
  KILN_RETURN_IF_ERROR(g.SortTopologically());
  return true;
}

}  // namespace kiln::passes
