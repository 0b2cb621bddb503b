#include "engine/passes/vmap.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/ir/rewriter.h"

namespace kiln::passes {
namespace {

using ir::TensorType;
using ir::ValueRef;

constexpr int64_t kMaxSize = int64_t{1} << 31;

class Vmap {
 public:
  Vmap(ir::Graph& g, int64_t size) : g_(g), size_(size) {}

  // Makes input node `n` batched, with the batch at `axis` of its type.
  absl::Status BatchInput(ir::Node& n, int64_t axis) {
    const TensorType per = n.type();
    const int64_t rank = per.rank();
    const int64_t a = axis < 0 ? axis + rank + 1 : axis;
    if (a < 0 || a > rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vmap axis ", axis, " is out of range for input \"", n.name, "\" of rank ", rank));
    }
    per_example_[n.out()] = per;
    n.outputs[0].dims.insert(n.outputs[0].dims.begin() + a, size_);
    ValueRef canonical = n.out();
    if (a != 0) {
      std::vector<int64_t> perm = {a};  // the batch first, the others in order
      for (int64_t i = 0; i <= rank; ++i) {
        if (i != a) perm.push_back(i);
      }
      ir::Rewriter r(g_, n, n.path);
      canonical = r.Transpose(n.out(), perm);
      KILN_RETURN_IF_ERROR(r.status());
    }
    batched_[n.out()] = canonical;
    return absl::OkStatus();
  }

