// Patterns of ONNX nodes that one Kiln op computes. torch.onnx.export below
// opset 17 writes nn.LayerNorm as seven nodes and the exact GELU as five; left
// as they are they cost a reduction pass and an elementwise kernel each, and
// hide the GELU from the matmul-epilogue fusion and the norm from the
// residual-norm fusion (engine/passes/fuse.cc). Each pattern is recognised at
// its last node, walking back through the producers; the earlier nodes are
// converted as usual and become dead code (canonicalize removes them) unless
// something else reads them. A pattern computes the same function of the
// same inputs, so a match never changes results beyond rounding.
//
//   LayerNorm: d = x - ReduceMean(x, [-1]); v = ReduceMean(Pow(d, 2), [-1]);
//              y = d / Sqrt(v + eps) * gamma + beta      -> LayerNorm(x, gamma, beta)
//   GELU:      y = x * (Erf(x / sqrt(2)) + 1) * 0.5      -> Unary GELU(x)
//   Pow:       Pow(x, 2) -> x * x (a multiply, not a general pow per element).
#include <cmath>

#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io::onnx_internal {

const onnx::NodeProto* Importer::Producer(const std::string& name, const char* op) const {
  if (onnx_graph_ == nullptr || producer_ == nullptr) return nullptr;
  auto it = producer_->find(name);
  if (it == producer_->end()) return nullptr;
  const onnx::NodeProto& n = onnx_graph_->node(it->second);
  if (n.op_type() != op || !(n.domain().empty() || n.domain() == "ai.onnx") || n.input_size() < 1 ||
      n.output_size() != 1) {
    return nullptr;  // (every pattern reads input 0 of the nodes it walks through)
  }
  return &n;
}

namespace {

const Value* Find(const Importer& c, const std::string& name) {
  if (c.scope() == nullptr) return nullptr;
  auto it = c.scope()->find(name);
  return it == c.scope()->end() ? nullptr : it->second.get();
}

// A known float value whose every element is one number.
std::optional<double> Splat(const Importer& c, const std::string& name) {
  const Value* v = Find(c, name);
  if (v == nullptr || v->known == nullptr || !v->known->complete() ||
      !IsFloat(v->known->t->dtype())) {
    return std::nullopt;
  }
  const HostTensor& t = *v->known->t;
  if (t.num_elements() < 1) return std::nullopt;
  const double first = t.GetAsDouble(0);
  for (int64_t i = 1; i < t.num_elements(); ++i) {
    if (t.GetAsDouble(i) != first) return std::nullopt;
  }
  return first;
}

bool Near(std::optional<double> v, double want) {
  return v && std::fabs(*v - want) <= 1e-6 * std::fabs(want);
}

// The node's input that is not `other` when exactly one is (a commutative
// op's operands in either order).
const std::string* OtherInput(const onnx::NodeProto& n, const std::string& other) {
  if (n.input_size() != 2) return nullptr;
  if (n.input(0) == other && n.input(1) != other) return &n.input(1);
  if (n.input(1) == other && n.input(0) != other) return &n.input(0);
  return nullptr;
}

// ReduceMean over the last axis alone, keepdims on.
bool MeanOverLastAxis(const Importer& c, const onnx::NodeProto& n, int64_t rank) {
  std::vector<int64_t> axes;
  for (const auto& a : n.attribute()) {
    if (a.name() == "keepdims" && a.i() != 1) return false;
    if (a.name() == "axes") axes.assign(a.ints().begin(), a.ints().end());
  }
  if (n.input_size() > 1 && !n.input(1).empty()) {  // opset 18: axes as an input
    const Value* v = Find(c, n.input(1));
    if (v == nullptr || v->known == nullptr || !v->known->complete()) return false;
    for (int64_t i = 0; i < v->known->t->num_elements(); ++i)
      axes.push_back(GetInt(*v->known->t, i));
  }
  return axes.size() == 1 && (axes[0] == -1 || axes[0] == rank - 1);
}

// At Add(Mul(Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))), gamma), beta).
absl::StatusOr<bool> LayerNorm(Importer& c) {
  const onnx::NodeProto& add = c.node();
  if (add.input_size() != 2) return false;
  for (int order = 0; order < 2; ++order) {
    const std::string& m_name = add.input(order);
    const std::string& beta = add.input(1 - order);
    const onnx::NodeProto* mul = c.Producer(m_name, "Mul");
    if (mul == nullptr || mul->input_size() != 2) continue;
    for (int morder = 0; morder < 2; ++morder) {
      const std::string& gamma = mul->input(1 - morder);
      const onnx::NodeProto* div = c.Producer(mul->input(morder), "Div");
      if (div == nullptr || div->input_size() != 2) continue;
      const std::string& d = div->input(0);
      const onnx::NodeProto* sqrt = c.Producer(div->input(1), "Sqrt");
      const onnx::NodeProto* sub = c.Producer(d, "Sub");
      if (sqrt == nullptr || sub == nullptr || sub->input_size() != 2) continue;
      const onnx::NodeProto* veps = c.Producer(sqrt->input(0), "Add");
      if (veps == nullptr || veps->input_size() != 2) continue;
      const onnx::NodeProto* var = nullptr;
      std::optional<double> eps;
      for (int k = 0; k < 2 && var == nullptr; ++k) {
        var = c.Producer(veps->input(k), "ReduceMean");
        eps = Splat(c, veps->input(1 - k));
        if (!eps) var = nullptr;
      }
      if (var == nullptr || !eps || *eps < 0) continue;
      const onnx::NodeProto* pow = c.Producer(var->input(0), "Pow");
      if (pow == nullptr || pow->input_size() != 2 || pow->input(0) != d ||
          !Near(Splat(c, pow->input(1)), 2)) {
        continue;
      }
      const std::string& x = sub->input(0);
      const onnx::NodeProto* mean = c.Producer(sub->input(1), "ReduceMean");
      if (mean == nullptr || mean->input(0) != x) continue;
      const Value* xv = Find(c, x);
      const Value* gv = Find(c, gamma);
      const Value* bv = Find(c, beta);
      if (xv == nullptr || gv == nullptr || bv == nullptr || !IsFloat(xv->type.dtype) ||
          xv->type.rank() < 1) {
        continue;
      }
      const int64_t rank = xv->type.rank();
      const int64_t dim = xv->type.dims.back();
      if (!MeanOverLastAxis(c, *mean, rank) || !MeanOverLastAxis(c, *var, rank) || dim < 0)
        continue;
      const IrDims normalized = {dim};
      if (gv->type.dims != normalized || bv->type.dims != normalized ||
          gv->type.dtype != xv->type.dtype || bv->type.dtype != xv->type.dtype) {
        continue;
      }
      // The result's type is x's: the pattern's own broadcasting adds nothing.
      const Value& out_in = c.in(order);
      if (!(out_in.type == xv->type)) continue;
      KILN_ASSIGN_OR_RETURN(ValueRef xr, c.RefOf(x));
      KILN_ASSIGN_OR_RETURN(ValueRef gr, c.RefOf(gamma));
      KILN_ASSIGN_OR_RETURN(ValueRef br, c.RefOf(beta));
      v1::Attrs a;
      a.mutable_layer_norm()->set_axis(rank - 1);
      a.mutable_layer_norm()->set_epsilon(*eps);
      KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_LAYER_NORM, {xr, gr, br}, a));
      c.SetOutput(0, y);
      return true;
    }
  }
  return false;
}

