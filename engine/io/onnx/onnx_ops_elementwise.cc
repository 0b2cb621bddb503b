// ONNX elementwise ops: activations, arithmetic, comparisons, logic, Clip,
// Cast, Where, and the (de)quantization ops written as elementwise Kiln ops.
#include <cmath>
#include <limits>

#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io::onnx_internal {
namespace {

absl::StatusOr<ValueRef> In(Importer& c, int i) { return c.Ref(i); }

absl::Status Out(Importer& c, absl::StatusOr<ValueRef> v) {
  if (!v.ok()) return v.status();
  c.SetOutput(0, *v);
  return absl::OkStatus();
}

absl::StatusOr<ValueRef> Scalar(Importer& c, ValueRef like, double v) {
  return c.ScalarConst(c.TypeOf(like).dtype, v);
}

template <v1::UnaryKind K>
absl::Status UnaryOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  return Out(c, c.Unary(K, x));
}

absl::Status IdentityOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(0));
  // Keeps a folded value folded; a graph value passes through.
  if (c.in(0).known) {
    c.SetKnown(0, c.in(0).known);
    if (c.in(0).ref.node >= 0) c.outputs()[0]->ref = c.in(0).ref;
  } else {
    KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
    c.SetOutput(0, x);
  }
  return absl::OkStatus();
}

absl::Status DropoutOp(Importer& c) {
  if (c.opset() >= 12 && c.has(2)) {
    const HostTensor* t = c.Const(2);
    if (t == nullptr || GetInt(*t, 0) != 0) {
      return c.Unsupported("Dropout in training mode (Kiln imports inference graphs)");
    }
  }
  KILN_RETURN_IF_ERROR(IdentityOp(c));
  if (c.wants(1)) {
    // An all-true mask: a scalar broadcast to the input's shape.
    if (!c.type(0).is_static()) return c.Unsupported("Dropout's mask of a run-time shape");
    KILN_ASSIGN_OR_RETURN(ValueRef t, c.ScalarConst(v1::DTYPE_BOOL, 1));
    v1::Attrs a;
    for (int64_t d : c.type(0).dims) a.mutable_expand()->add_shape(d);
    KILN_ASSIGN_OR_RETURN(ValueRef mask, c.Emit(v1::OP_EXPAND, {t}, a));
    c.SetOutput(1, mask);
  }
  return absl::OkStatus();
}

// Binary arithmetic; ONNX's Pow may take an exponent of another type.
template <v1::BinaryKind K>
absl::Status BinaryOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 1));
  if (K == v1::BINARY_POW && !IsFloat(c.TypeOf(a).dtype)) {
    // Integer powers in f64 (exact below 2^53), truncated back as ONNX does.
    const DType dt = c.TypeOf(a).dtype;
    KILN_ASSIGN_OR_RETURN(ValueRef af, c.Cast(a, v1::DTYPE_F64));
    KILN_ASSIGN_OR_RETURN(ValueRef bf, c.Cast(b, v1::DTYPE_F64));
    KILN_ASSIGN_OR_RETURN(ValueRef p, c.Binary(v1::BINARY_POW, af, bf));
    return Out(c, c.Cast(p, dt));
  }
  if (K == v1::BINARY_POW) {
    KILN_ASSIGN_OR_RETURN(b, c.Cast(b, c.TypeOf(a).dtype));
  }
  if (K == v1::BINARY_DIV && IsInteger(c.TypeOf(a).dtype)) {
    return c.Unsupported("integer Div (Kiln divides floats)");
  }
  return Out(c, c.Binary(K, a, b));
}

