// One VJP and one JVP rule per differentiable op (autodiff.h). Each rule is
// written with existing ops; broadcasting operands get their cotangent summed
// back to their own shape (Builder::SumTo).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "base/custom_ops.h"
#include "engine/ir/infer.h"
#include "engine/passes/autodiff_internal.h"

namespace kiln::passes::ad {
namespace {

absl::Status NoRule(const ir::Node& n, absl::string_view why) {
  return absl::UnimplementedError(
      absl::StrCat(ir::NodeLabel(n), " is not differentiable: ", why));
}

std::vector<int64_t> NormalizedAxes(const google::protobuf::RepeatedField<int64_t>& axes,
                                    int64_t rank) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) {
    int64_t n = a;
    ir::NormalizeAxis(a, rank, &n);
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t SoftmaxAxis(const ir::Node& n, int64_t rank) {
  const v1::SoftmaxAttrs& a =
      n.op == v1::OP_SOFTMAX ? n.attrs.softmax() : n.attrs.log_softmax();
  int64_t axis = a.has_axis() ? a.axis() : -1;
  ir::NormalizeAxis(axis, rank, &axis);
  return axis;
}

IrDims KeepDims(const IrDims& dims, const std::vector<int64_t>& axes) {
  IrDims keep = dims;
  for (int64_t a : axes) keep[a] = 1;
  return keep;
}

int64_t Product(const IrDims& d, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, d.size()); ++i) p *= d[i];
  return p;
}

// f'(x) of a unary op as a value, given x and y = f(x); invalid when f' is 0
// everywhere (floor, ceil, round, sign). IDENTITY and NEG are handled by the
// callers (no multiply).
ValueRef UnaryDerivative(Builder& b, v1::UnaryKind k, ValueRef x, ValueRef y) {
  const DType dt = b.T(x).dtype;
  auto c = [&](double v) { return b.Sc(v, dt); };
  switch (k) {
    case v1::UNARY_RELU: return b.Mask(v1::COMPARE_GT, x, c(0), dt);
    case v1::UNARY_GELU: {
      // Phi(x) + x phi(x)
      ValueRef cdf = b.Mul(c(0.5), b.Add(c(1), b.Un(v1::UNARY_ERF, b.Scale(x, M_SQRT1_2))));
      ValueRef pdf = b.Scale(b.Un(v1::UNARY_EXP, b.Scale(b.Mul(x, x), -0.5)),
                             1.0 / std::sqrt(2 * std::numbers::pi));
      return b.Add(cdf, b.Mul(x, pdf));
    }
    case v1::UNARY_GELU_TANH: {
      // y = 0.5 x (1 + t), t = tanh(u), u = c (x + 0.044715 x^3)
      const double kc = std::sqrt(2 / std::numbers::pi);
      ValueRef x2 = b.Mul(x, x);
      ValueRef u = b.Scale(b.Add(x, b.Scale(b.Mul(x2, x), 0.044715)), kc);
      ValueRef t = b.Un(v1::UNARY_TANH, u);
      ValueRef du = b.Scale(b.Add(c(1), b.Scale(x2, 3 * 0.044715)), kc);
      ValueRef left = b.Scale(b.Add(c(1), t), 0.5);
      ValueRef right = b.Mul(b.Scale(x, 0.5), b.Mul(b.Sub(c(1), b.Mul(t, t)), du));
      return b.Add(left, right);
    }
    case v1::UNARY_SILU: {
      ValueRef s = b.Un(v1::UNARY_SIGMOID, x);
      return b.Mul(s, b.Add(c(1), b.Mul(x, b.Sub(c(1), s))));
    }
    case v1::UNARY_SIGMOID: return b.Mul(y, b.Sub(c(1), y));
    case v1::UNARY_TANH: return b.Sub(c(1), b.Mul(y, y));
    case v1::UNARY_EXP: return y;
    case v1::UNARY_LOG: return b.Un(v1::UNARY_RECIPROCAL, x);
    case v1::UNARY_SQRT: return b.Div(c(0.5), y);
    case v1::UNARY_RSQRT: return b.Scale(b.Mul(y, b.Mul(y, y)), -0.5);
    case v1::UNARY_ABS: return b.Un(v1::UNARY_SIGN, x);
    case v1::UNARY_SIN: return b.Un(v1::UNARY_COS, x);
    case v1::UNARY_COS: return b.Neg(b.Un(v1::UNARY_SIN, x));
    case v1::UNARY_ERF:
      return b.Scale(b.Un(v1::UNARY_EXP, b.Neg(b.Mul(x, x))), 2 / std::sqrt(std::numbers::pi));
    case v1::UNARY_RECIPROCAL: return b.Neg(b.Mul(y, y));
    case v1::UNARY_SOFTPLUS: return b.Un(v1::UNARY_SIGMOID, x);
    default: return ValueRef{};  // floor, ceil, round, sign: zero almost everywhere
  }
}

// d(op)/da and d(op)/db of a binary op as values over the result's shape
// (before summing back to the operands' shapes). Invalid = not needed.
struct BinaryPartials {
  ValueRef da, db;
};

BinaryPartials BinaryDerivatives(Builder& b, const ir::Node& n, bool need_a, bool need_b) {
  const ValueRef a = n.operands[0], bb = n.operands[1], y = n.out();
  const DType dt = b.T(y).dtype;
  BinaryPartials p;
  switch (n.attrs.binary().kind()) {
    case v1::BINARY_ADD:
      p.da = b.Sc(1, dt), p.db = b.Sc(1, dt);
      break;
    case v1::BINARY_SUB:
      p.da = b.Sc(1, dt), p.db = b.Sc(-1, dt);
      break;
    case v1::BINARY_MUL:
      if (need_a) p.da = bb;
      if (need_b) p.db = a;
      break;
    case v1::BINARY_DIV:
      p.da = b.Un(v1::UNARY_RECIPROCAL, bb);
      if (need_b) p.db = b.Neg(b.Div(y, bb));
      break;
    case v1::BINARY_MAX:
    case v1::BINARY_MIN: {
      // Ties split the derivative evenly (as torch.maximum / jax.numpy.maximum).
      const v1::CompareKind wins =
          n.attrs.binary().kind() == v1::BINARY_MAX ? v1::COMPARE_GT : v1::COMPARE_LT;
      ValueRef w = b.Add(b.Mask(wins, a, bb, dt), b.Scale(b.Mask(v1::COMPARE_EQ, a, bb, dt), 0.5));
      p.da = w;
      if (need_b) p.db = b.Sub(b.Sc(1, dt), w);
      break;
    }
    case v1::BINARY_POW: {
      if (need_a) {
        p.da = b.Mul(bb, b.r().Binary(v1::BINARY_POW, a, b.Sub(bb, b.Sc(1, dt))));
      }
      if (need_b) {
        // y log a, taken as 0 where a <= 0 (jax.numpy.power does the same at 0).
        ValueRef pos = b.r().Compare(v1::COMPARE_GT, a, b.Sc(0, dt));
        ValueRef safe = b.r().Where(pos, a, b.Sc(1, dt));
        p.db = b.r().Where(pos, b.Mul(y, b.Un(v1::UNARY_LOG, safe)), b.Sc(0, dt));
      }
      break;
    }
    default:
      break;
  }
  return p;
}

// The matmul operands as matrices: rank-1 operands promoted as numpy.matmul
// does ([K] -> [1, K] on the left, [K, 1] on the right).
struct MatMulForm {
  ValueRef a, b;     // promoted
  ValueRef g;        // the result's cotangent (or tangent) with the promoted dims
  bool ta = false, tb = false;
  bool a_vec = false, b_vec = false;
};

IrDims PromotedResultDims(const IrDims& y, bool a_vec, bool b_vec) {
  IrDims d = y;
  if (a_vec) d.insert(d.end() - (b_vec ? 0 : 1), 1);
  if (b_vec) d.push_back(1);
  return d;
}

MatMulForm Promote(Builder& b, const ir::Node& n, ValueRef g) {
  MatMulForm f;
  f.a = n.operands[0];
  f.b = n.operands[1];
  f.a_vec = b.T(f.a).rank() == 1;
  f.b_vec = b.T(f.b).rank() == 1;
  f.ta = n.attrs.matmul().transpose_a() && !f.a_vec;
  f.tb = n.attrs.matmul().transpose_b() && !f.b_vec;
  if (f.a_vec) f.a = b.Reshape(f.a, {1, b.T(n.operands[0]).dims[0]});
  if (f.b_vec) f.b = b.Reshape(f.b, {b.T(n.operands[1]).dims[0], 1});
  if (Valid(g)) f.g = b.Reshape(g, PromotedResultDims(b.T(n.out()).dims, f.a_vec, f.b_vec));
  return f;
}

