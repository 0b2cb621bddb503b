// Inference for convolution, pooling and FFTs.
#include <limits>

#include "engine/ir/infer_internal.h"

namespace kiln::ir::infer_internal {
namespace {

// Conv and pool geometry is bounded to 32 bits. oneDNN (the CPU conv) keeps
// stride, dilation, padding and extents in int and rejects or misreads larger
// ones, which reached clients as INTERNAL at compile time. Each attribute is at
// most kMaxSpatialAttr, so any two of them still add up within int32 (oneDNN
// computes pad_high + stride), and a conv's padded input and dilated kernel
// extents are at most kMaxSpatialExtent.
constexpr int64_t kMaxSpatialExtent = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxSpatialAttr = kMaxSpatialExtent / 2;

// Per-spatial-dim attribute with a default when empty; every entry in
// [min, kMaxSpatialAttr].
absl::Status Spatial(Ctx& c, const google::protobuf::RepeatedField<int64_t>& f, int n,
                     int64_t def, int64_t min, const char* name, std::vector<int64_t>* out) {
  if (f.empty()) {
    out->assign(n, def);
    return absl::OkStatus();
  }
  if (f.size() != n) {
    return c.Error("attribute ", name, " needs ", n, " entries (one per spatial dim), got ",
                   f.size());
  }
  out->assign(f.begin(), f.end());
  for (int i = 0; i < n; ++i) {
    const int64_t v = (*out)[i];
    if (v < min) return c.Error("attribute ", name, "[", i, "]=", v, " must be >= ", min);
    if (v > kMaxSpatialAttr) {
      return c.Error("attribute ", name, "[", i, "]=", v, " exceeds the limit ", kMaxSpatialAttr);
    }
  }
  return absl::OkStatus();
}

absl::Status InferConv(Ctx& c) {
  if (auto s = c.Arity(2, 3); !s.ok()) return s;
  if (auto s = c.NeedFloat(0); !s.ok()) return s;
  if (auto s = c.SameDType(0, 1); !s.ok()) return s;
  if (c.num_operands() == 3) {
    if (auto s = c.SameDType(0, 2); !s.ok()) return s;
  }
  TensorType out;
  if (auto s = ConvResultType(c, c.in(0), c.in(1), c.num_operands() == 3 ? &c.in(2) : nullptr,
                              c.node.attrs.conv(), &out);
      !s.ok()) {
    return s;
  }
  return c.Set(std::move(out));
}

}  // namespace

absl::Status ConvResultType(Ctx& c, const TensorType& x, const TensorType& w,
                            const TensorType* bias, const v1::ConvAttrs& a, TensorType* result) {
  auto T = [&c](const TensorType& t) { return TypeToString(t, c.graph.symbols()); };
  if (x.rank() != 3 && x.rank() != 4) return c.Error("x must be [N, C, L] or [N, C, H, W], got ", T(x));
  if (w.rank() != x.rank()) return c.Error("w must have rank ", x.rank(), ", got ", T(w));
  const int sp = static_cast<int>(x.rank()) - 2;
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  if (groups < 1) return c.Error("attribute groups must be >= 1");
  std::vector<int64_t> stride, dil, lo, hi;
  if (auto s = Spatial(c, a.stride(), sp, 1, 1, "stride", &stride); !s.ok()) return s;
  if (auto s = Spatial(c, a.dilation(), sp, 1, 1, "dilation", &dil); !s.ok()) return s;
  if (auto s = Spatial(c, a.pad_low(), sp, 0, 0, "pad_low", &lo); !s.ok()) return s;
  if (auto s = Spatial(c, a.pad_high(), sp, 0, 0, "pad_high", &hi); !s.ok()) return s;
  const int64_t cin = x.dims[1], o = w.dims[0];
  if (cin >= 0 && cin % groups != 0) return c.Error("channels ", cin, " not divisible by groups");
  if (o >= 0 && o % groups != 0) return c.Error("output channels ", o, " not divisible by groups");
  // cin / groups, not w.dims[1] * groups: a huge groups would overflow.
  if (cin >= 0 && w.dims[1] >= 0 && w.dims[1] != cin / groups) {
    return c.Error("w has ", w.dims[1], " input channels per group, x has ", cin, " / ", groups);
  }
  if (bias != nullptr && (bias->rank() != 1 || !DimsCompatible(bias->dims[0], o))) {
    return c.Error("bias must be [", o, "], got ", T(*bias));
  }
  IrDims out = {x.dims[0], o};
  for (int i = 0; i < sp; ++i) {
    const int64_t in = x.dims[2 + i], k = w.dims[2 + i];
    if (in < 0 || k < 0) {
      out.push_back(kDynamic);
      continue;
    }
    if (k == 0) return c.Error("kernel dim ", i, " is zero");
    const CheckedInt eff = CheckedInt(dil[i]) * (k - 1) + 1;
    const CheckedInt padded = CheckedInt(in) + lo[i] + hi[i];
    if (!eff.ok() || eff.get() > kMaxSpatialExtent) {
      return c.Error("spatial dim ", i, ": the kernel of ", k, " dilated by dilation[", i, "]=",
                     dil[i], " spans ", eff.ok() ? absl::StrCat(eff.get()) : "more than int64",
                     ", over the limit ", kMaxSpatialExtent);
    }
    if (!padded.ok() || padded.get() > kMaxSpatialExtent) {
      return c.Error("spatial dim ", i, ": ", in, " padded by pad_low[", i, "]=", lo[i],
                     " and pad_high[", i, "]=", hi[i], " is ",
                     padded.ok() ? absl::StrCat(padded.get()) : "more than int64",
                     ", over the limit ", kMaxSpatialExtent);
    }
    if (padded.get() < eff.get()) {
      return c.Error("spatial dim ", i, " (", in, " padded to ", padded.get(),
                     ") is smaller than the dilated kernel ", eff.get());
    }
    out.push_back((padded.get() - eff.get()) / stride[i] + 1);
  }
  *result = TensorType(x.dtype, std::move(out));
  return absl::OkStatus();
}

namespace {

absl::Status InferConvTranspose(Ctx& c) {
  if (auto s = c.Arity(2, 3); !s.ok()) return s;
  if (auto s = c.NeedFloat(0); !s.ok()) return s;
  if (auto s = c.SameDType(0, 1); !s.ok()) return s;
  const TensorType& x = c.in(0);
  const TensorType& w = c.in(1);
  if (x.rank() != 4 || w.rank() != 4) return c.Error("x and w must be rank 4 (NCHW, [C, O/g, kH, kW])");
  const auto& a = c.node.attrs.conv_transpose2d();
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  if (groups < 1) return c.Error("attribute groups must be >= 1");
  std::vector<int64_t> stride, dil, lo, hi, op;
  if (auto s = Spatial(c, a.stride(), 2, 1, 1, "stride", &stride); !s.ok()) return s;
  if (auto s = Spatial(c, a.dilation(), 2, 1, 1, "dilation", &dil); !s.ok()) return s;
  if (auto s = Spatial(c, a.pad_low(), 2, 0, 0, "pad_low", &lo); !s.ok()) return s;
  if (auto s = Spatial(c, a.pad_high(), 2, 0, 0, "pad_high", &hi); !s.ok()) return s;
  if (auto s = Spatial(c, a.output_padding(), 2, 0, 0, "output_padding", &op); !s.ok()) return s;
  if (!DimsCompatible(x.dims[1], w.dims[0])) {
    return c.Error("w must have ", x.dims[1], " input channels, got ", c.T(1));
  }
  int64_t o = kDynamic;
  if (w.dims[1] >= 0) {
    const CheckedInt channels = CheckedInt(w.dims[1]) * groups;
    if (!channels.ok()) {
      return c.Overflow("output channels ", w.dims[1], " per group * groups=", groups);
    }
    o = channels.get();
  }
  if (x.dims[1] >= 0 && x.dims[1] % groups != 0) {
    return c.Error(x.dims[1], " input channels are not divisible by groups=", groups);
  }
  IrDims out = {x.dims[0], o};
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x.dims[2 + i], k = w.dims[2 + i];
    if (in < 0 || k < 0) {
      out.push_back(kDynamic);
      continue;
    }
    const CheckedInt size =
        (CheckedInt(in) - 1) * stride[i] - lo[i] - hi[i] + CheckedInt(dil[i]) * (k - 1) + op[i] + 1;
    if (!size.ok()) {
      return c.Overflow("output spatial dim ", i, " ((", in, " - 1) * stride ", stride[i],
                        " - pads ", lo[i], ", ", hi[i], " + dilation ", dil[i], " * (", k,
                        " - 1) + output_padding ", op[i], " + 1)");
    }
    if (size.get() < 0) return c.Error("output spatial dim ", i, " would be negative");
    out.push_back(size.get());
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferPool(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  if (auto s = c.NeedFloat(0); !s.ok()) return s;
  const TensorType& x = c.in(0);
  if (x.rank() != 3 && x.rank() != 4) return c.Error("x must be [N, C, L] or [N, C, H, W], got ", c.T(0));
  const int sp = static_cast<int>(x.rank()) - 2;
  const auto& a = c.node.attrs.pool();
  if (a.kind() == v1::POOL_KIND_UNSPECIFIED || !v1::PoolKind_IsValid(a.kind())) {
    return c.Error("unknown pool kind ", static_cast<int>(a.kind()));
  }
  std::vector<int64_t> window, stride, lo, hi;
  if (a.window_size() != sp) return c.Error("attribute window needs ", sp, " entries");
  if (auto s = Spatial(c, a.window(), sp, 1, 1, "window", &window); !s.ok()) return s;
  if (auto s = Spatial(c, a.stride(), sp, 0, 1, "stride", &stride); !s.ok()) return s;
  if (a.stride().empty()) stride = window;
  if (auto s = Spatial(c, a.pad_low(), sp, 0, 0, "pad_low", &lo); !s.ok()) return s;
  if (auto s = Spatial(c, a.pad_high(), sp, 0, 0, "pad_high", &hi); !s.ok()) return s;
  IrDims out = {x.dims[0], x.dims[1]};
  for (int i = 0; i < sp; ++i) {
    if (lo[i] >= window[i] || hi[i] >= window[i]) {
      return c.Error("padding on spatial dim ", i, " must be below the window ", window[i]);
    }
    const int64_t in = x.dims[2 + i];
    if (in < 0) {
      out.push_back(kDynamic);
      continue;
    }
    // lo and hi are below the window, itself at most kMaxSpatialAttr.
    const CheckedInt padded = CheckedInt(in) + lo[i] + hi[i];
    if (!padded.ok()) {
      return c.Overflow("spatial dim ", i, ": ", in, " + pad_low[", i, "]=", lo[i], " + pad_high[",
                        i, "]=", hi[i]);
    }
    if (padded.get() < window[i]) return c.Error("spatial dim ", i, " is smaller than the window");
    out.push_back((padded.get() - window[i]) / stride[i] + 1);
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

absl::Status InferFft(Ctx& c) {
  if (auto s = c.Arity(1, 1); !s.ok()) return s;
  if (auto s = c.NeedFloat(0); !s.ok()) return s;
  const TensorType& x = c.in(0);
  const v1::FftAttrs& a = c.node.op == v1::OP_FFT    ? c.node.attrs.fft()
                          : c.node.op == v1::OP_RFFT ? c.node.attrs.rfft()
                                                     : c.node.attrs.irfft();
  if (a.n() < 0) return c.Error("attribute n must be >= 0");
  IrDims out = x.dims;
  if (c.node.op == v1::OP_RFFT) {  // real [..., L] -> complex [..., n/2+1, 2]
    if (x.rank() < 1) return c.Error("rfft needs rank >= 1");
    const int64_t len = a.n() ? a.n() : x.dims.back();
    out.back() = len >= 0 ? len / 2 + 1 : kDynamic;
    out.push_back(2);
    return c.Set(TensorType(x.dtype, std::move(out)));
  }
  if (x.rank() < 2 || x.dims.back() != 2) {
    return c.Error("complex input must end in a dim of 2 (re, im), got ", c.T(0));
  }
  const int64_t len = x.dims[x.rank() - 2];
  if (c.node.op == v1::OP_FFT) {
    if (a.n()) out[x.rank() - 2] = a.n();
    return c.Set(TensorType(x.dtype, std::move(out)));
  }
  // irfft: complex [..., m, 2] -> real [..., n] with n default 2 (m - 1).
  out.pop_back();
  if (a.n() != 0) {
    out.back() = a.n();
  } else if (len < 0) {
    out.back() = kDynamic;
  } else {
    // m = 0 would give -2, which reads as a symbol.
    if (len == 0) return c.Error("irfft of an empty axis needs attribute n");
    const CheckedInt n = (CheckedInt(len) - 1) * 2;
    if (!n.ok()) return c.Overflow("default n = 2 * (", len, " - 1)");
    out.back() = n.get();
  }
  return c.Set(TensorType(x.dtype, std::move(out)));
}

}  // namespace

absl::Status InferVision(Ctx& c) {
  switch (c.node.op) {
    case v1::OP_CONV: return InferConv(c);
    case v1::OP_CONV_TRANSPOSE2D: return InferConvTranspose(c);
    case v1::OP_POOL: return InferPool(c);
    case v1::OP_FFT: case v1::OP_RFFT: case v1::OP_IRFFT: return InferFft(c);
    default: return c.Error("not a vision op");
  }
}

}  // namespace kiln::ir::infer_internal
