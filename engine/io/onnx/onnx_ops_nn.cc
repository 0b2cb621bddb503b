// ONNX linear algebra, convolution, pooling, normalization and TopK (softmax,
// reductions, Einsum and the losses are onnx_ops_reduce.cc).
#include <algorithm>
#include <cmath>

#include "base/checked_int.h"
#include "base/status.h"
#include "engine/io/onnx/onnx_internal.h"

namespace kiln::io::onnx_internal {

namespace nn_util {

absl::Status Out(Importer& c, int i, absl::StatusOr<ValueRef> v) {
  if (!v.ok()) return v.status();
  c.SetOutput(i, *v);
  return absl::OkStatus();
}

absl::StatusOr<ValueRef> Scalar(Importer& c, ValueRef like, double v) {
  return c.ScalarConst(c.TypeOf(like).dtype, v);
}

absl::Status NeedFloat(Importer& c, int i) {
  // Present first: Softmax with no input reached c.dtype(0) (kiln_fuzz_onnx_import).
  KILN_RETURN_IF_ERROR(c.Need(i));
  if (IsFloat(c.dtype(i))) return absl::OkStatus();
  return c.Unsupported(absl::StrCat(c.node().op_type(), " on ", DTypeName(c.dtype(i)),
                                    " (Kiln computes it in floating point)"));
}

}  // namespace nn_util

namespace {

using nn_util::NeedFloat;
using nn_util::Out;
using nn_util::Scalar;

absl::Status MatMulOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(1));
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef a, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, c.Ref(1));
  v1::Attrs attrs;
  attrs.mutable_matmul();
  return Out(c, 0, c.Emit(v1::OP_MATMUL, {a, b}, attrs));
}

absl::Status GemmOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(1));
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef a, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef b, c.Ref(1));
  if (c.rank(0) != 2 || c.rank(1) != 2) return c.Invalid("A and B must be matrices");
  v1::Attrs attrs;
  attrs.mutable_matmul()->set_transpose_a(c.AttrInt("transA", 0) != 0);
  attrs.mutable_matmul()->set_transpose_b(c.AttrInt("transB", 0) != 0);
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_MATMUL, {a, b}, attrs));
  const float alpha = c.AttrFloat("alpha", 1.f), beta = c.AttrFloat("beta", 1.f);
  if (alpha != 1.f) {
    KILN_ASSIGN_OR_RETURN(ValueRef s, Scalar(c, y, alpha));
    KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_MUL, y, s));
  }
  if (c.has(2) && beta != 0.f) {
    KILN_ASSIGN_OR_RETURN(ValueRef bias, c.Ref(2));
    if (beta != 1.f) {
      KILN_ASSIGN_OR_RETURN(ValueRef s, Scalar(c, bias, beta));
      KILN_ASSIGN_OR_RETURN(bias, c.Binary(v1::BINARY_MUL, bias, s));
    }
    KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_ADD, y, bias));
  }
  c.SetOutput(0, y);
  return absl::OkStatus();
}

// Spatial padding from auto_pad / pads; `out_ceil` for pooling's ceil_mode.
struct Window {
  std::vector<int64_t> kernel, stride, dilation, lo, hi;
};