absl::Status MatMulVjp(Builder& b, const ir::Node& n, ValueRef g, const std::vector<bool>& need,
                       std::vector<ValueRef>& grads) {
  MatMulForm f = Promote(b, n, g);
  if (need[0]) {
    // A_eff = ta ? A^T : A;  dA_eff = g @ B_eff^T.
    ValueRef da = f.ta ? b.r().MatMul(f.b, f.g, f.tb, true) : b.r().MatMul(f.g, f.b, false, !f.tb);
    da = b.SumTo(da, b.T(f.a).dims);
    grads[0] = b.Reshape(da, b.T(n.operands[0]).dims);
  }
  const IrDims a_dims = b.T(f.a).dims;  // a copy: new nodes may move the types
  if (need[1] && !f.ta && b.T(f.b).rank() == 2 && a_dims.size() > 2 &&
      std::all_of(a_dims.begin(), a_dims.end(), [](int64_t d) { return d >= 0; })) {
    // x @ W with a batched x [.., M, K] and a shared W: the batch is more
    // rows of one product, dW_eff = x[-1, K]^T @ g[-1, N], rather than a
    // batched product [.., K, N] summed over the batch (a buffer the batch's
    // size, and a reduction over it).
    const int64_t n_cols = b.T(f.g).dims.back();
    const int64_t rows = Product(a_dims, 0, a_dims.size() - 1);
    ValueRef a2 = b.Reshape(f.a, {rows, a_dims.back()});
    ValueRef g2 = b.Reshape(f.g, {rows, n_cols});
    ValueRef db = f.tb ? b.r().MatMul(g2, a2, true, false) : b.r().MatMul(a2, g2, true, false);
    grads[1] = b.Reshape(db, b.T(n.operands[1]).dims);
  } else if (need[1]) {
    // dB_eff = A_eff^T @ g.
    ValueRef db = f.tb ? b.r().MatMul(f.g, f.a, true, f.ta) : b.r().MatMul(f.a, f.g, !f.ta, false);
    db = b.SumTo(db, b.T(f.b).dims);
    grads[1] = b.Reshape(db, b.T(n.operands[1]).dims);
  }
  return b.status();
}

