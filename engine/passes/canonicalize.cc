// Canonicalize (DESIGN.md section 3, stage 4, "MIR"): algebraic and layout
// simplification, constant folding, common-subexpression elimination and
// dead-code elimination, iterated to a fixed point.
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "base/deterministic_bytes.h"
#include "base/status.h"
#include "engine/passes/pass.h"
#include "engine/passes/passes_internal.h"

namespace kiln::passes {
namespace {

// A constant holding one value (any shape) equal to `v`.
bool IsSplat(const ir::Graph& g, ir::ValueRef ref, double v) {
  const ir::Node* n = g.FindNode(ref.node);
  if (n->op != v1::OP_CONSTANT || !n->value || !IsFloat(n->value->dtype())) return false;
  for (int64_t i = 0; i < n->value->num_elements(); ++i) {
    if (n->value->GetAsDouble(i) != v) return false;
  }
  return n->value->num_elements() > 0;
}

// Replaces `n`'s uses by `with` when that keeps the result type; returns
// whether any use changed (a node already bypassed changes nothing).
bool Forward(ir::Graph& g, const ir::Node& n, ir::ValueRef with) {
  if (!(g.TypeOf(with) == n.outputs[0])) return false;
  return g.ReplaceAllUses(n.out(), with) > 0;
}

int SimplifyOnce(ir::Graph& g) {
  int changed = 0;
  for (const auto& np : g.nodes()) {
    ir::Node& n = *np;
    if (IsSource(n) || n.outputs.size() != 1) continue;
    switch (n.op) {
      case v1::OP_UNARY:
        if (n.attrs.unary().kind() == v1::UNARY_IDENTITY) changed += Forward(g, n, n.operands[0]);
        break;
      case v1::OP_CAST:
      case v1::OP_RESHAPE:
      case v1::OP_EXPAND:
        changed += Forward(g, n, n.operands[0]);
        if (n.op == v1::OP_RESHAPE) {
          ir::Node* src = g.FindNode(n.operands[0].node);
          if (src->op == v1::OP_RESHAPE) {  // reshape(reshape(x)) -> reshape(x)
            n.operands[0] = src->operands[0];
            ++changed;
          }
        }
        break;
      case v1::OP_TRANSPOSE: {
        const auto& perm = n.attrs.transpose().perm();
        bool identity = true;
        for (int i = 0; i < perm.size(); ++i) identity = identity && perm[i] == i;
        if (identity) {
          changed += Forward(g, n, n.operands[0]);
          break;
        }
        ir::Node* src = g.FindNode(n.operands[0].node);
        if (src->op == v1::OP_TRANSPOSE) {  // compose: out[i] = x[p1[p2[i]]]
          const auto& p1 = src->attrs.transpose().perm();
          std::vector<int64_t> composed;
          for (int64_t p : perm) composed.push_back(p1[p]);
          n.attrs.mutable_transpose()->clear_perm();
          for (int64_t p : composed) n.attrs.mutable_transpose()->add_perm(p);
          n.operands[0] = src->operands[0];
          ++changed;
        }
        break;
      }
      case v1::OP_BINARY: {
        const auto k = n.attrs.binary().kind();
        const ir::ValueRef a = n.operands[0], b = n.operands[1];
        if ((k == v1::BINARY_ADD || k == v1::BINARY_SUB) && IsSplat(g, b, 0.0)) {
          changed += Forward(g, n, a);
        } else if (k == v1::BINARY_ADD && IsSplat(g, a, 0.0)) {
          changed += Forward(g, n, b);
        } else if ((k == v1::BINARY_MUL || k == v1::BINARY_DIV) && IsSplat(g, b, 1.0)) {
          changed += Forward(g, n, a);
        } else if (k == v1::BINARY_MUL && IsSplat(g, a, 1.0)) {
          changed += Forward(g, n, b);
        }
        break;
      }
      case v1::OP_CONCAT:
        if (n.operands.size() == 1) changed += Forward(g, n, n.operands[0]);
        break;
      case v1::OP_SLICE:
        changed += Forward(g, n, n.operands[0]);
        break;
      default:
        break;
    }
  }
  return changed;
}

std::string CseKey(const ir::Graph& g, const ir::Node& n) {
  std::string key = absl::StrCat(static_cast<int>(n.op), "|");
  for (const ir::ValueRef& v : n.operands) absl::StrAppend(&key, v.node, ":", v.output, ",");
  absl::StrAppend(&key, "|");
  key += DeterministicBytes(n.attrs);
  for (const ir::TensorType& t : n.outputs) absl::StrAppend(&key, "|", ir::TypeToString(t));
  if (n.op == v1::OP_CONSTANT && n.value) {
    absl::StrAppend(&key, "|",
                    absl::Hash<std::string_view>()(std::string_view(
                        static_cast<const char*>(n.value->data()), n.value->num_bytes())));
  }
  return key;
}

int CseOnce(ir::Graph& g) {
  absl::flat_hash_map<std::string, ir::Node*> seen;
  int changed = 0;
  for (const auto& np : g.nodes()) {
    ir::Node& n = *np;
    if (n.op == v1::OP_INPUT || n.op == v1::OP_PARAM) continue;
    const std::string key = CseKey(g, n);
    auto [it, inserted] = seen.emplace(key, &n);
    if (inserted) continue;
    ir::Node& prev = *it->second;
    if (n.op == v1::OP_CONSTANT && prev.value->bytes() != n.value->bytes()) continue;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      changed += g.ReplaceAllUses(n.out(static_cast<int>(i)), prev.out(static_cast<int>(i)));
    }
  }
  return changed;
}

class CsePass final : public Pass {
 public:
  std::string name() const override { return "cse"; }
  absl::Status Run(ir::Graph& g, PassContext&) const override {
    CseOnce(g);
    g.RemoveDeadNodes();
    return absl::OkStatus();
  }
};

class DcePass final : public Pass {
 public:
  std::string name() const override { return "dce"; }
  absl::Status Run(ir::Graph& g, PassContext&) const override {
    g.RemoveDeadNodes();
    return absl::OkStatus();
  }
};

class SimplifyPass final : public Pass {
 public:
  std::string name() const override { return "simplify"; }
  absl::Status Run(ir::Graph& g, PassContext&) const override {
    while (SimplifyOnce(g) > 0) {
    }
    g.RemoveDeadNodes();
    return absl::OkStatus();
  }
};

class CanonicalizePass final : public Pass {
 public:
  std::string name() const override { return "canonicalize"; }
  absl::Status Run(ir::Graph& g, PassContext& ctx) const override {
    auto fold = MakeConstantFoldPass();
    for (int round = 0; round < 8; ++round) {
      int changed = 0;
      while (int c = SimplifyOnce(g)) changed += c;
      const size_t before = g.nodes().size();
      KILN_RETURN_IF_ERROR(fold->Run(g, ctx));
      changed += CseOnce(g);
      g.RemoveDeadNodes();
      if (g.nodes().size() != before) ++changed;
      if (changed == 0) break;
    }
    return g.SortTopologically();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCsePass() { return std::make_unique<CsePass>(); }
std::unique_ptr<Pass> MakeDcePass() { return std::make_unique<DcePass>(); }
std::unique_ptr<Pass> MakeSimplifyPass() { return std::make_unique<SimplifyPass>(); }
std::unique_ptr<Pass> MakeCanonicalizePass() { return std::make_unique<CanonicalizePass>(); }

}  // namespace kiln::passes
