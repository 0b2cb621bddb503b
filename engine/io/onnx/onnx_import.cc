// The ONNX importer's driver: the model, its inputs, initializers and nodes,
// and subgraphs (the per-node context, class Importer, is onnx_importer.cc). The
// op converters live in onnx_ops_*.cc, import-time folding in onnx_fold.cc.
#include "engine/io/onnx/onnx_import.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"
#include "engine/ir/infer.h"
#include "engine/ir/verifier.h"

namespace kiln::io {
namespace onnx_internal {

// ---- the driver -------------------------------------------------------------

namespace {

constexpr int kMinOpset = 9;
constexpr int kMaxOpset = 21;

const ConverterTable& Converters() {
  static const ConverterTable* table = [] {
    auto* t = new ConverterTable();
    RegisterElementwise(*t);
    RegisterTensorOps(*t);
    RegisterNnOps(*t);
    RegisterReduceOps(*t);
    RegisterControlFlow(*t);
    RegisterRecurrent(*t);
    return t;
  }();
  return *table;
}

bool IsDefaultDomain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

absl::StatusOr<TensorType> InputType(const onnx::ValueInfoProto& vi, ir::Graph& g,
                                     const OnnxImportOptions& options) {
  auto err = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("graph input \"", vi.name(), "\": ", what));
  };
  if (!vi.type().has_tensor_type()) return err("only tensor inputs are supported");
  const auto& tt = vi.type().tensor_type();
  const std::optional<DType> dt = DTypeFromOnnx(tt.elem_type());
  if (!dt) {
    return absl::UnimplementedError(absl::StrCat("graph input \"", vi.name(), "\": element type ",
                                                 tt.elem_type(), " has no Kiln dtype"));
  }
  TensorType t;
  t.dtype = *dt;
  for (const auto& [name, dims] : options.input_shapes) {
    if (name != vi.name()) continue;
    if (tt.has_shape() && tt.shape().dim_size() != static_cast<int>(dims.size())) {
      return err(absl::StrCat("the pinned shape [", absl::StrJoin(dims, ", "), "] has rank ",
                              dims.size(), "; the model says ", tt.shape().dim_size()));
    }
    for (int64_t d : dims) {
      if (d < 0) return err(absl::StrCat("pinned dim ", d, " is negative"));
      t.dims.push_back(d);
    }
    return t;
  }
  if (!tt.has_shape()) return err("has no shape (give it with the input shapes)");
  if (tt.shape().dim_size() > options.limits.max_rank) {
    return err(absl::StrCat("rank ", tt.shape().dim_size(), " exceeds the limit ",
                            options.limits.max_rank));
  }
  for (const auto& d : tt.shape().dim()) {
    if (d.has_dim_value()) {
      if (d.dim_value() < 0) return err(absl::StrCat("dim ", d.dim_value(), " is negative"));
      t.dims.push_back(d.dim_value());
    } else if (d.has_dim_param() && !d.dim_param().empty()) {
      t.dims.push_back(ir::SymbolDim(g.InternSymbol(d.dim_param())));
    } else {
      t.dims.push_back(ir::kDynamic);
    }
  }
  return t;
}

struct UnsupportedNode {
  int index;
  std::string message;
};

std::string NodeDescription(const onnx::NodeProto& n, int index, int opset) {
  const std::string domain = n.domain().empty() ? "ai.onnx" : n.domain();
  return absl::StrCat("node ", index, " \"", n.name(), "\": ", n.op_type(), " (domain ", domain,
                      ", opset ", opset, ")");
}

bool RunTimeInteger(const Value& v) {
  return v.ref.node >= 0 && (v.known == nullptr || !v.known->complete()) && IsInteger(v.type.dtype) &&
         v.type.is_static() && v.type.num_elements() == 1;
}

}  // namespace

std::optional<Value::Affine> AffineOf(const Value& v) {
  if (!RunTimeInteger(v)) return std::nullopt;
  if (v.affine) return v.affine;
  return Value::Affine{v.ref, 0};
}