// The cotangent of a slice's operand: the slice's cotangent scattered back
// (interleaved with zeros for steps > 1, then padded to the operand's size).
ValueRef SliceVjp(Builder& b, const ir::Node& n, ValueRef g) {
  const auto& a = n.attrs.slice();
  const TensorType& x = b.T(n.operands[0]);
  const int count = a.axes().empty() ? static_cast<int>(x.rank()) : a.axes_size();
  ValueRef out = g;
  for (int i = 0; i < count; ++i) {
    int64_t axis = i;
    if (!a.axes().empty()) ir::NormalizeAxis(a.axes(i), x.rank(), &axis);
    const int64_t dim = x.dims[axis];
    const int64_t step = a.step().empty() ? 1 : a.step(i);
    auto clampi = [dim](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
    const int64_t start = clampi(a.start(i));
    const int64_t taken = b.T(out).dims[axis];
    if (taken == 0) return b.Zeros(x);
    int64_t span = taken;
    if (step > 1) {
      IrDims d = b.T(out).dims;
      IrDims split = d;
      split.insert(split.begin() + axis + 1, 1);
      ValueRef s = b.Reshape(out, split);
      std::vector<int64_t> lo(split.size(), 0), hi(split.size(), 0);
      hi[axis + 1] = step - 1;
      s = b.Pad(s, lo, hi);
      IrDims merged = d;
      merged[axis] = taken * step;
      span = (taken - 1) * step + 1;
      out = b.Slice(b.Reshape(s, merged), axis, 0, span);
    }
    std::vector<int64_t> lo(x.rank(), 0), hi(x.rank(), 0);
    lo[axis] = start;
    hi[axis] = dim - start - span;
    if (lo[axis] != 0 || hi[axis] != 0) out = b.Pad(out, lo, hi);
  }
  return out;
}

// Gather's cotangent for its data operand, through a one-hot matrix of the
// indices: data [P.., A, Q..] <- g [P.., J.., Q..]. (Kiln's CPU backend has
// no ScatterAdd kernel; the one-hot costs |J| x A elements.)
ValueRef GatherVjp(Builder& b, const ir::Node& n, ValueRef g) {
  const TensorType& x = b.T(n.operands[0]);
  const ValueRef idx = n.operands[1];
  const DType it = b.T(idx).dtype;
  int64_t axis = 0;
  ir::NormalizeAxis(n.attrs.gather().axis(), x.rank(), &axis);
  const int64_t A = x.dims[axis];
  const int64_t P = Product(x.dims, 0, axis), Q = Product(x.dims, axis + 1);
  const int64_t R = b.T(idx).rank() == 0 ? 1 : Product(b.T(idx).dims);
  ValueRef flat = b.Reshape(idx, {R, 1});
  ValueRef neg = b.r().Compare(v1::COMPARE_LT, flat, b.Sc(0, it));
  flat = b.r().Where(neg, b.Add(flat, b.Sc(static_cast<double>(A), it)), flat);
  ValueRef onehot = b.Mask(v1::COMPARE_EQ, flat, b.Iota(A, it), x.dtype);  // [R, A]
  ValueRef g3 = b.Reshape(g, {P, R, Q});
  ValueRef out = b.r().MatMul(onehot, g3, true, false);                   // [P, A, Q]
  return b.Reshape(out, x.dims);
}

// The softmax cross-entropy's per-row derivative d loss_r / d logits and the
// weight of each row in the reduced loss (autodiff of kernels_loss.cc's
// formula). Rows are the logits' leading dims flattened: [R, C].
struct XentParts {
  ValueRef row_grad;     // [R, C]
  ValueRef label_grad;   // [R, C], probability labels only
  ValueRef weight;       // [R]: d loss / d loss_r for a unit output cotangent; invalid = 1
  ValueRef count;        // rank 0, REDUCTION_MEAN: the rows counted
  int64_t rows = 0, classes = 0;
};

XentParts Xent(Builder& b, const ir::Node& n, bool need_labels) {
  const auto& a = n.attrs.softmax_cross_entropy();
  const TensorType& x = b.T(n.operands[0]);
  const TensorType& lt = b.T(n.operands[1]);
  const DType dt = x.dtype;
  XentParts p;
  p.classes = x.dims.back();
  p.rows = Product(x.dims, 0, x.dims.size() - 1);
  const double s = a.label_smoothing(), C = static_cast<double>(p.classes);
  ValueRef x2 = b.Reshape(n.operands[0], {p.rows, p.classes});
  ValueRef logp = b.r().Add(v1::OP_LOG_SOFTMAX, {x2}, [] {
    v1::Attrs at;
    at.mutable_log_softmax()->set_axis(-1);
    return at;
  }());
  ValueRef prob = b.Un(v1::UNARY_EXP, logp);
  ValueRef valid;
  if (IsInteger(lt.dtype)) {
    ValueRef labels = b.Reshape(n.operands[1], {p.rows, 1});
    ValueRef onehot = b.Mask(v1::COMPARE_EQ, labels, b.Iota(p.classes, lt.dtype), dt);
    ValueRef target = b.Add(b.Scale(onehot, 1 - s), b.Sc(s / C, dt));
    p.row_grad = b.Sub(prob, target);
    if (a.has_ignore_index()) {
      valid = b.Mask(v1::COMPARE_NE, b.Reshape(n.operands[1], {p.rows}),
                     b.Sc(static_cast<double>(a.ignore_index()), lt.dtype), dt);
    }
  } else {
    ValueRef q = b.Add(b.Scale(b.Reshape(n.operands[1], {p.rows, p.classes}), 1 - s),
                       b.Sc(s / C, dt));
    p.row_grad = b.Sub(b.Mul(prob, b.SumKeep(q, {1})), q);
    if (need_labels) p.label_grad = b.Scale(logp, -(1 - s));
  }
  p.weight = valid;
  if (a.reduction() == v1::REDUCTION_MEAN) {
    p.count = Valid(valid) ? b.r().Reduce(v1::REDUCE_SUM, valid, {0}, false)
                           : b.Sc(static_cast<double>(p.rows), dt);
  }
  return p;
}

// The row weights times the output cotangent `g`, as [R, 1].
ValueRef XentRowScale(Builder& b, const ir::Node& n, const XentParts& p, ValueRef g) {
  const auto red = n.attrs.softmax_cross_entropy().reduction();
  ValueRef w = red == v1::REDUCTION_NONE ? b.Reshape(g, {p.rows}) : b.BroadcastTo(g, {p.rows});
  if (Valid(p.count)) w = b.Div(w, p.count);
  if (Valid(p.weight)) w = b.Mul(w, p.weight);
  return b.Reshape(w, {p.rows, 1});
}

// Rope rotates pairs by angles position x frequency: the rotation's
// transpose is the rotation by the negated positions (dims past rotary_dim
// pass through either way).
ValueRef RopeTranspose(Builder& b, const ir::Node& n, ValueRef g) {
  ValueRef negated;
  if (n.operands.size() == 2) {
    ValueRef p = n.operands[1];
    if (b.T(p).dtype != v1::DTYPE_I64) p = b.r().Cast(p, v1::DTYPE_I64);
    negated = b.Neg(p);
  } else {
    const int64_t seq = b.T(n.operands[0]).dims[2];
    auto t = HostTensor::Create(v1::DTYPE_I64, {seq});
    if (!t.ok()) return b.r().Scalar(0, v1::DTYPE_UNSPECIFIED);  // sticks the error
    for (int64_t i = 0; i < seq; ++i) {
      t->data_as<int64_t>()[i] = -(n.attrs.rope().position_offset() + i);
    }
    negated = b.r().Constant(std::move(t).value());
  }
  v1::Attrs a = n.attrs;
  a.mutable_rope()->set_position_offset(0);
  return b.r().Add(v1::OP_ROPE, {g, negated}, std::move(a));
}

// `x` with step-1 zeros between its elements along `axis`: length
// (n - 1) * step + 1 (the adjoint of taking every step-th element).
ValueRef Interleave(Builder& b, ValueRef x, int64_t axis, int64_t step) {
  const IrDims d = b.T(x).dims;
  const int64_t n = d[axis];
  if (step == 1 || n == 0) return x;
  IrDims split = d;
  split.insert(split.begin() + axis + 1, 1);
  std::vector<int64_t> lo(split.size(), 0), hi(split.size(), 0);
  hi[axis + 1] = step - 1;
  ValueRef s = b.Pad(b.Reshape(x, split), lo, hi);
  IrDims merged = d;
  merged[axis] = n * step;
  return b.Slice(b.Reshape(s, merged), axis, 0, (n - 1) * step + 1);
}

// `x` reversed along `axis` (a Gather of the reversed indices).
ValueRef Reverse(Builder& b, ValueRef x, int64_t axis) {
  const int64_t n = b.T(x).dims[axis];
  auto t = HostTensor::Create(v1::DTYPE_I64, {n});
  if (!t.ok()) return b.r().Scalar(0, v1::DTYPE_UNSPECIFIED);  // sticks the error
  for (int64_t i = 0; i < n; ++i) t->data_as<int64_t>()[i] = n - 1 - i;
  v1::Attrs a;
  a.mutable_gather()->set_axis(axis);
  return b.r().Add(v1::OP_GATHER, {x, b.r().Constant(std::move(t).value())}, std::move(a));
}

struct ConvShape {
  int sp = 0;
  std::vector<int64_t> stride, dilation, lo, hi;
  int64_t groups = 1;
};

ConvShape ConvShapeOf(const v1::ConvAttrs& a, int sp) {
  auto get = [&](const google::protobuf::RepeatedField<int64_t>& f, int64_t dflt) {
    std::vector<int64_t> v(sp, dflt);  // the verifier checked: empty or one per dim
    for (int i = 0; i < sp && i < f.size(); ++i) v[i] = f[i];
    return v;
  };
  ConvShape c;
  c.sp = sp;
  c.stride = get(a.stride(), 1);
  c.dilation = get(a.dilation(), 1);
  c.lo = get(a.pad_low(), 0);
  c.hi = get(a.pad_high(), 0);
  c.groups = a.groups() == 0 ? 1 : a.groups();
  return c;
}

ConvShape ConvShapeOf(const ir::Node& n, int sp) { return ConvShapeOf(n.attrs.conv(), sp); }

ValueRef ConvNode(Builder& b, ValueRef x, ValueRef w, const std::vector<int64_t>& stride,
                  const std::vector<int64_t>& dilation, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi) {
  v1::Attrs a;
  for (int64_t v : stride) a.mutable_conv()->add_stride(v);
  for (int64_t v : dilation) a.mutable_conv()->add_dilation(v);
  for (int64_t v : lo) a.mutable_conv()->add_pad_low(v);
  for (int64_t v : hi) a.mutable_conv()->add_pad_high(v);
  return b.r().Add(v1::OP_CONV, {x, w}, std::move(a));
}

v1::ConvAttrs ConvAttrsOf(const ConvShape& c) {
  v1::ConvAttrs a;
  for (int i = 0; i < c.sp; ++i) {
    a.add_stride(c.stride[i]);
    a.add_dilation(c.dilation[i]);
    a.add_pad_low(c.lo[i]);
    a.add_pad_high(c.hi[i]);
  }
  return a;
}

// One group's weight gradient: kiln.conv2d_backward_weights where `native`,
// the op is registered (the CPU backend is linked), the conv is 2-D and
// f32 / f16 / bf16, whatever its input channels (a first layer's one
// channel included: the op reads x and g as they lie, where the form below
// transposes both, g at the layer's full size, and slices and transposes
// the result). Else the correlation of x (channels as the batch) with g
// (the batch as channels), stride and dilation swapped, cropped to the
// kernel and transposed back.
ValueRef ConvWeightGrad(Builder& b, const ConvShape& c, ValueRef x, ValueRef w, ValueRef g,
                        bool native) {
  const IrDims wd = b.T(w).dims;
  const DType dt = b.T(x).dtype;
  if (native && c.sp == 2 && (dt == v1::DTYPE_F32 || dt == v1::DTYPE_F16 || dt == v1::DTYPE_BF16) &&
      CustomOpRegistry::Global().Find(kConvBackwardWeightsOp) != nullptr) {
    v1::Attrs a;
    a.mutable_custom()->set_name(kConvBackwardWeightsOp);
    a.mutable_custom()->set_payload(ConvAttrsOf(c).SerializeAsString());
    return b.r().Add(v1::OP_CUSTOM, {x, g, w}, std::move(a));
  }
  std::vector<int64_t> perm = {1, 0};
  for (int i = 0; i < c.sp; ++i) perm.push_back(2 + i);
  ValueRef xt = b.r().Transpose(x, perm);  // [C, N, S..]
  ValueRef gt = b.r().Transpose(g, perm);  // [O, N, S_out..]
  ValueRef corr = ConvNode(b, xt, gt, c.dilation, c.stride, c.lo, c.hi);  // [C, O, >= K..]
  v1::Attrs a;
  for (int i = 0; i < c.sp; ++i) {
    a.mutable_slice()->add_axes(2 + i);
    a.mutable_slice()->add_start(0);
    a.mutable_slice()->add_stop(wd[2 + i]);
  }
  return b.r().Transpose(b.r().Add(v1::OP_SLICE, {corr}, std::move(a)), perm);
}

// The cotangents of one group's conv (groups = 1): x [N, C, S..], w [O, C, K..],
// g [N, O, S_out..]. dx is the correlation of the stride-interleaved g with
// the flipped, channel-transposed kernel; dw the correlation of x (channels
// as the batch) with g (the batch as channels), stride and dilation swapped.
void ConvGroupVjp(Builder& b, const ConvShape& c, ValueRef x, ValueRef w, ValueRef g, bool need_x,
                  bool need_w, ValueRef* dx, ValueRef* dw) {
  const IrDims xd = b.T(x).dims, wd = b.T(w).dims;
  std::vector<int64_t> perm = {1, 0};
  for (int i = 0; i < c.sp; ++i) perm.push_back(2 + i);
  if (need_x && c.sp == 2) {
    // A 2-D conv's input gradient is the transposed conv of g with the same
    // weights, geometry and padding; the output padding gives back the rows
    // and columns the conv's stride skipped at the end (below the stride).
    v1::Attrs a;
    auto* t = a.mutable_conv_transpose2d();
    const IrDims gd = b.T(g).dims;
    for (int i = 0; i < c.sp; ++i) {
      const int64_t eff = c.dilation[i] * (wd[2 + i] - 1) + 1;
      t->add_stride(c.stride[i]);
      t->add_dilation(c.dilation[i]);
      t->add_pad_low(c.lo[i]);
      t->add_pad_high(c.hi[i]);
      t->add_output_padding(xd[2 + i] + c.lo[i] + c.hi[i] - eff - (gd[2 + i] - 1) * c.stride[i]);
    }
    *dx = b.r().Add(v1::OP_CONV_TRANSPOSE2D, {g, w}, std::move(a));
  } else if (need_x) {
    ValueRef gi = g;
    for (int i = 0; i < c.sp; ++i) gi = Interleave(b, gi, 2 + i, c.stride[i]);
    ValueRef wf = b.r().Transpose(w, perm);
    for (int i = 0; i < c.sp; ++i) wf = Reverse(b, wf, 2 + i);
    std::vector<int64_t> lo(c.sp), hi(c.sp), ones(c.sp, 1);
    for (int i = 0; i < c.sp; ++i) {
      const int64_t span = c.dilation[i] * (wd[2 + i] - 1);
      const int64_t padded = xd[2 + i] + c.lo[i] + c.hi[i];
      lo[i] = span;
      hi[i] = padded - b.T(gi).dims[2 + i];
    }
    ValueRef full = ConvNode(b, gi, wf, ones, c.dilation, lo, hi);  // [N, C, padded..]
    v1::Attrs a;
    for (int i = 0; i < c.sp; ++i) {
      a.mutable_slice()->add_axes(2 + i);
      a.mutable_slice()->add_start(c.lo[i]);
      a.mutable_slice()->add_stop(c.lo[i] + xd[2 + i]);
    }
    *dx = b.r().Add(v1::OP_SLICE, {full}, std::move(a));
  }
  if (need_w) *dw = ConvWeightGrad(b, c, x, w, g, /*native=*/true);
}

constexpr int64_t kMaxConvGradGroups = 64;

absl::Status ConvVjp(Builder& b, const ir::Node& n, ValueRef g, const std::vector<bool>& need,
                     std::vector<ValueRef>& grads) {
  const ValueRef x = n.operands[0], w = n.operands[1];
  const int sp = static_cast<int>(b.T(x).rank()) - 2;
  const ConvShape c = ConvShapeOf(n, sp);
  if (c.groups > kMaxConvGradGroups) {
    return NoRule(n, absl::StrCat("conv with ", c.groups, " groups (over ", kMaxConvGradGroups,
                                  ") has no gradient rule"));
  }
  if (n.operands.size() == 3 && need[2]) {
    std::vector<int64_t> axes = {0};
    for (int i = 0; i < sp; ++i) axes.push_back(2 + i);
    grads[2] = b.r().Reduce(v1::REDUCE_SUM, g, axes, false);
  }
  if (!need[0] && !need[1]) return b.status();
  if (c.groups == 1) {
    ConvGroupVjp(b, c, x, w, g, need[0], need[1], &grads[0], &grads[1]);
    return b.status();
  }
  const int64_t cg = b.T(x).dims[1] / c.groups, og = b.T(w).dims[0] / c.groups;
  std::vector<ValueRef> dxs, dws;
  for (int64_t k = 0; k < c.groups; ++k) {
    ValueRef dx, dw;
    ConvGroupVjp(b, c, b.Slice(x, 1, k * cg, (k + 1) * cg), b.Slice(w, 0, k * og, (k + 1) * og),
                 b.Slice(g, 1, k * og, (k + 1) * og), need[0], need[1], &dx, &dw);
    dxs.push_back(dx);
    dws.push_back(dw);
  }
  auto concat = [&](std::vector<ValueRef> parts, int64_t axis) {
    v1::Attrs a;
    a.mutable_concat()->set_axis(axis);
    return b.r().Add(v1::OP_CONCAT, std::move(parts), std::move(a));
  };
  if (need[0]) grads[0] = concat(dxs, 1);
  if (need[1]) grads[1] = concat(dws, 0);
  return b.status();
}

// ConvTranspose2d is the input gradient of the conv with its weights and
// geometry (ConvGroupVjp above), so its x-gradient is that conv (forward) of
// the cotangent, and its w-gradient that conv's weight gradient with the
// cotangent as the conv's input and x as its output's cotangent. Output
// padding at or over the stride (rows no tap reaches) has no rule.
absl::Status ConvTransposeVjp(Builder& b, const ir::Node& n, ValueRef g,
                              const std::vector<bool>& need, std::vector<ValueRef>& grads) {
  const auto& a = n.attrs.conv_transpose2d();
  const ValueRef x = n.operands[0], w = n.operands[1];
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  if (groups > kMaxConvGradGroups) {
    return NoRule(n, absl::StrCat("conv_transpose2d with ", groups, " groups (over ",
                                  kMaxConvGradGroups, ") has no gradient rule"));
  }
  ConvShape c;
  c.sp = 2;
  auto get = [&](const google::protobuf::RepeatedField<int64_t>& f, int64_t dflt) {
    std::vector<int64_t> v(2, dflt);  // the verifier checked: empty or one per dim
    for (int i = 0; i < 2 && i < f.size(); ++i) v[i] = f[i];
    return v;
  };
  c.stride = get(a.stride(), 1);
  c.dilation = get(a.dilation(), 1);
  c.lo = get(a.pad_low(), 0);
  c.hi = get(a.pad_high(), 0);
  const std::vector<int64_t> op = get(a.output_padding(), 0);
  for (int i = 0; i < 2; ++i) {
    if (op[i] >= c.stride[i]) {
      return NoRule(n, absl::StrCat("conv_transpose2d with output_padding ", op[i],
                                    " at or over its stride ", c.stride[i], " has no gradient rule"));
    }
  }
  if (n.operands.size() == 3 && need[2]) grads[2] = b.r().Reduce(v1::REDUCE_SUM, g, {0, 2, 3}, false);
  if (!need[0] && !need[1]) return b.status();
  const int64_t cg = b.T(x).dims[1] / groups, og = b.T(w).dims[1];
  std::vector<ValueRef> dxs, dws;
  for (int64_t k = 0; k < groups; ++k) {
    const ValueRef xk = groups == 1 ? x : b.Slice(x, 1, k * cg, (k + 1) * cg);
    const ValueRef wk = groups == 1 ? w : b.Slice(w, 0, k * cg, (k + 1) * cg);
    const ValueRef gk = groups == 1 ? g : b.Slice(g, 1, k * og, (k + 1) * og);
    if (need[0]) dxs.push_back(ConvNode(b, gk, wk, c.stride, c.dilation, c.lo, c.hi));
    if (need[1]) {
      ValueRef unused, dw;
      ConvGroupVjp(b, c, gk, wk, xk, false, true, &unused, &dw);
      dws.push_back(dw);
    }
  }
  auto join = [&](std::vector<ValueRef> parts, int64_t axis) {
    if (parts.size() == 1) return parts[0];
    v1::Attrs at;
    at.mutable_concat()->set_axis(axis);
    return b.r().Add(v1::OP_CONCAT, std::move(parts), std::move(at));
  };
  if (need[0]) grads[0] = join(dxs, 1);
  if (need[1]) grads[1] = join(dws, 0);
  return b.status();
}

struct PoolShape {
  int sp = 0;
  std::vector<int64_t> window, stride, lo, hi;
};

PoolShape PoolShapeOf(const v1::PoolAttrs& a, int sp) {
  PoolShape p;
  p.sp = sp;
  p.window.assign(a.window().begin(), a.window().end());
  p.stride = a.stride().empty() ? p.window : std::vector<int64_t>(a.stride().begin(), a.stride().end());
  p.lo.assign(sp, 0);
  p.hi.assign(sp, 0);
  for (int i = 0; i < sp && i < a.pad_low_size(); ++i) p.lo[i] = a.pad_low(i);
  for (int i = 0; i < sp && i < a.pad_high_size(); ++i) p.hi[i] = a.pad_high(i);
  return p;
}

bool NonOverlapping(const PoolShape& p) {
  for (int i = 0; i < p.sp; ++i) {
    if (p.stride[i] != p.window[i] || p.lo[i] != 0 || p.hi[i] != 0) return false;
  }
  return true;
}

// Avg pool as a one-channel conv of [N * C, 1, S..] with a kernel of ones;
// the divisor is the window size, or with count_include_pad off and padding,
// the count of real elements under each window (a conv of ones).
ValueRef AvgPoolVjp(Builder& b, const ir::Node& n, const PoolShape& p, ValueRef g) {
  const IrDims xd = b.T(n.operands[0]).dims;
  const IrDims yd = n.type().dims;
  const DType dt = n.type().dtype;
  IrDims x1 = {xd[0] * xd[1], 1}, y1 = {yd[0] * yd[1], 1}, k1 = {1, 1}, ones1 = {1, 1};
  bool padded = false;
  for (int i = 0; i < p.sp; ++i) {
    x1.push_back(xd[2 + i]);
    y1.push_back(yd[2 + i]);
    k1.push_back(p.window[i]);
    ones1.push_back(xd[2 + i]);
    padded = padded || p.lo[i] > 0 || p.hi[i] > 0;
  }
  ValueRef kernel = b.Zeros(TensorType(dt, k1));
  kernel = b.Add(kernel, b.Sc(1, dt));
  ValueRef g1 = b.Reshape(g, y1);
  ConvShape c;
  c.sp = p.sp;
  c.stride = p.stride;
  c.dilation.assign(p.sp, 1);
  c.lo = p.lo;
  c.hi = p.hi;
  if (padded && !n.attrs.pool().count_include_pad()) {
    ValueRef ones = b.Add(b.Zeros(TensorType(dt, ones1)), b.Sc(1, dt));
    g1 = b.Div(g1, ConvNode(b, ones, kernel, c.stride, c.dilation, c.lo, c.hi));
  } else {
    int64_t size = 1;
    for (int64_t k : p.window) size *= k;
    g1 = b.Scale(g1, 1.0 / static_cast<double>(size));
  }
  ValueRef dx, dw;
  ConvGroupVjp(b, c, b.Reshape(n.operands[0], x1), kernel, g1, true, false, &dx, &dw);
  return b.Reshape(dx, xd);
}

// Max pool's derivative, for every window shape: the input padded with the
// dtype's lowest value (what a max pool pads with; no pad when there is no
// padding), then one strided slice per window offset, in row-major order of
// the window. The first offset whose element equals the window's max takes
// the derivative and the others none, as torch's max_pool backward gives it
// to the first maximum of the window. `fn(slice node, weight)` gets each
// offset's slice of the padded input and its weight (1 where it takes the
// derivative, else 0, over the result's shape); returns the padded input.
template <typename Fn>
ValueRef ForEachWindowOffset(Builder& b, ValueRef x, ValueRef y, const PoolShape& p, Fn fn) {
  const DType dt = b.T(y).dtype;
  const IrDims yd = b.T(y).dims;
  std::vector<int64_t> lo(yd.size(), 0), hi(yd.size(), 0);
  bool padded = false;
  for (int i = 0; i < p.sp; ++i) {
    lo[2 + i] = p.lo[i], hi[2 + i] = p.hi[i];
    padded = padded || p.lo[i] > 0 || p.hi[i] > 0;
  }
  ValueRef xp = x;
  if (padded) {
    v1::Attrs pad;
    for (int64_t v : lo) pad.mutable_pad()->add_low(v);
    for (int64_t v : hi) pad.mutable_pad()->add_high(v);
    pad.mutable_pad()->set_value(dt == v1::DTYPE_F64 ? -1.7976931348623157e308
                                                     : -3.4028234663852886e38);
    xp = b.r().Add(v1::OP_PAD, {x}, std::move(pad));
  }
  int64_t offsets = 1;
  for (int64_t k : p.window) offsets *= k;
  ValueRef taken;  // 1 where an earlier offset holds the window's max
  for (int64_t o = 0; o < offsets; ++o) {
    v1::Attrs a;
    int64_t rest = o;
    for (int i = p.sp - 1; i >= 0; --i) {
      const int64_t j = rest % p.window[i];
      rest /= p.window[i];
      a.mutable_slice()->add_axes(2 + i);
      a.mutable_slice()->add_start(j);
      a.mutable_slice()->add_stop(j + (yd[2 + i] - 1) * p.stride[i] + 1);
      a.mutable_slice()->add_step(p.stride[i]);
    }
    const ValueRef xs = b.r().Add(v1::OP_SLICE, {xp}, std::move(a));
    if (!b.status().ok()) return ValueRef{};
    ValueRef w = b.Mask(v1::COMPARE_EQ, xs, y, dt);
    if (Valid(taken)) {
      w = b.Mul(w, b.Sub(b.Sc(1, dt), taken));
      if (o + 1 < offsets) taken = b.Add(taken, w);
    } else {
      taken = w;
    }
    fn(*b.graph().FindNode(xs.node), w);
  }
  return xp;
}

// The cotangent of edge or reflect padding: per padded axis, the middle of
// the cotangent, plus each padded border folded back onto the elements it
// copied (edge: summed onto the first / last element; reflect: reversed onto
// the elements after the first / before the last).
ValueRef PadFoldVjp(Builder& b, const ir::Node& n, ValueRef g) {
  const auto& a = n.attrs.pad();
  const IrDims xd = b.T(n.operands[0]).dims;
  const bool edge = a.mode() == v1::PAD_EDGE;
  ValueRef out = g;
  for (int64_t axis = 0; axis < static_cast<int64_t>(xd.size()); ++axis) {
    const int64_t lo = a.low(axis), hi = a.high(axis), len = xd[axis];
    if (lo == 0 && hi == 0) continue;
    ValueRef mid = b.Slice(out, axis, lo, lo + len);
    auto fold = [&](int64_t start, int64_t stop, int64_t before, int64_t after) {
      std::vector<int64_t> l(xd.size(), 0), h(xd.size(), 0);
      ValueRef part = b.Slice(out, axis, start, stop);
      part = edge ? b.SumKeep(part, {axis}) : Reverse(b, part, axis);
      l[axis] = before;
      h[axis] = after;
      mid = b.Add(mid, b.Pad(part, l, h));
    };
    if (lo > 0) edge ? fold(0, lo, 0, len - 1) : fold(0, lo, 1, len - 1 - lo);
    if (hi > 0) {
      edge ? fold(lo + len, lo + len + hi, len - 1, 0)
           : fold(lo + len, lo + len + hi, len - 1 - hi, 1);
    }
    out = mid;
  }
  return out;
}

}  // namespace