absl::StatusOr<Window> ReadWindow(Importer& c, const std::vector<int64_t>& kernel, bool ceil_mode,
                                  bool* extended) {
  const int64_t sp = static_cast<int64_t>(kernel.size());
  // kernel_shape is the client's and may disagree with X's rank
  // (kiln_fuzz_onnx_import: a 2-entry kernel_shape on a 1-D Conv read X's dims past the end).
  if (sp + 2 != c.rank(0)) {
    return c.Invalid(absl::StrCat("kernel_shape has ", sp, " entries; X of rank ", c.rank(0), " needs ",
                                  c.rank(0) - 2));
  }
  Window w;
  w.kernel = kernel;
  w.stride = c.AttrInts("strides").value_or(std::vector<int64_t>(sp, 1));
  w.dilation = c.AttrInts("dilations").value_or(std::vector<int64_t>(sp, 1));
  std::vector<int64_t> pads = c.AttrInts("pads").value_or(std::vector<int64_t>(2 * sp, 0));
  if (static_cast<int64_t>(w.stride.size()) != sp || static_cast<int64_t>(w.dilation.size()) != sp ||
      static_cast<int64_t>(pads.size()) != 2 * sp) {
    return c.Invalid("strides, dilations and pads must match the kernel's rank");
  }
  w.lo.assign(pads.begin(), pads.begin() + sp);
  w.hi.assign(pads.begin() + sp, pads.end());
  const std::string auto_pad = c.AttrString("auto_pad", "NOTSET");
  const IrDims& xd = c.type(0).dims;
  for (int64_t i = 0; i < sp; ++i) {
    if (w.stride[i] < 1 || w.dilation[i] < 1 || w.kernel[i] < 1) {
      return c.Invalid("strides, dilations and kernel sizes must be >= 1");
    }
    const int64_t in = xd[2 + i];
    const CheckedInt eff = (CheckedInt(w.kernel[i]) - 1) * w.dilation[i] + 1;
    if (!eff.ok()) return c.Invalid("dilated kernel overflows int64");
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      if (in < 0) return c.Unsupported("auto_pad SAME over a run-time spatial dim");
      const int64_t out = (in + w.stride[i] - 1) / w.stride[i];
      const CheckedInt need = (CheckedInt(out) - 1) * w.stride[i] + eff.get() - in;
      if (!need.ok()) return c.Invalid("padding overflows int64");
      const int64_t total = std::max<int64_t>(need.get(), 0);
      w.lo[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.hi[i] = total - w.lo[i];
    } else if (auto_pad == "VALID") {
      w.lo[i] = w.hi[i] = 0;
    } else if (auto_pad != "NOTSET" && !auto_pad.empty()) {
      return c.Invalid(absl::StrCat("unknown auto_pad \"", auto_pad, "\""));
    }
    if (ceil_mode) {
      if (in < 0) return c.Unsupported("ceil_mode over a run-time spatial dim");
      const CheckedInt span = CheckedInt(in) + w.lo[i] + w.hi[i] - eff.get();
      if (!span.ok() || span.get() < 0) continue;
      int64_t out = (span.get() + w.stride[i] - 1) / w.stride[i] + 1;
      // The last window must start inside the input or the low padding.
      if ((out - 1) * w.stride[i] >= in + w.lo[i]) --out;
      const int64_t extra = (out - 1) * w.stride[i] + eff.get() - (in + w.lo[i] + w.hi[i]);
      if (extra > 0) {
        w.hi[i] += extra;
        *extended = true;
      }
    }
  }
  return w;
}

absl::Status ConvOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(1));
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  const int64_t sp = c.rank(0) - 2;
  if (sp != 1 && sp != 2) return c.Unsupported(absl::StrCat(sp, "-D Conv (Kiln has 1-D and 2-D)"));
  // W is [M, C/group, k...]: checked before its spatial dims are read
  // (kiln_fuzz_onnx_import: a rank-1 W read past its dims).
  if (c.rank(1) != sp + 2) {
    return c.Invalid(
        absl::StrCat("W has rank ", c.rank(1), "; a ", sp, "-D Conv needs rank ", sp + 2));
  }
  std::vector<int64_t> kernel = c.AttrInts("kernel_shape").value_or(std::vector<int64_t>{});
  if (kernel.empty()) {
    for (int64_t i = 0; i < sp; ++i) kernel.push_back(c.type(1).dims[2 + i]);
  }
  bool extended = false;
  KILN_ASSIGN_OR_RETURN(Window w, ReadWindow(c, kernel, false, &extended));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef wt, c.Ref(1));
  std::vector<ValueRef> ops = {x, wt};
  if (c.has(2)) {
    KILN_ASSIGN_OR_RETURN(ValueRef b, c.Ref(2));
    ops.push_back(b);
  }
  v1::Attrs a;
  auto* ca = a.mutable_conv();
  for (int64_t i = 0; i < sp; ++i) {
    ca->add_stride(w.stride[i]);
    ca->add_dilation(w.dilation[i]);
    ca->add_pad_low(w.lo[i]);
    ca->add_pad_high(w.hi[i]);
  }
  ca->set_groups(c.AttrInt("group", 1));
  return Out(c, 0, c.Emit(v1::OP_CONV, ops, a));
}