void PropagateAffine(const onnx::NodeProto& n, const std::vector<const Value*>& inputs, Value& out) {
  if (!RunTimeInteger(out) || inputs.empty() || inputs[0] == nullptr) return;
  const std::string& op = n.op_type();
  const std::optional<Value::Affine> a = AffineOf(*inputs[0]);
  if (op == "Identity" || op == "Cast" || op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" ||
      op == "Flatten") {
    out.affine = a;
    return;
  }
  if ((op != "Add" && op != "Sub") || inputs.size() != 2 || inputs[1] == nullptr) return;
  // A known one-element integer as an int64.
  auto known = [](const Value& v) -> std::optional<int64_t> {
    if (v.known == nullptr || !v.known->complete() || v.known->t->num_elements() != 1 ||
        !IsInteger(v.known->t->dtype())) {
      return std::nullopt;
    }
    return GetInt(*v.known->t, 0);
  };
  const std::optional<int64_t> k1 = known(*inputs[1]);
  if (a && k1) {
    int64_t off = 0;
    const bool overflow = op == "Add" ? __builtin_add_overflow(a->offset, *k1, &off)
                                      : __builtin_sub_overflow(a->offset, *k1, &off);
    if (!overflow) out.affine = Value::Affine{a->base, off};
    return;
  }
  const std::optional<int64_t> k0 = known(*inputs[0]);
  const std::optional<Value::Affine> b = AffineOf(*inputs[1]);
  int64_t off = 0;
  if (op == "Add" && k0 && b && !__builtin_add_overflow(b->offset, *k0, &off)) {
    out.affine = Value::Affine{b->base, off};
  }
}