// Max, Min, Sum, Mean: variadic with broadcasting.
template <v1::BinaryKind K, bool kMean>
absl::Status VariadicOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef acc, In(c, 0));
  for (int i = 1; i < c.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(ValueRef v, In(c, i));
    KILN_ASSIGN_OR_RETURN(acc, c.Binary(K, acc, v));
  }
  if (kMean && c.num_inputs() > 1) {
    KILN_ASSIGN_OR_RETURN(ValueRef n, Scalar(c, acc, c.num_inputs()));
    KILN_ASSIGN_OR_RETURN(acc, c.Binary(v1::BINARY_DIV, acc, n));
  }
  if (c.num_inputs() == 1) {
    // One operand: the result is that operand (as a node of its own).
    v1::Attrs a;
    a.mutable_unary()->set_kind(v1::UNARY_IDENTITY);
    if (IsFloat(c.TypeOf(acc).dtype)) {
      KILN_ASSIGN_OR_RETURN(acc, c.Emit(v1::OP_UNARY, {acc}, a));
    }
  }
  c.SetOutput(0, acc);
  return absl::OkStatus();
}

template <v1::CompareKind K>
absl::Status CompareOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 1));
  return Out(c, c.Compare(K, a, b));
}

absl::StatusOr<ValueRef> BoolConst(Importer& c, bool v) { return c.ScalarConst(v1::DTYPE_BOOL, v); }

absl::Status NotOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef f, BoolConst(c, false));
  return Out(c, c.Compare(v1::COMPARE_EQ, x, f));
}

absl::Status AndOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef f, BoolConst(c, false));
  return Out(c, c.Where(a, b, f));
}

absl::Status OrOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef t, BoolConst(c, true));
  return Out(c, c.Where(a, t, b));
}

absl::Status XorOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 1));
  return Out(c, c.Compare(v1::COMPARE_NE, a, b));
}

absl::Status WhereOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef cond, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 2));
  return Out(c, c.Where(cond, a, b));
}

absl::Status CastOp(Importer& c) {
  const auto to = DTypeFromOnnx(static_cast<int32_t>(c.AttrInt("to", 0)));
  if (!to) return c.Unsupported(absl::StrCat("Cast to ONNX type ", c.AttrInt("to", 0), " (no Kiln dtype)"));
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  v1::Attrs a;
  a.mutable_cast()->set_to(*to);
  return Out(c, c.Emit(v1::OP_CAST, {x}, a));
}

absl::Status CastLikeOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(1));
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  v1::Attrs a;
  a.mutable_cast()->set_to(c.dtype(1));
  return Out(c, c.Emit(v1::OP_CAST, {x}, a));
}

// Clip: min/max attributes before opset 11, optional inputs after.
absl::Status ClipOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  if (c.opset() < 11) {
    const float lo = c.AttrFloat("min", -std::numeric_limits<float>::infinity());
    const float hi = c.AttrFloat("max", std::numeric_limits<float>::infinity());
    return Out(c, c.Clamp(x, std::isinf(lo) ? std::nullopt : std::optional<double>(lo),
                          std::isinf(hi) ? std::nullopt : std::optional<double>(hi)));
  }
  std::optional<double> lo, hi;
  for (int i : {1, 2}) {
    if (!c.has(i)) continue;
    if (c.Const(i) != nullptr && c.Const(i)->num_elements() == 1) {
      (i == 1 ? lo : hi) = c.Const(i)->GetAsDouble(0);
      continue;
    }
    // A run-time bound: max/min with it.
    KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, i));
    KILN_ASSIGN_OR_RETURN(x, c.Binary(i == 1 ? v1::BINARY_MAX : v1::BINARY_MIN, x, b));
  }
  if (lo && hi && *lo > *hi) {
    // ONNX: min > max gives max everywhere.
    KILN_ASSIGN_OR_RETURN(ValueRef m, Scalar(c, x, *hi));
    KILN_ASSIGN_OR_RETURN(ValueRef z, Scalar(c, x, 0));
    KILN_ASSIGN_OR_RETURN(ValueRef zx, c.Binary(v1::BINARY_MUL, x, z));
    return Out(c, c.Binary(v1::BINARY_ADD, zx, m));
  }
  if (!lo && !hi) {
    c.SetOutput(0, x);
    return absl::OkStatus();
  }
  return Out(c, c.Clamp(x, lo, hi));
}