// At Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5) (the operands of each Mul
// and Add in either order; x * (1/sqrt2) for the Div).
absl::StatusOr<bool> Gelu(Importer& c) {
  const onnx::NodeProto& outer = c.node();
  if (outer.input_size() != 2) return false;
  for (int order = 0; order < 2; ++order) {
    if (!Near(Splat(c, outer.input(1 - order)), 0.5)) continue;
    const onnx::NodeProto* inner = c.Producer(outer.input(order), "Mul");
    if (inner == nullptr || inner->input_size() != 2) continue;
    for (int k = 0; k < 2; ++k) {
      const std::string& x = inner->input(k);
      const onnx::NodeProto* plus = c.Producer(inner->input(1 - k), "Add");
      if (plus == nullptr || plus->input_size() != 2) continue;
      const onnx::NodeProto* erf = nullptr;
      for (int j = 0; j < 2 && erf == nullptr; ++j) {
        if (Near(Splat(c, plus->input(1 - j)), 1)) erf = c.Producer(plus->input(j), "Erf");
      }
      if (erf == nullptr) continue;
      const onnx::NodeProto* scaled = c.Producer(erf->input(0), "Div");
      bool ok = scaled != nullptr && scaled->input_size() == 2 && scaled->input(0) == x &&
                Near(Splat(c, scaled->input(1)), std::sqrt(2.0));
      if (!ok) {
        scaled = c.Producer(erf->input(0), "Mul");
        const std::string* other = scaled == nullptr ? nullptr : OtherInput(*scaled, x);
        ok = other != nullptr && Near(Splat(c, *other), 1 / std::sqrt(2.0));
      }
      const Value* xv = Find(c, x);
      if (!ok || xv == nullptr || !IsFloat(xv->type.dtype) || !(c.in(order).type == xv->type))
        continue;
      KILN_ASSIGN_OR_RETURN(ValueRef xr, c.RefOf(x));
      KILN_ASSIGN_OR_RETURN(ValueRef y, c.Unary(v1::UNARY_GELU, xr));
      c.SetOutput(0, y);
      return true;
    }
  }
  return false;
}

absl::StatusOr<bool> Square(Importer& c) {
  if (c.num_inputs() != 2 || !c.has(0) || !c.has(1) || !IsFloat(c.dtype(0)) ||
      !Near(Splat(c, c.node().input(1)), 2) || c.type(1).rank() > c.type(0).rank()) {
    return false;
  }
  for (int64_t d : c.type(1).dims) {
    if (d != 1) return false;
  }
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Binary(v1::BINARY_MUL, x, x));
  c.SetOutput(0, y);
  return true;
}

}  // namespace

absl::StatusOr<bool> TryPattern(Importer& c) {
  const std::string& op = c.node().op_type();
  if (!c.options().patterns || c.num_outputs() != 1) return false;
  if (op == "Add") return LayerNorm(c);
  if (op == "Mul") return Gelu(c);
  if (op == "Pow") return Square(c);
  return false;
}

}  // namespace kiln::io::onnx_internal
