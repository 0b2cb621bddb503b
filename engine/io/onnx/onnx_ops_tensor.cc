// ONNX data-movement ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
// Concat, Split, Slice, Gather, Expand, Tile, Pad, ConstantOfShape (and the
// table entries of the ops onnx_fold.cc always folds: Constant, Shape, Size,
// Range).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_join.h"
#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io::onnx_internal {
namespace {

// Reshape to dims whose negative entries are run-time dims: one of them
// becomes Kiln's -1; more than one needs concrete input shapes.
absl::StatusOr<ValueRef> ReshapeTo(Importer& c, ValueRef x, IrDims dims) {
  int unknown = 0;
  for (int64_t& d : dims) {
    if (d < 0) {
      ++unknown;
      d = -1;
    }
  }
  if (unknown > 1) {
    return c.Unsupported(absl::StrCat("reshape to a shape with ", unknown,
                                      " run-time dims (pin the input shapes)"));
  }
  return c.Reshape(x, dims);
}

absl::Status ReshapeOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  std::vector<int64_t> values, sym;
  KILN_RETURN_IF_ERROR(c.ShapeArg(1, &values, &sym));
  const bool allowzero = c.AttrInt("allowzero", 0) != 0;
  const IrDims& xd = c.type(0).dims;
  // Each target element: a size, a run-time dim (code < 0), or the one -1.
  IrDims target;
  int infer = -1;
  for (size_t k = 0; k < values.size(); ++k) {
    if (sym[k] != 0) {
      target.push_back(sym[k]);
      continue;
    }
    int64_t v = values[k];
    if (v == 0 && !allowzero) {
      if (k >= xd.size()) return c.Invalid("a 0 in the reshape target past the input's rank");
      target.push_back(xd[k]);
      continue;
    }
    if (v == -1) {
      if (infer >= 0) return c.Invalid("the reshape target has more than one -1");
      infer = static_cast<int>(k);
      target.push_back(0);
      continue;
    }
    if (v < 0) return c.Invalid(absl::StrCat("reshape target dim ", v, " is negative"));
    target.push_back(v);
  }
  if (infer < 0) {
    KILN_ASSIGN_OR_RETURN(ValueRef y, ReshapeTo(c, x, target));
    c.SetOutput(0, y);
    return absl::OkStatus();
  }
  // A -1: fine when every other element is known; else cancel named symbols of
  // the input against the target's and compute the -1 statically.
  std::vector<int64_t> syms;
  CheckedInt known = 1;
  for (size_t k = 0; k < target.size(); ++k) {
    if (static_cast<int>(k) == infer) continue;
    if (target[k] < 0) syms.push_back(target[k]);
    else known = known * target[k];
  }
  if (syms.empty()) {
    target[infer] = -1;
    KILN_ASSIGN_OR_RETURN(ValueRef y, c.Reshape(x, target));
    c.SetOutput(0, y);
    return absl::OkStatus();
  }
  CheckedInt in_known = 1;
  std::vector<int64_t> in_syms;
  for (int64_t d : xd) {
    if (d < 0) in_syms.push_back(d);
    else in_known = in_known * d;
  }
  std::vector<int64_t> a = syms, b = in_syms;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  const bool named = std::all_of(a.begin(), a.end(), [](int64_t d) { return ir::IsSymbolDim(d); });
  if (!named || a != b || syms.size() != 1 || !known.ok() || !in_known.ok() || known.get() == 0) {
    return c.Unsupported("reshape target depends on run-time dims it cannot be solved for (pin the "
                         "input shapes)");
  }
  target[infer] = in_known.get() / known.get();
  KILN_ASSIGN_OR_RETURN(ValueRef y, ReshapeTo(c, x, target));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status FlattenOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const IrDims& xd = c.type(0).dims;
  int64_t axis = c.AttrInt("axis", 1);
  if (axis < 0) axis += c.rank(0);
  if (axis < 0 || axis > c.rank(0)) return c.Invalid(absl::StrCat("axis ", axis, " is out of range"));
  // Each side is static, or one symbolic dim times nothing else (batch).
  auto side = [&](int64_t b, int64_t e) -> int64_t {
    CheckedInt p = 1;
    int64_t sym = 0;
    int nsym = 0;
    for (int64_t k = b; k < e; ++k) {
      if (xd[k] < 0) {
        sym = xd[k];
        ++nsym;
      } else {
        p = p * xd[k];
      }
    }
    if (!p.ok()) return -1;
    if (nsym == 0) return p.get();
    return nsym == 1 && p.get() == 1 ? sym : ir::kDynamic;
  };
  return [&]() -> absl::Status {
    KILN_ASSIGN_OR_RETURN(ValueRef y, ReshapeTo(c, x, {side(0, axis), side(axis, c.rank(0))}));
    c.SetOutput(0, y);
    return absl::OkStatus();
  }();
}