// ConvTranspose (2-D): W is [C, M/group, kH, kW], as Kiln's conv_transpose2d.
// Pads come from `pads`, or from output_shape / SAME_* auto_pad by ONNX's
// total_padding rule (SAME_UPPER puts the smaller half first, the others the
// larger half).
absl::Status ConvTransposeOp(Importer& c) {
  KILN_RETURN_IF_ERROR(c.Need(1));
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  if (c.rank(0) != 4) return c.Unsupported(absl::StrCat(c.rank(0) - 2, "-D ConvTranspose (Kiln has 2-D)"));
  const IrDims& xd = c.type(0).dims;
  const IrDims& wd = c.type(1).dims;
  if (xd[2] < 0 || xd[3] < 0 || wd[2] < 0 || wd[3] < 0) return c.Unsupported("ConvTranspose with symbolic spatial dims");
  auto two = [&](const char* name, int64_t def) -> absl::StatusOr<std::vector<int64_t>> {
    std::vector<int64_t> v = c.AttrInts(name).value_or(std::vector<int64_t>{def, def});
    if (v.size() != 2) return c.Invalid(absl::StrCat(name, " must have 2 entries"));
    return v;
  };
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> stride, two("strides", 1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dil, two("dilations", 1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out_pad, two("output_padding", 0));
  std::vector<int64_t> pads = c.AttrInts("pads").value_or(std::vector<int64_t>{0, 0, 0, 0});
  if (pads.size() != 4) return c.Invalid("pads must have 4 entries");
  const std::string auto_pad = c.AttrString("auto_pad", "NOTSET");
  std::optional<std::vector<int64_t>> out_shape = c.AttrInts("output_shape");
  if (out_shape && out_shape->size() == 4) out_shape = std::vector<int64_t>(out_shape->begin() + 2, out_shape->end());
  if (out_shape && out_shape->size() != 2) return c.Invalid("output_shape must have 2 (or 4) entries");
  if (!out_shape && (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")) {
    out_shape = std::vector<int64_t>{xd[2] * stride[0], xd[3] * stride[1]};
  }
  if (auto_pad == "VALID") pads = {0, 0, 0, 0};
  if (out_shape) {
    for (int i = 0; i < 2; ++i) {
      const int64_t total = stride[i] * (xd[2 + i] - 1) + out_pad[i] + ((wd[2 + i] - 1) * dil[i] + 1) - (*out_shape)[i];
      if (total < 0) return c.Unsupported("ConvTranspose whose output_shape needs negative padding");
      const int64_t small = total / 2, large = total - total / 2;
      pads[i] = auto_pad == "SAME_UPPER" ? small : large;
      pads[2 + i] = auto_pad == "SAME_UPPER" ? large : small;
    }
  }
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  KILN_ASSIGN_OR_RETURN(ValueRef wt, c.Ref(1));
  std::vector<ValueRef> ops = {x, wt};
  if (c.has(2)) {
    KILN_ASSIGN_OR_RETURN(ValueRef b, c.Ref(2));
    ops.push_back(b);
  }
  v1::Attrs a;
  auto* t = a.mutable_conv_transpose2d();
  for (int i = 0; i < 2; ++i) {
    t->add_stride(stride[i]);
    t->add_dilation(dil[i]);
    t->add_pad_low(pads[i]);
    t->add_pad_high(pads[2 + i]);
    t->add_output_padding(out_pad[i]);
  }
  t->set_groups(c.AttrInt("group", 1));
  return Out(c, 0, c.Emit(v1::OP_CONV_TRANSPOSE2D, ops, a));
}

absl::Status PoolOp(Importer& c, v1::PoolKind kind) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  if (c.wants(1)) return c.Unsupported("MaxPool's Indices output");
  const int64_t sp = c.rank(0) - 2;
  if (sp != 1 && sp != 2) return c.Unsupported(absl::StrCat(sp, "-D pooling (Kiln has 1-D and 2-D)"));
  // ReadWindow checks kernel_shape against X's rank (for Conv too).
  std::vector<int64_t> kernel = c.AttrInts("kernel_shape").value_or(std::vector<int64_t>{});
  bool extended = false;
  KILN_ASSIGN_OR_RETURN(Window w, ReadWindow(c, kernel, c.AttrInt("ceil_mode", 0) != 0, &extended));
  for (int64_t d : w.dilation) {
    if (d != 1) return c.Unsupported("dilated pooling");
  }
  const bool include_pad = c.AttrInt("count_include_pad", 0) != 0;
  if (kind == v1::POOL_AVG && include_pad && extended) {
    return c.Unsupported("ceil_mode with count_include_pad");
  }
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  v1::Attrs a;
  auto* pa = a.mutable_pool();
  pa->set_kind(kind);
  for (int64_t i = 0; i < sp; ++i) {
    pa->add_window(w.kernel[i]);
    pa->add_stride(w.stride[i]);
    pa->add_pad_low(w.lo[i]);
    pa->add_pad_high(w.hi[i]);
  }
  pa->set_count_include_pad(include_pad);
  return Out(c, 0, c.Emit(v1::OP_POOL, {x}, a));
}

absl::Status GlobalPoolOp(Importer& c, v1::ReduceKind kind) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const IrDims& xd = c.type(0).dims;
  const int64_t sp = c.rank(0) - 2;
  const bool spatial_static =
      std::all_of(xd.begin() + std::min<int64_t>(2, c.rank(0)), xd.end(), [](int64_t d) { return d > 0; });
  if ((sp == 1 || sp == 2) && spatial_static && IsFloat(c.dtype(0))) {
    // One window over the whole plane: the backend's pooling kernel, which
    // reads the plane contiguously (a reduce over the last axes is slower).
    v1::Attrs a;
    a.mutable_pool()->set_kind(kind == v1::REDUCE_MAX ? v1::POOL_MAX : v1::POOL_AVG);
    for (int64_t i = 0; i < sp; ++i) a.mutable_pool()->add_window(xd[2 + i]);
    return Out(c, 0, c.Emit(v1::OP_POOL, {x}, a));
  }
  std::vector<int64_t> axes;
  for (int64_t k = 2; k < c.rank(0); ++k) axes.push_back(k);
  return Out(c, 0, c.Reduce(kind, x, axes, true));
}

