#include "engine/ir/verifier.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kiln::ir {
namespace {

std::string ProtoNodeLabel(const v1::Node& n) {
  Node tmp;
  tmp.id = n.id();
  tmp.name = n.name();
  tmp.op = n.op();
  tmp.attrs = n.attrs();
  return NodeLabel(tmp);
}

absl::Status ProtoError(const v1::Node& n, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(ProtoNodeLabel(n), ": ", msg));
}

absl::StatusOr<TensorType> ImportType(const v1::TensorType& t, Graph& g, const v1::Node& n,
                                      const InferLimits& limits) {
  if (!IsKnownDType(t.dtype())) {
    return ProtoError(n, absl::StrCat("unknown dtype ", static_cast<int>(t.dtype())));
  }
  if (t.dims_size() > limits.max_rank) {
    return ProtoError(n, absl::StrCat("rank ", t.dims_size(), " exceeds the limit ", limits.max_rank));
  }
  TensorType out;
  out.dtype = t.dtype();
  for (const v1::Dim& d : t.dims()) {
    switch (d.kind_case()) {
      case v1::Dim::kSize:
        if (d.size() < 0) return ProtoError(n, absl::StrCat("negative dim ", d.size()));
        out.dims.push_back(d.size());
        break;
      case v1::Dim::kSymbol:
        if (d.symbol().empty() || d.symbol() == "?") {
          out.dims.push_back(kDynamic);
        } else {
          out.dims.push_back(SymbolDim(g.InternSymbol(d.symbol())));
        }
        break;
      default:
        return ProtoError(n, "a dim has neither size nor symbol");
    }
  }
  return out;
}

// Inference never leaves a dim that names no symbol (InferNode checks); one
// that does anyway is written anonymous rather than read out of range.
void ExportType(const TensorType& t, const Graph& g, v1::TensorType* out) {
  out->set_dtype(t.dtype);
  for (int64_t d : t.dims) {
    v1::Dim* dim = out->add_dims();
    if (d >= 0) {
      dim->set_size(d);
    } else if (const std::string* name = SymbolName(d, g.symbols()); name != nullptr) {
      dim->set_symbol(*name);
    } else {
      dim->set_symbol("?");
    }
  }
}

