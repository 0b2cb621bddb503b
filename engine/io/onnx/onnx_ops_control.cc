// ONNX control flow onto Kiln's If / Scan / While (graph.proto). Subgraphs
// are imported as Kiln graphs (ImportSubgraph); the values of enclosing graphs
// they read (ONNX's outer scope) become extra operands — carries that the
// body passes through unchanged, for Scan and While — or constants, when
// known at import.
//
//   If    -> If: both branches must give each output one type (Kiln's If
//            selects with Where).
//   Scan  -> Scan (opset 8's batch axis of 1 dropped; scan axes other than 0
//            transposed; one direction for every input and output).
//   Loop  -> While, carries (iteration, cond, v..., M, outer values...),
//            when the body has no scan outputs; with scan outputs, Scan of
//            length M when M and cond are known at import and the body
//            passes cond through (so the trip count is M). M and cond
//            given as graph inputs are known at import through value
//            specialisation (onnx_specialize.h: one import per value).
//            With scan outputs and a cond the body computes (a while
//            loop), a While with one more carry per scan output: a buffer
//            of max_while_scan_length rows, row i written by iteration i;
//            the graph returns the buffers and the rows written
//            (onnx_import.h, TrimStackedOutputs).
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

// GCC 12 reports the empty dims of scalar TensorTypes copied into
// std::optional as maybe-uninitialized (absl::InlinedVector's inline storage,
// a false positive); clang has no such warning.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kiln::io::onnx_internal {
namespace {

const onnx::GraphProto* GraphAttr(const Importer& c, const std::string& name) {
  const onnx::AttributeProto* a = c.Attr(name);
  return a != nullptr && a->has_g() ? &a->g() : nullptr;
}

// A one-element value as a scalar (ONNX's cond is often [1]).
absl::StatusOr<ValueRef> AsScalar(Importer& c, ValueRef v, const char* what) {
  const TensorType& t = c.TypeOf(v);
  if (t.rank() == 0) return v;
  for (int64_t d : t.dims) {
    if (d != 1) return c.Invalid(absl::StrCat(what, " must have one element, got rank ", t.rank()));
  }
  return c.Reshape(v, {});
}

absl::StatusOr<ValueRef> AsScalarIn(ir::Graph& g, const Importer& c, ValueRef v, const char* what) {
  const TensorType& t = g.TypeOf(v);
  if (t.rank() == 0) return v;
  for (int64_t d : t.dims) {
    if (d != 1) return c.Invalid(absl::StrCat(what, " must have one element, got rank ", t.rank()));
  }
  v1::Attrs a;
  a.mutable_reshape();
  return EmitIn(g, c, v1::OP_RESHAPE, {v}, a);
}

std::vector<std::string> Union(std::vector<std::string> a, const std::vector<std::string>& b) {
  absl::flat_hash_set<std::string> seen(a.begin(), a.end());
  for (const std::string& s : b) {
    if (seen.insert(s).second) a.push_back(s);
  }
  return a;
}

absl::StatusOr<std::vector<ValueRef>> Passed(Importer& c, const std::vector<std::string>& names) {
  std::vector<ValueRef> refs;
  for (const std::string& n : names) {
    KILN_ASSIGN_OR_RETURN(ValueRef r, c.RefOf(n));
    refs.push_back(r);
  }
  return refs;
}

ValueRef InputRef(const ir::Graph& g, const std::string& name) {
  for (const auto& n : g.nodes()) {
    if (n->op == v1::OP_INPUT && n->name == name) return n->out();
  }
  return ValueRef{-1, 0};
}

absl::Status IfOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(0));
  const onnx::GraphProto* then_g = GraphAttr(c, "then_branch");
  const onnx::GraphProto* else_g = GraphAttr(c, "else_branch");
  if (then_g == nullptr || else_g == nullptr) return c.Invalid("needs then_branch and else_branch graphs");
  if (c.dtype(0) != v1::DTYPE_BOOL) return c.Invalid("cond must be bool");
  const std::vector<std::string> free = Union(FreeValues(*then_g), FreeValues(*else_g));
  KILN_ASSIGN_OR_RETURN(ImportedSubgraph t, ImportSubgraph(c, *then_g, {}, free));
  KILN_ASSIGN_OR_RETURN(ImportedSubgraph e, ImportSubgraph(c, *else_g, {}, free));
  if (t.outputs.size() != e.outputs.size() || static_cast<int>(t.outputs.size()) != c.num_outputs()) {
    return c.Invalid(absl::StrCat("then_branch gives ", t.outputs.size(), " outputs, else_branch ",
                                  e.outputs.size(), ", the node ", c.num_outputs()));
  }
  for (size_t k = 0; k < t.outputs.size(); ++k) {
    if (!(t.outputs[k] == e.outputs[k])) {
      return c.Unsupported(absl::StrCat("the branches give output ", k, " as ",
                                        ir::TypeToString(t.outputs[k]), " and ",
                                        ir::TypeToString(e.outputs[k]),
                                        "; Kiln's If needs one type per output"));
    }
  }
  // Both branches take the same operands: the passed values (equal lists,
  // from one scope and one free list).
  KILN_ASSIGN_OR_RETURN(v1::Graph then_graph, ExportSubgraph(*t.graph, t.passed));
  KILN_ASSIGN_OR_RETURN(v1::Graph else_graph, ExportSubgraph(*e.graph, e.passed));
  KILN_ASSIGN_OR_RETURN(ValueRef cond, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(cond, AsScalar(c, cond, "cond"));
  std::vector<ValueRef> operands = {cond};
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> passed, Passed(c, t.passed));
  operands.insert(operands.end(), passed.begin(), passed.end());
  v1::Attrs a;
  *a.mutable_if_()->mutable_then_branch() = std::move(then_graph);
  *a.mutable_if_()->mutable_else_branch() = std::move(else_graph);
  KILN_ASSIGN_OR_RETURN(ValueRef r, c.Emit(v1::OP_IF, operands, a));
  for (int k = 0; k < c.num_outputs(); ++k) c.SetOutput(k, ValueRef{r.node, k});
  return absl::OkStatus();
}