absl::Status TransposeOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  std::vector<int64_t> perm = c.AttrInts("perm").value_or(std::vector<int64_t>{});
  if (perm.empty()) {
    for (int64_t k = c.rank(0) - 1; k >= 0; --k) perm.push_back(k);
  }
  v1::Attrs a;
  for (int64_t p : perm) a.mutable_transpose()->add_perm(p);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_TRANSPOSE, {x}, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status SqueezeOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(auto axes, c.IntsAttrOrInput("axes", 13, 1));
  const IrDims& xd = c.type(0).dims;
  std::vector<bool> drop(xd.size(), false);
  if (!axes || axes->empty()) {
    for (size_t k = 0; k < xd.size(); ++k) {
      if (xd[k] < 0) return c.Unsupported("Squeeze without axes of a run-time dim");
      drop[k] = xd[k] == 1;
    }
  } else {
    for (int64_t a : *axes) {
      KILN_ASSIGN_OR_RETURN(int64_t ax, NormAxis(c, a, c.rank(0)));
      if (xd[ax] > 1) return c.Invalid(absl::StrCat("cannot squeeze dim ", ax, " of size ", xd[ax]));
      drop[ax] = true;
    }
  }
  IrDims out;
  for (size_t k = 0; k < xd.size(); ++k) {
    if (!drop[k]) out.push_back(xd[k]);
  }
  KILN_ASSIGN_OR_RETURN(ValueRef y, ReshapeTo(c, x, out));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status UnsqueezeOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(auto axes, c.IntsAttrOrInput("axes", 13, 1));
  if (!axes) return c.Invalid("axes are required");
  const IrDims& xd = c.type(0).dims;
  const int64_t rank = c.rank(0) + static_cast<int64_t>(axes->size());
  std::vector<bool> ones(rank, false);
  for (int64_t a : *axes) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, NormAxis(c, a, rank));
    if (ones[ax]) return c.Invalid("axes repeat");
    ones[ax] = true;
  }
  IrDims out;
  size_t k = 0;
  for (int64_t i = 0; i < rank; ++i) out.push_back(ones[i] ? 1 : xd[k++]);
  KILN_ASSIGN_OR_RETURN(ValueRef y, ReshapeTo(c, x, out));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status ConcatOp(Importer& c) {
  std::vector<ValueRef> ops;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    KILN_ASSIGN_OR_RETURN(ValueRef v, c.Ref(i));
    ops.push_back(v);
  }
  if (ops.empty()) return c.Invalid("no inputs");
  v1::Attrs a;
  a.mutable_concat()->set_axis(c.AttrInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_CONCAT, ops, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::StatusOr<ValueRef> SliceAxis(Importer& c, ValueRef x, int64_t axis, int64_t start,
                                   int64_t stop) {
  v1::Attrs a;
  a.mutable_slice()->add_axes(axis);
  a.mutable_slice()->add_start(start);
  a.mutable_slice()->add_stop(stop);
  return c.Emit(v1::OP_SLICE, {x}, a);
}

absl::Status SplitOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", 0), c.rank(0)));
  const int64_t dim = c.type(0).dims[axis];
  KILN_ASSIGN_OR_RETURN(auto split, c.IntsAttrOrInput("split", 13, 1));
  const int n = c.num_outputs();
  std::vector<int64_t> sizes;
  if (split && !split->empty()) {
    sizes = *split;
  } else {
    if (dim < 0) return c.Unsupported("Split of a run-time dim");
    const int64_t parts = c.opset() >= 18 ? c.AttrInt("num_outputs", n) : n;
    if (parts <= 0) return c.Invalid("no outputs");
    const int64_t each = (dim + parts - 1) / parts;  // the last part may be smaller
    for (int64_t k = 0; k < parts; ++k) sizes.push_back(std::max<int64_t>(0, std::min(each, dim - k * each)));
  }
  if (static_cast<int>(sizes.size()) != n) {
    return c.Invalid(absl::StrCat("split has ", sizes.size(), " sizes for ", n, " outputs"));
  }
  CheckedInt start = 0;
  for (int k = 0; k < n; ++k) {
    if (sizes[k] < 0) return c.Invalid("negative split size");
    const CheckedInt stop = start + sizes[k];
    if (!stop.ok()) return c.Invalid("split sizes overflow");
    if (dim >= 0 && stop.get() > dim) return c.Invalid("split sizes exceed the dim");
    KILN_ASSIGN_OR_RETURN(ValueRef y, SliceAxis(c, x, axis, start.get(), stop.get()));
    c.SetOutput(k, y);
    start = stop;
  }
  return absl::OkStatus();
}

absl::StatusOr<ValueRef> IndexConst(Importer& c, const std::vector<int64_t>& idx) {
  KILN_RETURN_IF_ERROR(CheckTable(c, static_cast<int64_t>(idx.size()), "the gather index"));
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(v1::DTYPE_I64, {static_cast<int64_t>(idx.size())}));
  for (size_t i = 0; i < idx.size(); ++i) t.data_as<int64_t>()[i] = idx[i];
  return c.Constant(std::move(t));
}

absl::StatusOr<ValueRef> GatherAxis(Importer& c, ValueRef x, int64_t axis,
                                    const std::vector<int64_t>& idx) {
  KILN_ASSIGN_OR_RETURN(ValueRef i, IndexConst(c, idx));
  v1::Attrs a;
  a.mutable_gather()->set_axis(axis);
  return c.Emit(v1::OP_GATHER, {x, i}, a);
}

