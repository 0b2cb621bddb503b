// The per-node context of the ONNX importer (class Importer, onnx_internal.h):
// reading a node's inputs and attributes, emitting Kiln nodes and setting its
// outputs. The driver is onnx_import.cc.
#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"
#include "engine/ir/infer.h"

namespace kiln::io::onnx_internal {

std::string Importer::Label() const {
  const std::string name = node_.name().empty()
                               ? (node_.output_size() > 0 ? node_.output(0) : std::string("?"))
                               : node_.name();
  return absl::StrCat("ONNX node \"", name, "\" (", node_.op_type(), ", opset ", opset_, ")");
}

absl::Status Importer::Invalid(const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(Label(), ": ", what));
}

absl::Status Importer::Unsupported(const std::string& what) const {
  return absl::UnimplementedError(what);
}

absl::Status Importer::Need(int i) const {
  if (has(i)) return absl::OkStatus();
  return Invalid(absl::StrCat("input ", i, " is required"));
}

const HostTensor* Importer::Const(int i) const {
  if (!has(i) || !in(i).known || !in(i).known->complete()) return nullptr;
  return in(i).known->t.get();
}

absl::StatusOr<ValueRef> Importer::Ref(int i) {
  KILN_RETURN_IF_ERROR(Need(i));
  Value& v = *inputs_[i];
  if (v.ref.node >= 0) return v.ref;
  if (!v.known || !v.known->complete()) {
    return absl::InternalError(absl::StrCat(Label(), ": input ", i, " has no value"));
  }
  auto n = std::make_unique<ir::Node>();
  n->op = v1::OP_CONSTANT;
  n->name = node_.input(i);
  n->attrs.mutable_constant();
  n->value = v.known->t;
  KILN_RETURN_IF_ERROR(ir::InferNode(graph_, *n, options_.limits)) << "while importing " << Label();
  v.ref = graph_.AddNode(std::move(n))->out();
  return v.ref;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> Importer::Ints(int i) {
  if (!has(i)) return std::optional<std::vector<int64_t>>();
  const HostTensor* t = Const(i);
  if (t == nullptr) {
    return Unsupported(
        absl::StrCat("input ", i, " (\"", node_.input(i),
                     "\") must be known at import: a constant, or computed from "
                     "constants and input shapes (pin the input shapes to fold it)"));
  }
  if (!IsInteger(t->dtype()) && t->dtype() != v1::DTYPE_BOOL) {
    return Invalid(absl::StrCat("input ", i, " must be integers, got ", DTypeName(t->dtype())));
  }
  std::vector<int64_t> out(t->num_elements());
  for (int64_t k = 0; k < t->num_elements(); ++k) out[k] = GetInt(*t, k);
  return std::optional<std::vector<int64_t>>(std::move(out));
}

absl::StatusOr<Importer::SliceArgs> Importer::SliceOperands() {
  SliceArgs s;
  if (opset() < 10) {
    s.starts = AttrInts("starts").value_or(std::vector<int64_t>{});
    s.ends = AttrInts("ends").value_or(std::vector<int64_t>{});
    s.axes = AttrInts("axes").value_or(std::vector<int64_t>{});
  } else {
    KILN_ASSIGN_OR_RETURN(s.starts, RequiredInts(1));
    KILN_ASSIGN_OR_RETURN(s.ends, RequiredInts(2));
    KILN_ASSIGN_OR_RETURN(auto a, Ints(3));
    KILN_ASSIGN_OR_RETURN(auto st, Ints(4));
    if (a) s.axes = *a;
    if (st) s.steps = *st;
  }
  if (s.axes.empty()) {
    for (size_t i = 0; i < s.starts.size(); ++i) s.axes.push_back(static_cast<int64_t>(i));
  }
  if (s.steps.empty()) s.steps.assign(s.starts.size(), 1);
  if (s.ends.size() != s.starts.size() || s.axes.size() != s.starts.size() ||
      s.steps.size() != s.starts.size()) {
    return Invalid("starts, ends, axes and steps differ in length");
  }
  return s;
}

absl::StatusOr<std::vector<int64_t>> Importer::RequiredInts(int i) {
  KILN_RETURN_IF_ERROR(Need(i));
  auto v = Ints(i);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return Invalid(absl::StrCat("input ", i, " is required"));
  return std::move(**v);
}

absl::StatusOr<double> Importer::Scalar(int i) {
  KILN_RETURN_IF_ERROR(Need(i));
  const HostTensor* t = Const(i);
  if (t == nullptr) return Unsupported(absl::StrCat("input ", i, " must be a constant"));
  if (t->num_elements() != 1) {
    return Invalid(absl::StrCat("input ", i, " must have one element, got ", t->num_elements()));
  }
  return t->GetAsDouble(0);
}

absl::Status Importer::ShapeArg(int i, std::vector<int64_t>* values, std::vector<int64_t>* sym) {
  KILN_RETURN_IF_ERROR(Need(i));
  const Value& v = in(i);
  if (!v.known) {
    return Unsupported(absl::StrCat("shape input ", i, " (\"", node_.input(i),
                                    "\") is computed at run time; Kiln needs it at import "
                                    "(pin the input shapes so it folds)"));
  }
  const HostTensor& t = *v.known->t;
  if (!IsInteger(t.dtype())) return Invalid(absl::StrCat("shape input ", i, " must be integers"));
  if (t.rank() > 1) return Invalid(absl::StrCat("shape input ", i, " must be 1-D"));
  values->assign(t.num_elements(), 0);
  sym->assign(t.num_elements(), 0);
  for (int64_t k = 0; k < t.num_elements(); ++k) {
    (*values)[k] = GetInt(t, k);
    if (!v.known->complete()) (*sym)[k] = v.known->sym[k];
  }
  return absl::OkStatus();
}

const onnx::AttributeProto* Importer::Attr(const std::string& name) const {
  for (const auto& a : node_.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

int64_t Importer::AttrInt(const std::string& name, int64_t def) const {
  const auto* a = Attr(name);
  return a ? a->i() : def;
}

float Importer::AttrFloat(const std::string& name, float def) const {
  const auto* a = Attr(name);
  return a ? a->f() : def;
}

std::string Importer::AttrString(const std::string& name, const std::string& def) const {
  const auto* a = Attr(name);
  return a ? a->s() : def;
}

std::optional<std::vector<int64_t>> Importer::AttrInts(const std::string& name) const {
  const auto* a = Attr(name);
  if (!a) return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::optional<std::vector<float>> Importer::AttrFloats(const std::string& name) const {
  const auto* a = Attr(name);
  if (!a) return std::nullopt;
  return std::vector<float>(a->floats().begin(), a->floats().end());
}

absl::StatusOr<std::optional<std::vector<int64_t>>> Importer::IntsAttrOrInput(
    const std::string& name, int moved_at, int input) {
  if (opset_ < moved_at) return AttrInts(name);
  return Ints(input);
}

absl::StatusOr<ValueRef> Importer::Emit(v1::OpKind op, std::vector<ValueRef> operands,
                                        const v1::Attrs& attrs) {
  auto n = std::make_unique<ir::Node>();
  n->op = op;
  const std::string base = node_.output_size() > 0 ? node_.output(0) : node_.name();
  // base.k; SetOutput renames the node that carries an ONNX value to its name.
  n->name = absl::StrCat(base, ".", emitted_);
  ++emitted_;
  n->operands.assign(operands.begin(), operands.end());
  n->attrs = attrs;
  if (auto s = ir::InferNode(graph_, *n, options_.limits); !s.ok()) {
    return StatusBuilder(s) << "while importing " << Label();
  }
  return graph_.AddNode(std::move(n))->out();
}

absl::StatusOr<ValueRef> Importer::Constant(HostTensor t) {
  auto n = std::make_unique<ir::Node>();
  n->op = v1::OP_CONSTANT;
  n->name =
      absl::StrCat(node_.output_size() > 0 ? node_.output(0) : node_.name(), ".c", emitted_++);
  n->attrs.mutable_constant();
  n->value = std::make_shared<const HostTensor>(std::move(t));
  KILN_RETURN_IF_ERROR(ir::InferNode(graph_, *n, options_.limits)) << "while importing " << Label();
  return graph_.AddNode(std::move(n))->out();
}

absl::StatusOr<ValueRef> Importer::ScalarConst(DType dtype, double v) {
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(dtype, {}));
  if (IsInteger(dtype) || dtype == v1::DTYPE_BOOL) {
    // A client's float attribute (Shrink's bias, ...) made an integer: a value
    // no int64 holds is refused, never cast (undefined behaviour;
    // kiln_fuzz_onnx_import: a Shrink bias of 1.9e21 on an int8 input).
    if (!(v >= -0x1p63 && v < 0x1p63)) {
      return Invalid(absl::StrCat("the constant ", v, " does not fit the integer type ",
                                  v1::DType_Name(dtype)));
    }
    SetInt(t, 0, static_cast<int64_t>(v));
  } else {
    t.SetFromDouble(0, v);
  }
  return Constant(std::move(t));
}

absl::StatusOr<ValueRef> Importer::Unary(v1::UnaryKind kind, ValueRef x) {
  v1::Attrs a;
  a.mutable_unary()->set_kind(kind);
  return Emit(v1::OP_UNARY, {x}, a);
}

absl::StatusOr<ValueRef> Importer::Binary(v1::BinaryKind kind, ValueRef x, ValueRef y) {
  v1::Attrs a;
  a.mutable_binary()->set_kind(kind);
  return Emit(v1::OP_BINARY, {x, y}, a);
}

absl::StatusOr<ValueRef> Importer::Compare(v1::CompareKind kind, ValueRef x, ValueRef y) {
  v1::Attrs a;
  a.mutable_compare()->set_kind(kind);
  return Emit(v1::OP_COMPARE, {x, y}, a);
}

absl::StatusOr<ValueRef> Importer::Where(ValueRef c, ValueRef x, ValueRef y) {
  v1::Attrs a;
  a.mutable_where();
  return Emit(v1::OP_WHERE, {c, x, y}, a);
}

absl::StatusOr<ValueRef> Importer::Cast(ValueRef x, DType to) {
  if (TypeOf(x).dtype == to) return x;
  v1::Attrs a;
  a.mutable_cast()->set_to(to);
  return Emit(v1::OP_CAST, {x}, a);
}

absl::StatusOr<ValueRef> Importer::Reshape(ValueRef x, const IrDims& dims) {
  if (TypeOf(x).dims == dims) return x;
  v1::Attrs a;
  for (int64_t d : dims) a.mutable_reshape()->add_shape(d);
  return Emit(v1::OP_RESHAPE, {x}, a);
}

absl::StatusOr<ValueRef> Importer::Clamp(ValueRef x, std::optional<double> lo,
                                         std::optional<double> hi) {
  v1::Attrs a;
  if (lo) a.mutable_clamp()->set_min(*lo);
  if (hi) a.mutable_clamp()->set_max(*hi);
  a.mutable_clamp();
  return Emit(v1::OP_CLAMP, {x}, a);
}

absl::StatusOr<ValueRef> Importer::Reduce(v1::ReduceKind kind, ValueRef x,
                                          std::vector<int64_t> axes, bool keepdims) {
  v1::Attrs a;
  a.mutable_reduce()->set_kind(kind);
  a.mutable_reduce()->set_keepdims(keepdims);
  // Kiln reads an empty list as "all axes"; pass them explicitly.
  if (axes.empty()) {
    for (int64_t k = 0; k < TypeOf(x).rank(); ++k) axes.push_back(k);
  }
  for (int64_t ax : axes) a.mutable_reduce()->add_axes(ax);
  return Emit(v1::OP_REDUCE, {x}, a);
}

void Importer::SetOutput(int i, ValueRef v) {
  if (i >= num_outputs()) return;
  Value out;
  out.ref = v;
  out.type = graph_.TypeOf(v);
  // Name the Kiln node after the ONNX value where this node made it.
  ir::Node* n = graph_.FindNode(v.node);
  if (n != nullptr && n->op != v1::OP_INPUT && n->op != v1::OP_PARAM && v.output == 0 &&
      node_.output_size() > 0 && absl::StartsWith(n->name, absl::StrCat(node_.output(0), "."))) {
    n->name = node_.output(i);
  }
  outputs_[i] = std::move(out);
}

void Importer::SetKnown(int i, std::shared_ptr<const Known> k) {
  if (i >= num_outputs()) return;
  Value out;
  // Filled in place: GCC 12 reads moving a temporary IrDims into the
  // optional-bearing Value as maybe-uninitialized (onnx_ops_control.cc).
  out.type.dtype = k->t->dtype();
  out.type.dims.assign(k->t->dims().begin(), k->t->dims().end());
  out.known = std::move(k);
  outputs_[i] = std::move(out);
}

absl::Status Importer::SetConst(int i, HostTensor t) {
  if (t.num_elements() > options_.limits.max_tensor_elements) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Label(), ": result has ", t.num_elements(), " elements, over the limit"));
  }
  auto k = std::make_shared<Known>();
  k->t = std::make_shared<const HostTensor>(std::move(t));
  SetKnown(i, std::move(k));
  return absl::OkStatus();
}

absl::Status CheckTable(const Importer& c, int64_t elements, const std::string& what) {
  if (elements >= 0 && elements <= kMaxImportTable) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(c.Label(), ": ", what, " would have ", elements,
                                                   " elements, over the importer's limit of ",
                                                   kMaxImportTable));
}

absl::StatusOr<int64_t> NormAxis(const Importer& c, int64_t axis, int64_t rank) {
  int64_t out = 0;
  if (!ir::NormalizeAxis(axis, rank, &out)) {
    return c.Invalid(absl::StrCat("axis ", axis, " is out of range for rank ", rank));
  }
  return out;
}

}  // namespace kiln::io::onnx_internal