ValueRef MaxPoolVjpComposition(Builder& b, ValueRef x, ValueRef y, const v1::PoolAttrs& attrs,
                               ValueRef g) {
  const int sp = static_cast<int>(b.T(y).rank()) - 2;
  const PoolShape p = PoolShapeOf(attrs, sp);
  const IrDims xd = b.T(x).dims;
  if (!NonOverlapping(p)) {
    ValueRef sum;
    ForEachWindowOffset(b, x, y, p, [&](const ir::Node& slice, ValueRef w) {
      ValueRef back = SliceVjp(b, slice, b.Mul(g, w));
      sum = Valid(sum) ? b.Add(sum, back) : back;
    });
    if (!b.status().ok()) return ValueRef{};
    v1::Attrs crop;
    for (int i = 0; i < sp; ++i) {
      crop.mutable_slice()->add_axes(2 + i);
      crop.mutable_slice()->add_start(p.lo[i]);
      crop.mutable_slice()->add_stop(p.lo[i] + xd[2 + i]);
    }
    return b.r().Add(v1::OP_SLICE, {sum}, std::move(crop));
  }
  // Windows that tile the input: each offset's share g * w ([N, C, o..]) is
  // stacked to [k.., N, C, o..] and interleaved back by one transpose to
  // [N, C, o1, k1, o2, k2] = x's (cropped) shape; no full-size weights.
  const IrDims yd = b.T(y).dims;
  IrDims one = {1};
  one.insert(one.end(), yd.begin(), yd.end());
  std::vector<ValueRef> parts;
  ForEachWindowOffset(b, x, y, p, [&](const ir::Node&, ValueRef w) {
    parts.push_back(b.Reshape(b.Mul(g, w), one));
  });
  if (!b.status().ok()) return ValueRef{};
  v1::Attrs cat;
  cat.mutable_concat()->set_axis(0);
  ValueRef stacked = parts.size() == 1 ? parts[0] : b.r().Add(v1::OP_CONCAT, parts, std::move(cat));
  IrDims sd(p.window.begin(), p.window.end());
  sd.insert(sd.end(), yd.begin(), yd.end());
  std::vector<int64_t> perm = {sp, sp + 1};
  IrDims cropped = {xd[0], xd[1]};
  std::vector<int64_t> lo(xd.size(), 0), hi(xd.size(), 0);
  bool pad = false;
  for (int i = 0; i < sp; ++i) {
    perm.push_back(sp + 2 + i);
    perm.push_back(i);
    cropped.push_back(yd[2 + i] * p.window[i]);
    hi[2 + i] = xd[2 + i] - cropped.back();
    pad = pad || hi[2 + i] > 0;
  }
  ValueRef dx = b.Reshape(b.r().Transpose(b.Reshape(stacked, sd), perm), cropped);
  return pad ? b.Pad(dx, lo, hi) : dx;
}