// Slice whose start and end are computed at run time from one value (the
// Loop body's x[i:i+k]): end - start is known at import, so the result has a
// static extent k and is Gather(x, s + arange(k)) along the axis. ONNX clamps
// out-of-range bounds, which would shorten the result; Kiln's extent cannot
// change at run time, so those runs fail on the gather's range check instead
// (the index pushed past the dim when a negative start meets an end >= 0,
// where ONNX counts them from different ends).
absl::Status DynamicSliceOp(Importer& c) {
  const std::optional<Value::Affine> start = AffineOf(c.in(1));
  const std::optional<Value::Affine> end = AffineOf(c.in(2));
  if (!start || !end || !(start->base == end->base)) {
    return c.Unsupported(
        "Slice's starts and ends are computed at run time and their difference is not known at "
        "import (Kiln's shapes are static: the end must be the start plus a constant)");
  }
  KILN_ASSIGN_OR_RETURN(auto axes, c.Ints(3));
  KILN_ASSIGN_OR_RETURN(auto steps, c.Ints(4));
  if (axes && axes->size() != 1) return c.Invalid("starts, ends and axes differ in length");
  if (steps && (steps->size() != 1 || (*steps)[0] != 1)) {
    return c.Unsupported("a run-time Slice start with a step other than 1");
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, axes ? (*axes)[0] : 0, c.rank(0)));
  const int64_t n = c.type(0).dims[axis];
  if (n < 0) return c.Unsupported("a run-time Slice start over a run-time dim");
  int64_t extent = 0;
  if (__builtin_sub_overflow(end->offset, start->offset, &extent)) return c.Invalid("slice bounds overflow");
  if (extent < 0) {
    // ONNX's range may still be non-empty (a start >= 0 with a negative
    // end counts that end from the dim), so its extent is not known here.
    return c.Unsupported("a run-time Slice whose end is before its start");
  }
  const int64_t k = std::min(extent, n);
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  // s: the start as an int64 [1].
  KILN_ASSIGN_OR_RETURN(ValueRef s, c.Ref(1));
  KILN_ASSIGN_OR_RETURN(s, c.Cast(s, v1::DTYPE_I64));
  KILN_ASSIGN_OR_RETURN(s, c.Reshape(s, {1}));
  std::vector<int64_t> iota(k);
  for (int64_t j = 0; j < k; ++j) iota[j] = j;
  KILN_ASSIGN_OR_RETURN(ValueRef offsets, IndexConst(c, iota));
  KILN_ASSIGN_OR_RETURN(ValueRef idx, c.Binary(v1::BINARY_ADD, s, offsets));
  // A negative start with end = start + k >= 0: ONNX's range is empty or
  // wraps differently; push every index out of range so the run fails.
  KILN_ASSIGN_OR_RETURN(ValueRef zero, c.ScalarConst(v1::DTYPE_I64, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef neg_k, c.ScalarConst(v1::DTYPE_I64, static_cast<double>(-k)));
  KILN_ASSIGN_OR_RETURN(ValueRef negative, c.Compare(v1::COMPARE_LT, s, zero));
  KILN_ASSIGN_OR_RETURN(ValueRef crosses, c.Compare(v1::COMPARE_GE, s, neg_k));
  KILN_ASSIGN_OR_RETURN(ValueRef f, c.ScalarConst(v1::DTYPE_BOOL, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef bad, c.Where(negative, crosses, f));
  KILN_ASSIGN_OR_RETURN(ValueRef past, c.ScalarConst(v1::DTYPE_I64, static_cast<double>(2 * n + 2 * k)));
  KILN_ASSIGN_OR_RETURN(ValueRef pushed, c.Binary(v1::BINARY_ADD, idx, past));
  KILN_ASSIGN_OR_RETURN(idx, c.Where(bad, pushed, idx));
  v1::Attrs a;
  a.mutable_gather()->set_axis(axis);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_GATHER, {x, idx}, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status SliceOp(Importer& c) {
  if (c.opset() >= 10 && c.has(1) && c.has(2) && (c.Const(1) == nullptr || c.Const(2) == nullptr)) {
    return DynamicSliceOp(c);
  }
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(Importer::SliceArgs args, c.SliceOperands());
  std::vector<int64_t>& starts = args.starts;
  std::vector<int64_t>& ends = args.ends;
  std::vector<int64_t>& axes = args.axes;
  std::vector<int64_t>& steps = args.steps;
  v1::Attrs pos;
  std::vector<size_t> negative;
  for (size_t i = 0; i < starts.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, NormAxis(c, axes[i], c.rank(0)));
    axes[i] = ax;
    if (steps[i] == 0) return c.Invalid("slice step 0");
    if (steps[i] < 0) {
      negative.push_back(i);
      continue;
    }
    pos.mutable_slice()->add_axes(ax);
    pos.mutable_slice()->add_start(starts[i]);
    pos.mutable_slice()->add_stop(ends[i]);
    pos.mutable_slice()->add_step(steps[i]);
  }
  ValueRef y = x;
  if (pos.slice().axes_size() > 0) {
    KILN_ASSIGN_OR_RETURN(y, c.Emit(v1::OP_SLICE, {x}, pos));
  }
  // Negative steps: the picked indices, gathered (needs the dim's size).
  for (size_t i : negative) {
    const int64_t n = c.TypeOf(y).dims[axes[i]];
    if (n < 0) return c.Unsupported("a negative slice step over a run-time dim");
    KILN_RETURN_IF_ERROR(CheckTable(c, n, "the reversed slice's index"));
    int64_t s = starts[i] < 0 ? starts[i] + n : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + n : ends[i];
    s = std::clamp<int64_t>(s, -1, n - 1);
    e = std::clamp<int64_t>(e, -1, n - 1);
    std::vector<int64_t> idx;
    for (int64_t v = s; v > e; v += steps[i]) idx.push_back(v);
    KILN_ASSIGN_OR_RETURN(y, GatherAxis(c, y, axes[i], idx));
  }
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status GatherOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef i, c.Ref(1));
  v1::Attrs a;
  a.mutable_gather()->set_axis(c.AttrInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_GATHER, {x, i}, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// ONNX Expand broadcasts both ways: the result is broadcast(x.shape, shape).
absl::Status ExpandOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  std::vector<int64_t> shape, sym;
  KILN_RETURN_IF_ERROR(c.ShapeArg(1, &shape, &sym));
  const IrDims& xd = c.type(0).dims;
  const size_t rank = std::max(xd.size(), shape.size());
  std::vector<int64_t> out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t xi = k + xd.size() >= rank ? xd[k + xd.size() - rank] : 1;
    const size_t si = k + shape.size() - rank;
    const bool has_s = k + shape.size() >= rank;
    const int64_t s = has_s ? shape[si] : 1;
    if (has_s && sym[si] != 0) {
      if (xi < 0 && xi == sym[si]) {
        out[k] = -1;  // the input's own run-time dim
        continue;
      }
      return c.Unsupported("Expand to a run-time shape (pin the input shapes)");
    }
    if (xi < 0) {
      if (s != 1) return c.Unsupported("Expand of a run-time dim");
      out[k] = -1;
      continue;
    }
    if (xi != 1 && s != 1 && xi != s) {
      return c.Invalid(absl::StrCat("cannot expand [", absl::StrJoin(xd, ", "), "] to [",
                                    absl::StrJoin(shape, ", "), "]"));
    }
    if (s < 0) return c.Invalid("negative dim in the Expand shape");
    out[k] = xi == 1 ? s : xi;
  }
  if (std::find(out.begin(), out.end(), -1) != out.end()) {
    return c.Unsupported("Expand of a tensor with run-time dims (pin the input shapes)");
  }
  if (IrDims(out.begin(), out.end()) == xd) {
    c.SetOutput(0, x);
    return absl::OkStatus();
  }
  v1::Attrs a;
  for (int64_t d : out) a.mutable_expand()->add_shape(d);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_EXPAND, {x}, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// Tile: [d0, d1] by [r0, r1] = reshape [1, d0, 1, d1], expand [r0, d0, r1, d1],
// reshape [r0 * d0, r1 * d1].
absl::Status TileOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> reps, c.RequiredInts(1));
  const IrDims& xd = c.type(0).dims;
  if (reps.size() != xd.size()) return c.Invalid("repeats must have one entry per dim");
  if (!c.type(0).is_static()) return c.Unsupported("Tile of run-time dims");
  IrDims split, expanded, out;
  for (size_t k = 0; k < xd.size(); ++k) {
    if (reps[k] < 0) return c.Invalid("negative repeat");
    const CheckedInt d = CheckedInt(xd[k]) * reps[k];
    if (!d.ok()) return c.Invalid("tiled dim overflows int64");
    split.push_back(1);
    split.push_back(xd[k]);
    expanded.push_back(reps[k]);
    expanded.push_back(xd[k]);
    out.push_back(d.get());
  }
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Reshape(x, split));
  v1::Attrs a;
  for (int64_t d : expanded) a.mutable_expand()->add_shape(d);
  KILN_ASSIGN_OR_RETURN(y, c.Emit(v1::OP_EXPAND, {y}, a));
  KILN_ASSIGN_OR_RETURN(y, c.Reshape(y, out));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

