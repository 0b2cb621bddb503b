// ONNX softmax, reductions (Reduce*, ArgMax / ArgMin, CumSum, Hardmax), Einsum
// and the losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss).
#include <algorithm>
#include <cmath>

#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io::onnx_internal {
namespace {

using nn_util::NeedFloat;
using nn_util::Out;
using nn_util::Scalar;

absl::Status SoftmaxOp(Importer& c, v1::OpKind op) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const int64_t rank = c.rank(0);
  v1::Attrs a;
  auto* sa = op == v1::OP_SOFTMAX ? a.mutable_softmax() : a.mutable_log_softmax();
  if (c.opset() >= 13) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", -1), rank));
    sa->set_axis(axis);
    return Out(c, 0, c.Emit(op, {x}, a));
  }
  // Before opset 13: over the flattened [prod(:axis), prod(axis:)].
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", 1), rank));
  const IrDims xd = c.type(0).dims;
  if (axis == rank - 1) {
    sa->set_axis(axis);
    return Out(c, 0, c.Emit(op, {x}, a));
  }
  if (!c.type(0).is_static()) return c.Unsupported("opset < 13 softmax over several run-time dims");
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < rank; ++k) (k < axis ? outer : inner) *= xd[k];
  KILN_ASSIGN_OR_RETURN(ValueRef f, c.Reshape(x, {outer, inner}));
  sa->set_axis(1);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(op, {f}, a));
  return Out(c, 0, c.Reshape(y, xd));
}

absl::Status ReduceOp(Importer& c) {
  const std::string& op = c.node().op_type();
  const int moved = op == "ReduceSum" ? 13 : 18;
  KILN_ASSIGN_OR_RETURN(auto axes_opt, c.IntsAttrOrInput("axes", moved, 1));
  std::vector<int64_t> axes = axes_opt.value_or(std::vector<int64_t>{});
  const bool keep = c.AttrInt("keepdims", 1) != 0;
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  if (axes.empty() && c.AttrInt("noop_with_empty_axes", 0) != 0) {
    c.SetOutput(0, x);
    return absl::OkStatus();
  }
  for (int64_t& a : axes) {
    KILN_ASSIGN_OR_RETURN(a, NormAxis(c, a, c.rank(0)));
  }
  const DType dt = c.dtype(0);
  if (op == "ReduceMean" && !IsFloat(dt)) return c.Unsupported("ReduceMean of integers");
  if (op == "ReduceSum") return Out(c, 0, c.Reduce(v1::REDUCE_SUM, x, axes, keep));
  if (op == "ReduceMean") return Out(c, 0, c.Reduce(v1::REDUCE_MEAN, x, axes, keep));
  if (op == "ReduceMax") return Out(c, 0, c.Reduce(v1::REDUCE_MAX, x, axes, keep));
  if (op == "ReduceMin") return Out(c, 0, c.Reduce(v1::REDUCE_MIN, x, axes, keep));
  if (op == "ReduceProd") return Out(c, 0, c.Reduce(v1::REDUCE_PROD, x, axes, keep));
  if (op == "ReduceL1") {
    KILN_ASSIGN_OR_RETURN(ValueRef a, c.Unary(v1::UNARY_ABS, x));
    return Out(c, 0, c.Reduce(v1::REDUCE_SUM, a, axes, keep));
  }
  if (op == "ReduceSumSquare" || op == "ReduceL2") {
    KILN_ASSIGN_OR_RETURN(ValueRef sq, c.Binary(v1::BINARY_MUL, x, x));
    KILN_ASSIGN_OR_RETURN(ValueRef s, c.Reduce(v1::REDUCE_SUM, sq, axes, keep));
    if (op == "ReduceSumSquare") return Out(c, 0, s);
    if (!IsFloat(dt)) return c.Unsupported("ReduceL2 of integers");
    return Out(c, 0, c.Unary(v1::UNARY_SQRT, s));
  }
  if (!IsFloat(dt)) return c.Unsupported(absl::StrCat(op, " of integers"));
  if (op == "ReduceLogSum") {
    KILN_ASSIGN_OR_RETURN(ValueRef s, c.Reduce(v1::REDUCE_SUM, x, axes, keep));
    return Out(c, 0, c.Unary(v1::UNARY_LOG, s));
  }
  // ReduceLogSumExp, shifted by the max for range.
  KILN_ASSIGN_OR_RETURN(ValueRef m, c.Reduce(v1::REDUCE_MAX, x, axes, true));
  KILN_ASSIGN_OR_RETURN(ValueRef d, c.Binary(v1::BINARY_SUB, x, m));
  KILN_ASSIGN_OR_RETURN(ValueRef e, c.Unary(v1::UNARY_EXP, d));
  KILN_ASSIGN_OR_RETURN(ValueRef s, c.Reduce(v1::REDUCE_SUM, e, axes, true));
  KILN_ASSIGN_OR_RETURN(ValueRef l, c.Unary(v1::UNARY_LOG, s));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Binary(v1::BINARY_ADD, l, m));
  if (!keep) {
    KILN_ASSIGN_OR_RETURN(ValueRef shape_ref, c.Reduce(v1::REDUCE_MAX, x, axes, false));
    KILN_ASSIGN_OR_RETURN(y, c.Reshape(y, c.TypeOf(shape_ref).dims));
  }
  return Out(c, 0, y);
}