// where(x < 0, f(x), x) and friends.
absl::StatusOr<ValueRef> NegativePart(Importer& c, ValueRef x, ValueRef neg, bool or_equal) {
  KILN_ASSIGN_OR_RETURN(ValueRef z, Scalar(c, x, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef m, c.Compare(or_equal ? v1::COMPARE_LE : v1::COMPARE_LT, x, z));
  return c.Where(m, neg, x);
}

absl::Status LeakyReluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef a, Scalar(c, x, c.AttrFloat("alpha", 0.01f)));
  KILN_ASSIGN_OR_RETURN(ValueRef ax, c.Binary(v1::BINARY_MUL, x, a));
  return Out(c, NegativePart(c, x, ax, false));
}

absl::Status PReluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef s, In(c, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef sx, c.Binary(v1::BINARY_MUL, x, s));
  return Out(c, NegativePart(c, x, sx, false));
}

// alpha * (exp(x) - 1)
absl::StatusOr<ValueRef> Expm1Scaled(Importer& c, ValueRef x, double alpha) {
  KILN_ASSIGN_OR_RETURN(ValueRef e, c.Unary(v1::UNARY_EXP, x));
  KILN_ASSIGN_OR_RETURN(ValueRef one, Scalar(c, x, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef em1, c.Binary(v1::BINARY_SUB, e, one));
  KILN_ASSIGN_OR_RETURN(ValueRef a, Scalar(c, x, alpha));
  return c.Binary(v1::BINARY_MUL, em1, a);
}

absl::Status EluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef neg, Expm1Scaled(c, x, c.AttrFloat("alpha", 1.f)));
  return Out(c, NegativePart(c, x, neg, false));
}

absl::Status SeluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef neg, Expm1Scaled(c, x, c.AttrFloat("alpha", 1.67326319217681884765625f)));
  KILN_ASSIGN_OR_RETURN(ValueRef y, NegativePart(c, x, neg, true));
  KILN_ASSIGN_OR_RETURN(ValueRef g, Scalar(c, x, c.AttrFloat("gamma", 1.05070102214813232421875f)));
  return Out(c, c.Binary(v1::BINARY_MUL, y, g));
}

absl::Status CeluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  const double alpha = c.AttrFloat("alpha", 1.f);
  KILN_ASSIGN_OR_RETURN(ValueRef a, Scalar(c, x, alpha));
  KILN_ASSIGN_OR_RETURN(ValueRef xa, c.Binary(v1::BINARY_DIV, x, a));
  KILN_ASSIGN_OR_RETURN(ValueRef neg, Expm1Scaled(c, xa, alpha));
  return Out(c, NegativePart(c, x, neg, false));
}

absl::Status ThresholdedReluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef a, Scalar(c, x, c.AttrFloat("alpha", 1.f)));
  KILN_ASSIGN_OR_RETURN(ValueRef z, Scalar(c, x, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef m, c.Compare(v1::COMPARE_GT, x, a));
  return Out(c, c.Where(m, x, z));
}

// clamp(alpha * x + beta, 0, 1)
absl::StatusOr<ValueRef> HardSigmoid(Importer& c, ValueRef x, double alpha, double beta) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, Scalar(c, x, alpha));
  KILN_ASSIGN_OR_RETURN(ValueRef b, Scalar(c, x, beta));
  KILN_ASSIGN_OR_RETURN(ValueRef ax, c.Binary(v1::BINARY_MUL, x, a));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Binary(v1::BINARY_ADD, ax, b));
  return c.Clamp(y, 0.0, 1.0);
}

absl::Status HardSigmoidOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  return Out(c, HardSigmoid(c, x, c.AttrFloat("alpha", 0.2f), c.AttrFloat("beta", 0.5f)));
}

absl::Status HardSwishOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef h, HardSigmoid(c, x, 1.0 / 6, 0.5));
  return Out(c, c.Binary(v1::BINARY_MUL, x, h));
}

absl::Status SoftsignOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef a, c.Unary(v1::UNARY_ABS, x));
  KILN_ASSIGN_OR_RETURN(ValueRef one, Scalar(c, x, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef d, c.Binary(v1::BINARY_ADD, a, one));
  return Out(c, c.Binary(v1::BINARY_DIV, x, d));
}