absl::Status PadOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const std::string mode = c.AttrString("mode", "constant");
  std::vector<int64_t> pads;
  double value = 0;
  std::optional<std::vector<int64_t>> axes;
  if (c.opset() < 11) {
    pads = c.AttrInts("pads").value_or(c.AttrInts("paddings").value_or(std::vector<int64_t>{}));
    value = c.AttrFloat("value", 0.f);
  } else {
    KILN_ASSIGN_OR_RETURN(pads, c.RequiredInts(1));
    if (c.has(2)) {
      KILN_ASSIGN_OR_RETURN(value, c.Scalar(2));
    }
    if (c.opset() >= 18) {
      KILN_ASSIGN_OR_RETURN(axes, c.Ints(3));
    }
  }
  const int64_t rank = c.rank(0);
  std::vector<int64_t> ax;
  if (axes) {
    for (int64_t a : *axes) {
      KILN_ASSIGN_OR_RETURN(int64_t n, NormAxis(c, a, rank));
      ax.push_back(n);
    }
  } else {
    for (int64_t k = 0; k < rank; ++k) ax.push_back(k);
  }
  if (pads.size() != 2 * ax.size()) {
    return c.Invalid(absl::StrCat("pads has ", pads.size(), " entries; expected ", 2 * ax.size()));
  }
  std::vector<int64_t> lo(rank, 0), hi(rank, 0);
  for (size_t i = 0; i < ax.size(); ++i) {
    lo[ax[i]] = pads[i];
    hi[ax[i]] = pads[i + ax.size()];
  }
  // Negative pads crop.
  v1::Attrs crop;
  for (int64_t k = 0; k < rank; ++k) {
    if (lo[k] >= 0 && hi[k] >= 0) continue;
    const int64_t n = c.type(0).dims[k];
    if (n < 0) return c.Unsupported("negative padding of a run-time dim");
    crop.mutable_slice()->add_axes(k);
    crop.mutable_slice()->add_start(lo[k] < 0 ? -lo[k] : 0);
    crop.mutable_slice()->add_stop(hi[k] < 0 ? n + hi[k] : n);
    lo[k] = std::max<int64_t>(lo[k], 0);
    hi[k] = std::max<int64_t>(hi[k], 0);
  }
  if (crop.slice().axes_size() > 0) {
    KILN_ASSIGN_OR_RETURN(x, c.Emit(v1::OP_SLICE, {x}, crop));
  }
  v1::Attrs a;
  auto* p = a.mutable_pad();
  for (int64_t k = 0; k < rank; ++k) {
    p->add_low(lo[k]);
    p->add_high(hi[k]);
  }
  p->set_value(value);
  if (mode == "constant") p->set_mode(v1::PAD_CONSTANT);
  else if (mode == "reflect") p->set_mode(v1::PAD_REFLECT);
  else if (mode == "edge") p->set_mode(v1::PAD_EDGE);
  else return c.Unsupported(absl::StrCat("Pad mode \"", mode, "\""));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_PAD, {x}, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// Resize (and opset 9 Upsample): nearest, n-linear and cubic, separably, as