// [C] -> [C, 1, ..., 1] to broadcast over x [N, C, ...].
absl::StatusOr<ValueRef> PerChannel(Importer& c, int i, int64_t x_rank) {
  KILN_ASSIGN_OR_RETURN(ValueRef v, c.Ref(i));
  const TensorType& t = c.TypeOf(v);
  if (t.rank() != 1) return c.Invalid(absl::StrCat("input ", i, " must be 1-D"));
  if (x_rank < 2) return v;
  IrDims dims(x_rank - 1, 1);
  dims[0] = t.dims[0];
  return c.Reshape(v, dims);
}

absl::Status BatchNormOp(Importer& c) {
  if (c.AttrInt("training_mode", 0) != 0 || c.wants(1) || c.wants(2) || c.wants(3) || c.wants(4)) {
    return c.Unsupported("BatchNormalization in training mode (Kiln imports inference graphs)");
  }
  for (int i = 1; i <= 4; ++i) KILN_RETURN_IF_ERROR(c.Need(i));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const int64_t r = c.rank(0);
  KILN_ASSIGN_OR_RETURN(ValueRef scale, PerChannel(c, 1, r));
  KILN_ASSIGN_OR_RETURN(ValueRef bias, PerChannel(c, 2, r));
  KILN_ASSIGN_OR_RETURN(ValueRef mean, PerChannel(c, 3, r));
  KILN_ASSIGN_OR_RETURN(ValueRef var, PerChannel(c, 4, r));
  // y = x * a + (bias - mean * a), a = scale / sqrt(var + eps): constant
  // statistics fold at compile time into one multiply-add per element.
  KILN_ASSIGN_OR_RETURN(ValueRef eps, Scalar(c, var, c.AttrFloat("epsilon", 1e-5f)));
  KILN_ASSIGN_OR_RETURN(ValueRef ve, c.Binary(v1::BINARY_ADD, var, eps));
  KILN_ASSIGN_OR_RETURN(ValueRef inv, c.Unary(v1::UNARY_RSQRT, ve));
  KILN_ASSIGN_OR_RETURN(ValueRef a, c.Binary(v1::BINARY_MUL, scale, inv));
  KILN_ASSIGN_OR_RETURN(ValueRef ma, c.Binary(v1::BINARY_MUL, mean, a));
  KILN_ASSIGN_OR_RETURN(ValueRef b, c.Binary(v1::BINARY_SUB, bias, ma));
  KILN_ASSIGN_OR_RETURN(a, c.Cast(a, c.dtype(0)));
  KILN_ASSIGN_OR_RETURN(b, c.Cast(b, c.dtype(0)));
  KILN_ASSIGN_OR_RETURN(ValueRef xa, c.Binary(v1::BINARY_MUL, x, a));
  return Out(c, 0, c.Binary(v1::BINARY_ADD, xa, b));
}

