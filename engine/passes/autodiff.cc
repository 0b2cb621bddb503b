// Reverse and forward sweeps over ir::Graph, and the autodiff modes of the
// compile options (autodiff.h). The per-op rules are in autodiff_rules.cc.
#include "engine/passes/autodiff.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "engine/passes/autodiff_internal.h"
#include "engine/passes/decompose.h"

namespace kiln::passes {
namespace {

using ad::Builder;
using ad::Valid;
using ir::ValueRef;

// Ops replaced by their decomposition when they lie on the path: the
// primitives carry the rules (no backward kernels yet).
bool DecomposedForAutodiff(const ir::Node& n) {
  switch (n.op) {
    case v1::OP_ATTENTION:
    case v1::OP_LAYER_NORM:
    case v1::OP_RMS_NORM:
    case v1::OP_DOT_GENERAL:
    case v1::OP_GROUP_NORM:
      return HasDecomposition(n);
    default:
      return false;
  }
}

bool FloatResult(const ir::Node& n) { return n.outputs.size() >= 1 && IsFloat(n.type().dtype); }

// Nodes whose (float) result depends on one of `from`.
absl::flat_hash_set<int32_t> DependsOn(const ir::Graph& g, std::span<const ValueRef> from) {
  absl::flat_hash_set<int32_t> dep;
  for (ValueRef v : from) dep.insert(v.node);
  for (const auto& n : g.nodes()) {
    if (dep.contains(n->id) || !FloatResult(*n)) continue;
    for (ValueRef o : n->operands) {
      if (dep.contains(o.node)) {
        dep.insert(n->id);
        break;
      }
    }
  }
  return dep;
}

// Nodes that one of `to` depends on (including themselves).
absl::flat_hash_set<int32_t> FeedInto(const ir::Graph& g, std::span<const ValueRef> to) {
  absl::flat_hash_set<int32_t> need;
  for (ValueRef v : to) need.insert(v.node);
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    if (!need.contains((*it)->id)) continue;
    for (ValueRef o : (*it)->operands) need.insert(o.node);
  }
  return need;
}

// The ids of the nodes on a path from `from` to `to`, checked to have rules.
// Decomposes the composites between `from` and the graph outputs from index
// `base` on.
absl::Status DecomposeOnPath(ir::Graph& g, std::span<const ValueRef> from, size_t base) {
  for (int round = 0; round < 8; ++round) {
    std::vector<ValueRef> targets;
    for (size_t i = base; i < g.outputs().size(); ++i) targets.push_back(g.outputs()[i].value);
    const auto dep = DependsOn(g, from);
    const auto need = FeedInto(g, targets);
    std::vector<const ir::Node*> composite;
    for (const auto& n : g.nodes()) {
      if (dep.contains(n->id) && need.contains(n->id) && DecomposedForAutodiff(*n)) {
        composite.push_back(n.get());
      }
    }
    if (composite.empty()) return absl::OkStatus();
    for (const ir::Node* n : composite) {
      KILN_RETURN_IF_ERROR(Decompose(g, *n).status())
          << "while decomposing " << ir::NodeLabel(*n) << " for autodiff";
    }
    g.RemoveDeadNodes();
    KILN_RETURN_IF_ERROR(g.SortTopologically());
  }
  return absl::OkStatus();
}

// Composite ops on the path become primitives first (fixed point: a
// decomposition may hold another composite, e.g. a DotGeneral); `to` follows
// the decompositions (Decompose rewires graph uses, so `to` rides along as
// temporary graph outputs).
absl::StatusOr<absl::flat_hash_set<int32_t>> PathBetween(ir::Graph& g,
                                                         std::span<const ValueRef> from,
                                                         std::vector<ValueRef>& to) {
  const size_t base = g.outputs().size();
  for (ValueRef v : to) g.outputs().push_back({"__autodiff_target", v});
  absl::Status decomposed = DecomposeOnPath(g, from, base);
  for (size_t i = 0; i < to.size(); ++i) to[i] = g.outputs()[base + i].value;
  g.outputs().resize(base);
  KILN_RETURN_IF_ERROR(decomposed);
  const auto dep = DependsOn(g, from);
  const auto need = FeedInto(g, to);
  absl::flat_hash_set<int32_t> path;
  absl::flat_hash_set<int32_t> sources;
  for (ValueRef v : from) sources.insert(v.node);
  for (const auto& n : g.nodes()) {
    if (!dep.contains(n->id) || !need.contains(n->id)) continue;
    path.insert(n->id);
    if (sources.contains(n->id)) continue;
    if (n->outputs.size() != 1) {
      return absl::UnimplementedError(absl::StrCat(
          ir::NodeLabel(*n), " is not differentiable: ops with several results have no rule"));
    }
    if (!ad::HasRule(*n)) {
      return absl::UnimplementedError(absl::StrCat(
          ir::NodeLabel(*n), " is not differentiable: ", ir::OpName(n->op),
          " has no gradient rule, and it lies between the differentiated values and the result"));
    }
  }
  return path;
}

}  // namespace