// one, two or four gathers per resized axis with the source indices and
// weights computed here (the resized dims must be static):
// y = sum_k x[i_k] * w_k along each axis.
absl::Status ResizeOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const bool upsample = c.node().op_type() == "Upsample";
  const std::string mode = c.AttrString("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic") {
    return c.Invalid(absl::StrCat(c.node().op_type(), ": unknown mode \"", mode, "\""));
  }
  const std::string transform = upsample || c.opset() < 11
      ? std::string("asymmetric") : c.AttrString("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = upsample || c.opset() < 11
      ? std::string("floor") : c.AttrString("nearest_mode", "round_prefer_floor");
  if (transform == "tf_crop_and_resize") return c.Unsupported("Resize with tf_crop_and_resize");
  if (c.AttrInt("antialias", 0) != 0) return c.Unsupported("Resize with antialias");
  if (c.AttrString("keep_aspect_ratio_policy", "stretch") != "stretch") {
    return c.Unsupported("Resize keep_aspect_ratio_policy other than stretch");
  }
  const int64_t rank = c.rank(0);
  std::vector<int64_t> axes;
  if (c.opset() >= 18) axes = c.AttrInts("axes").value_or(std::vector<int64_t>{});
  if (axes.empty()) {
    for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
  }
  for (int64_t& a : axes) {
    KILN_ASSIGN_OR_RETURN(a, NormAxis(c, a, rank));
  }
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  const int scales_in = upsample || c.opset() < 11 ? 1 : 2;
  if (upsample && c.opset() < 9) {
    for (float f : c.AttrFloats("scales").value_or(std::vector<float>{})) scales.push_back(f);
  } else if (c.has(scales_in) && c.Const(scales_in) != nullptr && c.Const(scales_in)->num_elements() > 0) {
    const HostTensor* t = c.Const(scales_in);
    for (int64_t i = 0; i < t->num_elements(); ++i) {
      scales.push_back(static_cast<double>(static_cast<float>(t->GetAsDouble(i))));
    }
  } else if (c.has(scales_in) && c.Const(scales_in) == nullptr) {
    return c.Unsupported("Resize scales computed at run time");
  }
  if (!upsample && c.opset() >= 11 && c.has(3)) {
    KILN_ASSIGN_OR_RETURN(sizes, c.RequiredInts(3));
  }
  const size_t n_axes = axes.size();
  if ((scales.empty() ? sizes.size() : scales.size()) != n_axes) {
    return c.Invalid(absl::StrCat("Resize needs ", n_axes, " scales or sizes"));
  }
  ValueRef y = x;
  for (size_t k = 0; k < n_axes; ++k) {
    const int64_t axis = axes[k];
    const int64_t n = c.TypeOf(y).dims[axis];
    if (n < 0) return c.Unsupported("Resize of a run-time dim");
    double s;
    int64_t m;
    if (!scales.empty()) {
      s = scales[k];
      if (!(s > 0) || !std::isfinite(s)) return c.Invalid("Resize scales must be positive");
      const double md = std::floor(static_cast<double>(n) * s);
      if (md > static_cast<double>(c.options().limits.max_tensor_elements)) {
        return c.Invalid("Resize output dim over the limits");
      }
      m = static_cast<int64_t>(md);
    } else {
      m = sizes[k];
      if (m < 0) return c.Invalid("negative Resize size");
      if (n == 0) return c.Invalid("Resize of an empty dim");
      s = static_cast<double>(m) / static_cast<double>(n);
    }
    KILN_RETURN_IF_ERROR(CheckTable(c, m, "a resized dim's index table"));
    if (m == n && s == 1.0) continue;
    // Taps: one (nearest), two (linear) or four (cubic) source indices per
    // output element with their weights; indices past the edges clamp (the ONNX
    // reference pads with the edge values).
    const int taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
    std::vector<std::vector<int64_t>> idx(taps, std::vector<int64_t>(m));
    std::vector<std::vector<double>> wt(taps, std::vector<double>(m, 1.0));
    for (int64_t o = 0; o < m; ++o) {
      double xo;
      const double lr = static_cast<double>(n) * s;  // unrounded, as the ONNX reference
      if (transform == "half_pixel") xo = (o + 0.5) / s - 0.5;
      else if (transform == "pytorch_half_pixel") xo = lr > 1 ? (o + 0.5) / s - 0.5 : -0.5;
      else if (transform == "align_corners") xo = lr == 1 ? 0 : o * static_cast<double>(n - 1) / (lr - 1);
      else if (transform == "asymmetric") xo = o / s;
      else if (transform == "tf_half_pixel_for_nn") xo = (o + 0.5) / s;
      else return c.Invalid(absl::StrCat("unknown coordinate_transformation_mode \"", transform, "\""));
      // Every tap past an edge clamps to it, so a source coordinate beyond the
      // edges by more than the taps' reach picks the same elements: clamped
      // here, it always fits the int64 casts below (a tiny scale made it ~1e24).
      xo = std::clamp(xo, -4.0, static_cast<double>(n) + 4.0);
      if (taps == 1) {
        double r;
        if (nearest == "round_prefer_floor") r = xo == std::floor(xo) + 0.5 ? std::floor(xo) : std::round(xo);
        else if (nearest == "round_prefer_ceil") r = std::round(xo);
        else if (nearest == "floor") r = std::floor(xo);
        else if (nearest == "ceil") r = std::ceil(xo);
        else return c.Invalid(absl::StrCat("unknown nearest_mode \"", nearest, "\""));
        idx[0][o] = std::clamp<int64_t>(static_cast<int64_t>(r), 0, n - 1);
        continue;
      }
      const double fl = std::floor(xo);
      const double t = xo - fl;
      const int64_t base = static_cast<int64_t>(fl) - (taps == 4 ? 1 : 0);
      std::vector<double> w;
      if (taps == 2) {
        w = {1 - t, t};
      } else {
        const double a = c.AttrFloat("cubic_coeff_a", -0.75f);
        auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };   // 1 < d < 2
        auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };         // d <= 1
        w = {far(t + 1), near(t), near(1 - t), far(2 - t)};
      }
      double sum = 0;
      for (int k = 0; k < taps; ++k) {
        const int64_t i = base + k;
        if (c.AttrInt("exclude_outside", 0) != 0 && (i < 0 || i >= n)) w[k] = 0;
        sum += w[k];
        idx[k][o] = std::clamp<int64_t>(i, 0, n - 1);
      }
      for (int k = 0; k < taps; ++k) wt[k][o] = c.AttrInt("exclude_outside", 0) != 0 && sum != 0 ? w[k] / sum : w[k];
    }
    if (taps == 1) {
      KILN_ASSIGN_OR_RETURN(y, GatherAxis(c, y, axis, idx[0]));
      continue;
    }
    if (!IsFloat(c.TypeOf(y).dtype)) return c.Unsupported(absl::StrCat(mode, " Resize of integers"));
    ValueRef acc;
    for (int k = 0; k < taps; ++k) {
      KILN_ASSIGN_OR_RETURN(ValueRef g, GatherAxis(c, y, axis, idx[k]));
      Dims wd(rank, 1);
      wd[axis] = m;
      KILN_ASSIGN_OR_RETURN(HostTensor wk, HostTensor::Create(c.TypeOf(y).dtype, wd));
      for (int64_t o = 0; o < m; ++o) wk.SetFromDouble(o, wt[k][o]);
      KILN_ASSIGN_OR_RETURN(ValueRef wv, c.Constant(std::move(wk)));
      KILN_ASSIGN_OR_RETURN(ValueRef term, c.Binary(v1::BINARY_MUL, g, wv));
      if (k == 0) {
        acc = term;
      } else {
        KILN_ASSIGN_OR_RETURN(acc, c.Binary(v1::BINARY_ADD, acc, term));
      }
    }
    y = acc;
  }
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// GatherElements: out[.., j, ..] = data[.., indices[.., j, ..], ..] along axis,
// written as a one-hot selection: sum_i data[.., i, ..] * (indices == i) over
// a new axis (O(m * n) work per row: fine for the index-sized tensors it sees).
absl::Status GatherElementsOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef idx, c.Ref(1));
  const int64_t rank = c.rank(0);
  if (c.rank(1) != rank || rank == 0) return c.Invalid("data and indices must have the same rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", 0), rank));
  if (!c.type(0).is_static() || !c.type(1).is_static()) return c.Unsupported("GatherElements over run-time dims");
  const IrDims xd = c.type(0).dims, id = c.type(1).dims;
  const DType dt = c.dtype(0);
  if (dt == v1::DTYPE_BOOL) return c.Unsupported("GatherElements of bool");
  // Other dims: the indices' extent of the data.
  v1::Attrs crop;
  for (int64_t k = 0; k < rank; ++k) {
    if (k == axis || id[k] == xd[k]) continue;
    if (id[k] > xd[k]) return c.Invalid("indices exceed the data on a non-gathered dim");
    crop.mutable_slice()->add_axes(k);
    crop.mutable_slice()->add_start(0);
    crop.mutable_slice()->add_stop(id[k]);
  }
  if (crop.slice().axes_size() > 0) {
    KILN_ASSIGN_OR_RETURN(x, c.Emit(v1::OP_SLICE, {x}, crop));
  }
  const int64_t n = xd[axis];
  KILN_RETURN_IF_ERROR(CheckTable(c, n, "the gathered axis' iota"));
  KILN_ASSIGN_OR_RETURN(idx, c.Cast(idx, v1::DTYPE_I64));
  KILN_ASSIGN_OR_RETURN(ValueRef zero_i, c.ScalarConst(v1::DTYPE_I64, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef n_i, c.ScalarConst(v1::DTYPE_I64, static_cast<double>(n)));
  KILN_ASSIGN_OR_RETURN(ValueRef neg, c.Compare(v1::COMPARE_LT, idx, zero_i));
  KILN_ASSIGN_OR_RETURN(ValueRef wrapped, c.Binary(v1::BINARY_ADD, idx, n_i));
  KILN_ASSIGN_OR_RETURN(idx, c.Where(neg, wrapped, idx));
  // data [.., 1, n, ..], indices [.., m, 1, ..], iota [1.., n, 1..] at axis + 1.
  IrDims xe = c.TypeOf(x).dims, ie = id;
  xe.insert(xe.begin() + axis, 1);
  ie.insert(ie.begin() + axis + 1, 1);
  KILN_ASSIGN_OR_RETURN(ValueRef xr, c.Reshape(x, xe));
  KILN_ASSIGN_OR_RETURN(ValueRef ir, c.Reshape(idx, ie));
  Dims od(rank + 1, 1);
  od[axis + 1] = n;
  KILN_ASSIGN_OR_RETURN(HostTensor iota, HostTensor::Create(v1::DTYPE_I64, od));
  for (int64_t i = 0; i < n; ++i) iota.data_as<int64_t>()[i] = i;
  KILN_ASSIGN_OR_RETURN(ValueRef io, c.Constant(std::move(iota)));
  KILN_ASSIGN_OR_RETURN(ValueRef mask, c.Compare(v1::COMPARE_EQ, ir, io));
  KILN_ASSIGN_OR_RETURN(ValueRef zero, c.ScalarConst(dt, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef sel, c.Where(mask, xr, zero));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Reduce(v1::REDUCE_SUM, sel, {axis + 1}, false));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// OneHot(indices, depth, values = [off, on]): on where indices (negative ones
// counted from depth) equal an iota along the new axis, else off.
absl::Status OneHotOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef idx, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(double depth_d, c.Scalar(1));
  const HostTensor* values = c.Const(2);
  if (values == nullptr || values->num_elements() != 2) {
    return c.Unsupported("OneHot values must be a constant [off, on]");
  }
  if (!(depth_d >= 1) || depth_d > static_cast<double>(c.options().limits.max_tensor_elements)) {
    return c.Invalid("OneHot depth out of range");
  }
  const int64_t depth = static_cast<int64_t>(depth_d);
  KILN_RETURN_IF_ERROR(CheckTable(c, depth, "the one-hot iota"));
  const int64_t rank = c.rank(0) + 1;
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", -1), rank));
  KILN_ASSIGN_OR_RETURN(idx, c.Cast(idx, v1::DTYPE_I64));
  KILN_ASSIGN_OR_RETURN(ValueRef zero, c.ScalarConst(v1::DTYPE_I64, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef dv, c.ScalarConst(v1::DTYPE_I64, static_cast<double>(depth)));
  KILN_ASSIGN_OR_RETURN(ValueRef neg, c.Compare(v1::COMPARE_LT, idx, zero));
  KILN_ASSIGN_OR_RETURN(ValueRef wrapped, c.Binary(v1::BINARY_ADD, idx, dv));
  KILN_ASSIGN_OR_RETURN(idx, c.Where(neg, wrapped, idx));
  IrDims ie = c.TypeOf(idx).dims;
  ie.insert(ie.begin() + axis, 1);
  if (std::count_if(ie.begin(), ie.end(), [](int64_t d) { return d < 0; }) > 1) {
    return c.Unsupported("OneHot of run-time dims");
  }
  KILN_ASSIGN_OR_RETURN(ValueRef ir, ReshapeTo(c, idx, ie));
  Dims od(rank, 1);
  od[axis] = depth;
  KILN_ASSIGN_OR_RETURN(HostTensor iota, HostTensor::Create(v1::DTYPE_I64, od));
  for (int64_t i = 0; i < depth; ++i) iota.data_as<int64_t>()[i] = i;
  KILN_ASSIGN_OR_RETURN(ValueRef io, c.Constant(std::move(iota)));
  KILN_ASSIGN_OR_RETURN(ValueRef mask, c.Compare(v1::COMPARE_EQ, ir, io));
  KILN_ASSIGN_OR_RETURN(ValueRef off, c.ScalarConst(values->dtype(), values->GetAsDouble(0)));
  KILN_ASSIGN_OR_RETURN(ValueRef on, c.ScalarConst(values->dtype(), values->GetAsDouble(1)));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Where(mask, on, off));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// Trilu: keep the upper (j - i >= k) or lower (j - i <= k) triangle of the
// last two dims; the mask is a constant made here.
absl::Status TriluOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  if (c.rank(0) < 2) return c.Invalid("Trilu needs rank >= 2");
  int64_t k = 0;
  if (c.has(1)) {
    KILN_ASSIGN_OR_RETURN(double kd, c.Scalar(1));
    if (kd != kd) return c.Invalid("Trilu's k is NaN");
    // Past +-2^62 every element is on one side of diagonal k; clamped, the
    // value always fits int64 (a float k of 1e30 would not).
    k = static_cast<int64_t>(std::clamp(kd, -0x1p62, 0x1p62));
  }
  const bool upper = c.AttrInt("upper", 1) != 0;
  const int64_t n = c.type(0).dims[c.rank(0) - 2], m = c.type(0).dims[c.rank(0) - 1];
  if (n < 0 || m < 0) return c.Unsupported("Trilu over run-time dims");
  KILN_RETURN_IF_ERROR(CheckTable(c, (CheckedInt(n) * m).value().value_or(-1), "the triangle mask"));
  KILN_ASSIGN_OR_RETURN(HostTensor mask, HostTensor::Create(v1::DTYPE_BOOL, {n, m}));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      const CheckedInt d = CheckedInt(j) - i;
      SetInt(mask, i * m + j, upper ? d.get() >= k : d.get() <= k);
    }
  }
  KILN_ASSIGN_OR_RETURN(ValueRef mv, c.Constant(std::move(mask)));
  KILN_ASSIGN_OR_RETURN(ValueRef zero, c.ScalarConst(c.dtype(0), 0));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Where(mv, x, zero));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// EyeLike: a constant of the input's (static, 2-D) shape, ones on diagonal k.