// (x - mean) * rsqrt(var + eps) over `axes`; `mean_out` / `inv_out` receive
// the statistics (keepdims).
absl::StatusOr<ValueRef> Normalize(Importer& c, ValueRef x, const std::vector<int64_t>& axes,
                                   double epsilon, ValueRef* mean_out = nullptr,
                                   ValueRef* inv_out = nullptr) {
  KILN_ASSIGN_OR_RETURN(ValueRef mean, c.Reduce(v1::REDUCE_MEAN, x, axes, true));
  KILN_ASSIGN_OR_RETURN(ValueRef d, c.Binary(v1::BINARY_SUB, x, mean));
  KILN_ASSIGN_OR_RETURN(ValueRef d2, c.Binary(v1::BINARY_MUL, d, d));
  KILN_ASSIGN_OR_RETURN(ValueRef var, c.Reduce(v1::REDUCE_MEAN, d2, axes, true));
  KILN_ASSIGN_OR_RETURN(ValueRef eps, Scalar(c, var, epsilon));
  KILN_ASSIGN_OR_RETURN(ValueRef ve, c.Binary(v1::BINARY_ADD, var, eps));
  KILN_ASSIGN_OR_RETURN(ValueRef inv, c.Unary(v1::UNARY_RSQRT, ve));
  if (mean_out) *mean_out = mean;
  if (inv_out) *inv_out = inv;
  return c.Binary(v1::BINARY_MUL, d, inv);
}

absl::Status InstanceNormOp(Importer& c) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  std::vector<int64_t> axes;
  for (int64_t k = 2; k < c.rank(0); ++k) axes.push_back(k);
  KILN_ASSIGN_OR_RETURN(ValueRef y, Normalize(c, x, axes, c.AttrFloat("epsilon", 1e-5f)));
  KILN_ASSIGN_OR_RETURN(ValueRef s, PerChannel(c, 1, c.rank(0)));
  KILN_ASSIGN_OR_RETURN(ValueRef b, PerChannel(c, 2, c.rank(0)));
  KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_MUL, y, s));
  return Out(c, 0, c.Binary(v1::BINARY_ADD, y, b));
}