namespace {

// A node output that a hook may claim (a Constant the user wants as a param):
// true = taken, not a value of the graph.
using OutputHook = std::function<absl::StatusOr<bool>(const std::string& name, const Value& v)>;

// Converts `graph`'s nodes, in order, into `g`, reading and extending `values`
// (the graph's inputs, initializers and, for a subgraph, the enclosing scope's
// values it reads). A node Kiln cannot convert is added to `unsupported` and
// every value that depends on it is skipped, so one error can name them all.
absl::Status ConvertNodes(const onnx::GraphProto& graph, ir::Graph& g, const OnnxImportOptions& options,
                          int opset, ValueMap& values, std::vector<UnsupportedNode>& unsupported,
                          const OutputHook& hook) {
  const ConverterTable& table = Converters();
  // Where each value is produced, to tell a cycle from a missing value.
  absl::flat_hash_map<std::string, int> producer;
  for (int i = 0; i < graph.node_size(); ++i) {
    for (const auto& o : graph.node(i).output()) {
      if (!o.empty()) producer.emplace(o, i);
    }
  }

  absl::flat_hash_set<std::string> poisoned;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& n = graph.node(i);
    if (!IsDefaultDomain(n.domain()) || !table.contains(n.op_type())) {
      unsupported.push_back({i, absl::StrCat(NodeDescription(n, i, opset),
                                             IsDefaultDomain(n.domain())
                                                 ? ": no Kiln conversion for this op"
                                                 : ": Kiln imports only the default ONNX domain")});
      for (const auto& o : n.output()) poisoned.insert(o);
      continue;
    }
    std::vector<Value*> inputs;
    bool skip = false;
    for (int k = 0; k < n.input_size(); ++k) {
      const std::string& name = n.input(k);
      if (name.empty()) {
        inputs.push_back(nullptr);
        continue;
      }
      if (poisoned.contains(name)) {
        skip = true;
        break;
      }
      auto it = values.find(name);
      if (it == values.end()) {
        auto p = producer.find(name);
        if (p == producer.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              NodeDescription(n, i, opset), ": input \"", name,
              "\" is not a graph input, an initializer or any node's output (missing initializer?)"));
        }
        return absl::InvalidArgumentError(absl::StrCat(
            NodeDescription(n, i, opset), ": input \"", name, "\" is produced by node ", p->second,
            ", which does not come before it (a cycle, or nodes out of topological order)"));
      }
      if (it->second->stacked) {
        unsupported.push_back(
            {i, absl::StrCat(NodeDescription(n, i, opset), ": reads \"", name,
                             "\", the stacked output of the while loop ", it->second->stacked->loop,
                             ", whose length is known only at run time: Kiln returns such an "
                             "output as a graph output only")});
        skip = true;
        break;
      }
      inputs.push_back(it->second.get());
    }
    if (skip) {
      for (const auto& o : n.output()) poisoned.insert(o);
      continue;
    }
    const std::vector<const Value*> input_values(inputs.begin(), inputs.end());
    Importer c(g, options, n, opset, std::move(inputs));
    c.set_scope(&values);
    c.set_producers(&graph, &producer);
    absl::Status s;
    auto folded = TryFold(c);
    if (!folded.ok()) {
      s = folded.status();
    } else if (!*folded) {
      auto pattern = TryPattern(c);
      if (!pattern.ok()) {
        s = pattern.status();
      } else if (!*pattern) {
        s = table.at(n.op_type())(c);
      }
    }
    if (absl::IsUnimplemented(s)) {
      unsupported.push_back({i, absl::StrCat(NodeDescription(n, i, opset), ": ", s.message())});
      for (const auto& o : n.output()) poisoned.insert(o);
      continue;
    }
    if (!s.ok()) {
      if (absl::StrContains(s.message(), "ONNX node")) return s;
      return StatusBuilder(s) << "while importing " << c.Label();
    }
    for (int k = 0; k < n.output_size(); ++k) {
      const std::string& name = n.output(k);
      if (name.empty()) continue;
      if (values.contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(NodeDescription(n, i, opset), ": output \"", name,
                         "\" is already defined (every ONNX value has one producer)"));
      }
      if (!c.outputs()[k]) {
        return absl::UnimplementedError(absl::StrCat(NodeDescription(n, i, opset), ": output ", k,
                                                     " (\"", name, "\") is not supported"));
      }
      if (n.op_type() == "Constant" && hook) {
        KILN_ASSIGN_OR_RETURN(bool taken, hook(name, *c.outputs()[k]));
        if (taken) continue;
      }
      if (k == 0) PropagateAffine(n, input_values, *c.outputs()[k]);
      values[name] = std::make_unique<Value>(std::move(*c.outputs()[k]));
    }
  }
  return absl::OkStatus();
}

void CollectFreeValues(const onnx::GraphProto& body, absl::flat_hash_set<std::string>& defined,
                       absl::flat_hash_set<std::string>& seen, std::vector<std::string>& free) {
  // `defined` is extended by this graph's names for its own uses only.
  absl::flat_hash_set<std::string> local = defined;
  for (const auto& vi : body.input()) local.insert(vi.name());
  for (const auto& init : body.initializer()) local.insert(init.name());
  for (const auto& n : body.node()) {
    for (const auto& in : n.input()) {
      if (!in.empty() && !local.contains(in) && seen.insert(in).second) free.push_back(in);
    }
    for (const auto& a : n.attribute()) {
      if (a.has_g()) CollectFreeValues(a.g(), local, seen, free);
      for (const auto& sg : a.graphs()) CollectFreeValues(sg, local, seen, free);
    }
    for (const auto& o : n.output()) local.insert(o);
  }
}

}  // namespace

std::vector<std::string> FreeValues(const onnx::GraphProto& body) {
  absl::flat_hash_set<std::string> defined, seen;
  std::vector<std::string> free;
  CollectFreeValues(body, defined, seen, free);
  return free;
}