absl::Status EyeLikeOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(0));
  if (c.rank(0) != 2 || !c.type(0).is_static()) return c.Unsupported("EyeLike of a run-time or non-2-D shape");
  DType dt = c.dtype(0);
  if (c.Attr("dtype") != nullptr) {
    auto d = DTypeFromOnnx(static_cast<int32_t>(c.AttrInt("dtype", 1)));
    if (!d) return c.Unsupported("EyeLike dtype with no Kiln dtype");
    dt = *d;
  }
  const int64_t k = c.AttrInt("k", 0), n = c.type(0).dims[0], m = c.type(0).dims[1];
  KILN_RETURN_IF_ERROR(CheckTable(c, (CheckedInt(n) * m).value().value_or(-1), "the identity"));
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(dt, {n, m}));
  for (int64_t i = 0; i < n; ++i) {
    const CheckedInt j = CheckedInt(i) + k;
    if (j.ok() && j.get() >= 0 && j.get() < m) t.SetFromDouble(i * m + j.get(), 1);
  }
  return c.SetConst(0, std::move(t));
}

// DepthToSpace / SpaceToDepth: reshape, transpose, reshape.
absl::Status DepthSpaceOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  if (c.rank(0) != 4 || !c.type(0).is_static()) return c.Unsupported("a run-time or non-4-D shape");
  const int64_t b = c.AttrInt("blocksize", 0);
  const IrDims& d = c.type(0).dims;
  const int64_t n = d[0], ch = d[1], h = d[2], w = d[3];
  if (b <= 0) return c.Invalid("blocksize must be positive");
  IrDims split, out;
  std::vector<int64_t> perm;
  if (c.node().op_type() == "DepthToSpace") {
    if (ch % (b * b) != 0) return c.Invalid("channels not divisible by blocksize^2");
    const int64_t oc = ch / (b * b);
    if (c.AttrString("mode", "DCR") == "DCR") {
      split = {n, b, b, oc, h, w};
      perm = {0, 3, 4, 1, 5, 2};
    } else {
      split = {n, oc, b, b, h, w};
      perm = {0, 1, 4, 2, 5, 3};
    }
    out = {n, oc, h * b, w * b};
  } else {
    if (h % b != 0 || w % b != 0) return c.Invalid("spatial dims not divisible by blocksize");
    split = {n, ch, h / b, b, w / b, b};
    perm = {0, 3, 5, 1, 2, 4};
    out = {n, ch * b * b, h / b, w / b};
  }
  KILN_ASSIGN_OR_RETURN(ValueRef r, c.Reshape(x, split));
  v1::Attrs a;
  for (int64_t p : perm) a.mutable_transpose()->add_perm(p);
  KILN_ASSIGN_OR_RETURN(ValueRef t, c.Emit(v1::OP_TRANSPOSE, {r}, a));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Reshape(t, out));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// Not folded (too large): a broadcast scalar.