ValueRef ConvWeightGradComposition(Builder& b, ValueRef x, ValueRef g, ValueRef w,
                                   const v1::ConvAttrs& attrs) {
  return ConvWeightGrad(b, ConvShapeOf(attrs, static_cast<int>(b.T(x).rank()) - 2), x, w, g,
                        /*native=*/false);
}

ValueRef MaxPoolJvpComposition(Builder& b, ValueRef x, ValueRef y, const v1::PoolAttrs& attrs,
                               ValueRef t) {
  const int sp = static_cast<int>(b.T(y).rank()) - 2;
  const PoolShape p = PoolShapeOf(attrs, sp);
  ValueRef tp = t;
  if (!NonOverlapping(p)) {
    v1::Attrs pad;
    for (int64_t i = 0; i < b.T(y).rank(); ++i) {
      pad.mutable_pad()->add_low(i < 2 ? 0 : p.lo[i - 2]);
      pad.mutable_pad()->add_high(i < 2 ? 0 : p.hi[i - 2]);
    }
    tp = b.r().Add(v1::OP_PAD, {t}, std::move(pad));
  }
  ValueRef out;
  ForEachWindowOffset(b, x, y, p, [&](const ir::Node& slice, ValueRef w) {
    ValueRef ts = b.r().Add(v1::OP_SLICE, {tp}, slice.attrs);
    ValueRef part = b.Mul(ts, w);
    out = Valid(out) ? b.Add(out, part) : part;
  });
  return out;
}