// GroupNormalization (opset 18, 21): Kiln's GroupNorm normalizes; the affine
// part is per group before opset 21 (scale and bias of [num_groups], each
// value repeated over its group's channels) and per channel from 21 on.
absl::Status GroupNormOp(Importer& c) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_RETURN_IF_ERROR(c.Need(1));
  KILN_RETURN_IF_ERROR(c.Need(2));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const int64_t rank = c.rank(0);
  if (rank < 2) return c.Invalid("X must be [N, C, ...]");
  const int64_t groups = c.AttrInt("num_groups", 0);
  if (groups <= 0) return c.Invalid(absl::StrCat("num_groups must be positive, got ", groups));
  const int64_t ch = c.type(0).dims[1];
  if (ch < 0) return c.Unsupported("GroupNormalization with a symbolic channel count");
  if (ch % groups != 0) return c.Invalid(absl::StrCat(ch, " channels are not divisible by num_groups=", groups));
  v1::Attrs a;
  a.mutable_group_norm()->set_groups(groups);
  a.mutable_group_norm()->set_epsilon(c.AttrFloat("epsilon", 1e-5f));
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_GROUP_NORM, {x}, a));
  const bool per_group = c.opset() < 21;
  std::vector<ValueRef> affine;
  for (int i : {1, 2}) {
    KILN_ASSIGN_OR_RETURN(ValueRef v, c.Ref(i));
    KILN_ASSIGN_OR_RETURN(v, c.Cast(v, c.dtype(0)));
    const TensorType& t = c.TypeOf(v);
    const int64_t want = per_group ? groups : ch;
    if (t.rank() != 1 || t.dims[0] != want) {
      return c.Invalid(absl::StrCat("input ", i, " must be [", want, "] (", per_group ? "per group before opset 21"
                                                                                      : "per channel", ")"));
    }
    if (per_group) {  // [G] -> [G, 1] -> [G, C/G] -> [C]
      KILN_ASSIGN_OR_RETURN(v, c.Reshape(v, {groups, 1}));
      v1::Attrs e;
      e.mutable_expand()->add_shape(groups);
      e.mutable_expand()->add_shape(ch / groups);
      KILN_ASSIGN_OR_RETURN(v, c.Emit(v1::OP_EXPAND, {v}, e));
      KILN_ASSIGN_OR_RETURN(v, c.Reshape(v, {ch}));
    }
    IrDims dims(rank - 1, 1);
    dims[0] = ch;
    KILN_ASSIGN_OR_RETURN(v, c.Reshape(v, dims));
    affine.push_back(v);
  }
  KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_MUL, y, affine[0]));
  return Out(c, 0, c.Binary(v1::BINARY_ADD, y, affine[1]));
}

// TopK (K an attribute before opset 10, then input 1, known at import):
// Kiln's topk, always sorted (ONNX allows any order when sorted = 0), ties by
// the lower index, indices i64.
absl::Status TopKOp(Importer& c) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  int64_t k = 0;
  if (c.opset() < 10) {
    k = c.AttrInt("k", -1);
  } else {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kv, c.RequiredInts(1));
    if (kv.size() != 1) return c.Invalid("K must hold one value");
    k = kv[0];
  }
  const int64_t rank = c.rank(0);
  if (rank == 0) return c.Invalid("X must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", -1), rank));
  const int64_t n = c.type(0).dims[axis];
  if (k < 0 || (n >= 0 && k > n)) return c.Invalid(absl::StrCat("K=", k, " is outside [0, ", n, "]"));
  v1::Attrs a;
  a.mutable_topk()->set_k(k);
  a.mutable_topk()->set_axis(axis);
  a.mutable_topk()->set_smallest(c.AttrInt("largest", 1) == 0);
  KILN_ASSIGN_OR_RETURN(ValueRef values, c.Emit(v1::OP_TOPK, {x}, a));
  c.SetOutput(0, values);
  c.SetOutput(1, ValueRef{values.node, 1});
  return absl::OkStatus();
}

absl::Status MeanVarianceNormOp(Importer& c) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const std::vector<int64_t> axes = c.AttrInts("axes").value_or(std::vector<int64_t>{0, 2, 3});
  return Out(c, 0, Normalize(c, x, axes, 1e-9));
}