absl::Status ArgOp(Importer& c, bool min) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", 0), c.rank(0)));
  const bool keep = c.AttrInt("keepdims", 1) != 0;
  const bool last = c.AttrInt("select_last_index", 0) != 0;
  if (min) {
    if (!IsFloat(c.dtype(0)) && !IsSignedInteger(c.dtype(0))) {
      return c.Unsupported("ArgMin of unsigned integers");
    }
    KILN_ASSIGN_OR_RETURN(x, c.Unary(v1::UNARY_NEG, x));
  }
  const int64_t n = c.type(0).dims[axis];
  if (last) {
    // The last maximum = n - 1 - the first maximum of the reversed axis.
    if (n < 0) return c.Unsupported("select_last_index over a run-time dim");
    KILN_RETURN_IF_ERROR(CheckTable(c, n, "the reversed index"));
    KILN_ASSIGN_OR_RETURN(HostTensor idx, HostTensor::Create(v1::DTYPE_I64, {n}));
    for (int64_t i = 0; i < n; ++i) idx.data_as<int64_t>()[i] = n - 1 - i;
    KILN_ASSIGN_OR_RETURN(ValueRef ir, c.Constant(std::move(idx)));
    v1::Attrs g;
    g.mutable_gather()->set_axis(axis);
    KILN_ASSIGN_OR_RETURN(x, c.Emit(v1::OP_GATHER, {x, ir}, g));
  }
  v1::Attrs a;
  a.mutable_argmax()->set_axis(axis);
  a.mutable_argmax()->set_keepdims(keep);
  a.mutable_argmax()->set_index_dtype(v1::DTYPE_I64);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_ARGMAX, {x}, a));
  if (last) {
    KILN_ASSIGN_OR_RETURN(ValueRef top, c.ScalarConst(v1::DTYPE_I64, n - 1));
    KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_SUB, top, y));
  }
  return Out(c, 0, y);
}