// Sets an empty attribute message of the op's own kind when none was sent
// (all defaults); rejects attributes of another op's kind.
absl::Status NormalizeAttrs(const v1::Node& n, v1::Attrs& attrs) {
  const auto* desc = v1::Attrs::descriptor();
  const auto* oneof = desc->FindOneofByName("kind");
  const auto* refl = v1::Attrs::GetReflection();
  const auto* set = refl->GetOneofFieldDescriptor(attrs, oneof);
  const auto* want = desc->FindFieldByNumber(static_cast<int>(n.op()));
  if (want == nullptr) return ProtoError(n, "op has no attribute message");
  if (set == nullptr) {
    refl->MutableMessage(&attrs, want);
    return absl::OkStatus();
  }
  if (set != want) {
    return ProtoError(n, absl::StrCat("attrs carry `", set->name(), "` but the op needs `",
                                      want->name(), "`"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsInternalOp(OpKind op) {
  return op == v1::OP_FUSED_ELEMENTWISE || op == v1::OP_FUSED_MATMUL ||
         op == v1::OP_FUSED_RESIDUAL_NORM || op == v1::OP_COPY || op == v1::OP_FUSED_CONV;
}

absl::StatusOr<std::unique_ptr<Graph>> ImportGraph(const v1::Graph& proto,
                                                   const VerifyOptions& options, int depth) {
  if (proto.ir_version() > kIrVersion) {
    return absl::InvalidArgumentError(absl::StrCat("graph \"", proto.name(), "\" has ir_version ",
                                                   proto.ir_version(), "; this kilnd reads up to ",
                                                   kIrVersion));
  }
  if (proto.ir_version() < 0) return absl::InvalidArgumentError("ir_version must be >= 0");
  if (proto.nodes_size() > options.max_nodes) {
    return absl::ResourceExhaustedError(absl::StrCat("graph \"", proto.name(), "\" has ",
                                                     proto.nodes_size(),
                                                     " nodes, over the limit of ",
                                                     options.max_nodes));
  }
  auto g = std::make_unique<Graph>();
  g->set_name(proto.name());
  g->set_ir_version(kIrVersion);
  absl::flat_hash_set<int32_t> ids;
  absl::flat_hash_set<std::string> source_names;
  for (const v1::Node& pn : proto.nodes()) {
    if (pn.id() < 0) return ProtoError(pn, "node ids must be >= 0");
    // The compiler numbers the nodes it adds after the largest id
    // (Graph::AddNode): a client's id near INT32_MAX left no room and
    // overflowed it (kiln_fuzz_graph_ingest).
    if (pn.id() > kMaxClientNodeId) {
      return ProtoError(pn, absl::StrCat("node id ", pn.id(), " is over the limit of ", kMaxClientNodeId));
    }
    if (!ids.insert(pn.id()).second) return ProtoError(pn, "duplicate node id");
    if (!v1::OpKind_IsValid(pn.op()) || pn.op() == v1::OP_KIND_UNSPECIFIED) {
      return ProtoError(pn, absl::StrCat("unknown op ", static_cast<int>(pn.op())));
    }
    if (IsInternalOp(pn.op()) && !options.allow_internal_ops) {
      return ProtoError(pn, "internal op; clients cannot send it");
    }
    auto node = std::make_unique<Node>();
    node->id = pn.id();
    node->name = pn.name();
    node->op = pn.op();
    node->attrs = pn.attrs();
    KILN_RETURN_IF_ERROR(NormalizeAttrs(pn, node->attrs));
    for (const v1::ValueRef& op : pn.operands()) {
      node->operands.push_back(ValueRef{op.node(), op.output()});
    }
    for (const v1::TensorType& t : pn.outputs()) {
      KILN_ASSIGN_OR_RETURN(TensorType type, ImportType(t, *g, pn, options.limits));
      node->outputs.push_back(std::move(type));
    }
    if (pn.op() == v1::OP_INPUT || pn.op() == v1::OP_PARAM) {
      if (!pn.name().empty() && !source_names.insert(pn.name()).second) {
        return ProtoError(pn, "another input or param has the same name");
      }
    }
    if (pn.op() == v1::OP_CONSTANT) {
      const v1::Tensor& v = node->attrs.constant().value();
      if (!IsKnownDType(v.dtype())) return ProtoError(pn, "constant value has an unknown dtype");
      if (v.dims_size() > options.limits.max_rank) return ProtoError(pn, "constant rank over the limit");
      auto n = CheckedNumElements(std::span<const int64_t>(v.dims().data(), v.dims_size()));
      if (!n.ok()) return ProtoError(pn, absl::StrCat("constant value: ", n.status().message()));
      if (*n > options.limits.max_tensor_elements) {
        return absl::ResourceExhaustedError(absl::StrCat(ProtoNodeLabel(pn), ": constant has ", *n,
                                                         " elements, over the limit"));
      }
      auto t = HostTensor::FromProto(v);
      if (!t.ok()) return ProtoError(pn, absl::StrCat("constant value: ", t.status().message()));
      node->value = std::make_shared<const HostTensor>(std::move(t).value());
      node->attrs.mutable_constant()->clear_value();
    }
    node->origins = {node->id};
    g->AddNode(std::move(node));
  }
  absl::flat_hash_set<std::string> out_names;
  for (const v1::GraphOutput& o : proto.outputs()) {
    if (o.name().empty()) return absl::InvalidArgumentError("graph output with an empty name");
    if (!out_names.insert(o.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate graph output \"", o.name(), "\""));
    }
    g->outputs().push_back(GraphOutput{o.name(), ValueRef{o.value().node(), o.value().output()}});
  }
  KILN_RETURN_IF_ERROR(VerifyGraph(*g, options, depth));
  return g;
}

absl::Status VerifyGraph(Graph& g, const VerifyOptions& options, int depth) {
  // Dangling operands first, so a missing node is reported as such, not as a cycle.
  for (const auto& n : g.nodes()) {
    for (size_t i = 0; i < n->operands.size(); ++i) {
      if (g.FindNode(n->operands[i].node) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(NodeLabel(*n), ": operand ", i,
                                                       " names node ", n->operands[i].node,
                                                       ", which does not exist"));
      }
    }
  }
  KILN_RETURN_IF_ERROR(g.SortTopologically());
  for (const auto& np : g.nodes()) {
    Node& n = *np;
    for (size_t i = 0; i < n.operands.size(); ++i) {
      const ValueRef v = n.operands[i];
      const Node* src = g.FindNode(v.node);
      if (v.output < 0 || v.output >= static_cast<int>(src->outputs.size())) {
        return absl::InvalidArgumentError(absl::StrCat(NodeLabel(n), ": operand ", i, " reads output ",
                                                       v.output, " of ", NodeLabel(*src), ", which has ",
                                                       src->outputs.size()));
      }
    }
    const bool is_source = n.op == v1::OP_INPUT || n.op == v1::OP_PARAM;
    auto declared = n.outputs;
    KILN_RETURN_IF_ERROR(InferNode(g, n, options.limits, depth));
    if (!is_source && !declared.empty() && n.op != v1::OP_CUSTOM) {
      bool ok = declared.size() == n.outputs.size();
      for (size_t i = 0; ok && i < declared.size(); ++i) {
        ok = declared[i].dtype == n.outputs[i].dtype && declared[i].rank() == n.outputs[i].rank();
        for (int64_t k = 0; ok && k < declared[i].rank(); ++k) {
          const int64_t a = declared[i].dims[k], b = n.outputs[i].dims[k];
          ok = a < 0 || b < 0 || a == b;
        }
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            NodeLabel(n), ": declared result ", TypeToString(declared[0], g.symbols()),
            " differs from the inferred ", TypeToString(n.outputs[0], g.symbols())));
      }
    }
  }
  if (g.outputs().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("graph \"", g.name(), "\" has no outputs"));
  }
  for (const GraphOutput& o : g.outputs()) {
    const Node* src = g.FindNode(o.value.node);
    if (src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("output \"", o.name, "\" names node ",
                                                     o.value.node, ", which does not exist"));
    }
    if (o.value.output < 0 || o.value.output >= static_cast<int>(src->outputs.size())) {
      return absl::InvalidArgumentError(absl::StrCat("output \"", o.name, "\" reads output ",
                                                     o.value.output, " of ", NodeLabel(*src)));
    }
  }
  return absl::OkStatus();
}

