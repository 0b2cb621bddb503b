#include "engine/ir/infer.h"

#include <cmath>

#include "engine/ir/infer_internal.h"

namespace kiln::ir {

using infer_internal::Ctx;
using infer_internal::DimsCompatible;

bool NormalizeAxis(int64_t axis, int64_t rank, int64_t* out) {
  if (axis < -rank || axis >= rank) return false;
  *out = axis < 0 ? axis + rank : axis;
  return true;
}

bool BroadcastDims(const IrDims& a, const IrDims& b, IrDims* out) {
  const size_t rank = std::max(a.size(), b.size());
  IrDims r(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == db) {
      r[i] = da;
    } else if (da == 1) {
      r[i] = db;
    } else if (db == 1) {
      r[i] = da;
    } else if (da >= 0 && db >= 0) {
      return false;
    } else if (da >= 0) {
      r[i] = da;  // a symbolic dim must equal the concrete one (or be 1)
    } else if (db >= 0) {
      r[i] = db;
    } else {
      r[i] = kDynamic;
    }
  }
  *out = std::move(r);
  return true;
}

namespace infer_internal {

absl::Status Ctx::Arity(int min, int max) const {
  const int n = num_operands();
  if (n >= min && n <= max) return absl::OkStatus();
  if (min == max) return Error("expects ", min, " operand(s), got ", n);
  return Error("expects ", min, " to ", max, " operands, got ", n);
}

absl::Status Ctx::NeedFloat(int operand) const {
  if (IsFloat(in(operand).dtype)) return absl::OkStatus();
  return Error("operand ", operand, " must be a float type, got ", T(operand));
}

absl::Status Ctx::SameDType(int a, int b) const {
  if (in(a).dtype == in(b).dtype) return absl::OkStatus();
  return Error("dtype mismatch: operand ", a, " is ", T(a), ", operand ", b, " is ", T(b),
               " (insert a cast)");
}

absl::Status Ctx::Rank(int operand, int64_t min, int64_t max) const {
  const int64_t r = in(operand).rank();
  if (r >= min && r <= max) return absl::OkStatus();
  if (min == max) return Error("operand ", operand, " must have rank ", min, ", got ", T(operand));
  return Error("operand ", operand, " must have rank ", min, "..", max, ", got ", T(operand));
}

absl::Status Ctx::Axis(int64_t axis, int64_t rank, const char* field, int64_t* out) const {
  if (NormalizeAxis(axis, rank, out)) return absl::OkStatus();
  return Error("attribute ", field, "=", axis, " is out of range for rank ", rank);
}

absl::Status Ctx::Set(TensorType t) {
  node.outputs.clear();
  node.outputs.push_back(std::move(t));
  return absl::OkStatus();
}

namespace {

bool IsBool(DType d) { return d == v1::DTYPE_BOOL; }

absl::Status InferUnary(Ctx& c) {
  if (!c.node.attrs.has_unary()) return c.Error("missing unary attributes");
  const v1::UnaryKind kind = c.node.attrs.unary().kind();
  if (kind == v1::UNARY_KIND_UNSPECIFIED || !v1::UnaryKind_IsValid(kind)) {
    return c.Error("unknown unary kind ", static_cast<int>(kind));
  }
  const DType d = c.in(0).dtype;
  const bool int_ok = kind == v1::UNARY_IDENTITY || kind == v1::UNARY_RELU ||
                      kind == v1::UNARY_NEG || kind == v1::UNARY_ABS || kind == v1::UNARY_SIGN;
  if (!IsFloat(d) && !(int_ok && IsSignedInteger(d))) {
    return c.Error(v1::UnaryKind_Name(kind), " needs a float", int_ok ? " or signed integer" : "",
                   " operand, got ", c.T(0));
  }
  return c.Set(c.in(0));
}

absl::Status InferBroadcast(Ctx& c, int first, int last, DType out_dtype) {
  IrDims dims = c.in(first).dims;
  for (int i = first + 1; i <= last; ++i) {
    IrDims next;
    if (!BroadcastDims(dims, c.in(i).dims, &next)) {
      return c.Error("operands do not broadcast: ", c.T(first), " and ", c.T(i));
    }
    dims = std::move(next);
  }
  return c.Set(TensorType(out_dtype, std::move(dims)));
}

}  // namespace

absl::Status InferElementwise(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_UNARY:
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      return InferUnary(c);
    case v1::OP_BINARY: {
      if (auto s = c.Arity(2, 2); !s.ok()) return s;
      if (!c.node.attrs.has_binary()) return c.Error("missing binary attributes");
      const auto kind = c.node.attrs.binary().kind();
      if (kind == v1::BINARY_KIND_UNSPECIFIED || !v1::BinaryKind_IsValid(kind)) {
        return c.Error("unknown binary kind ", static_cast<int>(kind));
      }
      if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      const DType d = c.in(0).dtype;
      if (IsBool(d) || IsQuantized(d)) return c.Error("binary ops need numbers, got ", c.T(0));
      if (kind == v1::BINARY_POW && !IsFloat(d)) return c.Error("pow needs floats, got ", c.T(0));
      return InferBroadcast(c, 0, 1, d);
    }
    case v1::OP_COMPARE: {
      if (auto s = c.Arity(2, 2); !s.ok()) return s;
      if (!c.node.attrs.has_compare()) return c.Error("missing compare attributes");
      const auto kind = c.node.attrs.compare().kind();
      if (kind == v1::COMPARE_KIND_UNSPECIFIED || !v1::CompareKind_IsValid(kind)) {
        return c.Error("unknown compare kind ", static_cast<int>(kind));
      }
      if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      if (IsQuantized(c.in(0).dtype)) return c.Error("cannot compare ", c.T(0));
      return InferBroadcast(c, 0, 1, v1::DTYPE_BOOL);
    }
    case v1::OP_WHERE: {
      if (auto s = c.Arity(3, 3); !s.ok()) return s;
      if (!IsBool(c.in(0).dtype)) return c.Error("condition (operand 0) must be bool, got ", c.T(0));
      if (auto s = c.SameDType(1, 2); !s.ok()) return s;
      return InferBroadcast(c, 0, 2, c.in(1).dtype);
    }
    case v1::OP_CAST: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      const DType to = c.node.attrs.cast().to();
      if (!IsKnownDType(to) || IsQuantized(to)) {
        return c.Error("attribute to=", static_cast<int>(to), " is not a dense dtype");
      }
      if (IsQuantized(c.in(0).dtype)) return c.Error("cast cannot read ", c.T(0), " (use dequantize)");
      return c.Set(TensorType(to, c.in(0).dims));
    }
    case v1::OP_CLAMP: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      const auto& a = c.node.attrs.clamp();
      if (!IsFloat(c.in(0).dtype) && !IsInteger(c.in(0).dtype)) {
        return c.Error("clamp needs numbers, got ", c.T(0));
      }
      if (a.has_min() && a.has_max() && !(a.min() <= a.max())) {
        return c.Error("attribute min=", a.min(), " exceeds max=", a.max());
      }
      if ((a.has_min() && std::isnan(a.min())) || (a.has_max() && std::isnan(a.max()))) {
        return c.Error("clamp bounds must not be NaN");
      }
      return c.Set(c.in(0));
    }
    default:
      return c.Error("not an elementwise op");
  }
}