// perm moving `axis` of a rank-`rank` tensor to the front, and its inverse.
std::vector<int64_t> ToFront(int64_t axis, int64_t rank) {
  std::vector<int64_t> p = {axis};
  for (int64_t i = 0; i < rank; ++i) {
    if (i != axis) p.push_back(i);
  }
  return p;
}
std::vector<int64_t> FromFront(int64_t axis, int64_t rank) {
  std::vector<int64_t> p;
  for (int64_t i = 1; i <= axis; ++i) p.push_back(i);
  p.insert(p.begin() + axis, 0);
  for (int64_t i = axis + 1; i < rank; ++i) p.push_back(i);
  return p;
}

absl::StatusOr<ValueRef> Transpose(Importer& c, ValueRef v, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return v;
  v1::Attrs a;
  for (int64_t p : perm) a.mutable_transpose()->add_perm(p);
  return c.Emit(v1::OP_TRANSPOSE, {v}, a);
}

absl::Status ScanOp(Importer& c) {
  const onnx::GraphProto* body = GraphAttr(c, "body");
  if (body == nullptr) return c.Invalid("needs a body graph");
  const int64_t m = c.AttrInt("num_scan_inputs", -1);
  const bool batched = c.opset() < 9;  // opset 8: sequence_lens first, a batch axis
  const int first = batched ? 1 : 0;
  if (batched && c.has(0)) return c.Unsupported("opset-8 Scan's sequence_lens");
  const int total = c.num_inputs() - first;
  if (m < 1 || m > total) return c.Invalid(absl::StrCat("num_scan_inputs ", m, " out of range"));
  const int n = static_cast<int>(total - m);  // loop-carried states
  const int k_out = c.num_outputs() - n;
  if (k_out < 0) return c.Invalid("fewer outputs than states");
  auto dirs = c.AttrInts(batched ? "directions" : "scan_input_directions");
  auto out_dirs = c.AttrInts("scan_output_directions");
  auto in_axes = c.AttrInts("scan_input_axes");
  auto out_axes = c.AttrInts("scan_output_axes");
  int direction = -1;
  auto same = [&](const std::optional<std::vector<int64_t>>& d, size_t count) -> bool {
    for (size_t i = 0; i < count; ++i) {
      const int64_t v = d && i < d->size() ? (*d)[i] : 0;
      if (direction < 0) direction = static_cast<int>(v);
      if (v != direction) return false;
    }
    return true;
  };
  if (!same(dirs, static_cast<size_t>(m)) || !same(out_dirs, static_cast<size_t>(k_out))) {
    return c.Unsupported("scan directions differ between inputs or outputs; Kiln's Scan has one");
  }
  // States, then scan inputs with their axis in front (and opset 8's batch of 1 dropped).
  std::vector<ValueRef> states, xs;
  std::vector<std::optional<TensorType>> formal;
  for (int i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(ValueRef s, c.Ref(first + i));
    if (batched) {
      const TensorType& t = c.TypeOf(s);
      if (t.rank() < 1 || t.dims[0] != 1) return c.Unsupported("opset-8 Scan with a batch other than 1");
      KILN_ASSIGN_OR_RETURN(s, c.Reshape(s, IrDims(t.dims.begin() + 1, t.dims.end())));
    }
    states.push_back(s);
    formal.push_back(c.TypeOf(s));
  }
  int64_t length = -1;
  for (int i = 0; i < m; ++i) {
    KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(first + n + i));
    TensorType t = c.TypeOf(x);
    if (batched) {
      if (t.rank() < 2 || t.dims[0] != 1) return c.Unsupported("opset-8 Scan with a batch other than 1");
      KILN_ASSIGN_OR_RETURN(x, c.Reshape(x, IrDims(t.dims.begin() + 1, t.dims.end())));
      t = c.TypeOf(x);
    }
    int64_t axis = in_axes && i < static_cast<int>(in_axes->size()) ? (*in_axes)[i] : 0;
    KILN_ASSIGN_OR_RETURN(axis, NormAxis(c, axis, t.rank()));
    KILN_ASSIGN_OR_RETURN(x, Transpose(c, x, ToFront(axis, t.rank())));
    t = c.TypeOf(x);
    if (t.dims[0] < 0) return c.Unsupported("the scan length must be known at import");
    if (length >= 0 && t.dims[0] != length) return c.Invalid("scan inputs differ in length");
    length = t.dims[0];
    xs.push_back(x);
    formal.push_back(TensorType(t.dtype, IrDims(t.dims.begin() + 1, t.dims.end())));
  }
  KILN_ASSIGN_OR_RETURN(ImportedSubgraph sub, ImportSubgraph(c, *body, formal, FreeValues(*body)));
  if (static_cast<int>(sub.outputs.size()) != n + k_out) {
    return c.Invalid(absl::StrCat("body gives ", sub.outputs.size(), " outputs for ", n, " states and ",
                                  k_out, " scan outputs"));
  }
  // Kiln's body: carries (states, then passed values, returned unchanged),
  // then one slice of each scan input; outputs carries, then ys.
  std::vector<std::string> order(sub.formal.begin(), sub.formal.begin() + n);
  order.insert(order.end(), sub.passed.begin(), sub.passed.end());
  order.insert(order.end(), sub.formal.begin() + n, sub.formal.end());
  std::vector<ir::GraphOutput>& outs = sub.graph->outputs();
  std::vector<ir::GraphOutput> passthrough;
  for (const std::string& p : sub.passed) passthrough.push_back(ir::GraphOutput{p, InputRef(*sub.graph, p)});
  outs.insert(outs.begin() + n, passthrough.begin(), passthrough.end());
  KILN_ASSIGN_OR_RETURN(v1::Graph body_graph, ExportSubgraph(*sub.graph, order));
  std::vector<ValueRef> operands = states;
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> passed, Passed(c, sub.passed));
  operands.insert(operands.end(), passed.begin(), passed.end());
  operands.insert(operands.end(), xs.begin(), xs.end());
  v1::Attrs a;
  auto* sa = a.mutable_scan();
  *sa->mutable_body() = std::move(body_graph);
  sa->set_num_carries(n + static_cast<int>(passed.size()));
  sa->set_length(length);
  sa->set_reverse(direction == 1);
  KILN_ASSIGN_OR_RETURN(ValueRef r, c.Emit(v1::OP_SCAN, operands, a));
  const int carries = n + static_cast<int>(passed.size());
  for (int i = 0; i < n; ++i) {
    ValueRef s{r.node, i};
    if (batched) {
      IrDims d = c.TypeOf(s).dims;
      d.insert(d.begin(), 1);
      KILN_ASSIGN_OR_RETURN(s, c.Reshape(s, d));
    }
    c.SetOutput(i, s);
  }
  for (int j = 0; j < k_out; ++j) {
    ValueRef y{r.node, carries + j};
    const int64_t rank = c.TypeOf(y).rank();
    int64_t axis = out_axes && j < static_cast<int>(out_axes->size()) ? (*out_axes)[j] : 0;
    KILN_ASSIGN_OR_RETURN(axis, NormAxis(c, axis, rank));
    KILN_ASSIGN_OR_RETURN(y, Transpose(c, y, FromFront(axis, rank)));
    if (batched) {
      IrDims d = c.TypeOf(y).dims;
      d.insert(d.begin(), 1);
      KILN_ASSIGN_OR_RETURN(y, c.Reshape(y, d));
    }
    c.SetOutput(n + j, y);
  }
  return absl::OkStatus();
}