absl::Status Specialize(Graph& g, const std::vector<std::pair<std::string, Dims>>& shapes,
                        const VerifyOptions& options) {
  std::vector<int64_t> bound(g.symbols().size(), -1);
  // Check every input before binding any, so a rejected shape list leaves
  // the graph as it was.
  std::vector<std::pair<TensorType*, IrDims>> binds;
  for (const auto& np : g.nodes()) {
    Node& n = *np;
    if (n.op != v1::OP_INPUT) continue;
    const Dims* given = nullptr;
    for (const auto& [name, dims] : shapes) {
      if (name == n.name) given = &dims;
    }
    TensorType& t = n.outputs[0];
    if (given == nullptr) {
      if (t.is_static()) continue;
      return absl::InvalidArgumentError(absl::StrCat("input \"", n.name, "\" has symbolic shape ",
                                                     TypeToString(t, g.symbols()),
                                                     " and no concrete shape was given"));
    }
    if (static_cast<int64_t>(given->size()) != t.rank()) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", n.name, "\" expects ",
                                                     TypeToString(t, g.symbols()), ", got shape ",
                                                     DimsToString(*given)));
    }
    for (int64_t k = 0; k < t.rank(); ++k) {
      const int64_t want = t.dims[k], got = (*given)[k];
      if (got < 0) return absl::InvalidArgumentError("negative dim in input shape");
      if (want >= 0 && want != got) {
        return absl::InvalidArgumentError(absl::StrCat("input \"", n.name, "\" expects ",
                                                       TypeToString(t, g.symbols()), ", got shape ",
                                                       DimsToString(*given)));
      }
      if (IsSymbolDim(want)) {
        int64_t& b = bound[SymbolIndex(want)];
        if (b >= 0 && b != got) {
          return absl::InvalidArgumentError(absl::StrCat(
              "symbol \"", g.symbols()[SymbolIndex(want)], "\" is ", b, " in one input and ", got,
              " in input \"", n.name, "\""));
        }
        b = got;
      }
    }
    binds.emplace_back(&t, IrDims(given->begin(), given->end()));
  }
  for (auto& [type, dims] : binds) type->dims = std::move(dims);
  KILN_RETURN_IF_ERROR(VerifyGraph(g, options));
  for (const auto& np : g.nodes()) {
    for (const TensorType& t : np->outputs) {
      if (!t.is_static()) {
        return absl::InvalidArgumentError(absl::StrCat(
            NodeLabel(*np), ": result ", TypeToString(t, g.symbols()),
            " is still symbolic after binding the inputs"));
      }
    }
  }
  return absl::OkStatus();
}