absl::StatusOr<ValueRef> Importer::RefOf(const std::string& name) {
  if (scope_ == nullptr) return absl::InternalError(absl::StrCat(Label(), ": no enclosing scope"));
  auto it = scope_->find(name);
  if (it == scope_->end()) {
    return Invalid(absl::StrCat("a subgraph reads \"", name, "\", which no enclosing graph defines"));
  }
  Value& v = *it->second;
  if (v.ref.node >= 0) return v.ref;
  if (!v.known || !v.known->complete()) {
    return absl::InternalError(absl::StrCat(Label(), ": value \"", name, "\" has no value"));
  }
  auto n = std::make_unique<ir::Node>();
  n->op = v1::OP_CONSTANT;
  n->name = name;
  n->attrs.mutable_constant();
  n->value = v.known->t;
  KILN_RETURN_IF_ERROR(ir::InferNode(graph_, *n, options_.limits)) << "while importing " << Label();
  v.ref = graph_.AddNode(std::move(n))->out();
  return v.ref;
}

absl::StatusOr<ImportedSubgraph> ImportSubgraph(Importer& c, const onnx::GraphProto& body,
                                                const std::vector<std::optional<TensorType>>& formal,
                                                const std::vector<std::string>& free) {
  if (body.input_size() != static_cast<int>(formal.size())) {
    return c.Invalid(absl::StrCat("subgraph \"", body.name(), "\" has ", body.input_size(),
                                  " inputs; the op gives it ", formal.size()));
  }
  if (body.node_size() > c.options().max_nodes) {
    return absl::ResourceExhaustedError(absl::StrCat(c.Label(), ": subgraph has ", body.node_size(),
                                                     " nodes, over the limit of ", c.options().max_nodes));
  }
  ImportedSubgraph out;
  out.graph = std::make_unique<ir::Graph>();
  ir::Graph& g = *out.graph;
  g.set_name(body.name().empty() ? "subgraph" : body.name());
  ValueMap values;
  auto add_input = [&](const std::string& name, const TensorType& t) -> absl::Status {
    if (values.contains(name)) {
      return c.Invalid(absl::StrCat("subgraph \"", body.name(), "\" defines \"", name, "\" twice"));
    }
    auto n = std::make_unique<ir::Node>();
    n->op = v1::OP_INPUT;
    n->name = name;
    n->attrs.mutable_input();
    n->outputs.push_back(t);
    KILN_RETURN_IF_ERROR(ir::InferNode(g, *n, c.options().limits)) << "subgraph input \"" << name << "\"";
    auto v = std::make_unique<Value>();
    v->ref = g.AddNode(std::move(n))->out();
    v->type = t;
    values[name] = std::move(v);
    return absl::OkStatus();
  };
  for (int i = 0; i < body.input_size(); ++i) {
    const onnx::ValueInfoProto& vi = body.input(i);
    if (vi.name().empty()) return c.Invalid("a subgraph input has no name");
    TensorType t;
    if (formal[i]) {
      t = *formal[i];
    } else {
      KILN_ASSIGN_OR_RETURN(t, InputType(vi, g, c.options()));
    }
    KILN_RETURN_IF_ERROR(add_input(vi.name(), t));
    out.formal.push_back(vi.name());
  }
  // Values of the enclosing scope: known ones are copied in as constants,
  // the others become inputs the op passes in (after the formal ones).
  for (const std::string& name : free) {
    if (values.contains(name)) continue;  // a formal input shadows it
    const ValueMap* scope = c.scope();
    auto it = scope == nullptr ? ValueMap::const_iterator() : scope->find(name);
    if (scope == nullptr || it == scope->end()) {
      return c.Invalid(absl::StrCat("subgraph \"", body.name(), "\" reads \"", name,
                                    "\", which no enclosing graph defines"));
    }
    const Value& outer = *it->second;
    if (outer.known && outer.known->complete()) {
      auto v = std::make_unique<Value>();
      v->type = outer.type;
      v->known = outer.known;
      values[name] = std::move(v);
      continue;
    }
    KILN_RETURN_IF_ERROR(add_input(name, outer.type));
    out.passed.push_back(name);
  }
  for (const auto& init : body.initializer()) {
    if (values.contains(init.name())) continue;
    auto t = TensorFromProto(init, c.options().limits);
    if (!t.ok()) return StatusBuilder(t.status()) << "subgraph initializer \"" << init.name() << "\"";
    auto k = std::make_shared<Known>();
    k->t = std::make_shared<const HostTensor>(std::move(t).value());
    auto v = std::make_unique<Value>();
    v->type = TensorType(k->t->dtype(), IrDims(k->t->dims().begin(), k->t->dims().end()));
    v->known = std::move(k);
    values[init.name()] = std::move(v);
  }
  std::vector<UnsupportedNode> unsupported;
  KILN_RETURN_IF_ERROR(ConvertNodes(body, g, c.options(), c.opset(), values, unsupported, nullptr));
  if (!unsupported.empty()) {
    std::vector<std::string> lines;
    for (const auto& u : unsupported) lines.push_back(u.message);
    return c.Unsupported(absl::StrCat("its subgraph \"", body.name(), "\" has node(s) Kiln cannot import: ",
                                      absl::StrJoin(lines, "; ")));
  }
  for (const auto& o : body.output()) {
    auto it = values.find(o.name());
    if (it == values.end()) {
      return c.Invalid(absl::StrCat("subgraph output \"", o.name(), "\" is not produced by any node"));
    }
    Value& v = *it->second;
    if (v.stacked) {
      return c.Unsupported(absl::StrCat("its subgraph \"", body.name(), "\" returns \"", o.name(),
                                        "\", the stacked output of the while loop ", v.stacked->loop,
                                        ", whose length is known only at run time: Kiln returns "
                                        "such an output as an output of the model only"));
    }
    if (v.ref.node < 0) {
      onnx::NodeProto dummy;
      dummy.set_name(o.name());
      dummy.add_output(o.name());
      dummy.set_op_type("output");
      dummy.add_input(o.name());
      Importer oc(g, c.options(), dummy, c.opset(), {&v});
      KILN_ASSIGN_OR_RETURN(v.ref, oc.Ref(0));
    }
    g.outputs().push_back(ir::GraphOutput{o.name(), v.ref});
    out.outputs.push_back(v.type);
  }
  if (g.outputs().empty()) return c.Invalid(absl::StrCat("subgraph \"", body.name(), "\" has no outputs"));
  return out;
}