absl::Status GeluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  const std::string approx = c.AttrString("approximate", "none");
  if (approx != "none" && approx != "tanh") return c.Invalid("approximate must be none or tanh");
  return Out(c, c.Unary(approx == "tanh" ? v1::UNARY_GELU_TANH : v1::UNARY_GELU, x));
}

absl::Status IsNaNOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  return Out(c, c.Compare(v1::COMPARE_NE, x, x));
}

absl::Status IsInfOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  const bool pos = c.AttrInt("detect_positive", 1) != 0, neg = c.AttrInt("detect_negative", 1) != 0;
  const double inf = std::numeric_limits<double>::infinity();
  if (pos && neg) {
    KILN_ASSIGN_OR_RETURN(ValueRef a, c.Unary(v1::UNARY_ABS, x));
    KILN_ASSIGN_OR_RETURN(ValueRef i, Scalar(c, x, inf));
    return Out(c, c.Compare(v1::COMPARE_EQ, a, i));
  }
  KILN_ASSIGN_OR_RETURN(ValueRef i, Scalar(c, x, neg && !pos ? -inf : inf));
  if (!pos && !neg) {
    KILN_ASSIGN_OR_RETURN(ValueRef z, Scalar(c, x, 0));
    KILN_ASSIGN_OR_RETURN(ValueRef zx, c.Binary(v1::BINARY_MUL, x, z));
    return Out(c, c.Compare(v1::COMPARE_EQ, zx, i));  // x * 0 is never infinite: all false
  }
  return Out(c, c.Compare(v1::COMPARE_EQ, x, i));
}

// Hyperbolic functions and their inverses from exp, log and sqrt.
absl::Status HyperbolicOp(Importer& c) {
  const std::string& op = c.node().op_type();
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  if (!IsFloat(c.TypeOf(x).dtype)) return c.Invalid(absl::StrCat(op, " needs floats"));
  KILN_ASSIGN_OR_RETURN(ValueRef one, Scalar(c, x, 1));
  KILN_ASSIGN_OR_RETURN(ValueRef half, Scalar(c, x, 0.5));
  if (op == "Sinh" || op == "Cosh") {
    KILN_ASSIGN_OR_RETURN(ValueRef e, c.Unary(v1::UNARY_EXP, x));
    KILN_ASSIGN_OR_RETURN(ValueRef nx, c.Unary(v1::UNARY_NEG, x));
    KILN_ASSIGN_OR_RETURN(ValueRef en, c.Unary(v1::UNARY_EXP, nx));
    KILN_ASSIGN_OR_RETURN(ValueRef s, c.Binary(op == "Sinh" ? v1::BINARY_SUB : v1::BINARY_ADD, e, en));
    return Out(c, c.Binary(v1::BINARY_MUL, s, half));
  }
  if (op == "Asinh" || op == "Acosh") {  // log(x + sqrt(x^2 +- 1))
    KILN_ASSIGN_OR_RETURN(ValueRef x2, c.Binary(v1::BINARY_MUL, x, x));
    KILN_ASSIGN_OR_RETURN(ValueRef r, c.Binary(op == "Asinh" ? v1::BINARY_ADD : v1::BINARY_SUB, x2, one));
    KILN_ASSIGN_OR_RETURN(ValueRef sq, c.Unary(v1::UNARY_SQRT, r));
    KILN_ASSIGN_OR_RETURN(ValueRef sum, c.Binary(v1::BINARY_ADD, x, sq));
    return Out(c, c.Unary(v1::UNARY_LOG, sum));
  }
  if (op == "Atanh") {  // 0.5 * log((1 + x) / (1 - x))
    KILN_ASSIGN_OR_RETURN(ValueRef p, c.Binary(v1::BINARY_ADD, one, x));
    KILN_ASSIGN_OR_RETURN(ValueRef m, c.Binary(v1::BINARY_SUB, one, x));
    KILN_ASSIGN_OR_RETURN(ValueRef q, c.Binary(v1::BINARY_DIV, p, m));
    KILN_ASSIGN_OR_RETURN(ValueRef l, c.Unary(v1::UNARY_LOG, q));
    return Out(c, c.Binary(v1::BINARY_MUL, l, half));
  }
  // Tan
  KILN_ASSIGN_OR_RETURN(ValueRef sn, c.Unary(v1::UNARY_SIN, x));
  KILN_ASSIGN_OR_RETURN(ValueRef cs, c.Unary(v1::UNARY_COS, x));
  return Out(c, c.Binary(v1::BINARY_DIV, sn, cs));
}