// Whether the body's first output (cond_out) is its cond_in, through Identity nodes.
bool PassesCondThrough(const onnx::GraphProto& body) {
  if (body.input_size() < 2 || body.output_size() < 1) return false;
  std::string name = body.output(0).name();
  for (int hops = 0; hops < 16; ++hops) {
    if (name == body.input(1).name()) return true;
    const onnx::NodeProto* producer = nullptr;
    for (const auto& n : body.node()) {
      for (const auto& o : n.output()) {
        if (o == name) producer = &n;
      }
    }
    if (producer == nullptr || producer->op_type() != "Identity" || producer->input_size() != 1) return false;
    name = producer->input(0);
  }
  return false;
}

absl::Status LoopOp(Importer& c) {
  const onnx::GraphProto* body = GraphAttr(c, "body");
  if (body == nullptr) return c.Invalid("needs a body graph");
  const int n = c.num_inputs() - 2;  // loop-carried values
  if (n < 0) return c.Invalid("needs M and cond inputs (either may be empty)");
  const int k_out = c.num_outputs() - n;
  if (k_out < 0) return c.Invalid("fewer outputs than loop-carried values");
  if (body->input_size() != 2 + n || body->output_size() != 1 + n + k_out) {
    return c.Invalid(absl::StrCat("body has ", body->input_size(), " inputs and ", body->output_size(),
                                  " outputs for ", n, " loop-carried values and ", k_out, " scan outputs"));
  }
  const HostTensor* m_known = c.has(0) ? c.Const(0) : nullptr;
  const HostTensor* cond_known = c.has(1) ? c.Const(1) : nullptr;
  // Carries: iteration (i64), cond (bool), v..., then M (While only), then passed values.
  TensorType i64;  // scalars (default dims: GCC 12 misreads `{}` here)
  i64.dtype = v1::DTYPE_I64;
  TensorType b;
  b.dtype = v1::DTYPE_BOOL;
  std::vector<std::optional<TensorType>> formal = {i64, b};
  std::vector<ValueRef> v;
  for (int i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(2 + i));
    v.push_back(x);
    formal.push_back(c.TypeOf(x));
  }
  KILN_ASSIGN_OR_RETURN(ImportedSubgraph sub, ImportSubgraph(c, *body, formal, FreeValues(*body)));
  ir::Graph& g = *sub.graph;
  for (int i = 0; i < n; ++i) {
    if (!(sub.outputs[1 + i] == *formal[2 + i])) {
      return c.Unsupported(absl::StrCat("loop-carried value ", i, " changes from ",
                                        ir::TypeToString(*formal[2 + i]), " to ",
                                        ir::TypeToString(sub.outputs[1 + i]),
                                        "; Kiln's While keeps carry shapes"));
    }
  }
  bool as_scan = false;
  bool stacked = false;  // a While stacking its scan outputs into bounded buffers
  int64_t trip = -1;
  int64_t bound = 0;  // the stacked buffers' rows
  if (k_out > 0) {
    // ONNX stacks scan outputs over the iterations actually run: a Scan when
    // that count is known at import. When the body passes cond through, the
    // count is M (or 0) and depends only on input values: value
    // specialisation (onnx_specialize.h) fixes them, so that stays
    // UNIMPLEMENTED here. When the body computes cond (a while loop), the
    // count is known only at run time: a While that writes iteration i's
    // outputs into row i of buffers of `bound` rows, returned with the count.
    const bool cond_true = !c.has(1) || (cond_known != nullptr && GetInt(*cond_known, 0) != 0);
    const bool cond_false = cond_known != nullptr && GetInt(*cond_known, 0) == 0;
    const bool passes = PassesCondThrough(*body);
    const bool m_one = m_known != nullptr && m_known->num_elements() == 1;
    as_scan = m_one && (cond_false || (cond_true && passes));
    stacked = !as_scan && !passes;
    if (!as_scan && !stacked) {
      return c.Unsupported(
          "Loop with scan outputs needs its trip count known at import (M and cond known, the body "
          "passing cond through); Kiln's While keeps carry shapes");
    }
  }
  if (stacked) {
    bound = std::min(c.options().max_while_scan_length, c.options().max_loop_iterations);
    if (m_known != nullptr && m_known->num_elements() == 1) {
      bound = std::min(bound, std::max<int64_t>(0, GetInt(*m_known, 0)));
    }
    KILN_RETURN_IF_ERROR(CheckTable(c, bound, "a while loop's stacked rows"));
    for (int j = 0; j < k_out; ++j) {
      for (int64_t d : sub.outputs[1 + n + j].dims) {
        if (d < 0) {
          return c.Unsupported(absl::StrCat(
              "scan output ", j, " of a while loop is ", ir::TypeToString(sub.outputs[1 + n + j]),
              ": its stacked buffer needs static dims (pin the input shapes)"));
        }
      }
    }
  }
  if (as_scan) {
    trip = cond_known != nullptr && GetInt(*cond_known, 0) == 0 ? 0 : std::max<int64_t>(0, GetInt(*m_known, 0));
    if (trip > c.options().max_loop_iterations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          c.Label(), ": the Loop's trip count M = ", trip, " is over the iteration limit of ",
          c.options().max_loop_iterations, " (max_while_iterations)"));
    }
  }
  // The body's wrapper: iteration + 1, cond_out as a scalar, v_out, then
  // M and the passed values unchanged, then the scan outputs.
  const ValueRef iter = InputRef(g, sub.formal[0]);
  KILN_ASSIGN_OR_RETURN(HostTensor one, HostTensor::Create(v1::DTYPE_I64, {}));
  SetInt(one, 0, 1);
  auto cn = std::make_unique<ir::Node>();
  cn->op = v1::OP_CONSTANT;
  cn->attrs.mutable_constant();
  cn->value = std::make_shared<const HostTensor>(std::move(one));
  KILN_RETURN_IF_ERROR(ir::InferNode(g, *cn, c.options().limits));
  const ValueRef one_ref = g.AddNode(std::move(cn))->out();
  v1::Attrs add;
  add.mutable_binary()->set_kind(v1::BINARY_ADD);
  KILN_ASSIGN_OR_RETURN(ValueRef next, EmitIn(g, c, v1::OP_BINARY, {iter, one_ref}, add));
  std::vector<ir::GraphOutput> body_out = g.outputs();
  if (g.TypeOf(body_out[0].value).dtype != v1::DTYPE_BOOL) return c.Invalid("the body's cond_out must be bool");
  KILN_ASSIGN_OR_RETURN(ValueRef cond_out, AsScalarIn(g, c, body_out[0].value, "the body's cond_out"));
  std::vector<ir::GraphOutput> outs = {{"iteration", next}, {"cond", cond_out}};
  for (int i = 0; i < n; ++i) outs.push_back(body_out[1 + i]);
  std::vector<std::string> order = {sub.formal[0], sub.formal[1]};
  for (int i = 0; i < n; ++i) order.push_back(sub.formal[2 + i]);
  std::string m_name;
  if (!as_scan) {
    m_name = "kiln.loop.M";
    auto mn = std::make_unique<ir::Node>();
    mn->op = v1::OP_INPUT;
    mn->name = m_name;
    mn->attrs.mutable_input();
    mn->outputs.push_back(i64);
    KILN_RETURN_IF_ERROR(ir::InferNode(g, *mn, c.options().limits));
    const ValueRef m_ref = g.AddNode(std::move(mn))->out();
    outs.push_back({m_name, m_ref});
    order.push_back(m_name);
  }
  for (const std::string& p : sub.passed) {
    outs.push_back({p, InputRef(g, p)});
    order.push_back(p);
  }
  if (as_scan) {
    for (int j = 0; j < k_out; ++j) outs.push_back(body_out[1 + n + j]);
  }
  if (stacked) {
    // Row `iteration` of each buffer takes this iteration's output: a Where
    // on iota == iteration (exact for every dtype; ScatterAdd would add).
    for (int j = 0; j < k_out; ++j) {
      const TensorType& step = g.TypeOf(body_out[1 + n + j].value);
      IrDims rows_dims(step.dims.size() + 1, 1);
      rows_dims[0] = bound;
      KILN_ASSIGN_OR_RETURN(HostTensor iota, HostTensor::Create(v1::DTYPE_I64, Dims(rows_dims.begin(), rows_dims.end())));
      for (int64_t r = 0; r < bound; ++r) SetInt(iota, r, r);
      auto in = std::make_unique<ir::Node>();
      in->op = v1::OP_CONSTANT;
      in->attrs.mutable_constant();
      in->value = std::make_shared<const HostTensor>(std::move(iota));
      KILN_RETURN_IF_ERROR(ir::InferNode(g, *in, c.options().limits));
      const ValueRef rows = g.AddNode(std::move(in))->out();
      v1::Attrs eq;
      eq.mutable_compare()->set_kind(v1::COMPARE_EQ);
      KILN_ASSIGN_OR_RETURN(ValueRef here, EmitIn(g, c, v1::OP_COMPARE, {rows, iter}, eq));
      IrDims one_row = step.dims;
      one_row.insert(one_row.begin(), 1);
      v1::Attrs rs;
      for (int64_t d : one_row) rs.mutable_reshape()->add_shape(d);
      KILN_ASSIGN_OR_RETURN(ValueRef row, EmitIn(g, c, v1::OP_RESHAPE, {body_out[1 + n + j].value}, rs));
      const std::string name = absl::StrCat("kiln.loop.stack", j);
      auto bn = std::make_unique<ir::Node>();
      bn->op = v1::OP_INPUT;
      bn->name = name;
      bn->attrs.mutable_input();
      IrDims buf_dims = step.dims;
      buf_dims.insert(buf_dims.begin(), bound);
      bn->outputs.push_back(TensorType(step.dtype, buf_dims));
      KILN_RETURN_IF_ERROR(ir::InferNode(g, *bn, c.options().limits));
      const ValueRef buf = g.AddNode(std::move(bn))->out();
      v1::Attrs where;
      where.mutable_where();
      KILN_ASSIGN_OR_RETURN(ValueRef next_buf, EmitIn(g, c, v1::OP_WHERE, {here, row, buf}, where));
      outs.push_back({name, next_buf});
      order.push_back(name);
    }
  }
  g.outputs() = outs;
  KILN_ASSIGN_OR_RETURN(v1::Graph body_graph, ExportSubgraph(g, order));

  // Initial carries.
  KILN_ASSIGN_OR_RETURN(ValueRef iter0, c.ScalarConst(v1::DTYPE_I64, 0));
  ValueRef cond0;
  if (c.has(1)) {
    KILN_ASSIGN_OR_RETURN(cond0, c.Ref(1));
    KILN_ASSIGN_OR_RETURN(cond0, AsScalar(c, cond0, "cond"));
  } else {
    KILN_ASSIGN_OR_RETURN(cond0, c.ScalarConst(v1::DTYPE_BOOL, 1));
  }
  std::vector<ValueRef> operands = {iter0, cond0};
  operands.insert(operands.end(), v.begin(), v.end());
  KILN_ASSIGN_OR_RETURN(std::vector<ValueRef> passed, Passed(c, sub.passed));
  const int first_passed = 2 + n + (as_scan ? 0 : 1);

  v1::Attrs a;
  if (as_scan) {
    operands.insert(operands.end(), passed.begin(), passed.end());
    auto* sa = a.mutable_scan();
    *sa->mutable_body() = std::move(body_graph);
    sa->set_num_carries(static_cast<int>(operands.size()));
    sa->set_length(trip);
    KILN_ASSIGN_OR_RETURN(ValueRef r, c.Emit(v1::OP_SCAN, operands, a));
    for (int i = 0; i < n; ++i) c.SetOutput(i, ValueRef{r.node, 2 + i});
    for (int j = 0; j < k_out; ++j) c.SetOutput(n + j, ValueRef{r.node, first_passed + static_cast<int>(passed.size()) + j});
    return absl::OkStatus();
  }
  // M: absent = no bound (the server's iteration limit still applies).
  ValueRef m0;
  if (c.has(0)) {
    KILN_ASSIGN_OR_RETURN(m0, c.Ref(0));
    KILN_ASSIGN_OR_RETURN(m0, AsScalar(c, m0, "M"));
    KILN_ASSIGN_OR_RETURN(m0, c.Cast(m0, v1::DTYPE_I64));
  } else {
    KILN_ASSIGN_OR_RETURN(m0, c.ScalarConst(v1::DTYPE_I64, static_cast<double>(int64_t{1} << 62)));
  }
  operands.push_back(m0);
  operands.insert(operands.end(), passed.begin(), passed.end());
  std::vector<int> buffers;  // operand index of each stacked buffer
  for (int j = 0; stacked && j < k_out; ++j) {
    const TensorType& step = sub.outputs[1 + n + j];
    KILN_ASSIGN_OR_RETURN(ValueRef zero, c.ScalarConst(step.dtype, 0));
    v1::Attrs ex;
    ex.mutable_expand()->add_shape(bound);
    for (int64_t d : step.dims) ex.mutable_expand()->add_shape(d);
    KILN_ASSIGN_OR_RETURN(ValueRef buf, c.Emit(v1::OP_EXPAND, {zero}, ex));
    buffers.push_back(static_cast<int>(operands.size()));
    operands.push_back(buf);
  }
  // cond(carries) = cond && iteration < M.
  ir::Graph cg;
  cg.set_name("loop_cond");
  std::vector<ValueRef> cin;
  std::vector<std::string> corder;
  for (size_t i = 0; i < operands.size(); ++i) {
    auto in = std::make_unique<ir::Node>();
    in->op = v1::OP_INPUT;
    in->name = absl::StrCat("c", i);
    in->attrs.mutable_input();
    in->outputs.push_back(c.TypeOf(operands[i]));
    KILN_RETURN_IF_ERROR(ir::InferNode(cg, *in, c.options().limits));
    cin.push_back(cg.AddNode(std::move(in))->out());
    corder.push_back(absl::StrCat("c", i));
  }
  v1::Attrs lt;
  lt.mutable_compare()->set_kind(v1::COMPARE_LT);
  KILN_ASSIGN_OR_RETURN(ValueRef below, EmitIn(cg, c, v1::OP_COMPARE, {cin[0], cin[2 + n]}, lt));
  // bool AND as Where(cond, below, false).
  KILN_ASSIGN_OR_RETURN(HostTensor f, HostTensor::Create(v1::DTYPE_BOOL, {}));
  auto fn = std::make_unique<ir::Node>();
  fn->op = v1::OP_CONSTANT;
  fn->attrs.mutable_constant();
  fn->value = std::make_shared<const HostTensor>(std::move(f));
  KILN_RETURN_IF_ERROR(ir::InferNode(cg, *fn, c.options().limits));
  const ValueRef false_ref = cg.AddNode(std::move(fn))->out();
  v1::Attrs where;
  where.mutable_where();
  KILN_ASSIGN_OR_RETURN(ValueRef more, EmitIn(cg, c, v1::OP_WHERE, {cin[1], below, false_ref}, where));
  if (stacked) {  // and iteration < bound: a row left to write
    KILN_ASSIGN_OR_RETURN(HostTensor b, HostTensor::Create(v1::DTYPE_I64, {}));
    SetInt(b, 0, bound);
    auto bn = std::make_unique<ir::Node>();
    bn->op = v1::OP_CONSTANT;
    bn->attrs.mutable_constant();
    bn->value = std::make_shared<const HostTensor>(std::move(b));
    KILN_RETURN_IF_ERROR(ir::InferNode(cg, *bn, c.options().limits));
    const ValueRef bound_ref = cg.AddNode(std::move(bn))->out();
    KILN_ASSIGN_OR_RETURN(ValueRef room, EmitIn(cg, c, v1::OP_COMPARE, {cin[0], bound_ref}, lt));
    KILN_ASSIGN_OR_RETURN(more, EmitIn(cg, c, v1::OP_WHERE, {more, room, false_ref}, where));
  }
  cg.outputs().push_back(ir::GraphOutput{"more", more});
  KILN_ASSIGN_OR_RETURN(v1::Graph cond_graph, ExportSubgraph(cg, corder));
  auto* wa = a.mutable_while_();
  *wa->mutable_cond() = std::move(cond_graph);
  *wa->mutable_body() = std::move(body_graph);
  KILN_ASSIGN_OR_RETURN(ValueRef r, c.Emit(v1::OP_WHILE, operands, a));
  for (int i = 0; i < n; ++i) c.SetOutput(i, ValueRef{r.node, 2 + i});
  if (!stacked) return absl::OkStatus();
  // The rows written: the final iteration, plus one when cond and iteration
  // < M still held (the loop stopped for want of a row: past the bound).
  const ValueRef iter_f{r.node, 0}, cond_f{r.node, 1}, m_f{r.node, 2 + n};
  KILN_ASSIGN_OR_RETURN(ValueRef below_m, c.Compare(v1::COMPARE_LT, iter_f, m_f));
  KILN_ASSIGN_OR_RETURN(ValueRef no, c.ScalarConst(v1::DTYPE_BOOL, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef wanted_more, c.Where(cond_f, below_m, no));
  KILN_ASSIGN_OR_RETURN(ValueRef extra, c.Cast(wanted_more, v1::DTYPE_I64));
  KILN_ASSIGN_OR_RETURN(ValueRef length, c.Binary(v1::BINARY_ADD, iter_f, extra));
  for (int j = 0; j < k_out; ++j) {
    c.SetOutput(n + j, ValueRef{r.node, buffers[j]});
    if (c.outputs()[n + j]) c.outputs()[n + j]->stacked = Value::Stacked{length, bound, c.Label()};
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterControlFlow(ConverterTable& table) {
  table["If"] = IfOp;
  table["Scan"] = ScanOp;
  table["Loop"] = LoopOp;
}

}  // namespace kiln::io::onnx_internal