void ExportGraph(const Graph& g, v1::Graph* proto, const ExportOptions& options) {
  proto->Clear();
  proto->set_name(options.strip_names ? "" : g.name());
  proto->set_ir_version(g.ir_version());
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    v1::Node* pn = proto->add_nodes();
    pn->set_id(n.id);
    const bool keep_name = !options.strip_names || n.op == v1::OP_INPUT || n.op == v1::OP_PARAM;
    if (keep_name) pn->set_name(n.name);
    pn->set_op(n.op);
    for (const ValueRef& v : n.operands) {
      v1::ValueRef* r = pn->add_operands();
      r->set_node(v.node);
      r->set_output(v.output);
    }
    *pn->mutable_attrs() = n.attrs;
    if (n.op == v1::OP_CONSTANT && n.value && options.with_constants) {
      n.value->ToProto(pn->mutable_attrs()->mutable_constant()->mutable_value());
    }
    for (const TensorType& t : n.outputs) ExportType(t, g, pn->add_outputs());
  }
  for (const GraphOutput& o : g.outputs()) {
    v1::GraphOutput* po = proto->add_outputs();
    po->set_name(o.name);
    po->mutable_value()->set_node(o.value.node);
    po->mutable_value()->set_output(o.value.output);
  }
}

absl::StatusOr<std::vector<TensorType>> InferSubgraph(const v1::Graph& body,
                                                      const std::vector<TensorType>& args,
                                                      const InferLimits& limits, int depth) {
  VerifyOptions opts;
  opts.limits = limits;
  // Import with the declared input types first, then rebind them to `args`.
  KILN_ASSIGN_OR_RETURN(auto g, ImportGraph(body, opts, depth));
  std::vector<Node*> inputs;
  for (const auto& n : g->nodes()) {
    if (n->op == v1::OP_INPUT) inputs.push_back(n.get());
  }
  if (inputs.size() != args.size()) {
    return absl::InvalidArgumentError(absl::StrCat("subgraph has ", inputs.size(),
                                                   " inputs but receives ", args.size(), " values"));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const TensorType& want = inputs[i]->outputs[0];
    bool ok = want.dtype == args[i].dtype && want.rank() == args[i].rank();
    for (int64_t k = 0; ok && k < want.rank(); ++k) {
      ok = want.dims[k] < 0 || args[i].dims[k] < 0 || want.dims[k] == args[i].dims[k];
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "subgraph input \"", inputs[i]->name, "\" is ", TypeToString(want, g->symbols()),
          " but receives ", TypeToString(args[i])));
    }
    TensorType t = args[i];
    for (auto& d : t.dims) {
      if (d < 0) d = kDynamic;
    }
    inputs[i]->outputs[0] = t;
  }
  KILN_RETURN_IF_ERROR(VerifyGraph(*g, opts, depth));
  std::vector<TensorType> outs;
  for (const GraphOutput& o : g->outputs()) {
    // The body's symbols are its own (a custom op may declare one): the caller's
    // graph has no such symbol, so they leave as anonymous dims.
    TensorType t = g->TypeOf(o.value);
    for (auto& d : t.dims) {
      if (d < 0) d = kDynamic;
    }
    outs.push_back(std::move(t));
  }
  return outs;
}

}  // namespace kiln::ir