absl::Status ConstantOfShapeOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, c.RequiredInts(0));
  HostTensor value = HostTensor::FromVector<float>(v1::DTYPE_F32, {}, {0.f});
  if (const auto* a = c.Attr("value")) {
    KILN_ASSIGN_OR_RETURN(value, TensorFromProto(a->t(), c.options().limits));
    if (value.num_elements() != 1) return c.Invalid("attribute value must have one element");
    KILN_ASSIGN_OR_RETURN(value, HostTensor::FromBytes(value.dtype(), {}, value.bytes()));
  }
  KILN_ASSIGN_OR_RETURN(ValueRef s, c.Constant(std::move(value)));
  v1::Attrs a;
  for (int64_t d : shape) a.mutable_expand()->add_shape(d);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_EXPAND, {s}, a));
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// Reached only when onnx_fold.cc could not fold the node.
absl::Status NotFolded(Importer& c) {
  return c.Unsupported(absl::StrCat(c.node().op_type(),
                                    " over run-time values (Kiln needs it known at import)"));
}

}  // namespace

void RegisterTensorOps(ConverterTable& t) {
  t["Constant"] = NotFolded;
  t["Shape"] = NotFolded;
  t["Size"] = NotFolded;
  t["Range"] = NotFolded;
  t["Reshape"] = ReshapeOp;
  t["Flatten"] = FlattenOp;
  t["Transpose"] = TransposeOp;
  t["Squeeze"] = SqueezeOp;
  t["Unsqueeze"] = UnsqueezeOp;
  t["Concat"] = ConcatOp;
  t["Split"] = SplitOp;
  t["Slice"] = SliceOp;
  t["Gather"] = GatherOp;
  t["Expand"] = ExpandOp;
  t["Tile"] = TileOp;
  t["Pad"] = PadOp;
  t["ConstantOfShape"] = ConstantOfShapeOp;
  t["Resize"] = ResizeOp;
  t["Trilu"] = TriluOp;
  t["OneHot"] = OneHotOp;
  t["GatherElements"] = GatherElementsOp;
  t["EyeLike"] = EyeLikeOp;
  t["DepthToSpace"] = DepthSpaceOp;
  t["SpaceToDepth"] = DepthSpaceOp;
  t["Upsample"] = ResizeOp;
}

}  // namespace kiln::io::onnx_internal