absl::StatusOr<ValueRef> EmitIn(ir::Graph& g, const Importer& c, v1::OpKind op,
                                std::vector<ValueRef> operands, const v1::Attrs& attrs) {
  auto n = std::make_unique<ir::Node>();
  n->op = op;
  n->operands.assign(operands.begin(), operands.end());
  n->attrs = attrs;
  if (auto s = ir::InferNode(g, *n, c.options().limits); !s.ok()) {
    return StatusBuilder(s) << "while importing " << c.Label();
  }
  return g.AddNode(std::move(n))->out();
}

absl::StatusOr<v1::Graph> ExportSubgraph(ir::Graph& g, const std::vector<std::string>& order) {
  g.RemoveDeadNodes();  // what a pattern (onnx_patterns.cc) left behind
  v1::Graph exported;
  ir::ExportGraph(g, &exported);
  v1::Graph out = exported;
  out.clear_nodes();
  std::vector<bool> taken(exported.nodes_size(), false);
  for (const std::string& name : order) {
    bool found = false;
    for (int i = 0; i < exported.nodes_size() && !found; ++i) {
      if (taken[i] || exported.nodes(i).op() != v1::OP_INPUT || exported.nodes(i).name() != name) continue;
      *out.add_nodes() = exported.nodes(i);
      taken[i] = found = true;
    }
    if (!found) return absl::InternalError(absl::StrCat("subgraph has no input \"", name, "\""));
  }
  for (int i = 0; i < exported.nodes_size(); ++i) {
    if (exported.nodes(i).op() == v1::OP_INPUT && !taken[i]) {
      return absl::InternalError(absl::StrCat("subgraph input \"", exported.nodes(i).name(), "\" is not bound"));
    }
    if (!taken[i]) *out.add_nodes() = exported.nodes(i);
  }
  return out;
}

}  // namespace onnx_internal