namespace {

// Max pool's derivative: the CPU's one-pass kernel (base/custom_ops.h) where
// the process has it, which legalize decomposes into the composition above
// for devices that do not claim it; else the composition itself.
absl::Status PoolVjp(Builder& b, const ir::Node& n, ValueRef g, std::vector<ValueRef>& grads) {
  const int sp = static_cast<int>(n.type().rank()) - 2;
  const PoolShape p = PoolShapeOf(n.attrs.pool(), sp);
  if (n.attrs.pool().kind() == v1::POOL_AVG) {
    grads[0] = AvgPoolVjp(b, n, p, g);
    return b.status();
  }
  if (CustomOpRegistry::Global().Find(kMaxPoolBackwardOp) != nullptr) {
    v1::Attrs a;
    a.mutable_custom()->set_name(kMaxPoolBackwardOp);
    a.mutable_custom()->set_payload(n.attrs.pool().SerializeAsString());
    grads[0] = b.r().Add(v1::OP_CUSTOM, {n.operands[0], n.out(), g}, std::move(a));
    return b.status();
  }
  grads[0] = MaxPoolVjpComposition(b, n.operands[0], n.out(), n.attrs.pool(), g);
  return b.status();
}

// d prod(x over axes) / d x_i = the product of the other elements, exactly,
// zeros included: with no zero in the group y / x_i; with one, the product of
// the nonzero elements at the zero and 0 elsewhere; with more, 0.
ValueRef ProdOthers(Builder& b, ValueRef x, const std::vector<int64_t>& axes) {
  const DType dt = b.T(x).dtype;
  ValueRef is_zero = b.r().Compare(v1::COMPARE_EQ, x, b.Sc(0, dt));
  ValueRef zeros = b.SumKeep(b.r().Cast(is_zero, dt), axes);
  ValueRef nonzero = b.r().Where(is_zero, b.Sc(1, dt), x);
  ValueRef prod = b.r().Reduce(v1::REDUCE_PROD, nonzero, axes, true);
  ValueRef one_zero = b.r().Where(is_zero, prod, b.Sc(0, dt));
  return b.r().Where(
      b.r().Compare(v1::COMPARE_EQ, zeros, b.Sc(0, dt)), b.Div(prod, nonzero),
      b.r().Where(b.r().Compare(v1::COMPARE_EQ, zeros, b.Sc(1, dt)), one_zero, b.Sc(0, dt)));
}

// FakeQuantize and FakeQuantizeLSQ (docs/quantization.md): x / s on the grid
// [qmin, qmax] with the scale (and zero point) broadcast along the node's axis.
struct FakeQuantParts {
  ValueRef v;     // x / s, in x's dtype
  ValueRef q;     // clamp(round(v) + zp, qmin, qmax) - zp: the grid point
  ValueRef mask;  // 1 where round(v) + zp lies on the grid, else 0
  IrDims s_dims;  // the scale's dims broadcastable to x
};

FakeQuantParts FakeQuant(Builder& b, const ir::Node& n) {
  const bool lsq = n.op == v1::OP_FAKE_QUANTIZE_LSQ;
  const int bits = lsq ? n.attrs.fake_quantize_lsq().bits() : n.attrs.fake_quantize().bits();
  const bool symmetric =
      lsq ? n.attrs.fake_quantize_lsq().symmetric() : n.attrs.fake_quantize().symmetric();
  const bool has_axis =
      lsq ? n.attrs.fake_quantize_lsq().has_axis() : n.attrs.fake_quantize().has_axis();
  const ValueRef x = n.operands[0];
  const TensorType& xt = b.T(x);
  const DType dt = xt.dtype;
  const double qmin = symmetric ? -std::ldexp(1.0, bits - 1) : 0;
  const double qmax = symmetric ? std::ldexp(1.0, bits - 1) - 1 : std::ldexp(1.0, bits) - 1;
  FakeQuantParts p;
  p.s_dims = IrDims(xt.rank(), 1);
  if (has_axis) {
    int64_t axis = lsq ? n.attrs.fake_quantize_lsq().axis() : n.attrs.fake_quantize().axis();
    ir::NormalizeAxis(axis, xt.rank(), &axis);
    p.s_dims[axis] = xt.dims[axis];
  }
  auto fit = [&](ValueRef v) {
    if (b.T(v).dtype != dt) v = b.r().Cast(v, dt);
    return b.Reshape(v, p.s_dims);
  };
  p.v = b.Div(x, fit(n.operands[1]));
  ValueRef r = b.Un(v1::UNARY_ROUND, p.v);
  ValueRef zp = n.operands.size() > 2 ? fit(n.operands[2]) : ValueRef{};
  if (Valid(zp)) r = b.Add(r, zp);
  p.mask = b.Mul(b.Mask(v1::COMPARE_GE, r, b.Sc(qmin, dt), dt),
                 b.Mask(v1::COMPARE_LE, r, b.Sc(qmax, dt), dt));
  p.q =
      b.r().Binary(v1::BINARY_MIN, b.r().Binary(v1::BINARY_MAX, r, b.Sc(qmin, dt)), b.Sc(qmax, dt));
  if (Valid(zp)) p.q = b.Sub(p.q, zp);
  return p;
}

// LSQ's d y / d s (Esser et al. 2020, eq. 3): round(v) - v on the grid, the
// clamped end (qmin or qmax) off it; i.e. q - mask * v.
ValueRef LsqScalePartial(Builder& b, const FakeQuantParts& p) {
  return b.Sub(p.q, b.Mul(p.mask, p.v));
}

}  // namespace

ValueRef Builder::Scale(ValueRef x, double v) {
  if (!Valid(x)) return x;
  return Mul(x, Sc(v, T(x).dtype));
}

ValueRef Builder::Mask(v1::CompareKind kind, ValueRef a, ValueRef b, DType dtype) {
  return r_.Cast(r_.Compare(kind, a, b), dtype);
}

ValueRef Builder::Zeros(const TensorType& t) { return BroadcastTo(Sc(0, t.dtype), t.dims); }

ValueRef Builder::BroadcastTo(ValueRef x, const IrDims& dims) {
  if (!r_.ok()) return ValueRef{};
  if (T(x).dims == dims) return x;
  v1::Attrs a;
  for (int64_t d : dims) a.mutable_expand()->add_shape(d);
  return r_.Add(v1::OP_EXPAND, {x}, std::move(a));
}

ValueRef Builder::SumTo(ValueRef x, const IrDims& dims) {
  if (!r_.ok()) return ValueRef{};
  const IrDims& from = T(x).dims;
  if (from == dims) return x;
  const int64_t extra = static_cast<int64_t>(from.size()) - static_cast<int64_t>(dims.size());
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < static_cast<int64_t>(from.size()); ++i) {
    if (i < extra || (dims[i - extra] == 1 && from[i] != 1)) axes.push_back(i);
  }
  ValueRef s = axes.empty() ? x : r_.Reduce(v1::REDUCE_SUM, x, axes, false);
  return Reshape(s, dims);
}

ValueRef Builder::Reshape(ValueRef x, const IrDims& dims) {
  if (!r_.ok()) return ValueRef{};
  if (T(x).dims == dims) return x;
  return r_.Reshape(x, dims);
}

ValueRef Builder::Iota(int64_t n, DType dtype) {
  auto t = HostTensor::Create(dtype, {n});
  if (!t.ok()) return r_.Scalar(0, v1::DTYPE_UNSPECIFIED);  // sticks the error
  for (int64_t i = 0; i < n; ++i) t->SetFromDouble(i, static_cast<double>(i));
  return r_.Constant(std::move(t).value());
}

ValueRef Builder::Slice(ValueRef x, int64_t axis, int64_t start, int64_t stop) {
  v1::Attrs a;
  a.mutable_slice()->add_axes(axis);
  a.mutable_slice()->add_start(start);
  a.mutable_slice()->add_stop(stop);
  return r_.Add(v1::OP_SLICE, {x}, std::move(a));
}

ValueRef Builder::Pad(ValueRef x, const std::vector<int64_t>& low,
                      const std::vector<int64_t>& high) {
  v1::Attrs a;
  for (int64_t v : low) a.mutable_pad()->add_low(v);
  for (int64_t v : high) a.mutable_pad()->add_high(v);
  return r_.Add(v1::OP_PAD, {x}, std::move(a));
}

bool HasRule(const ir::Node& n) {
  switch (n.op) {
    case v1::OP_UNARY: case v1::OP_BINARY: case v1::OP_WHERE: case v1::OP_CAST:
    case v1::OP_CLAMP: case v1::OP_MATMUL: case v1::OP_SOFTMAX: case v1::OP_LOG_SOFTMAX:
    case v1::OP_RESHAPE: case v1::OP_TRANSPOSE: case v1::OP_SLICE: case v1::OP_CONCAT:
    case v1::OP_EXPAND: case v1::OP_GATHER: case v1::OP_CUMSUM: case v1::OP_ROPE:
    case v1::OP_CONV: case v1::OP_CONV_TRANSPOSE2D:
    case v1::OP_SOFTMAX_CROSS_ENTROPY: case v1::OP_MEAN_SQUARED_ERROR:
      return true;
    case v1::OP_PAD:
      return true;
    case v1::OP_POOL:
      return true;
    case v1::OP_REDUCE:
      return true;
    case v1::OP_FAKE_QUANTIZE:
    case v1::OP_FAKE_QUANTIZE_LSQ:
      return true;
    case v1::OP_CUSTOM:
      return n.attrs.custom().name() == kMaxPoolBackwardOp ||
             n.attrs.custom().name() == kConvBackwardWeightsOp;
    default:
      return false;
  }
}