absl::Status InferLinalg(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_MATMUL: {
      if (auto s = c.Arity(2, 2); !s.ok()) return s;
      // The integer product (ONNX's MatMulInteger): i8 or u8 @ i8, exact in
      // i32 accumulation (the int8 inference form, docs/quantization.md).
      const DType ad = c.in(0).dtype, bd = c.in(1).dtype;
      const bool integer = ad == v1::DTYPE_I8 || ad == v1::DTYPE_U8;
      if (integer && bd != v1::DTYPE_I8) {
        return c.Error("an integer matmul is i8 or u8 @ i8, got ", c.T(0), " @ ", c.T(1));
      }
      if (!integer) {
        if (auto s = c.NeedFloat(0); !s.ok()) return s;
        if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      }
      if (auto s = c.Rank(0, 1, c.limits.max_rank); !s.ok()) return s;
      if (auto s = c.Rank(1, 1, c.limits.max_rank); !s.ok()) return s;
      const auto& attrs = c.node.attrs.matmul();
      IrDims a = c.in(0).dims, b = c.in(1).dims;
      const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
      if (a_vec) a.insert(a.begin(), 1);
      if (b_vec) b.push_back(1);
      const size_t ra = a.size(), rb = b.size();
      // As in numpy, a vector has no transpose: the flag applies to matrices.
      const bool ta = attrs.transpose_a() && !a_vec, tb = attrs.transpose_b() && !b_vec;
      const int64_t m = ta ? a[ra - 1] : a[ra - 2];
      const int64_t ka = ta ? a[ra - 2] : a[ra - 1];
      const int64_t kb = tb ? b[rb - 1] : b[rb - 2];
      const int64_t n = tb ? b[rb - 2] : b[rb - 1];
      if (!DimsCompatible(ka, kb)) {
        return c.Error("contracting dims differ: ", c.T(0), " @ ", c.T(1), " (K ", ka, " vs ", kb,
                       ")");
      }
      IrDims batch;
      if (!BroadcastDims(IrDims(a.begin(), a.end() - 2), IrDims(b.begin(), b.end() - 2), &batch)) {
        return c.Error("batch dims do not broadcast: ", c.T(0), " @ ", c.T(1));
      }
      IrDims out = batch;
      if (!a_vec) out.push_back(m);
      if (!b_vec) out.push_back(n);
      return c.Set(TensorType(integer ? v1::DTYPE_I32 : ad, std::move(out)));
    }
    case v1::OP_DOT_GENERAL: {
      if (auto s = c.Arity(2, 2); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      const auto& d = c.node.attrs.dot_general();
      const IrDims& a = c.in(0).dims;
      const IrDims& b = c.in(1).dims;
      if (d.lhs_contracting_size() != d.rhs_contracting_size() ||
          d.lhs_batch_size() != d.rhs_batch_size()) {
        return c.Error("lhs and rhs must list as many contracting and batch dims");
      }
      std::vector<bool> used_a(a.size()), used_b(b.size());
      auto take = [&](int64_t axis, const IrDims& dims, std::vector<bool>& used, const char* field,
                      int64_t* out) -> absl::Status {
        if (axis < 0 || axis >= static_cast<int64_t>(dims.size())) {
          return c.Error("attribute ", field, " axis ", axis, " out of range for rank ", dims.size());
        }
        if (used[axis]) return c.Error("attribute ", field, " repeats axis ", axis);
        used[axis] = true;
        *out = dims[axis];
        return absl::OkStatus();
      };
      IrDims out;
      for (int i = 0; i < d.lhs_batch_size(); ++i) {
        int64_t da, db;
        if (auto s = take(d.lhs_batch(i), a, used_a, "lhs_batch", &da); !s.ok()) return s;
        if (auto s = take(d.rhs_batch(i), b, used_b, "rhs_batch", &db); !s.ok()) return s;
        if (!DimsCompatible(da, db)) return c.Error("batch dim ", i, " differs: ", da, " vs ", db);
        out.push_back(da >= 0 ? da : db);
      }
      for (int i = 0; i < d.lhs_contracting_size(); ++i) {
        int64_t da, db;
        if (auto s = take(d.lhs_contracting(i), a, used_a, "lhs_contracting", &da); !s.ok()) return s;
        if (auto s = take(d.rhs_contracting(i), b, used_b, "rhs_contracting", &db); !s.ok()) return s;
        if (!DimsCompatible(da, db)) {
          return c.Error("contracting dim ", i, " differs: ", da, " vs ", db);
        }
      }
      for (size_t i = 0; i < a.size(); ++i) if (!used_a[i]) out.push_back(a[i]);
      for (size_t i = 0; i < b.size(); ++i) if (!used_b[i]) out.push_back(b[i]);
      return c.Set(TensorType(c.in(0).dtype, std::move(out)));
    }
    case v1::OP_DENSE_SOLVE: {
      if (auto s = c.Arity(2, 2); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (auto s = c.SameDType(0, 1); !s.ok()) return s;
      if (auto s = c.Rank(0, 2, c.limits.max_rank); !s.ok()) return s;
      if (auto s = c.Rank(1, 1, c.limits.max_rank); !s.ok()) return s;
      const IrDims& a = c.in(0).dims;
      const IrDims& b = c.in(1).dims;
      const int64_t n = a[a.size() - 1];
      if (!DimsCompatible(a[a.size() - 2], n)) return c.Error("A must be square, got ", c.T(0));
      // b is [..., n] (vector) or [..., n, k].
      const bool vec = b.size() == a.size() - 1;
      if (!vec && b.size() != a.size()) {
        return c.Error("b must have rank ", a.size() - 1, " or ", a.size(), ", got ", c.T(1));
      }
      const int64_t bn = vec ? b[b.size() - 1] : b[b.size() - 2];
      if (!DimsCompatible(bn, n)) return c.Error("b has ", bn, " rows, A has ", n);
      // One system per batch element: the batch dims agree (no broadcasting).
      for (size_t k = 0; k + 2 < a.size(); ++k) {
        if (!DimsCompatible(a[k], b[k])) {
          return c.Error("batch dims of A ", c.T(0), " and b ", c.T(1), " differ at dim ", k);
        }
      }
      return c.Set(c.in(1));
    }
    default:
      return c.Error("not a linear-algebra op");
  }
}

namespace {

absl::Status CheckNormParams(Ctx& c, int64_t axis_attr, bool has_axis, int first_param) {
  const TensorType& x = c.in(0);
  int64_t axis;
  if (auto s = c.Axis(has_axis ? axis_attr : -1, x.rank(), "axis", &axis); !s.ok()) return s;
  const IrDims norm(x.dims.begin() + axis, x.dims.end());
  for (int i = first_param; i < c.num_operands(); ++i) {
    if (auto s = c.SameDType(0, i); !s.ok()) return s;
    const IrDims& p = c.in(i).dims;
    bool ok = p.size() == norm.size();
    for (size_t k = 0; ok && k < p.size(); ++k) ok = DimsCompatible(p[k], norm[k]);
    if (!ok) {
      return c.Error("operand ", i, " must be shaped like the normalized dims ",
                     TypeToString(TensorType(x.dtype, norm), c.graph.symbols()), ", got ", c.T(i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckEpsilon(Ctx& c, bool has, double eps) {
  if (has && !(eps > 0.0 && std::isfinite(eps))) {
    return c.Error("attribute epsilon=", eps, " must be positive and finite");
  }
  return absl::OkStatus();
}

absl::Status InferAttention(Ctx& c) {
  const auto& a = c.node.attrs.attention();
  const bool needs_mask = a.mask() == v1::MASK_CUSTOM || a.mask() == v1::MASK_BIAS;
  if (!v1::MaskKind_IsValid(a.mask())) {
    return c.Error("unknown mask kind ", static_cast<int>(a.mask()));
  }
  if (auto s = c.Arity(needs_mask ? 4 : 3, needs_mask ? 4 : 3); !s.ok()) {
    return needs_mask ? c.Error("mask ", v1::MaskKind_Name(a.mask()),
                                " needs a 4th operand (the mask or bias)")
                      : s;
  }
  // Rank 4: q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv]. Rank 3
  // (the packed layout a projection writes, which fuse gives the CPU's
  // kernel in place of the head transposes): q [B, Sq, Hq*D], k [B, Sk,
  // Hkv*D], v [B, Sk, Hkv*Dv] with the heads named by the attributes heads
  // (required) and kv_heads (0 = heads); the result [B, Sq, Hq*Dv].
  const bool packed = c.in(0).rank() == 3;
  for (int i = 0; i < 3; ++i) {
    if (packed ? c.in(i).rank() != 3 : c.in(i).rank() != 4) {
      return c.Error("operand ", i, " must be [B, H, S, D] (rank 4), or [B, S, H*D] (rank 3) "
                     "like q, got ", c.T(i));
    }
  }
  if (auto s = c.NeedFloat(0); !s.ok()) return s;
  if (auto s = c.SameDType(0, 1); !s.ok()) return s;
  if (auto s = c.SameDType(0, 2); !s.ok()) return s;
  IrDims q = c.in(0).dims, k = c.in(1).dims, v = c.in(2).dims;
  if (packed) {
    const int64_t hq = a.heads(), hkv = a.kv_heads() != 0 ? a.kv_heads() : a.heads();
    if (hq <= 0 || hkv <= 0) {
      return c.Error("rank-3 q, k, v ([B, S, H*D]) need attribute heads > 0 (and kv_heads >= 0)");
    }
    // Back to [B, H, S, D] for the checks below; a symbolic last dim stays
    // unknown (its head dim too).
    auto split = [&](const IrDims& x, int64_t heads, int i, IrDims* out) -> absl::Status {
      if (x[2] >= 0 && x[2] % heads != 0) {
        return c.Error("operand ", i, "'s last dim must divide by its ", heads, " heads, got ",
                       c.T(i));
      }
      *out = {x[0], heads, x[1], x[2] >= 0 ? x[2] / heads : kDynamic};
      return absl::OkStatus();
    };
    if (auto s = split(c.in(0).dims, hq, 0, &q); !s.ok()) return s;
    if (auto s = split(c.in(1).dims, hkv, 1, &k); !s.ok()) return s;
    if (auto s = split(c.in(2).dims, hkv, 2, &v); !s.ok()) return s;
  }
  if (!DimsCompatible(q[0], k[0]) || !DimsCompatible(k[0], v[0])) {
    return c.Error("batch differs: q ", c.T(0), ", k ", c.T(1), ", v ", c.T(2));
  }
  if (!DimsCompatible(k[1], v[1]) || !DimsCompatible(k[2], v[2])) {
    return c.Error("k and v must share heads and sequence: k ", c.T(1), ", v ", c.T(2));
  }
  if (!DimsCompatible(q[3], k[3])) return c.Error("head dim differs: q ", c.T(0), ", k ", c.T(1));
  if (q[1] >= 0 && k[1] > 0 && q[1] % k[1] != 0) {
    return c.Error("query heads ", q[1], " must be a multiple of kv heads ", k[1]);
  }
  if (k[1] == 0 && q[1] > 0) return c.Error("kv heads must be positive");
  if (a.heads() != 0 && q[1] >= 0 && a.heads() != q[1]) {
    return c.Error("attribute heads=", a.heads(), " but q has ", q[1], " heads");
  }
  if (a.kv_heads() != 0 && k[1] >= 0 && a.kv_heads() != k[1]) {
    return c.Error("attribute kv_heads=", a.kv_heads(), " but k has ", k[1], " heads");
  }
  if (a.has_scale() && !std::isfinite(a.scale())) return c.Error("attribute scale must be finite");
  if (a.softcap() < 0 || !std::isfinite(a.softcap())) {
    return c.Error("attribute softcap=", a.softcap(), " must be >= 0 and finite");
  }
  if (a.mask() == v1::MASK_PREFIX && a.prefix() < 0) return c.Error("attribute prefix must be >= 0");
  if (a.mask() == v1::MASK_SLIDING_WINDOW && a.window() <= 0) {
    return c.Error("attribute window must be positive for a sliding-window mask");
  }
  if (a.mask() == v1::MASK_CUSTOM) {
    const TensorType& m = c.in(3);
    if (m.dtype != v1::DTYPE_BOOL) return c.Error("custom mask must be bool, got ", c.T(3));
    const bool ok2 = m.rank() == 2 && DimsCompatible(m.dims[0], q[0]) &&
                     DimsCompatible(m.dims[1], k[2]);
    const bool ok3 = m.rank() == 3 && DimsCompatible(m.dims[0], q[0]) &&
                     DimsCompatible(m.dims[1], q[2]) && DimsCompatible(m.dims[2], k[2]);
    if (!ok2 && !ok3) return c.Error("custom mask must be [B, Sk] or [B, Sq, Sk], got ", c.T(3));
  }
  if (a.mask() == v1::MASK_BIAS) {
    if (auto s = c.SameDType(0, 3); !s.ok()) return s;
    const TensorType& m = c.in(3);
    const IrDims want = {q[0], q[1], q[2], k[2]};
    IrDims out;
    if (m.rank() > 4 || !BroadcastDims(want, m.dims, &out) || out.size() != 4) {
      return c.Error("bias must broadcast to [B, Hq, Sq, Sk], got ", c.T(3));
    }
  }
  if (packed) {
    int64_t width = kDynamic;
    if (v[3] >= 0) {
      const CheckedInt w = CheckedInt(v[3]) * q[1];
      if (!w.ok()) return c.Overflow("the result's last dim, ", q[1], " heads x ", v[3]);
      width = w.get();
    }
    return c.Set(TensorType(c.in(0).dtype, {q[0], q[2], width}));
  }
  return c.Set(TensorType(c.in(0).dtype, {q[0], q[1], q[2], v[3]}));
}

}  // namespace

absl::Status InferNorms(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_SOFTMAX:
    case v1::OP_LOG_SOFTMAX: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      const auto& a = c.node.op == v1::OP_SOFTMAX ? c.node.attrs.softmax()
                                                   : c.node.attrs.log_softmax();
      int64_t axis;
      if (c.in(0).rank() == 0) return c.Error("softmax needs rank >= 1");
      if (auto s = c.Axis(a.has_axis() ? a.axis() : -1, c.in(0).rank(), "axis", &axis); !s.ok()) {
        return s;
      }
      return c.Set(c.in(0));
    }
    case v1::OP_LAYER_NORM: {
      if (auto s = c.Arity(1, 3); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (c.in(0).rank() == 0) return c.Error("layer_norm needs rank >= 1");
      const auto& a = c.node.attrs.layer_norm();
      if (auto s = CheckEpsilon(c, a.has_epsilon(), a.epsilon()); !s.ok()) return s;
      if (auto s = CheckNormParams(c, a.axis(), a.has_axis(), 1); !s.ok()) return s;
      return c.Set(c.in(0));
    }
    case v1::OP_RMS_NORM: {
      if (auto s = c.Arity(1, 2); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (c.in(0).rank() == 0) return c.Error("rms_norm needs rank >= 1");
      const auto& a = c.node.attrs.rms_norm();
      if (auto s = CheckEpsilon(c, a.has_epsilon(), a.epsilon()); !s.ok()) return s;
      if (auto s = CheckNormParams(c, a.axis(), a.has_axis(), 1); !s.ok()) return s;
      return c.Set(c.in(0));
    }
    case v1::OP_GROUP_NORM: {
      if (auto s = c.Arity(1, 3); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (auto s = c.Rank(0, 2, c.limits.max_rank); !s.ok()) return s;
      const auto& a = c.node.attrs.group_norm();
      if (auto s = CheckEpsilon(c, a.has_epsilon(), a.epsilon()); !s.ok()) return s;
      const int64_t ch = c.in(0).dims[1];
      if (a.groups() <= 0) return c.Error("attribute groups must be positive");
      if (ch >= 0 && ch % a.groups() != 0) {
        return c.Error("channels ", ch, " not divisible by groups=", a.groups());
      }
      for (int i = 1; i < c.num_operands(); ++i) {
        if (auto s = c.SameDType(0, i); !s.ok()) return s;
        if (c.in(i).rank() != 1 || !DimsCompatible(c.in(i).dims[0], ch)) {
          return c.Error("operand ", i, " must be [C] = [", ch, "], got ", c.T(i));
        }
      }
      return c.Set(c.in(0));
    }
    case v1::OP_ROPE: {
      if (auto s = c.Arity(1, 2); !s.ok()) return s;
      if (auto s = c.NeedFloat(0); !s.ok()) return s;
      if (auto s = c.Rank(0, 4, 4); !s.ok()) return c.Error("x must be [B, H, S, D], got ", c.T(0));
      const auto& a = c.node.attrs.rope();
      const int64_t d = c.in(0).dims[3];
      const int64_t rd = a.rotary_dim() == 0 ? d : a.rotary_dim();
      if (a.rotary_dim() < 0) return c.Error("attribute rotary_dim must be >= 0");
      if (rd >= 0 && rd % 2 != 0) return c.Error("rotary dim ", rd, " must be even");
      if (d >= 0 && rd > d) return c.Error("rotary_dim ", rd, " exceeds head dim ", d);
      if (a.has_theta() && !(a.theta() > 0 && std::isfinite(a.theta()))) {
        return c.Error("attribute theta must be positive");
      }
      // Default positions are position_offset .. position_offset + S - 1.
      const int64_t seq = c.in(0).dims[2];
      if (c.num_operands() == 1 && seq > 0 && !(CheckedInt(a.position_offset()) + (seq - 1)).ok()) {
        return c.Overflow("the last default position, attribute position_offset=",
                          a.position_offset(), " + ", seq - 1);
      }
      if (c.num_operands() == 2) {
        const TensorType& p = c.in(1);
        if (!IsInteger(p.dtype)) return c.Error("positions must be integers, got ", c.T(1));
        const IrDims& x = c.in(0).dims;
        const bool ok = (p.rank() == 1 && DimsCompatible(p.dims[0], x[2])) ||
                        (p.rank() == 2 && DimsCompatible(p.dims[0], x[0]) &&
                         DimsCompatible(p.dims[1], x[2]));
        if (!ok) return c.Error("positions must be [S] or [B, S], got ", c.T(1));
      }
      return c.Set(c.in(0));
    }
    case v1::OP_ATTENTION:
      return InferAttention(c);
    default:
      return c.Error("not a normalization op");
  }
}

}  // namespace infer_internal

absl::Status InferNode(const Graph& graph, Node& node, const InferLimits& limits, int depth) {
  Ctx c{graph, node, limits, depth};
  absl::Status status;
  switch (node.op) {
    case v1::OP_UNARY: case v1::OP_BINARY: case v1::OP_COMPARE: case v1::OP_WHERE:
    case v1::OP_CAST: case v1::OP_CLAMP:
      status = infer_internal::InferElementwise(c);
      break;
    case v1::OP_MATMUL: case v1::OP_DOT_GENERAL: case v1::OP_DENSE_SOLVE:
      status = infer_internal::InferLinalg(c);
      break;
    case v1::OP_SOFTMAX: case v1::OP_LOG_SOFTMAX: case v1::OP_LAYER_NORM: case v1::OP_RMS_NORM:
    case v1::OP_GROUP_NORM: case v1::OP_ROPE: case v1::OP_ATTENTION:
      status = infer_internal::InferNorms(c);
      break;
    case v1::OP_RESHAPE: case v1::OP_TRANSPOSE: case v1::OP_SLICE: case v1::OP_CONCAT:
    case v1::OP_EXPAND: case v1::OP_PAD: case v1::OP_GATHER: case v1::OP_SCATTER_ADD:
    case v1::OP_REDUCE: case v1::OP_ARGMAX: case v1::OP_CUMSUM: case v1::OP_TOPK:
      status = infer_internal::InferShapeOps(c);
      break;
    case v1::OP_CONV: case v1::OP_CONV_TRANSPOSE2D: case v1::OP_POOL: case v1::OP_FFT:
    case v1::OP_RFFT: case v1::OP_IRFFT:
      status = infer_internal::InferVision(c);
      break;
    default:
      status = infer_internal::InferMisc(c);
      break;
  }
  if (!status.ok()) return status;
  for (const TensorType& t : node.outputs) {
    if (t.rank() > limits.max_rank) {
      return c.Error("result rank ", t.rank(), " exceeds the limit ", limits.max_rank);
    }
    // Negative dims mean symbols, so a rule whose arithmetic went out of range
    // would hand later code (printing, export, specialization) a symbol that does
    // not exist; every rule checks its arithmetic, and this catches any that did not.
    for (size_t k = 0; k < t.dims.size(); ++k) {
      const int64_t d = t.dims[k];
      if (d >= 0 || d == kDynamic || SymbolName(d, graph.symbols()) != nullptr) continue;
      return c.Error("result dim ", k, " is ", d, ", neither a size nor a symbol (shape arithmetic "
                     "out of range)");
    }
    if (!t.is_static()) continue;
    CheckedInt product = 1;
    for (int64_t d : t.dims) product = product * d;
    if (!product.ok()) {
      return c.Overflow("result shape ", TypeToString(t, graph.symbols()), ": element count");
    }
    const int64_t n = product.get();
    // Configured limits, not malformed graphs: RESOURCE_EXHAUSTED (verifier.h).
    if (n > limits.max_tensor_elements) {
      return absl::ResourceExhaustedError(absl::StrCat(
          NodeLabel(node), ": result ", TypeToString(t, graph.symbols()), " has ", n,
          " elements, over the limit of ", limits.max_tensor_elements));
    }
    auto bytes = BytesFor(t.dtype, n);
    if (bytes && *bytes > limits.max_tensor_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          NodeLabel(node), ": result ", TypeToString(t, graph.symbols()), " takes ", *bytes,
          " bytes, over the limit of ", limits.max_tensor_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::ir