// Mod in f64 (exact for integers below 2^53): fmod=1 truncates the quotient
// (C fmod, the sign of x), fmod=0 floors it (Python %, the sign of y).
absl::Status ModOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef a, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, In(c, 1));
  const DType dt = c.TypeOf(a).dtype;
  const bool fmod = c.AttrInt("fmod", 0) != 0;
  if (IsFloat(dt) && !fmod) return c.Invalid("Mod of floats needs fmod=1");
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Cast(a, v1::DTYPE_F64));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Cast(b, v1::DTYPE_F64));
  KILN_ASSIGN_OR_RETURN(ValueRef q, c.Binary(v1::BINARY_DIV, x, y));
  ValueRef whole;
  if (fmod) {
    KILN_ASSIGN_OR_RETURN(ValueRef aq, c.Unary(v1::UNARY_ABS, q));
    KILN_ASSIGN_OR_RETURN(ValueRef fq, c.Unary(v1::UNARY_FLOOR, aq));
    KILN_ASSIGN_OR_RETURN(ValueRef sq, c.Unary(v1::UNARY_SIGN, q));
    KILN_ASSIGN_OR_RETURN(whole, c.Binary(v1::BINARY_MUL, fq, sq));
  } else {
    KILN_ASSIGN_OR_RETURN(whole, c.Unary(v1::UNARY_FLOOR, q));
  }
  KILN_ASSIGN_OR_RETURN(ValueRef yw, c.Binary(v1::BINARY_MUL, y, whole));
  KILN_ASSIGN_OR_RETURN(ValueRef r, c.Binary(v1::BINARY_SUB, x, yw));
  return Out(c, c.Cast(r, dt));
}

// Shrink: x + bias below -lambd, x - bias above lambd, 0 between.
absl::Status ShrinkOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  const double lambd = c.AttrFloat("lambd", 0.5f), bias = c.AttrFloat("bias", 0.f);
  KILN_ASSIGN_OR_RETURN(ValueRef lo, Scalar(c, x, -lambd));
  KILN_ASSIGN_OR_RETURN(ValueRef hi, Scalar(c, x, lambd));
  KILN_ASSIGN_OR_RETURN(ValueRef b, Scalar(c, x, bias));
  KILN_ASSIGN_OR_RETURN(ValueRef z, Scalar(c, x, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef below, c.Compare(v1::COMPARE_LT, x, lo));
  KILN_ASSIGN_OR_RETURN(ValueRef above, c.Compare(v1::COMPARE_GT, x, hi));
  KILN_ASSIGN_OR_RETURN(ValueRef xp, c.Binary(v1::BINARY_ADD, x, b));
  KILN_ASSIGN_OR_RETURN(ValueRef xm, c.Binary(v1::BINARY_SUB, x, b));
  KILN_ASSIGN_OR_RETURN(ValueRef inner, c.Where(above, xm, z));
  return Out(c, c.Where(below, xp, inner));
}

// Per-axis (1-D) scale and zero point broadcast along `axis` of x.
absl::StatusOr<ValueRef> AlongAxis(Importer& c, ValueRef v, int64_t x_rank, int64_t axis_attr) {
  const TensorType& t = c.TypeOf(v);
  if (t.rank() == 0 || (t.rank() == 1 && t.dims[0] == 1)) return v;
  if (t.rank() != 1) return c.Unsupported("blocked quantization (scale of rank > 1)");
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, axis_attr, x_rank));
  IrDims dims(x_rank, 1);
  dims[axis] = t.dims[0];
  return c.Reshape(v, dims);
}