  // Re-emits `n` over its batched operands, when it has any.
  absl::Status Visit(const ir::Node& n) {
    bool any = false;
    for (ValueRef v : n.operands) any = any || batched_.contains(v);
    if (!any) return absl::OkStatus();
    if (n.outputs.size() != 1) return NoRule(n);
    ir::Rewriter r(g_, n, n.path);
    std::vector<ValueRef> ops;
    for (ValueRef v : n.operands) ops.push_back(Value(v));
    ValueRef out;
    switch (n.op) {
      case v1::OP_UNARY:
      case v1::OP_CAST:
      case v1::OP_CLAMP:
      case v1::OP_BINARY:
      case v1::OP_COMPARE:
      case v1::OP_WHERE: {
        int64_t rank = 0;
        for (ValueRef v : n.operands) rank = std::max(rank, PerExample(v).rank());
        for (size_t i = 0; i < ops.size(); ++i) ops[i] = Lift(r, n.operands[i], ops[i], rank);
        out = r.Add(n.op, ops, n.attrs);
        break;
      }
      case v1::OP_MATMUL: {
        bool ta = n.attrs.matmul().transpose_a(), tb = n.attrs.matmul().transpose_b();
        int64_t ra = PerExample(n.operands[0]).rank(), rb = PerExample(n.operands[1]).rank();
        bool promoted = false;
        // A batched vector would read as a matrix: promote it first, as
        // numpy.matmul does ([k] -> [1, k] on the left, [k, 1] on the right).
        if (ra == 1 && batched_.contains(n.operands[0])) {
          ops[0] = r.Reshape(ops[0], {size_, 1, PerExample(n.operands[0]).dims[0]});
          ra = 2, ta = false, promoted = true;
        }
        if (rb == 1 && batched_.contains(n.operands[1])) {
          ops[1] = r.Reshape(ops[1], {size_, PerExample(n.operands[1]).dims[0], 1});
          rb = 2, tb = false, promoted = true;
        }
        const int64_t rank = std::max(ra, rb);
        if (batched_.contains(n.operands[0])) ops[0] = LiftTo(r, ops[0], ra, rank);
        if (batched_.contains(n.operands[1])) ops[1] = LiftTo(r, ops[1], rb, rank);
        out = r.MatMul(ops[0], ops[1], ta, tb);
        if (promoted) out = r.Reshape(out, WithBatch(n.type().dims));
        break;
      }
      case v1::OP_REDUCE: {
        const v1::ReduceAttrs& a = n.attrs.reduce();
        const int64_t rank = PerExample(n.operands[0]).rank();
        std::vector<int64_t> axes;
        if (a.axes().empty()) {
          for (int64_t i = 0; i < rank; ++i) axes.push_back(i + 1);
        }
        for (int64_t x : a.axes()) axes.push_back((x < 0 ? x + rank : x) + 1);
        out = r.Reduce(a.kind(), ops[0], axes, a.keepdims());
        break;
      }
      case v1::OP_SOFTMAX:
      case v1::OP_LOG_SOFTMAX: {
        v1::Attrs a = n.attrs;
        if (a.softmax().has_axis() && a.softmax().axis() >= 0) {
          a.mutable_softmax()->set_axis(a.softmax().axis() + 1);
        }
        out = r.Add(n.op, ops, std::move(a));
        break;
      }
      case v1::OP_EXPAND: {
        // Right-aligned like NumPy: the operand lifted to the target's rank first.
        const ir::IrDims& shape = n.type().dims;
        ops[0] =
            LiftTo(r, ops[0], PerExample(n.operands[0]).rank(), static_cast<int64_t>(shape.size()));
        v1::Attrs a;
        for (int64_t d : WithBatch(shape)) a.mutable_expand()->add_shape(d);
        out = r.Add(n.op, {ops[0]}, std::move(a));
        break;
      }
      case v1::OP_RESHAPE: {
        if (ops.size() != 1) return NoRule(n);
        out = r.Reshape(ops[0], WithBatch(n.type().dims));
        break;
      }
      case v1::OP_TRANSPOSE: {
        const int64_t rank = PerExample(n.operands[0]).rank();
        std::vector<int64_t> perm = {0};
        if (n.attrs.transpose().perm().empty()) {
          for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i + 1);
        }
        for (int64_t p : n.attrs.transpose().perm()) perm.push_back((p < 0 ? p + rank : p) + 1);
        out = r.Transpose(ops[0], perm);
        break;
      }
      default:
        return NoRule(n);
    }
    KILN_RETURN_IF_ERROR(r.status()) << "while batching " << ir::NodeLabel(n) << " for vmap";
    batched_[n.out()] = out;
    return absl::OkStatus();
  }

  // The graph output `o`, with the batch at `axis` of its type.
  absl::StatusOr<ValueRef> Output(const ir::GraphOutput& o, int64_t axis) {
    const ir::Node& origin = *g_.FindNode(o.value.node);
    ir::Rewriter r(g_, origin, origin.path);
    const TensorType per = PerExample(o.value);
    const int64_t rank = per.rank();
    const int64_t a = axis < 0 ? axis + rank + 1 : axis;
    if (a < 0 || a > rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vmap axis ", axis, " is out of range for output \"", o.name, "\" of rank ", rank));
    }
    ValueRef v;
    if (auto it = batched_.find(o.value); it != batched_.end()) {
      v = it->second;
    } else {  // depends on no batched input: the same for every slice
      v1::Attrs e;
      for (int64_t d : WithBatch(per.dims)) e.mutable_expand()->add_shape(d);
      v = r.Add(v1::OP_EXPAND, {o.value}, std::move(e));
    }
    if (a != 0) {
      std::vector<int64_t> perm;
      for (int64_t i = 0; i <= rank; ++i) perm.push_back(i < a ? i + 1 : i == a ? 0 : i);
      v = r.Transpose(v, perm);
    }
    KILN_RETURN_IF_ERROR(r.status()) << "while batching output \"" << o.name << "\" for vmap";
    return v;
  }

 private:
  const TensorType& PerExample(ValueRef v) const {
    auto it = per_example_.find(v);
    return it != per_example_.end() ? it->second : g_.TypeOf(v);
  }
  ValueRef Value(ValueRef v) const {
    auto it = batched_.find(v);
    return it != batched_.end() ? it->second : v;
  }
  ir::IrDims WithBatch(const ir::IrDims& dims) const {
    ir::IrDims out = {size_};
    out.insert(out.end(), dims.begin(), dims.end());
    return out;
  }
  // A batched value of per-example rank `from` as rank `to` (ones after the
  // batch dim), so that NumPy broadcasting aligns its dims as it did.
  ValueRef LiftTo(ir::Rewriter& r, ValueRef v, int64_t from, int64_t to) {
    if (from >= to) return v;
    const TensorType& t = r.TypeOf(v);
    ir::IrDims dims = {size_};
    for (int64_t i = from; i < to; ++i) dims.push_back(1);
    dims.insert(dims.end(), t.dims.begin() + 1, t.dims.end());
    return r.Reshape(v, dims);
  }
  ValueRef Lift(ir::Rewriter& r, ValueRef old, ValueRef v, int64_t to) {
    if (!batched_.contains(old)) return v;
    return LiftTo(r, v, PerExample(old).rank(), to);
  }
  static absl::Status NoRule(const ir::Node& n) {
    return absl::UnimplementedError(absl::StrCat(
        ir::NodeLabel(n),
        " has no vmap batching rule (vmap batches unary, binary, compare, where, "
        "cast, clamp, matmul, reduce, softmax, log_softmax, expand, reshape and transpose)"));
  }

  ir::Graph& g_;
  const int64_t size_;
  absl::flat_hash_map<ValueRef, ValueRef> batched_;        // old value -> batch at dim 0
  absl::flat_hash_map<ValueRef, TensorType> per_example_;  // batched inputs' own types
};

}  // namespace

