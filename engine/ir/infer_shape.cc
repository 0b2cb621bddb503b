// Inference for the shape family: reshape .. topk.
#include <algorithm>

#include "engine/ir/infer_internal.h"

namespace kiln::ir::infer_internal {
namespace {

absl::Status InferReshape(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  const auto& shape = c.node.attrs.reshape().shape();
  const TensorType& x = c.in(0);
  int infer_at = -1;
  CheckedInt known = 1;
  IrDims out;
  for (int i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d == -1) {
      if (infer_at >= 0) return c.Error("attribute shape has more than one -1");
      infer_at = i;
      out.push_back(kDynamic);
      continue;
    }
    if (d < 0) return c.Error("attribute shape has negative dim ", d);
    known = known * d;
    if (!known.ok()) return c.Overflow("attribute shape [", absl::StrJoin(shape, ", "), "]");
    out.push_back(d);
  }
  if (!x.is_static()) {
    // Keep a symbolic input dim where the target keeps the same position and
    // the other dims match, the common "[-1, S, H]" of batch-polymorphic graphs.
    if (infer_at >= 0 && x.rank() == static_cast<int64_t>(out.size())) {
      bool rest_equal = true;
      for (size_t i = 0; i < out.size(); ++i) {
        if (static_cast<int>(i) != infer_at && out[i] != x.dims[i]) rest_equal = false;
      }
      if (rest_equal) out[infer_at] = x.dims[infer_at];
    }
    return c.Set(TensorType(x.dtype, std::move(out)));
  }
  const int64_t total = x.num_elements();  // the operand's count passed InferNode's check
  const int64_t product = known.get();
  if (infer_at >= 0) {
    if (product == 0) {
      if (total != 0) return c.Error("cannot infer -1 with a zero-sized dim in ", c.T(0));
      out[infer_at] = 0;
    } else {
      if (total % product != 0) {
        return c.Error("cannot reshape ", c.T(0), " (", total, " elements) to a multiple of ",
                       product);
      }
      out[infer_at] = total / product;
    }
  } else if (product != total) {
    return c.Error("cannot reshape ", c.T(0), " (", total, " elements) into ", product,
                   " elements");
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferTranspose(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  const auto& perm = c.node.attrs.transpose().perm();
  const TensorType& x = c.in(0);
  if (perm.size() != x.rank()) {
    return c.Error("attribute perm has ", perm.size(), " entries for rank ", x.rank());
  }
  std::vector<bool> seen(x.rank());
  IrDims out;
  for (int64_t p : perm) {
    if (p < 0 || p >= x.rank() || seen[p]) return c.Error("attribute perm is not a permutation");
    seen[p] = true;
    out.push_back(x.dims[p]);
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferSlice(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  const auto& a = c.node.attrs.slice();
  const TensorType& x = c.in(0);
  const int n = a.axes().empty() ? static_cast<int>(x.rank()) : a.axes_size();
  if (a.start_size() != n || a.stop_size() != n || (a.step_size() != 0 && a.step_size() != n)) {
    return c.Error("attributes start/stop/step must have one entry per sliced axis (", n, ")");
  }
  IrDims out = x.dims;
  std::vector<bool> seen(x.rank());
  for (int i = 0; i < n; ++i) {
    int64_t axis = i;
    if (!a.axes().empty()) {
      if (auto s = c.Axis(a.axes(i), x.rank(), "axes", &axis); !s.ok()) return s;
    }
    if (seen[axis]) return c.Error("attribute axes repeats axis ", axis);
    seen[axis] = true;
    const int64_t step = a.step().empty() ? 1 : a.step(i);
    if (step < 1) return c.Error("attribute step[", i, "]=", step, " must be >= 1");
    const int64_t dim = x.dims[axis];
    if (dim < 0) {
      out[axis] = kDynamic;
      continue;
    }
    auto clampi = [dim](int64_t v) {
      if (v < 0) v += dim;
      return std::clamp<int64_t>(v, 0, dim);
    };
    const int64_t start = clampi(a.start(i)), stop = clampi(a.stop(i));
    // ceil((stop - start) / step) without `+ step - 1`, which overflows for a huge step.
    out[axis] = stop > start ? (stop - start - 1) / step + 1 : 0;
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferConcat(Ctx& c) {
  if (c.num_operands() < 1) return c.Error("expects at least 1 operand");
  const TensorType& x0 = c.in(0);
  if (x0.rank() == 0) return c.Error("cannot concatenate scalars");
  int64_t axis;
  if (auto s = c.Axis(c.node.attrs.concat().axis(), x0.rank(), "axis", &axis); !s.ok()) return s;
  IrDims out = x0.dims;
  for (int i = 1; i < c.num_operands(); ++i) {
    const TensorType& xi = c.in(i);
    if (auto s = c.SameDType(0, i); !s.ok()) return s;
    if (xi.rank() != x0.rank()) return c.Error("rank differs: ", c.T(0), " vs ", c.T(i));
    for (int64_t k = 0; k < x0.rank(); ++k) {
      if (k == axis) continue;
      if (!DimsCompatible(xi.dims[k], x0.dims[k])) {
        return c.Error("dim ", k, " differs: ", c.T(0), " vs ", c.T(i));
      }
    }
    if (out[axis] < 0 || xi.dims[axis] < 0) {
      out[axis] = kDynamic;
      continue;
    }
    const CheckedInt sum = CheckedInt(out[axis]) + xi.dims[axis];
    if (!sum.ok()) {
      return c.Overflow("concatenated dim ", axis, ": ", out[axis], " (operands 0..", i - 1,
                        ") + ", xi.dims[axis], " (operand ", i, ")");
    }
    out[axis] = sum.get();
  }
  return c.Set(TensorType(x0.dtype, std::move(out)));
}

absl::Status InferExpand(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  const auto& shape = c.node.attrs.expand().shape();
  const TensorType& x = c.in(0);
  if (shape.size() < x.rank()) {
    return c.Error("attribute shape has rank ", shape.size(), " below the operand's ", x.rank());
  }
  IrDims target(shape.begin(), shape.end());
  CheckedInt elements = 1;
  for (int64_t d : target) {
    if (d < 0) return c.Error("attribute shape has negative dim ", d);
    elements = elements * d;
  }
  if (!elements.ok()) return c.Overflow("attribute shape [", absl::StrJoin(shape, ", "), "]");
  const int64_t off = target.size() - x.rank();
  for (int64_t i = 0; i < x.rank(); ++i) {
    const int64_t d = x.dims[i];
    if (d != 1 && d >= 0 && d != target[off + i]) {
      return c.Error("cannot expand ", c.T(0), " to [", absl::StrJoin(target, ", "), "]");
    }
  }
  return c.Set(TensorType(x.dtype, std::move(target)));
}

absl::Status InferPad(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  const auto& a = c.node.attrs.pad();
  const TensorType& x = c.in(0);
  if (a.low_size() != x.rank() || a.high_size() != x.rank()) {
    return c.Error("attributes low and high need one entry per dim (", x.rank(), ")");
  }
  if (!v1::PadMode_IsValid(a.mode())) return c.Error("unknown pad mode ", static_cast<int>(a.mode()));
  IrDims out = x.dims;
  for (int64_t i = 0; i < x.rank(); ++i) {
    const int64_t lo = a.low(i), hi = a.high(i);
    if (lo < 0 || hi < 0) {
      return c.Error("negative padding on dim ", i, ": low[", i, "]=", lo, ", high[", i, "]=", hi,
                     " (use slice)");
    }
    // Checked before the dim is known, so a symbolic dim fails at import too.
    const CheckedInt padding = CheckedInt(lo) + hi;
    if (!padding.ok()) return c.Overflow("low[", i, "]=", lo, " + high[", i, "]=", hi);
    if (x.dims[i] < 0) continue;
    if (a.mode() == v1::PAD_REFLECT && (lo >= x.dims[i] || hi >= x.dims[i])) {
      return c.Error("reflect padding on dim ", i, " must be below its size ", x.dims[i]);
    }
    if (a.mode() == v1::PAD_EDGE && x.dims[i] == 0 && (lo > 0 || hi > 0)) {
      return c.Error("edge padding of an empty dim ", i);
    }
    const CheckedInt size = padding + x.dims[i];
    if (!size.ok()) {
      return c.Overflow("dim ", i, " of size ", x.dims[i], " + low[", i, "]=", lo, " + high[", i,
                        "]=", hi);
    }
    out[i] = size.get();
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferGather(Ctx& c) {
  if (auto s = c.Arity(2, 2); !s.ok()) return s;
  const TensorType& x = c.in(0);
  const TensorType& idx = c.in(1);
  if (!IsInteger(idx.dtype)) return c.Error("indices must be integers, got ", c.T(1));
  if (x.rank() == 0) return c.Error("cannot gather from a scalar");
  int64_t axis;
  if (auto s = c.Axis(c.node.attrs.gather().axis(), x.rank(), "axis", &axis); !s.ok()) return s;
  IrDims out(x.dims.begin(), x.dims.begin() + axis);
  out.insert(out.end(), idx.dims.begin(), idx.dims.end());
  out.insert(out.end(), x.dims.begin() + axis + 1, x.dims.end());
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferScatterAdd(Ctx& c) {
  if (auto s = c.Arity(3, 3); !s.ok()) return s;
  const TensorType& x = c.in(0);
  const TensorType& idx = c.in(1);
  const TensorType& upd = c.in(2);
  if (!IsInteger(idx.dtype)) return c.Error("indices must be integers, got ", c.T(1));
  if (auto s = c.SameDType(0, 2); !s.ok()) return s;
  if (x.rank() == 0) return c.Error("cannot scatter into a scalar");
  int64_t axis;
  if (auto s = c.Axis(c.node.attrs.scatter_add().axis(), x.rank(), "axis", &axis); !s.ok()) {
    return s;
  }
  IrDims want(x.dims.begin(), x.dims.begin() + axis);
  want.insert(want.end(), idx.dims.begin(), idx.dims.end());
  want.insert(want.end(), x.dims.begin() + axis + 1, x.dims.end());
  bool ok = want.size() == upd.dims.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = DimsCompatible(want[i], upd.dims[i]);
  if (!ok) {
    return c.Error("updates must be ", TypeToString(TensorType(x.dtype, want), c.graph.symbols()),
                   ", got ", c.T(2));
  }
  return c.Set(x);
}

absl::Status ReduceDims(Ctx& c, const TensorType& x,
                        const google::protobuf::RepeatedField<int64_t>& axes, bool keepdims,
                        IrDims* out, std::vector<bool>* reduced) {
  reduced->assign(x.rank(), axes.empty());
  for (int64_t a : axes) {
    int64_t axis;
    if (auto s = c.Axis(a, x.rank(), "axes", &axis); !s.ok()) return s;
    if ((*reduced)[axis]) return c.Error("attribute axes repeats axis ", axis);
    (*reduced)[axis] = true;
  }
  out->clear();
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (!(*reduced)[i]) {
      out->push_back(x.dims[i]);
    } else if (keepdims) {
      out->push_back(1);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InferShapeOps(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_RESHAPE: return InferReshape(c);
    case v1::OP_TRANSPOSE: return InferTranspose(c);
    case v1::OP_SLICE: return InferSlice(c);
    case v1::OP_CONCAT: return InferConcat(c);
    case v1::OP_EXPAND: return InferExpand(c);
    case v1::OP_PAD: return InferPad(c);
    case v1::OP_GATHER: return InferGather(c);
    case v1::OP_SCATTER_ADD: return InferScatterAdd(c);
    case v1::OP_REDUCE: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      const auto& a = c.node.attrs.reduce();
      if (a.kind() == v1::REDUCE_KIND_UNSPECIFIED || !v1::ReduceKind_IsValid(a.kind())) {
        return c.Error("unknown reduce kind ", static_cast<int>(a.kind()));
      }
      const TensorType& x = c.in(0);
      if (x.dtype == v1::DTYPE_BOOL || IsQuantized(x.dtype)) return c.Error("cannot reduce ", c.T(0));
      if (a.kind() == v1::REDUCE_MEAN && !IsFloat(x.dtype)) return c.Error("mean needs floats");
      IrDims out;
      std::vector<bool> reduced;
      if (auto s = ReduceDims(c, x, a.axes(), a.keepdims(), &out, &reduced); !s.ok()) return s;
      if (a.kind() == v1::REDUCE_MAX || a.kind() == v1::REDUCE_MIN) {
        for (int64_t i = 0; i < x.rank(); ++i) {
          if (reduced[i] && x.dims[i] == 0) {
            return c.Error(v1::ReduceKind_Name(a.kind()), " over empty dim ", i, " has no identity");
          }
        }
      }
      return c.Set(TensorType(x.dtype, std::move(out)));
    }
    case v1::OP_ARGMAX: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      const auto& a = c.node.attrs.argmax();
      const TensorType& x = c.in(0);
      if (x.rank() == 0) return c.Error("argmax needs rank >= 1");
      if (!IsFloat(x.dtype) && !IsInteger(x.dtype)) return c.Error("argmax needs numbers");
      int64_t axis;
      if (auto s = c.Axis(a.axis(), x.rank(), "axis", &axis); !s.ok()) return s;
      if (x.dims[axis] == 0) return c.Error("argmax over empty dim ", axis);
      DType id = a.index_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : a.index_dtype();
      if (id != v1::DTYPE_I32 && id != v1::DTYPE_I64) return c.Error("index_dtype must be i32 or i64");
      IrDims out;
      for (int64_t i = 0; i < x.rank(); ++i) {
        if (i != axis) out.push_back(x.dims[i]);
        else if (a.keepdims()) out.push_back(1);
      }
      return c.Set(TensorType(id, std::move(out)));
    }
    case v1::OP_CUMSUM: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      const TensorType& x = c.in(0);
      if (x.rank() == 0) return c.Error("cumsum needs rank >= 1");
      if (!IsFloat(x.dtype) && !IsInteger(x.dtype)) return c.Error("cumsum needs numbers");
      int64_t axis;
      if (auto s = c.Axis(c.node.attrs.cumsum().axis(), x.rank(), "axis", &axis); !s.ok()) return s;
      return c.Set(x);
    }
    case v1::OP_TOPK: {
      if (auto s = c.Arity(1, 1); !s.ok()) return s;
      const auto& a = c.node.attrs.topk();
      const TensorType& x = c.in(0);
      if (x.rank() == 0) return c.Error("topk needs rank >= 1");
      int64_t axis;
      if (auto s = c.Axis(a.has_axis() ? a.axis() : -1, x.rank(), "axis", &axis); !s.ok()) return s;
      if (a.k() < 0) return c.Error("attribute k must be >= 0");
      if (x.dims[axis] >= 0 && a.k() > x.dims[axis]) {
        return c.Error("k=", a.k(), " exceeds the axis size ", x.dims[axis]);
      }
      DType id = a.index_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : a.index_dtype();
      if (id != v1::DTYPE_I32 && id != v1::DTYPE_I64) return c.Error("index_dtype must be i32 or i64");
      IrDims out = x.dims;
      out[axis] = a.k();
      c.node.outputs.clear();
      c.node.outputs.push_back(TensorType(x.dtype, out));
      c.node.outputs.push_back(TensorType(id, out));
      return absl::OkStatus();
    }
    default:
      return c.Error("not a shape op");
  }
}

}  // namespace kiln::ir::infer_internal