absl::Status DequantizeLinearOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef s, In(c, 1));
  const int64_t rank = c.rank(0);
  const int64_t axis = c.AttrInt("axis", 1);
  const DType ft = c.TypeOf(s).dtype;
  KILN_ASSIGN_OR_RETURN(ValueRef xf, c.Cast(x, ft));
  if (c.has(2)) {
    KILN_ASSIGN_OR_RETURN(ValueRef z, In(c, 2));
    KILN_ASSIGN_OR_RETURN(z, c.Cast(z, ft));
    KILN_ASSIGN_OR_RETURN(z, AlongAxis(c, z, rank, axis));
    KILN_ASSIGN_OR_RETURN(xf, c.Binary(v1::BINARY_SUB, xf, z));
  }
  KILN_ASSIGN_OR_RETURN(s, AlongAxis(c, s, rank, axis));
  return Out(c, c.Binary(v1::BINARY_MUL, xf, s));
}

// Round half to even: Kiln's round rounds half away from zero, so the ties are
// fixed up: r = round(v); where |v - trunc(v)| == 0.5 and r is odd, step back.
absl::StatusOr<ValueRef> RoundHalfEven(Importer& c, ValueRef v) {
  KILN_ASSIGN_OR_RETURN(ValueRef half, Scalar(c, v, 0.5));
  KILN_ASSIGN_OR_RETURN(ValueRef two, Scalar(c, v, 2));
  KILN_ASSIGN_OR_RETURN(ValueRef vh, c.Binary(v1::BINARY_DIV, v, two));
  // floor(v / 2 + 0.25) * 2 rounds to the nearest even at exact ties.
  KILN_ASSIGN_OR_RETURN(ValueRef fl, c.Unary(v1::UNARY_FLOOR, v));
  KILN_ASSIGN_OR_RETURN(ValueRef frac, c.Binary(v1::BINARY_SUB, v, fl));
  KILN_ASSIGN_OR_RETURN(ValueRef tie, c.Compare(v1::COMPARE_EQ, frac, half));
  KILN_ASSIGN_OR_RETURN(ValueRef quarter, Scalar(c, v, 0.25));
  KILN_ASSIGN_OR_RETURN(ValueRef q, c.Binary(v1::BINARY_ADD, vh, quarter));
  KILN_ASSIGN_OR_RETURN(ValueRef fq, c.Unary(v1::UNARY_FLOOR, q));
  KILN_ASSIGN_OR_RETURN(ValueRef even, c.Binary(v1::BINARY_MUL, fq, two));
  KILN_ASSIGN_OR_RETURN(ValueRef fh, c.Binary(v1::BINARY_ADD, v, half));
  KILN_ASSIGN_OR_RETURN(ValueRef nearest, c.Unary(v1::UNARY_FLOOR, fh));
  return c.Where(tie, even, nearest);
}

absl::Status QuantizeLinearOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef s, In(c, 1));
  const int64_t rank = c.rank(0);
  const int64_t axis = c.AttrInt("axis", 1);
  DType out = v1::DTYPE_U8;
  if (c.has(2)) out = c.dtype(2);
  if (out != v1::DTYPE_U8 && out != v1::DTYPE_I8) {
    return c.Unsupported(absl::StrCat("QuantizeLinear to ", DTypeName(out)));
  }
  KILN_ASSIGN_OR_RETURN(s, AlongAxis(c, s, rank, axis));
  KILN_ASSIGN_OR_RETURN(s, c.Cast(s, c.TypeOf(x).dtype));
  KILN_ASSIGN_OR_RETURN(ValueRef q, c.Binary(v1::BINARY_DIV, x, s));
  KILN_ASSIGN_OR_RETURN(q, RoundHalfEven(c, q));
  if (c.has(2)) {
    KILN_ASSIGN_OR_RETURN(ValueRef z, In(c, 2));
    KILN_ASSIGN_OR_RETURN(z, c.Cast(z, c.TypeOf(x).dtype));
    KILN_ASSIGN_OR_RETURN(z, AlongAxis(c, z, rank, axis));
    KILN_ASSIGN_OR_RETURN(q, c.Binary(v1::BINARY_ADD, q, z));
  }
  KILN_ASSIGN_OR_RETURN(q, out == v1::DTYPE_U8 ? c.Clamp(q, 0.0, 255.0) : c.Clamp(q, -128.0, 127.0));
  return Out(c, c.Cast(q, out));
}

}  // namespace