absl::Status UnbatchShapes(v1::VmapSpec& spec, std::vector<std::pair<std::string, Dims>>& shapes) {
  const std::set<std::string> named(spec.inputs().begin(), spec.inputs().end());
  for (auto& [name, dims] : shapes) {
    if (!named.empty() && !named.contains(name)) continue;
    const int64_t rank = static_cast<int64_t>(dims.size());
    const int64_t a = spec.axis() < 0 ? spec.axis() + rank : spec.axis();
    if (a < 0 || a >= rank) {
      return absl::InvalidArgumentError(absl::StrCat("vmap axis ", spec.axis(),
                                                     " is out of range for the shape of input \"",
                                                     name, "\" (rank ", rank, ")"));
    }
    if (spec.size() == 0) spec.set_size(dims[a]);
    if (dims[a] != spec.size()) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", name, "\" has ", dims[a],
                                                     " at the vmap axis, but the batch is ",
                                                     spec.size()));
    }
    dims.erase(dims.begin() + a);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ApplyVmap(ir::Graph& graph, const v1::VmapSpec& spec) {
  if (spec.size() < 1 || spec.size() > kMaxSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vmap size ", spec.size(),
        " is out of range: it must be in [1, 2^31] (0 takes it from the inputs' shapes)"));
  }
  const std::set<std::string> named(spec.inputs().begin(), spec.inputs().end());
  std::set<std::string> wanted = named;  // the named ones not found yet
  if (named.size() != static_cast<size_t>(spec.inputs_size())) {
    return absl::InvalidArgumentError("vmap inputs name an input twice");
  }
  KILN_RETURN_IF_ERROR(graph.SortTopologically());
  std::vector<ir::Node*> nodes;
  for (const auto& n : graph.nodes()) nodes.push_back(n.get());
  Vmap vmap(graph, spec.size());
  std::string names;
  for (ir::Node* n : nodes) {
    if (n->op != v1::OP_INPUT) continue;
    absl::StrAppend(&names, names.empty() ? "" : ", ", n->name);
    if (!named.empty() && !wanted.erase(n->name)) continue;
    KILN_RETURN_IF_ERROR(vmap.BatchInput(*n, spec.axis()));
  }
  if (!wanted.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vmap inputs name \"", *wanted.begin(),
        "\", which is no input of the graph; its inputs: ", names.empty() ? "none" : names));
  }
  for (ir::Node* n : nodes) {
    if (n->op == v1::OP_INPUT) continue;
    KILN_RETURN_IF_ERROR(vmap.Visit(*n));
  }
  std::vector<ir::GraphOutput> outputs = graph.outputs();
  for (ir::GraphOutput& o : outputs) {
    KILN_ASSIGN_OR_RETURN(o.value, vmap.Output(o, spec.axis()));
  }
  graph.outputs() = std::move(outputs);
  graph.RemoveDeadNodes();
  KILN_RETURN_IF_ERROR(graph.SortTopologically());
  return true;
}

}  // namespace kiln::passes