ir::ValueRef AddInput(ir::Graph& graph, const std::string& name, const ir::TensorType& type) {
  auto node = std::make_unique<ir::Node>();
  node->op = v1::OP_INPUT;
  node->name = name;
  node->attrs.mutable_input();
  node->outputs.push_back(type);
  return graph.AddNode(std::move(node))->out();
}

absl::StatusOr<std::vector<ValueRef>> FindDifferentiable(const ir::Graph& graph,
                                                         std::span<const std::string> names) {
  absl::flat_hash_map<std::string, const ir::Node*> by_name;
  std::vector<std::string> candidates;
  for (const auto& n : graph.nodes()) {
    if (n->op != v1::OP_PARAM && n->op != v1::OP_INPUT) continue;
    by_name[n->name] = n.get();
    if (IsFloat(n->type().dtype)) candidates.push_back(n->name);
  }
  std::vector<ValueRef> out;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& name : names) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no param or input named \"", name,
                       "\" to differentiate; the graph has: ", absl::StrJoin(candidates, ", ")));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is named twice"));
    }
    if (!IsFloat(it->second->type().dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot differentiate with respect to \"", name, "\": it is ",
          ir::TypeToString(it->second->type(), graph.symbols()), ", not a float tensor"));
    }
    out.push_back(it->second->out());
  }
  return out;
}