using namespace onnx_internal;  // NOLINT: this file is the internals' driver

absl::StatusOr<OnnxModel> ImportOnnxModel(std::string_view bytes,
                                          const OnnxImportOptions& options) {
  if (static_cast<int64_t>(bytes.size()) > options.max_model_bytes ||
      bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::ResourceExhaustedError(absl::StrCat("ONNX model of ", bytes.size(),
                                                     " bytes exceeds the limit of ",
                                                     options.max_model_bytes));
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not an ONNX model: the bytes do not parse as onnx.ModelProto (truncated or another "
        "format)");
  }
  if (!model.has_graph()) return absl::InvalidArgumentError("ONNX model has no graph");
  const onnx::GraphProto& graph = model.graph();
  // Opsets: only the default domain's matters; imports no node uses are ignored.
  absl::flat_hash_map<std::string, int64_t> opsets;
  for (const auto& o : model.opset_import()) {
    opsets[IsDefaultDomain(o.domain()) ? std::string() : o.domain()] = o.version();
  }
  bool uses_default = false;
  for (const auto& n : graph.node()) uses_default |= IsDefaultDomain(n.domain());
  int opset = 0;
  if (uses_default) {
    auto it = opsets.find("");
    if (it == opsets.end()) {
      return absl::InvalidArgumentError("ONNX model imports no opset of the default domain");
    }
    if (it->second < kMinOpset || it->second > kMaxOpset) {
      return absl::UnimplementedError(absl::StrCat("ONNX opset ", it->second,
                                                   " of the default domain; Kiln imports opsets ",
                                                   kMinOpset, " to ", kMaxOpset));
    }
    opset = static_cast<int>(it->second);
  }
  if (graph.node_size() > options.max_nodes) {
    return absl::ResourceExhaustedError(absl::StrCat("ONNX graph has ", graph.node_size(),
                                                     " nodes, over the limit of ", options.max_nodes));
  }

  // Every unsupported node first, in one error.
  std::vector<UnsupportedNode> unsupported;
  const ConverterTable& table = Converters();
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& n = graph.node(i);
    const int node_opset = IsDefaultDomain(n.domain())
                               ? opset
                               : static_cast<int>(opsets.contains(n.domain()) ? opsets[n.domain()] : 0);
    if (!IsDefaultDomain(n.domain())) {
      unsupported.push_back({i, absl::StrCat(NodeDescription(n, i, node_opset),
                                             ": Kiln imports only the default ONNX domain")});
    } else if (!table.contains(n.op_type())) {
      unsupported.push_back({i, absl::StrCat(NodeDescription(n, i, node_opset),
                                             ": no Kiln conversion for this op")});
    }
  }
  auto unsupported_error = [&]() {
    std::vector<std::string> lines;
    for (const auto& u : unsupported) lines.push_back(absl::StrCat("  ", u.message));
    return absl::UnimplementedError(absl::StrCat("ONNX model has ", unsupported.size(),
                                                 " node(s) Kiln cannot import:\n",
                                                 absl::StrJoin(lines, "\n")));
  };
  if (!unsupported.empty()) return unsupported_error();

  ir::Graph g;
  g.set_name(graph.name().empty() ? "onnx" : graph.name());
  OnnxModel result;
  absl::flat_hash_map<std::string, std::unique_ptr<Value>> values;
  absl::flat_hash_set<std::string> initializer_names;
  absl::flat_hash_set<std::string> param_names(options.params.begin(), options.params.end());
  absl::flat_hash_set<std::string> params_found;

  for (const auto& init : graph.initializer()) {
    if (init.name().empty()) return absl::InvalidArgumentError("ONNX initializer without a name");
    if (!initializer_names.insert(init.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("ONNX initializer \"", init.name(), "\" appears twice"));
    }
  }
  absl::flat_hash_set<std::string> input_names;
  for (const auto& vi : graph.input()) {
    if (initializer_names.contains(vi.name())) continue;  // IR < 4 lists initializers as inputs
    if (vi.name().empty()) return absl::InvalidArgumentError("ONNX graph input without a name");
    if (!input_names.insert(vi.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("ONNX graph input \"", vi.name(), "\" appears twice"));
    }
    const HostTensor* fixed = nullptr;
    for (const auto& [name, value] : options.input_values) {
      if (name == vi.name()) fixed = value;
    }
    if (fixed != nullptr) {
      auto k = std::make_shared<Known>();
      k->t = std::make_shared<const HostTensor>(fixed->Clone());
      auto v = std::make_unique<Value>();
      v->type = TensorType(fixed->dtype(), IrDims(fixed->dims().begin(), fixed->dims().end()));
      v->known = std::move(k);
      values[vi.name()] = std::move(v);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(TensorType t, InputType(vi, g, options));
    auto n = std::make_unique<ir::Node>();
    n->op = v1::OP_INPUT;
    n->name = vi.name();
    n->attrs.mutable_input();
    n->outputs.push_back(t);
    KILN_RETURN_IF_ERROR(ir::InferNode(g, *n, options.limits)) << "graph input \"" << vi.name() << "\"";
    auto v = std::make_unique<Value>();
    v->ref = g.AddNode(std::move(n))->out();
    v->type = t;
    values[vi.name()] = std::move(v);
  }
  for (const auto& [name, value] : options.input_values) {
    if (!input_names.contains(name) || value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("a value was given for \"", name,
                                                     "\", which is not an input of the ONNX graph"));
    }
  }
  for (const auto& [name, dims] : options.input_shapes) {
    if (!input_names.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("a shape was given for \"", name,
                                                     "\", which is not an input of the ONNX graph"));
    }
  }

  auto add_param = [&](const std::string& name, std::shared_ptr<const HostTensor> t) -> absl::Status {
    auto n = std::make_unique<ir::Node>();
    n->op = v1::OP_PARAM;
    n->name = name;
    n->attrs.mutable_param();
    n->outputs.push_back(TensorType(t->dtype(), IrDims(t->dims().begin(), t->dims().end())));
    KILN_RETURN_IF_ERROR(ir::InferNode(g, *n, options.limits)) << "param \"" << name << "\"";
    auto v = std::make_unique<Value>();
    v->type = n->outputs[0];
    v->ref = g.AddNode(std::move(n))->out();
    values[name] = std::move(v);
    result.params.emplace_back(name, t->Clone());
    params_found.insert(name);
    return absl::OkStatus();
  };

  for (const auto& init : graph.initializer()) {
    if (values.contains(init.name())) continue;
    auto t = TensorFromProto(init, options.limits);
    if (!t.ok()) return StatusBuilder(t.status()) << "ONNX initializer \"" << init.name() << "\"";
    auto shared = std::make_shared<const HostTensor>(std::move(t).value());
    if (options.all_initializers_as_params || param_names.contains(init.name())) {
      KILN_RETURN_IF_ERROR(add_param(init.name(), shared));
      continue;
    }
    auto k = std::make_shared<Known>();
    k->t = shared;
    auto v = std::make_unique<Value>();
    v->type = TensorType(shared->dtype(), IrDims(shared->dims().begin(), shared->dims().end()));
    v->known = std::move(k);
    values[init.name()] = std::move(v);
  }

  KILN_RETURN_IF_ERROR(ConvertNodes(graph, g, options, opset, values, unsupported,
                                    [&](const std::string& name, const Value& v) -> absl::StatusOr<bool> {
                                      if (!param_names.contains(name) || !v.known) return false;
                                      KILN_RETURN_IF_ERROR(add_param(name, v.known->t));
                                      return true;
                                    }));
  if (!unsupported.empty()) return unsupported_error();
  for (const std::string& p : options.params) {
    if (!params_found.contains(p)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", p, "\" was asked to be a param, but the ONNX graph has no initializer or Constant "
          "node output of that name"));
    }
  }

  absl::flat_hash_set<std::string> out_names;
  std::vector<ir::GraphOutput> lengths;  // of while loops' stacked outputs, after the model's
  for (const auto& o : graph.output()) {
    auto it = values.find(o.name());
    if (it == values.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ONNX graph output \"", o.name(), "\" is not produced by any node"));
    }
    if (!out_names.insert(o.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("ONNX graph output \"", o.name(), "\" appears twice"));
    }
    Value& v = *it->second;
    if (v.ref.node < 0) {
      onnx::NodeProto dummy;
      dummy.set_name(o.name());
      dummy.add_output(o.name());
      dummy.set_op_type("output");
      dummy.add_input(o.name());
      Importer c(g, options, dummy, opset, {&v});
      KILN_ASSIGN_OR_RETURN(v.ref, c.Ref(0));
    }
    g.outputs().push_back(ir::GraphOutput{o.name(), v.ref});
    if (v.stacked) lengths.push_back({absl::StrCat(kStackedLengthPrefix, o.name()), v.stacked->length});
  }
  for (const ir::GraphOutput& l : lengths) {
    if (out_names.contains(l.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ONNX graph output \"", l.name, "\" takes the name of a while loop's stacked-output length"));
    }
    g.outputs().push_back(l);
  }
  if (g.outputs().empty()) return absl::InvalidArgumentError("ONNX graph has no outputs");
  g.RemoveDeadNodes();
  ir::ExportGraph(g, &result.graph);
  return result;
}