absl::Status LayerNormOp(Importer& c) {
  KILN_RETURN_IF_ERROR(NeedFloat(c, 0));
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(0));
  const int64_t rank = c.rank(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(c, c.AttrInt("axis", -1), rank));
  const double eps = c.AttrFloat("epsilon", 1e-5f);
  const IrDims normalized(c.type(0).dims.begin() + axis, c.type(0).dims.end());
  const bool exact = c.has(1) && c.type(1).dims == normalized &&
                     (!c.has(2) || c.type(2).dims == normalized) && !c.wants(1) && !c.wants(2);
  if (exact) {
    std::vector<ValueRef> ops = {x};
    for (int i : {1, 2}) {
      if (!c.has(i)) continue;
      KILN_ASSIGN_OR_RETURN(ValueRef v, c.Ref(i));
      KILN_ASSIGN_OR_RETURN(v, c.Cast(v, c.dtype(0)));
      ops.push_back(v);
    }
    v1::Attrs a;
    a.mutable_layer_norm()->set_axis(axis);
    a.mutable_layer_norm()->set_epsilon(eps);
    return Out(c, 0, c.Emit(v1::OP_LAYER_NORM, ops, a));
  }
  std::vector<int64_t> axes;
  for (int64_t k = axis; k < rank; ++k) axes.push_back(k);
  ValueRef mean, inv;
  KILN_ASSIGN_OR_RETURN(ValueRef y, Normalize(c, x, axes, eps, &mean, &inv));
  for (int i : {1, 2}) {
    if (!c.has(i)) continue;
    KILN_ASSIGN_OR_RETURN(ValueRef v, c.Ref(i));
    KILN_ASSIGN_OR_RETURN(v, c.Cast(v, c.dtype(0)));
    KILN_ASSIGN_OR_RETURN(y, c.Binary(i == 1 ? v1::BINARY_MUL : v1::BINARY_ADD, y, v));
  }
  c.SetOutput(0, y);
  c.SetOutput(1, mean);
  c.SetOutput(2, inv);
  return absl::OkStatus();
}

// x - zero_point in f32; a per-row (A: [M]) or per-column (B: [N]) zero point
// broadcasts along the right dim.
absl::StatusOr<ValueRef> Centered(Importer& c, int x_in, int zp_in, bool is_a) {
  KILN_ASSIGN_OR_RETURN(ValueRef x, c.Ref(x_in));
  KILN_ASSIGN_OR_RETURN(x, c.Cast(x, v1::DTYPE_F32));
  if (!c.has(zp_in)) return x;
  KILN_ASSIGN_OR_RETURN(ValueRef z, c.Ref(zp_in));
  KILN_ASSIGN_OR_RETURN(z, c.Cast(z, v1::DTYPE_F32));
  const TensorType& zt = c.TypeOf(z);
  if (is_a && zt.rank() == 1 && zt.dims[0] != 1) {
    KILN_ASSIGN_OR_RETURN(z, c.Reshape(z, {zt.dims[0], 1}));
  }
  return c.Binary(v1::BINARY_SUB, x, z);
}

absl::Status MatMulIntegerOp(Importer& c) {
  // Exact in f32 while every dot product stays below 2^24 (K * 255 * 255).
  KILN_ASSIGN_OR_RETURN(ValueRef a, Centered(c, 0, 2, true));
  KILN_ASSIGN_OR_RETURN(ValueRef b, Centered(c, 1, 3, false));
  v1::Attrs m;
  m.mutable_matmul();
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_MATMUL, {a, b}, m));
  return Out(c, 0, c.Cast(y, v1::DTYPE_I32));
}