absl::Status VjpRule(Builder& b, const ir::Node& n, ValueRef g, const std::vector<bool>& need,
                     std::vector<ValueRef>& grads) {
  const TensorType& y = n.type();
  auto dims = [&](int i) -> const IrDims& { return b.T(n.operands[i]).dims; };
  switch (n.op) {
    case v1::OP_UNARY: {
      const auto k = n.attrs.unary().kind();
      if (k == v1::UNARY_IDENTITY) {
        grads[0] = g;
      } else if (k == v1::UNARY_NEG) {
        grads[0] = b.Neg(g);
      } else {
        ValueRef d = UnaryDerivative(b, k, n.operands[0], n.out());
        grads[0] = Valid(d) ? b.Mul(g, d) : b.Zeros(y);
      }
      break;
    }
    case v1::OP_BINARY: {
      BinaryPartials p = BinaryDerivatives(b, n, need[0], need[1]);
      if (need[0]) grads[0] = b.SumTo(b.BroadcastTo(b.Mul(g, p.da), y.dims), dims(0));
      if (need[1]) grads[1] = b.SumTo(b.BroadcastTo(b.Mul(g, p.db), y.dims), dims(1));
      break;
    }
    case v1::OP_WHERE: {
      const ValueRef c = n.operands[0], zero = b.Sc(0, y.dtype);
      if (need[1]) grads[1] = b.SumTo(b.BroadcastTo(b.r().Where(c, g, zero), y.dims), dims(1));
      if (need[2]) grads[2] = b.SumTo(b.BroadcastTo(b.r().Where(c, zero, g), y.dims), dims(2));
      break;
    }
    case v1::OP_CAST:
      grads[0] = b.r().Cast(g, b.T(n.operands[0]).dtype);
      break;
    case v1::OP_CLAMP: {
      const auto& a = n.attrs.clamp();
      const ValueRef x = n.operands[0];
      ValueRef m = g;
      if (a.has_min()) m = b.Mul(m, b.Mask(v1::COMPARE_GE, x, b.Sc(a.min(), y.dtype), y.dtype));
      if (a.has_max()) m = b.Mul(m, b.Mask(v1::COMPARE_LE, x, b.Sc(a.max(), y.dtype), y.dtype));
      grads[0] = m;
      break;
    }
    case v1::OP_MATMUL:
      return MatMulVjp(b, n, g, need, grads);
    case v1::OP_SOFTMAX: {
      const int64_t axis = SoftmaxAxis(n, y.rank());
      ValueRef gy = b.Mul(g, n.out());
      grads[0] = b.Sub(gy, b.Mul(n.out(), b.SumKeep(gy, {axis})));
      break;
    }
    case v1::OP_LOG_SOFTMAX: {
      const int64_t axis = SoftmaxAxis(n, y.rank());
      grads[0] = b.Sub(g, b.Mul(b.Un(v1::UNARY_EXP, n.out()), b.SumKeep(g, {axis})));
      break;
    }
    case v1::OP_RESHAPE:
      grads[0] = b.Reshape(g, dims(0));
      break;
    case v1::OP_TRANSPOSE: {
      const auto& perm = n.attrs.transpose().perm();
      std::vector<int64_t> inv(perm.size());
      for (int i = 0; i < perm.size(); ++i) inv[perm[i]] = i;
      grads[0] = b.r().Transpose(g, inv);
      break;
    }
    case v1::OP_SLICE:
      grads[0] = SliceVjp(b, n, g);
      break;
    case v1::OP_CONCAT: {
      int64_t axis = 0;
      ir::NormalizeAxis(n.attrs.concat().axis(), y.rank(), &axis);
      int64_t offset = 0;
      for (size_t i = 0; i < n.operands.size(); ++i) {
        const int64_t len = dims(i)[axis];
        if (need[i]) grads[i] = b.Slice(g, axis, offset, offset + len);
        offset += len;
      }
      break;
    }
    case v1::OP_EXPAND:
      grads[0] = b.SumTo(g, dims(0));
      break;
    case v1::OP_PAD: {
      if (n.attrs.pad().mode() != v1::PAD_CONSTANT) {
        grads[0] = PadFoldVjp(b, n, g);
        break;
      }
      v1::Attrs a;
      for (int64_t i = 0; i < y.rank(); ++i) {
        a.mutable_slice()->add_start(n.attrs.pad().low(i));
        a.mutable_slice()->add_stop(n.attrs.pad().low(i) + dims(0)[i]);
      }
      grads[0] = b.r().Add(v1::OP_SLICE, {g}, std::move(a));
      break;
    }
    case v1::OP_GATHER:
      if (need[1]) return NoRule(n, "indices are integers");
      grads[0] = GatherVjp(b, n, g);
      break;
    case v1::OP_ROPE:
      grads[0] = RopeTranspose(b, n, g);
      break;
    case v1::OP_CONV:
      return ConvVjp(b, n, g, need, grads);
    case v1::OP_CONV_TRANSPOSE2D:
      return ConvTransposeVjp(b, n, g, need, grads);
    case v1::OP_POOL:
      return PoolVjp(b, n, g, grads);
    case v1::OP_CUSTOM: {
      // kiln.max_pool_backward(x, y, g) is linear in g, and piecewise
      // constant in x and y (no gradient there, as for the compare it
      // replaces). Its adjoint in g picks each window's first maximum: max
      // pool's JVP.
      if (n.attrs.custom().name() == kConvBackwardWeightsOp) {
        // dw(x, g) is bilinear: <G, dw(x, g)> = <g, conv(x, G)>, so x gets
        // the conv's input gradient of g with G as the weights, and g gets
        // conv(x, G); w is read for its shape only.
        v1::ConvAttrs conv;
        if (!conv.ParseFromString(n.attrs.custom().payload())) return NoRule(n, "unreadable payload");
        const ConvShape c = ConvShapeOf(conv, 2);
        ValueRef unused;
        if (need[0]) ConvGroupVjp(b, c, n.operands[0], g, n.operands[1], true, false, &grads[0], &unused);
        if (need[1]) grads[1] = ConvNode(b, n.operands[0], g, c.stride, c.dilation, c.lo, c.hi);
        break;
      }
      if (n.attrs.custom().name() != kMaxPoolBackwardOp) return NoRule(n, "custom op");
      v1::PoolAttrs pool;
      if (!pool.ParseFromString(n.attrs.custom().payload())) return NoRule(n, "unreadable payload");
      if (need[2]) grads[2] = MaxPoolJvpComposition(b, n.operands[0], n.operands[1], pool, g);
      break;
    }
    case v1::OP_CUMSUM: {
      v1::Attrs a = n.attrs;
      a.mutable_cumsum()->set_reverse(!n.attrs.cumsum().reverse());
      grads[0] = b.r().Add(v1::OP_CUMSUM, {g}, std::move(a));
      break;
    }
    case v1::OP_REDUCE: {
      const auto& a = n.attrs.reduce();
      const TensorType& x = b.T(n.operands[0]);
      const std::vector<int64_t> axes = NormalizedAxes(a.axes(), x.rank());
      const IrDims keep = KeepDims(x.dims, axes);
      ValueRef gk = b.BroadcastTo(b.Reshape(g, keep), x.dims);
      switch (a.kind()) {
        case v1::REDUCE_SUM:
          grads[0] = gk;
          break;
        case v1::REDUCE_MEAN: {
          int64_t count = 1;
          for (int64_t ax : axes) count *= x.dims[ax];
          grads[0] = b.Scale(gk, 1.0 / static_cast<double>(count));
          break;
        }
        case v1::REDUCE_MAX:
        case v1::REDUCE_MIN: {
          // Ties share the cotangent evenly (torch.amax, jax.numpy.max).
          ValueRef hit = b.Mask(v1::COMPARE_EQ, n.operands[0],
                                b.BroadcastTo(b.Reshape(n.out(), keep), x.dims), x.dtype);
          grads[0] = b.Mul(gk, b.Div(hit, b.SumKeep(hit, axes)));
          break;
        }
        case v1::REDUCE_PROD:
          grads[0] = b.Mul(gk, ProdOthers(b, n.operands[0], axes));
          break;
        default:
          return NoRule(n, "unknown reduce kind");
      }
      break;
    }
    case v1::OP_SOFTMAX_CROSS_ENTROPY: {
      if (need[1] && IsInteger(b.T(n.operands[1]).dtype)) return NoRule(n, "labels are integers");
      XentParts p = Xent(b, n, need[1]);
      ValueRef w = XentRowScale(b, n, p, g);
      if (need[0]) grads[0] = b.Reshape(b.Mul(p.row_grad, w), dims(0));
      if (need[1]) grads[1] = b.Reshape(b.Mul(p.label_grad, w), dims(1));
      break;
    }
    case v1::OP_MEAN_SQUARED_ERROR: {
      const auto red = n.attrs.mean_squared_error().reduction();
      const IrDims& pd = dims(0);
      ValueRef d = b.Scale(b.Sub(n.operands[0], n.operands[1]), 2.0);  // pred's shape
      ValueRef gp = b.Mul(d, red == v1::REDUCTION_NONE ? g : b.BroadcastTo(g, pd));
      if (red == v1::REDUCTION_MEAN) {
        gp = b.Scale(gp, 1.0 / static_cast<double>(std::max<int64_t>(1, Product(pd))));
      }
      if (need[0]) grads[0] = gp;
      if (need[1]) grads[1] = b.SumTo(b.Neg(gp), dims(1));
      break;
    }
    case v1::OP_FAKE_QUANTIZE:
    case v1::OP_FAKE_QUANTIZE_LSQ: {
      // The straight-through estimator, clipped as PyTorch's fake_quantize:
      // the cotangent passes where x lands on the grid. FakeQuantize's scale
      // and zero point get none (they are observers' statistics, as in
      // torch.ao.quantization); LSQ's scale gets its published gradient.
      FakeQuantParts p = FakeQuant(b, n);
      if (need[0]) grads[0] = b.Mul(g, p.mask);
      if (n.op == v1::OP_FAKE_QUANTIZE_LSQ && need[1]) {
        ValueRef gs = b.Reshape(b.SumTo(b.Mul(g, LsqScalePartial(b, p)), p.s_dims), dims(1));
        if (b.T(gs).dtype != b.T(n.operands[1]).dtype)
          gs = b.r().Cast(gs, b.T(n.operands[1]).dtype);
        grads[1] = gs;
      }
      break;
    }
    default:
      return NoRule(n, "the op has no gradient rule");
  }
  return b.status();
}