absl::Status TrimStackedOutputs(std::vector<std::pair<std::string, HostTensor>>& outputs) {
  std::vector<std::pair<std::string, HostTensor>> kept;
  for (auto& [name, t] : outputs) {
    if (absl::StartsWith(name, kStackedLengthPrefix)) continue;
    const std::string length_name = absl::StrCat(kStackedLengthPrefix, name);
    const HostTensor* length = nullptr;
    for (const auto& [other, l] : outputs) {
      if (other == length_name) length = &l;
    }
    if (length == nullptr) {
      kept.emplace_back(name, std::move(t));
      continue;
    }
    if (length->dtype() != v1::DTYPE_I64 || length->num_elements() != 1 || t.dims().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("output \"", length_name,
                                                     "\" is not the i64 length of a stacked output"));
    }
    const int64_t rows = t.dims()[0], n = length->data_as<int64_t>()[0];
    if (n > rows) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the while loop stacking output \"", name, "\" ran more iterations than its ", rows,
          " rows (OnnxImportOptions::max_while_scan_length)"));
    }
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("output \"", length_name, "\" is negative"));
    Dims dims = t.dims();
    dims[0] = n;
    KILN_ASSIGN_OR_RETURN(HostTensor cut, HostTensor::Create(t.dtype(), dims));
    if (cut.num_bytes() > 0) std::memcpy(cut.data(), t.data(), cut.num_bytes());
    kept.emplace_back(name, std::move(cut));
  }
  outputs = std::move(kept);
  return absl::OkStatus();
}

absl::StatusOr<v1::Graph> ImportOnnx(std::string_view bytes, const OnnxImportOptions& options) {
  KILN_ASSIGN_OR_RETURN(OnnxModel m, ImportOnnxModel(bytes, options));
  return std::move(m.graph);
}

std::vector<std::string> SupportedOnnxOps() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : Converters()) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kiln::io