absl::Status QLinearMatMulOp(Importer& c) {
  for (int i = 0; i < 8; ++i) KILN_RETURN_IF_ERROR(c.Need(i));
  KILN_ASSIGN_OR_RETURN(ValueRef a, Centered(c, 0, 2, true));
  KILN_ASSIGN_OR_RETURN(ValueRef b, Centered(c, 3, 5, false));
  KILN_ASSIGN_OR_RETURN(ValueRef as, c.Ref(1));
  KILN_ASSIGN_OR_RETURN(ValueRef bs, c.Ref(4));
  KILN_ASSIGN_OR_RETURN(as, c.Cast(as, v1::DTYPE_F32));
  KILN_ASSIGN_OR_RETURN(bs, c.Cast(bs, v1::DTYPE_F32));
  if (c.TypeOf(as).rank() == 1 && c.TypeOf(as).dims[0] != 1) {
    KILN_ASSIGN_OR_RETURN(as, c.Reshape(as, {c.TypeOf(as).dims[0], 1}));
  }
  KILN_ASSIGN_OR_RETURN(a, c.Binary(v1::BINARY_MUL, a, as));
  KILN_ASSIGN_OR_RETURN(b, c.Binary(v1::BINARY_MUL, b, bs));
  v1::Attrs m;
  m.mutable_matmul();
  KILN_ASSIGN_OR_RETURN(ValueRef y, c.Emit(v1::OP_MATMUL, {a, b}, m));
  KILN_ASSIGN_OR_RETURN(ValueRef ys, c.Ref(6));
  KILN_ASSIGN_OR_RETURN(ys, c.Cast(ys, v1::DTYPE_F32));
  KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_DIV, y, ys));
  // Round half to even, as QuantizeLinear: floor(v + 0.5) except exact ties.
  KILN_ASSIGN_OR_RETURN(ValueRef half, c.ScalarConst(v1::DTYPE_F32, 0.5));
  KILN_ASSIGN_OR_RETURN(ValueRef two, c.ScalarConst(v1::DTYPE_F32, 2));
  KILN_ASSIGN_OR_RETURN(ValueRef quarter, c.ScalarConst(v1::DTYPE_F32, 0.25));
  KILN_ASSIGN_OR_RETURN(ValueRef fl, c.Unary(v1::UNARY_FLOOR, y));
  KILN_ASSIGN_OR_RETURN(ValueRef frac, c.Binary(v1::BINARY_SUB, y, fl));
  KILN_ASSIGN_OR_RETURN(ValueRef tie, c.Compare(v1::COMPARE_EQ, frac, half));
  KILN_ASSIGN_OR_RETURN(ValueRef yh, c.Binary(v1::BINARY_DIV, y, two));
  KILN_ASSIGN_OR_RETURN(ValueRef q, c.Binary(v1::BINARY_ADD, yh, quarter));
  KILN_ASSIGN_OR_RETURN(ValueRef fq, c.Unary(v1::UNARY_FLOOR, q));
  KILN_ASSIGN_OR_RETURN(ValueRef even, c.Binary(v1::BINARY_MUL, fq, two));
  KILN_ASSIGN_OR_RETURN(ValueRef ph, c.Binary(v1::BINARY_ADD, y, half));
  KILN_ASSIGN_OR_RETURN(ValueRef near, c.Unary(v1::UNARY_FLOOR, ph));
  KILN_ASSIGN_OR_RETURN(y, c.Where(tie, even, near));
  KILN_ASSIGN_OR_RETURN(ValueRef yz, c.Ref(7));
  const DType out = c.dtype(7);
  KILN_ASSIGN_OR_RETURN(yz, c.Cast(yz, v1::DTYPE_F32));
  KILN_ASSIGN_OR_RETURN(y, c.Binary(v1::BINARY_ADD, y, yz));
  KILN_ASSIGN_OR_RETURN(y, out == v1::DTYPE_U8 ? c.Clamp(y, 0.0, 255.0) : c.Clamp(y, -128.0, 127.0));
  return Out(c, 0, c.Cast(y, out));
}

}  // namespace

void RegisterNnOps(ConverterTable& t) {
  t["MatMul"] = MatMulOp;
  t["Gemm"] = GemmOp;
  t["Conv"] = ConvOp;
  t["MaxPool"] = [](Importer& c) { return PoolOp(c, v1::POOL_MAX); };
  t["AveragePool"] = [](Importer& c) { return PoolOp(c, v1::POOL_AVG); };
  t["GlobalAveragePool"] = [](Importer& c) { return GlobalPoolOp(c, v1::REDUCE_MEAN); };
  t["GlobalMaxPool"] = [](Importer& c) { return GlobalPoolOp(c, v1::REDUCE_MAX); };
  t["BatchNormalization"] = BatchNormOp;
  t["InstanceNormalization"] = InstanceNormOp;
  t["GroupNormalization"] = GroupNormOp;
  t["TopK"] = TopKOp;
  t["ConvTranspose"] = ConvTransposeOp;
  t["MeanVarianceNormalization"] = MeanVarianceNormOp;
  t["LayerNormalization"] = LayerNormOp;
  t["MatMulInteger"] = MatMulIntegerOp;
  t["QLinearMatMul"] = QLinearMatMulOp;
}

}  // namespace kiln::io::onnx_internal