absl::StatusOr<ValueRef> JvpRule(Builder& b, const ir::Node& n,
                                 const std::vector<ValueRef>& t) {
  const TensorType& y = n.type();
  auto fit = [&](ValueRef v) { return b.BroadcastTo(v, y.dims); };
  ValueRef out;
  switch (n.op) {
    case v1::OP_UNARY: {
      const auto k = n.attrs.unary().kind();
      if (k == v1::UNARY_IDENTITY) {
        out = t[0];
      } else if (k == v1::UNARY_NEG) {
        out = b.Neg(t[0]);
      } else {
        ValueRef d = UnaryDerivative(b, k, n.operands[0], n.out());
        out = Valid(d) ? b.Mul(t[0], d) : b.Zeros(y);
      }
      break;
    }
    case v1::OP_BINARY: {
      BinaryPartials p = BinaryDerivatives(b, n, Valid(t[0]), Valid(t[1]));
      ValueRef l = Valid(t[0]) ? b.Mul(t[0], p.da) : ValueRef{};
      ValueRef r = Valid(t[1]) ? b.Mul(t[1], p.db) : ValueRef{};
      out = fit(Valid(l) && Valid(r) ? b.Add(l, r) : (Valid(l) ? l : r));
      break;
    }
    case v1::OP_WHERE: {
      const ValueRef zero = b.Sc(0, y.dtype);
      out = fit(b.r().Where(n.operands[0], Valid(t[1]) ? t[1] : zero, Valid(t[2]) ? t[2] : zero));
      break;
    }
    case v1::OP_CAST:
      out = b.r().Cast(t[0], y.dtype);
      break;
    case v1::OP_CLAMP: {
      std::vector<ValueRef> grads(1);
      if (auto s = VjpRule(b, n, t[0], {true}, grads); !s.ok()) return s;
      out = grads[0];  // elementwise: the mask times the tangent
      break;
    }
    case v1::OP_MATMUL: {
      const auto& a = n.attrs.matmul();
      ValueRef l = Valid(t[0]) ? b.r().MatMul(t[0], n.operands[1], a.transpose_a(), a.transpose_b())
                               : ValueRef{};
      ValueRef r = Valid(t[1]) ? b.r().MatMul(n.operands[0], t[1], a.transpose_a(), a.transpose_b())
                               : ValueRef{};
      out = Valid(l) && Valid(r) ? b.Add(l, r) : (Valid(l) ? l : r);
      break;
    }
    case v1::OP_SOFTMAX: {
      const int64_t axis = SoftmaxAxis(n, y.rank());
      ValueRef ty = b.Mul(t[0], n.out());
      out = b.Sub(ty, b.Mul(n.out(), b.SumKeep(ty, {axis})));
      break;
    }
    case v1::OP_LOG_SOFTMAX: {
      const int64_t axis = SoftmaxAxis(n, y.rank());
      out = b.Sub(t[0], b.SumKeep(b.Mul(b.Un(v1::UNARY_EXP, n.out()), t[0]), {axis}));
      break;
    }
    case v1::OP_RESHAPE: case v1::OP_TRANSPOSE: case v1::OP_SLICE: case v1::OP_EXPAND:
    case v1::OP_CUMSUM:
      out = b.Same(n, {t[0]});
      break;
    case v1::OP_PAD: {
      v1::Attrs a = n.attrs;  // linear in x: the same padding of the tangent
      a.mutable_pad()->set_value(0);
      out = b.r().Add(v1::OP_PAD, {t[0]}, std::move(a));
      break;
    }
    case v1::OP_CONCAT: {
      std::vector<ValueRef> parts;
      for (size_t i = 0; i < n.operands.size(); ++i) {
        parts.push_back(Valid(t[i]) ? t[i] : b.Zeros(b.T(n.operands[i])));
      }
      out = b.Same(n, std::move(parts));
      break;
    }
    case v1::OP_GATHER:
      if (!Valid(t[0])) return ValueRef{};
      out = b.Same(n, {t[0], n.operands[1]});
      break;
    case v1::OP_CUSTOM:  // kiln.max_pool_backward: linear in g (VjpRule says why)
      if (n.attrs.custom().name() == kConvBackwardWeightsOp) {  // bilinear in x and g
        if (Valid(t[0])) out = b.Same(n, {t[0], n.operands[1], n.operands[2]});
        if (Valid(t[1])) {
          const ValueRef part = b.Same(n, {n.operands[0], t[1], n.operands[2]});
          out = Valid(out) ? b.Add(out, part) : part;
        }
        if (!Valid(out)) return ValueRef{};
        break;
      }
      if (n.attrs.custom().name() != kMaxPoolBackwardOp) return NoRule(n, "custom op");
      if (!Valid(t[2])) return ValueRef{};
      out = b.Same(n, {n.operands[0], n.operands[1], t[2]});
      break;
    case v1::OP_POOL: {
      if (n.attrs.pool().kind() == v1::POOL_AVG) {
        out = b.Same(n, {t[0]});  // linear
        break;
      }
      out = MaxPoolJvpComposition(b, n.operands[0], n.out(), n.attrs.pool(), t[0]);
      break;
    }
    case v1::OP_CONV: case v1::OP_CONV_TRANSPOSE2D: {
      // Bilinear in (x, w), plus the bias.
      ValueRef l = Valid(t[0]) ? b.Same(n, {t[0], n.operands[1]}) : ValueRef{};
      ValueRef r = Valid(t[1]) ? b.Same(n, {n.operands[0], t[1]}) : ValueRef{};
      out = Valid(l) && Valid(r) ? b.Add(l, r) : (Valid(l) ? l : r);
      if (n.operands.size() == 3 && Valid(t[2])) {
        IrDims bd(y.rank(), 1);
        bd[1] = y.dims[1];
        ValueRef tb = b.BroadcastTo(b.Reshape(t[2], bd), y.dims);
        out = Valid(out) ? b.Add(out, tb) : tb;
      }
      break;
    }
    case v1::OP_ROPE: {
      std::vector<ValueRef> operands = {t[0]};
      if (n.operands.size() == 2) operands.push_back(n.operands[1]);
      out = b.Same(n, std::move(operands));
      break;
    }
    case v1::OP_REDUCE: {
      const auto& a = n.attrs.reduce();
      if (a.kind() == v1::REDUCE_SUM || a.kind() == v1::REDUCE_MEAN) {
        out = b.Same(n, {t[0]});
        break;
      }
      const TensorType& x = b.T(n.operands[0]);
      const std::vector<int64_t> axes = NormalizedAxes(a.axes(), x.rank());
      if (a.kind() == v1::REDUCE_PROD) {
        out = b.r().Reduce(v1::REDUCE_SUM, b.Mul(t[0], ProdOthers(b, n.operands[0], axes)), axes,
                           a.keepdims());
        break;
      }
      ValueRef hit = b.Mask(v1::COMPARE_EQ, n.operands[0],
                            b.BroadcastTo(b.Reshape(n.out(), KeepDims(x.dims, axes)), x.dims),
                            x.dtype);
      ValueRef w = b.Div(hit, b.SumKeep(hit, axes));
      out = b.r().Reduce(v1::REDUCE_SUM, b.Mul(t[0], w), axes, a.keepdims());
      break;
    }
    case v1::OP_SOFTMAX_CROSS_ENTROPY: {
      const bool soft = !IsInteger(b.T(n.operands[1]).dtype);
      XentParts p = Xent(b, n, soft && Valid(t[1]));
      ValueRef dl;  // [R]: the tangent of each row's loss
      if (Valid(t[0])) {
        ValueRef tx = b.Reshape(t[0], {p.rows, p.classes});
        dl = b.r().Reduce(v1::REDUCE_SUM, b.Mul(p.row_grad, tx), {1}, false);
      }
      if (soft && Valid(t[1])) {
        ValueRef tq = b.Reshape(t[1], {p.rows, p.classes});
        ValueRef d = b.r().Reduce(v1::REDUCE_SUM, b.Mul(p.label_grad, tq), {1}, false);
        dl = Valid(dl) ? b.Add(dl, d) : d;
      }
      if (!Valid(dl)) return ValueRef{};
      if (n.attrs.softmax_cross_entropy().reduction() == v1::REDUCTION_NONE) {
        out = b.Reshape(Valid(p.weight) ? b.Mul(dl, p.weight) : dl, y.dims);
        break;
      }
      ValueRef w = b.Reshape(XentRowScale(b, n, p, b.Sc(1, y.dtype)), {p.rows});
      out = b.r().Reduce(v1::REDUCE_SUM, b.Mul(dl, w), {0}, false);
      break;
    }
    case v1::OP_MEAN_SQUARED_ERROR: {
      const auto red = n.attrs.mean_squared_error().reduction();
      const IrDims& pd = b.T(n.operands[0]).dims;
      ValueRef d = b.Scale(b.Sub(n.operands[0], n.operands[1]), 2.0);
      ValueRef tp = Valid(t[0]) ? t[0] : b.Sc(0, y.dtype);
      ValueRef dt = Valid(t[1]) ? b.Sub(tp, t[1]) : tp;
      ValueRef e = b.BroadcastTo(b.Mul(d, dt), pd);
      if (red == v1::REDUCTION_NONE) {
        out = e;
      } else {
        out = b.r().Reduce(red == v1::REDUCTION_MEAN ? v1::REDUCE_MEAN : v1::REDUCE_SUM, e, {},
                           false);
      }
      break;
    }
    case v1::OP_FAKE_QUANTIZE:
    case v1::OP_FAKE_QUANTIZE_LSQ: {
      FakeQuantParts p = FakeQuant(b, n);
      ValueRef tx = Valid(t[0]) ? b.Mul(t[0], p.mask) : ValueRef{};
      ValueRef ts;
      if (n.op == v1::OP_FAKE_QUANTIZE_LSQ && Valid(t[1])) {
        ValueRef s = t[1];
        if (b.T(s).dtype != y.dtype) s = b.r().Cast(s, y.dtype);
        ts = b.Mul(b.Reshape(s, p.s_dims), LsqScalePartial(b, p));
      }
      out = Valid(tx) && Valid(ts) ? b.Add(tx, ts)
            : Valid(tx)            ? tx
            : Valid(ts)            ? fit(ts)
                                   : b.Zeros(y);
      break;
    }
    default:
      return NoRule(n, "the op has no derivative rule");
  }
  if (!b.status().ok()) return b.status();
  return out;
}

}  // namespace kiln::passes::ad