absl::StatusOr<ValueRef> FindOutput(const ir::Graph& graph, const std::string& name) {
  std::vector<std::string> names;
  for (const ir::GraphOutput& o : graph.outputs()) {
    if (o.name == name) return o.value;
    names.push_back(o.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("the graph has no output named \"", name,
                                                 "\"; its outputs: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::vector<ValueRef>> BuildVjp(ir::Graph& g, ValueRef y, ValueRef dy,
                                               std::span<const ValueRef> wrt) {
  // The sweep may decompose composites; track y through it by its uses: a
  // temporary graph output keeps y (and dy) rewired by Decompose.
  std::vector<ValueRef> targets = {y, dy};
  absl::StatusOr<absl::flat_hash_set<int32_t>> path_or = PathBetween(g, wrt, targets);
  if (!path_or.ok()) return path_or.status();
  y = targets[0];
  dy = targets[1];
  const absl::flat_hash_set<int32_t>& path = *path_or;

  absl::flat_hash_map<int32_t, ValueRef> cot;  // node id -> cotangent of its result
  if (path.contains(y.node)) cot[y.node] = dy;
  // Snapshot the forward nodes: rules append to the graph as they go.
  std::vector<ir::Node*> forward;
  for (const auto& n : g.nodes()) {
    if (path.contains(n->id)) forward.push_back(n.get());
  }
  absl::flat_hash_set<int32_t> sources;
  for (ValueRef v : wrt) sources.insert(v.node);
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    const ir::Node& n = **it;
    auto c = cot.find(n.id);
    if (c == cot.end() || sources.contains(n.id)) continue;
    std::vector<bool> need(n.operands.size());
    bool any = false;
    for (size_t i = 0; i < n.operands.size(); ++i) {
      need[i] = path.contains(n.operands[i].node);
      any = any || need[i];
    }
    if (!any) continue;
    Builder b(g, n);
    std::vector<ValueRef> grads(n.operands.size());
    KILN_RETURN_IF_ERROR(ad::VjpRule(b, n, c->second, need, grads)) << "in the reverse sweep";
    for (size_t i = 0; i < n.operands.size(); ++i) {
      if (!need[i] || !Valid(grads[i])) continue;
      const int32_t to = n.operands[i].node;
      auto [slot, fresh] = cot.try_emplace(to, grads[i]);
      if (!fresh) {
        slot->second = b.Add(slot->second, grads[i]);
        KILN_RETURN_IF_ERROR(b.status());
      }
    }
  }
  std::vector<ValueRef> out;
  for (ValueRef x : wrt) {
    auto c = cot.find(x.node);
    if (c != cot.end()) {
      out.push_back(c->second);
      continue;
    }
    Builder b(g, *g.FindNode(x.node));
    out.push_back(b.Zeros(g.TypeOf(x)));
    KILN_RETURN_IF_ERROR(b.status());
  }
  KILN_RETURN_IF_ERROR(g.SortTopologically());
  return out;
}

absl::StatusOr<std::vector<ValueRef>> BuildJvp(ir::Graph& g, std::span<const ValueRef> xs,
                                               std::span<const ValueRef> dxs,
                                               std::span<const ValueRef> ys) {
  std::vector<ValueRef> targets(ys.begin(), ys.end());
  absl::StatusOr<absl::flat_hash_set<int32_t>> path_or = PathBetween(g, xs, targets);
  if (!path_or.ok()) return path_or.status();
  const absl::flat_hash_set<int32_t>& path = *path_or;

  absl::flat_hash_map<int32_t, ValueRef> tan;
  for (size_t i = 0; i < xs.size(); ++i) tan[xs[i].node] = dxs[i];
  std::vector<ir::Node*> forward;
  for (const auto& n : g.nodes()) {
    if (path.contains(n->id) && !tan.contains(n->id)) forward.push_back(n.get());
  }
  for (ir::Node* np : forward) {
    const ir::Node& n = *np;
    std::vector<ValueRef> t(n.operands.size());
    bool any = false;
    for (size_t i = 0; i < n.operands.size(); ++i) {
      auto it = tan.find(n.operands[i].node);
      if (it != tan.end()) t[i] = it->second, any = true;
    }
    if (!any) continue;
    Builder b(g, n);
    absl::StatusOr<ValueRef> rule = ad::JvpRule(b, n, t);
    KILN_RETURN_IF_ERROR(rule.status()) << "in the forward sweep";
    const ValueRef out = *rule;
    if (Valid(out)) tan[n.id] = out;
  }
  std::vector<ValueRef> out;
  for (ValueRef y : targets) {
    auto it = tan.find(y.node);
    if (it != tan.end()) {
      out.push_back(it->second);
      continue;
    }
    Builder b(g, *g.FindNode(y.node));
    out.push_back(b.Zeros(g.TypeOf(y)));
    KILN_RETURN_IF_ERROR(b.status());
  }
  KILN_RETURN_IF_ERROR(g.SortTopologically());
  return out;
}

absl::StatusOr<bool> ApplyAutodiff(ir::Graph& g, const v1::AutodiffSpec& spec) {
  if (spec.mode() == v1::AUTODIFF_NONE) return false;
  if (!v1::AutodiffMode_IsValid(spec.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown autodiff mode ", static_cast<int>(spec.mode())));
  }
  if (spec.wrt().empty()) {
    return absl::InvalidArgumentError("autodiff needs at least one param or input in `wrt`");
  }
  KILN_ASSIGN_OR_RETURN(ValueRef y, FindOutput(g, spec.output()));
  const std::vector<std::string> names(spec.wrt().begin(), spec.wrt().end());
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> wrt, FindDifferentiable(g, names));
  const ir::TensorType yt = g.TypeOf(y);
  if (!IsFloat(yt.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("output \"", spec.output(), "\" is ",
                                                   ir::TypeToString(yt), ", not a float tensor"));
  }
  const bool scalar_mode = spec.mode() == v1::AUTODIFF_GRAD ||
                           spec.mode() == v1::AUTODIFF_GRAD_WITH_LOSS ||
                           spec.mode() == v1::AUTODIFF_HVP;
  if (scalar_mode && yt.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output \"", spec.output(), "\" must be a scalar to take its gradient, but it is ",
        ir::TypeToString(yt), " (use vjp with a cotangent)"));
  }
  std::vector<ir::GraphOutput> outputs;
  auto add_grads = [&](const std::string& prefix, const std::vector<ValueRef>& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      outputs.push_back({absl::StrCat(prefix, names[i]), values[i]});
    }
  };
  switch (spec.mode()) {
    case v1::AUTODIFF_GRAD:
    case v1::AUTODIFF_GRAD_WITH_LOSS:
    case v1::AUTODIFF_HVP: {
      const ir::Node& yn = *g.FindNode(y.node);
      Builder b(g, yn);
      ValueRef one = b.BroadcastTo(b.Sc(1, yt.dtype), yt.dims);
      KILN_RETURN_IF_ERROR(b.status());
      // y itself may be rewritten by a decomposition: keep it as an output.
      g.outputs().push_back({"__autodiff_loss", y});
      KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> grads, BuildVjp(g, y, one, wrt));
      y = g.outputs().back().value;
      g.outputs().pop_back();
      if (spec.mode() != v1::AUTODIFF_GRAD) outputs.push_back({spec.output(), y});
      add_grads("grad/", grads);
      if (spec.mode() == v1::AUTODIFF_HVP) {
        std::vector<ValueRef> tangents;
        for (size_t i = 0; i < wrt.size(); ++i) {
          tangents.push_back(AddInput(g, absl::StrCat("tangent/", names[i]), g.TypeOf(wrt[i])));
        }
        for (const ir::GraphOutput& o : outputs) g.outputs().push_back(o);
        KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> hv, BuildJvp(g, wrt, tangents, grads));
        // The grads may have moved (decomposed) too: read them back.
        const size_t kept = g.outputs().size() - outputs.size();
        for (size_t i = 0; i < outputs.size(); ++i) outputs[i] = g.outputs()[kept + i];
        g.outputs().resize(kept);
        add_grads("hvp/", hv);
      }
      break;
    }
    case v1::AUTODIFF_VJP: {
      ValueRef dy = AddInput(g, absl::StrCat("cotangent/", spec.output()), yt);
      KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> grads, BuildVjp(g, y, dy, wrt));
      for (const ir::GraphOutput& o : g.outputs()) outputs.push_back(o);
      add_grads("grad/", grads);
      break;
    }
    case v1::AUTODIFF_JVP: {
      std::vector<ValueRef> tangents;
      for (size_t i = 0; i < wrt.size(); ++i) {
        tangents.push_back(AddInput(g, absl::StrCat("tangent/", names[i]), g.TypeOf(wrt[i])));
      }
      KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> ty, BuildJvp(g, wrt, tangents, {&y, 1}));
      for (const ir::GraphOutput& o : g.outputs()) outputs.push_back(o);
      outputs.push_back({absl::StrCat("tangent/", spec.output()), ty[0]});
      break;
    }
    default:
      break;
  }
  g.outputs() = std::move(outputs);
  KILN_RETURN_IF_ERROR(g.SortTopologically());
  return true;
}

}  // namespace kiln::passes