void RegisterElementwise(ConverterTable& t) {
  t["Relu"] = UnaryOp<v1::UNARY_RELU>;
  t["Sigmoid"] = UnaryOp<v1::UNARY_SIGMOID>;
  t["Tanh"] = UnaryOp<v1::UNARY_TANH>;
  t["Exp"] = UnaryOp<v1::UNARY_EXP>;
  t["Log"] = UnaryOp<v1::UNARY_LOG>;
  t["Sqrt"] = UnaryOp<v1::UNARY_SQRT>;
  t["Neg"] = UnaryOp<v1::UNARY_NEG>;
  t["Abs"] = UnaryOp<v1::UNARY_ABS>;
  t["Sin"] = UnaryOp<v1::UNARY_SIN>;
  t["Cos"] = UnaryOp<v1::UNARY_COS>;
  t["Erf"] = UnaryOp<v1::UNARY_ERF>;
  t["Floor"] = UnaryOp<v1::UNARY_FLOOR>;
  t["Ceil"] = UnaryOp<v1::UNARY_CEIL>;
  t["Sign"] = UnaryOp<v1::UNARY_SIGN>;
  t["Reciprocal"] = UnaryOp<v1::UNARY_RECIPROCAL>;
  t["Softplus"] = UnaryOp<v1::UNARY_SOFTPLUS>;
  t["Round"] = [](Importer& c) -> absl::Status {
    KILN_ASSIGN_OR_RETURN(ValueRef x, In(c, 0));
    return Out(c, RoundHalfEven(c, x));
  };
  t["Identity"] = IdentityOp;
  t["Dropout"] = DropoutOp;
  t["Add"] = BinaryOp<v1::BINARY_ADD>;
  t["Sub"] = BinaryOp<v1::BINARY_SUB>;
  t["Mul"] = BinaryOp<v1::BINARY_MUL>;
  t["Div"] = BinaryOp<v1::BINARY_DIV>;
  t["Pow"] = BinaryOp<v1::BINARY_POW>;
  t["Max"] = VariadicOp<v1::BINARY_MAX, false>;
  t["Min"] = VariadicOp<v1::BINARY_MIN, false>;
  t["Sum"] = VariadicOp<v1::BINARY_ADD, false>;
  t["Mean"] = VariadicOp<v1::BINARY_ADD, true>;
  t["Equal"] = CompareOp<v1::COMPARE_EQ>;
  t["Less"] = CompareOp<v1::COMPARE_LT>;
  t["LessOrEqual"] = CompareOp<v1::COMPARE_LE>;
  t["Greater"] = CompareOp<v1::COMPARE_GT>;
  t["GreaterOrEqual"] = CompareOp<v1::COMPARE_GE>;
  t["Not"] = NotOp;
  t["And"] = AndOp;
  t["Or"] = OrOp;
  t["Xor"] = XorOp;
  t["Where"] = WhereOp;
  t["Cast"] = CastOp;
  t["CastLike"] = CastLikeOp;
  t["Clip"] = ClipOp;
  t["LeakyRelu"] = LeakyReluOp;
  t["PRelu"] = PReluOp;
  t["Elu"] = EluOp;
  t["Selu"] = SeluOp;
  t["Celu"] = CeluOp;
  t["ThresholdedRelu"] = ThresholdedReluOp;
  t["HardSigmoid"] = HardSigmoidOp;
  t["HardSwish"] = HardSwishOp;
  t["Softsign"] = SoftsignOp;
  t["Shrink"] = ShrinkOp;
  t["Mod"] = ModOp;
  for (const char* op : {"Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Tan"}) t[op] = HyperbolicOp;
  t["Gelu"] = GeluOp;
  t["IsNaN"] = IsNaNOp;
  t["IsInf"] = IsInfOp;
  t["DequantizeLinear"] = DequantizeLinearOp;
  t["QuantizeLinear"] = QuantizeLinearOp;
}

}  // namespace kiln::io::onnx_internal