// Hardmax: 1 where the first maximum along the axis is, else 0 (before
// opset 13, over the flattened [prod(:axis), prod(axis:)]).
absl::Status HardmaxOp(Importer& c) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const int64_t rank = c.rank(0);
  const IrDims xd = c.type(0).dims;
  if (!c.type(0).is_static()) return c.Unsupported("Hardmax over run-time dims");
  int64_t axis;
  ValueRef v = x;
  if (c.opset() >= 13) {
    KILN_ASSIGN_OR_RETURN(axis, NormAxis(c, c.AttrInt("axis", -1), rank));
  } else {
    KILN_ASSIGN_OR_RETURN(int64_t a, NormAxis(c, c.AttrInt("axis", 1), rank));
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < rank; ++k) (k < a ? outer : inner) *= xd[k];
    KILN_ASSIGN_OR_RETURN(v, c.Reshape(x, {outer, inner}));
    axis = 1;
  }
  const IrDims vd = c.TypeOf(v).dims;
  v1::Attrs am;
  am.mutable_argmax()->set_axis(axis);
  am.mutable_argmax()->set_keepdims(true);
  am.mutable_argmax()->set_index_dtype(v1::DTYPE_I64);
  KILN_ASSIGN_OR_RETURN(ValueRef idx, c.Emit(v1::OP_ARGMAX, {v}, am));
  Dims id(vd.size(), 1);
  id[axis] = vd[axis];
  KILN_RETURN_IF_ERROR(CheckTable(c, vd[axis], "the class iota"));
  KILN_ASSIGN_OR_RETURN(HostTensor iota, HostTensor::Create(v1::DTYPE_I64, id));
  for (int64_t i = 0; i < vd[axis]; ++i) iota.data_as<int64_t>()[i] = i;
  KILN_ASSIGN_OR_RETURN(ValueRef io, c.Constant(std::move(iota)));
  KILN_ASSIGN_OR_RETURN(ValueRef eq, c.Compare(v1::COMPARE_EQ, idx, io));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Cast(eq, c.dtype(0)));
  return Out(c, 0, c.Reshape(y, xd));
}

absl::Status CumSumOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(double axis_d, c.Scalar(1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, static_cast<int64_t>(axis_d), c.rank(0)));
  v1::Attrs a;
  a.mutable_cumsum()->set_axis(axis);
  a.mutable_cumsum()->set_exclusive(c.AttrInt("exclusive", 0) != 0);
  a.mutable_cumsum()->set_reverse(c.AttrInt("reverse", 0) != 0);
  return Out(c, 0, c.Emit(v1::OP_CUMSUM, {x}, a));
}

// Einsum of one or two operands without repeated letters in an operand and
// without an ellipsis: letters only one operand has and the output lacks are
// summed first; two operands contract through dot_general; a transpose puts
// the result in the output's order.
absl::Status EinsumOp(Importer& c) {
  std::string eq = c.AttrString("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  if (eq.find("...") != std::string::npos) return c.Unsupported("Einsum with an ellipsis");
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> ins;
  for (size_t b = 0;;) {
    const size_t e = lhs.find(',', b);
    ins.push_back(lhs.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (static_cast<int>(ins.size()) != c.num_inputs() || ins.size() > 2) {
    return c.Unsupported("Einsum of more than two operands");
  }
  std::string out;
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
  } else {
    // Implicit output: the letters that appear once, in alphabetical order.
    for (char ch = 'A'; ch <= 'z'; ++ch) {
      if (std::count(lhs.begin(), lhs.end(), ch) == 1) out.push_back(ch);
    }
  }
  std::vector<ValueRef> vals;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (static_cast<int64_t>(ins[i].size()) != c.rank(static_cast<int>(i))) {
      return c.Invalid(
          absl::StrCat("Einsum operand ", i, " \"", ins[i], "\" does not match its rank"));
    }
    for (char ch : ins[i]) {
      if (std::count(ins[i].begin(), ins[i].end(), ch) > 1) {
        return c.Unsupported("Einsum with a repeated letter in one operand (diagonals)");
      }
    }
    KILN_ASSIGN_OR_RETURN(ValueRef v, c.Ref(static_cast<int>(i)));
    // Sum the letters no one else needs.
    std::vector<int64_t> axes;
    std::string kept;
    for (size_t k = 0; k < ins[i].size(); ++k) {
      const char ch = ins[i][k];
      const bool other = ins.size() == 2 && ins[1 - i].find(ch) != std::string::npos;
      if (out.find(ch) == std::string::npos && !other) {
        axes.push_back(static_cast<int64_t>(k));
      } else {
        kept.push_back(ch);
      }
    }
    if (!axes.empty()) {
      KILN_ASSIGN_OR_RETURN(v, c.Reduce(v1::REDUCE_SUM, v, axes, false));
    }
    ins[i] = kept;
    vals.push_back(v);
  }
  std::string have = ins[0];
  ValueRef y = vals[0];
  if (ins.size() == 2) {
    KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
    const std::string& a = ins[0];
    const std::string& b = ins[1];
    v1::Attrs d;
    auto* dg = d.mutable_dot_general();
    std::string batch, afree, bfree;
    for (size_t k = 0; k < a.size(); ++k) {
      const size_t j = b.find(a[k]);
      if (j == std::string::npos) {
        afree.push_back(a[k]);
      } else if (out.find(a[k]) != std::string::npos) {
        batch.push_back(a[k]);
        dg->add_lhs_batch(static_cast<int64_t>(k));
        dg->add_rhs_batch(static_cast<int64_t>(j));
      } else {
        dg->add_lhs_contracting(static_cast<int64_t>(k));
        dg->add_rhs_contracting(static_cast<int64_t>(j));
      }
    }
    for (char ch : b) {
      if (a.find(ch) == std::string::npos) bfree.push_back(ch);
    }
    KILN_ASSIGN_OR_RETURN(y, c.Emit(v1::OP_DOT_GENERAL, {vals[0], vals[1]}, d));
    have = batch + afree + bfree;
  }
  if (have.size() != out.size())
    return c.Invalid("Einsum output letters do not match its operands");
  std::vector<int64_t> perm;
  for (char ch : out) {
    const size_t k = have.find(ch);
    if (k == std::string::npos)
      return c.Invalid(
          absl::StrCat("Einsum output letter '", std::string(1, ch), "' is in no operand"));
    perm.push_back(static_cast<int64_t>(k));
  }
  bool identity = true;
  for (size_t k = 0; k < perm.size(); ++k) identity &= perm[k] == static_cast<int64_t>(k);
  if (!identity) {
    v1::Attrs t;
    for (int64_t p : perm) t.mutable_transpose()->add_perm(p);
    KILN_ASSIGN_OR_RETURN(y, c.Emit(v1::OP_TRANSPOSE, {y}, t));
  }
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// NegativeLogLikelihoodLoss over log-probabilities x [N, C, d...] and class ids
// t [N, d...]: loss = -x[n, t, d] * weight[t] (0 where t == ignore_index), then
// the reduction (mean divides by the summed weights). The class is picked with
// a one-hot mask (t == iota along C), so no gather-by-element op is needed.
absl::StatusOr<ValueRef> NllLoss(Importer& c, ValueRef x, int target_in, int weight_in) {
  KILN_ASSIGN_OR_RETURN(ValueRef t, c.Ref(target_in));
  const TensorType xt = c.TypeOf(x);
  if (xt.rank() < 2 || !IsFloat(xt.dtype)) return c.Invalid("input must be float [N, C, ...]");
  const int64_t classes = xt.dims[1];
  if (classes < 0) return c.Unsupported("a run-time class count");
  if (!IsInteger(c.TypeOf(t).dtype)) return c.Invalid("target must be integers");
  KILN_ASSIGN_OR_RETURN(t, c.Cast(t, v1::DTYPE_I64));
  const TensorType tt = c.TypeOf(t);
  const std::string reduction = c.AttrString("reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none") {
    return c.Invalid(absl::StrCat("unknown reduction \"", reduction, "\""));
  }
  std::optional<ValueRef> valid;
  if (c.Attr("ignore_index") != nullptr) {
    KILN_ASSIGN_OR_RETURN(ValueRef ig, c.ScalarConst(v1::DTYPE_I64, c.AttrInt("ignore_index", 0)));
    KILN_ASSIGN_OR_RETURN(valid, c.Compare(v1::COMPARE_NE, t, ig));
    KILN_ASSIGN_OR_RETURN(ValueRef zero, c.ScalarConst(v1::DTYPE_I64, 0));
    KILN_ASSIGN_OR_RETURN(t, c.Where(*valid, t, zero));
  }
  IrDims t1 = tt.dims;
  t1.insert(t1.begin() + 1, 1);
  KILN_ASSIGN_OR_RETURN(ValueRef te, c.Reshape(t, t1));
  Dims iota_dims(xt.rank(), 1);
  iota_dims[1] = classes;
  KILN_RETURN_IF_ERROR(CheckTable(c, classes, "the class iota"));
  KILN_ASSIGN_OR_RETURN(HostTensor iota, HostTensor::Create(v1::DTYPE_I64, iota_dims));
  for (int64_t i = 0; i < classes; ++i) iota.data_as<int64_t>()[i] = i;
  KILN_ASSIGN_OR_RETURN(ValueRef io, c.Constant(std::move(iota)));
  KILN_ASSIGN_OR_RETURN(ValueRef mask, c.Compare(v1::COMPARE_EQ, te, io));
  KILN_ASSIGN_OR_RETURN(ValueRef zf, c.ScalarConst(xt.dtype, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef sel, c.Where(mask, x, zf));
  KILN_ASSIGN_OR_RETURN(ValueRef picked, c.Reduce(v1::REDUCE_SUM, sel, {1}, false));
  KILN_ASSIGN_OR_RETURN(ValueRef loss, c.Unary(v1::UNARY_NEG, picked));
  std::optional<ValueRef> w;
  if (c.has(weight_in)) {
    KILN_ASSIGN_OR_RETURN(ValueRef weight, c.Ref(weight_in));
    KILN_ASSIGN_OR_RETURN(weight, c.Cast(weight, xt.dtype));
    v1::Attrs g;
    g.mutable_gather()->set_axis(0);
    KILN_ASSIGN_OR_RETURN(w, c.Emit(v1::OP_GATHER, {weight, t}, g));
  }
  if (valid) {
    KILN_ASSIGN_OR_RETURN(ValueRef vf, c.Cast(*valid, xt.dtype));
    if (w) {
      KILN_ASSIGN_OR_RETURN(w, c.Binary(v1::BINARY_MUL, *w, vf));
    } else {
      w = vf;
    }
  }
  if (w) {
    KILN_ASSIGN_OR_RETURN(loss, c.Binary(v1::BINARY_MUL, loss, *w));
  }
  if (reduction == "none") return loss;
  KILN_ASSIGN_OR_RETURN(ValueRef total, c.Reduce(v1::REDUCE_SUM, loss, {}, false));
  if (reduction == "sum") return total;
  if (!w) {
    int64_t count = 1;
    for (int64_t d : tt.dims) {
      if (d < 0) return c.Unsupported("mean loss over run-time dims");
      count *= d;
    }
    KILN_ASSIGN_OR_RETURN(ValueRef n, c.ScalarConst(xt.dtype, static_cast<double>(count)));
    return c.Binary(v1::BINARY_DIV, total, n);
  }
  KILN_ASSIGN_OR_RETURN(ValueRef wsum, c.Reduce(v1::REDUCE_SUM, *w, {}, false));
  return c.Binary(v1::BINARY_DIV, total, wsum);
}

absl::Status NllLossOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  return Out(c, 0, NllLoss(c, x, 1, 2));
}

absl::Status SoftmaxCrossEntropyOp(Importer& c) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  if (c.rank(0) < 2) return c.Invalid("scores must be [N, C, ...]");
  v1::Attrs a;
  a.mutable_log_softmax()->set_axis(1);
  KILN_ASSIGN_OR_RETURN(ValueRef lp, c.Emit(v1::OP_LOG_SOFTMAX, {x}, a));
  KILN_ASSIGN_OR_RETURN(ValueRef loss, NllLoss(c, lp, 1, 2));
  c.SetOutput(0, loss);
  c.SetOutput(1, lp);
  return absl::OkStatus();
}

}  // namespace

void RegisterReduceOps(ConverterTable& t) {
  t["Softmax"] = [](Importer& c) { return SoftmaxOp(c, v1::OP_SOFTMAX); };
  t["LogSoftmax"] = [](Importer& c) { return SoftmaxOp(c, v1::OP_LOG_SOFTMAX); };
  for (const char* r :
       {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}) {
    t[r] = ReduceOp;
  }
  t["ArgMax"] = [](Importer& c) { return ArgOp(c, false); };
  t["ArgMin"] = [](Importer& c) { return ArgOp(c, true); };
  t["CumSum"] = CumSumOp;
  t["Hardmax"] = HardmaxOp;
  t["Einsum"] = EinsumOp;
  t["NegativeLogLikelihoodLoss"] = NllLossOp;
  t["SoftmaxCrossEntropyLoss"] = SoftmaxCrossEntropyOp;
}

}  // namespace kiln::io::onnx_internal
