// Quantize, Dequantize, FakeQuantize and FakeQuantizeLSQ (forward) on the CPU.
//
// Semantics (docs/quantization.md states them for clients):
// - The integer grid: bits 8 or 4, held one value per byte. Signed (i8, or a
//   symmetric fake quantize) is [-2^(bits-1), 2^(bits-1) - 1]; unsigned (u8, or
//   an asymmetric fake quantize) is [0, 2^bits - 1].
// - The scale is a scalar (per tensor; axis unset) or [C] along `axis` (per
//   channel); the optional zero point has the scale's shape. Symmetric ops take
//   no zero point (its zero point is 0). A scale to divide by must be positive
//   and finite, a zero point must lie on the grid: either is a launch error
//   naming the node and the channel.
// - q = clamp(round_half_even(x / s) + zp, qmin, qmax), with x / s computed in
//   the input's compute precision (f32 for f32/f16/bf16, f64 for f64); NaN
//   quantizes to zp. Dequantize: (q - zp) * s. FakeQuantize: the dequantized
//   quantization, in x's dtype (the straight-through gradient is the autodiff
//   pass's business, not the kernel's).
// - Dequantize also decodes the block types (q8_0 ... q6_k; no scale operand,
//   rows of whole blocks) through the DequantMatMul decoders.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"
#include "base/checked_int.h"
#include "base/status.h"

namespace kiln::cpu {
namespace {

using backend::BufferView;
using backend::Claim;
using backend::KernelSpec;
using backend::TensorDesc;

constexpr int64_t kChunk = 1024;  // elements converted per step (stack buffers)

// A claim's reason (legalize and PrepareKernel prefix the node's label).
template <typename... Args>
absl::Status Bad(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

absl::Status Arity(const KernelSpec& spec, size_t lo, size_t hi) {
  if (spec.inputs.size() < lo || spec.inputs.size() > hi || spec.outputs.size() != 1) {
    return Bad("expects ", lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "..", hi),
               " operands and 1 result, got ", spec.inputs.size(), " and ", spec.outputs.size());
  }
  return absl::OkStatus();
}

absl::Status Output(const KernelSpec& spec, DType dtype, const Dims& dims) {
  const TensorDesc& o = spec.outputs[0];
  if (o.dtype != dtype || o.dims != dims) {
    return Bad("result is ", TypeString(o), " but the op computes ", DTypeName(dtype),
               DimsToString(dims));
  }
  return absl::OkStatus();
}

struct QuantPlan {
  DType in = v1::DTYPE_F32, out = v1::DTYPE_F32;
  bool has_zp = false;
  int64_t qmin = 0, qmax = 0;
  int64_t channels = 1, inner = 1, total = 0;  // x viewed as [outer, channels, inner]
  bool blocks = false;                         // Dequantize of a block type
  bool to_int = false;                         // Quantize
  bool round_trip = false;                     // FakeQuantize(LSQ)
};

struct QuantAttrs {
  int32_t bits = 8;
  bool has_axis = false;
  int64_t axis = 0;
  bool symmetric = false;
  DType to = v1::DTYPE_UNSPECIFIED;
};

QuantAttrs AttrsOf(const KernelSpec& spec) {
  QuantAttrs a;
  switch (spec.op) {
    case v1::OP_QUANTIZE: {
      const auto& q = spec.attrs.quantize();
      a = {q.bits(), q.has_axis(), q.axis(), q.symmetric(), q.to()};
      if (a.to == v1::DTYPE_UNSPECIFIED) a.to = v1::DTYPE_I8;
      break;
    }
    case v1::OP_DEQUANTIZE: {
      const auto& q = spec.attrs.dequantize();
      a = {8, q.has_axis(), q.axis(), false, q.to()};
      if (a.to == v1::DTYPE_UNSPECIFIED) a.to = v1::DTYPE_F32;
      break;
    }
    case v1::OP_FAKE_QUANTIZE: {
      const auto& q = spec.attrs.fake_quantize();
      a = {q.bits(), q.has_axis(), q.axis(), q.symmetric(), v1::DTYPE_UNSPECIFIED};
      break;
    }
    default: {
      const auto& q = spec.attrs.fake_quantize_lsq();
      a = {q.bits(), q.has_axis(), q.axis(), q.symmetric(), v1::DTYPE_UNSPECIFIED};
      break;
    }
  }
  return a;
}

absl::Status CheckScaleShape(const KernelSpec& spec, const TensorDesc& x, const TensorDesc& s,
                             const char* what, const QuantAttrs& a, QuantPlan& p) {
  if (!a.has_axis) {
    if (s.num_elements() != 1 || s.rank() > 1) {
      return Bad("per-tensor ", what, " must be a scalar, got ", TypeString(s));
    }
    return absl::OkStatus();
  }
  int64_t axis = 0;
  if (!NormalizeAxis(a.axis, x.rank(), &axis)) {
    return Bad("axis ", a.axis, " is out of range for ", TypeString(x));
  }
  if (s.rank() != 1 || s.dims[0] != x.dims[axis]) {
    return Bad("per-channel ", what, " must be [", x.dims[axis], "] (axis ", axis, " of ",
               TypeString(x), "), got ", TypeString(s));
  }
  p.channels = x.dims[axis];
  p.inner = Product(x.dims, axis + 1, x.dims.size());
  return absl::OkStatus();
}

absl::StatusOr<QuantPlan> Validate(const KernelSpec& spec) {
  const QuantAttrs a = AttrsOf(spec);
  QuantPlan p;
  const bool lsq = spec.op == v1::OP_FAKE_QUANTIZE_LSQ;
  if (spec.op == v1::OP_DEQUANTIZE && !spec.inputs.empty() && IsQuantized(spec.inputs[0].dtype)) {
    if (auto s = Arity(spec, 1, 1); !s.ok()) return s;
    const TensorDesc& w = spec.inputs[0];
    if (a.has_axis) return Bad("block-quantized ", TypeString(w), " takes no axis");
    const int64_t be = LayoutOf(w.dtype).block_elems;
    if (w.rank() == 0 || w.dims.back() % be != 0) {
      return Bad(TypeString(w), ": rows are not whole ", be, "-element ", DTypeName(w.dtype),
                 " blocks");
    }
    if (!IsFloat(a.to)) return Bad("attribute to must be a float type");
    CheckedInt total = 1;
    for (int64_t d : w.dims) total = total * d;
    if (!total.ok() || !(total * 8).ok()) return Bad("sizes overflow int64: ", TypeString(w));
    if (auto s = Output(spec, a.to, w.dims); !s.ok()) return s;
    p.in = w.dtype;
    p.out = a.to;
    p.blocks = true;
    p.total = total.get();
    return p;
  }
  if (auto s = Arity(spec, 2, lsq ? 2 : 3); !s.ok()) return s;
  const TensorDesc& x = spec.inputs[0];
  const TensorDesc& s = spec.inputs[1];
  CheckedInt total = 1;
  for (int64_t d : x.dims) total = total * d;
  if (!total.ok() || !(total * 8).ok()) return Bad("sizes overflow int64: ", TypeString(x));
  p.in = x.dtype;
  p.total = total.get();
  p.inner = p.total;
  p.has_zp = spec.inputs.size() == 3;
  if (!IsFloat(s.dtype)) return Bad("scale must be a float type, got ", TypeString(s));
  if (auto st = CheckScaleShape(spec, x, s, "scale", a, p); !st.ok()) return st;
  if (p.has_zp) {
    const TensorDesc& z = spec.inputs[2];
    if (a.symmetric) {
      return Bad("symmetric quantization takes no zero point (it is 0), got ", TypeString(z));
    }
    if (z.dims != s.dims) {
      return Bad("zero point ", TypeString(z), " must have the scale's shape ", TypeString(s));
    }
  }
  if (spec.op != v1::OP_DEQUANTIZE && a.bits != 8 && a.bits != 4) {
    return Bad("attribute bits=", a.bits, " must be 8 or 4");
  }
  const int64_t levels = int64_t{1} << a.bits;
  switch (spec.op) {
    case v1::OP_QUANTIZE: {
      if (!IsFloat(x.dtype)) return Bad("quantizes a float tensor, got ", TypeString(x));
      if (a.to != v1::DTYPE_I8 && a.to != v1::DTYPE_U8) {
        return Bad("attribute to must be i8 or u8, got ", DTypeName(a.to));
      }
      if (a.symmetric && a.to != v1::DTYPE_I8) {
        return Bad("symmetric quantization is signed: attribute to must be i8");
      }
      if (p.has_zp && spec.inputs[2].dtype != a.to) {
        return Bad("zero point must be ", DTypeName(a.to), " like the result, got ",
                   TypeString(spec.inputs[2]));
      }
      p.out = a.to;
      p.to_int = true;
      break;
    }
    case v1::OP_DEQUANTIZE: {
      if (x.dtype != v1::DTYPE_I8 && x.dtype != v1::DTYPE_U8) {
        return Bad("dequantizes i8, u8 or a block type, got ", TypeString(x));
      }
      if (!IsFloat(a.to)) return Bad("attribute to must be a float type");
      if (p.has_zp && spec.inputs[2].dtype != x.dtype) {
        return Bad("zero point must be ", DTypeName(x.dtype), " like the input, got ",
                   TypeString(spec.inputs[2]));
      }
      p.out = a.to;
      const bool sign = x.dtype == v1::DTYPE_I8;
      p.qmin = sign ? -128 : 0;
      p.qmax = sign ? 127 : 255;
      if (auto st = Output(spec, p.out, x.dims); !st.ok()) return st;
      return p;
    }
    default: {
      if (!IsFloat(x.dtype)) {
        return Bad("fake-quantizes a float tensor, got ", TypeString(x));
      }
      if (p.has_zp && !IsFloat(spec.inputs[2].dtype) && !IsInteger(spec.inputs[2].dtype)) {
        return Bad("zero point must be a number type, got ", TypeString(spec.inputs[2]));
      }
      p.out = x.dtype;
      p.round_trip = true;
      break;
    }
  }
  const bool sign = p.to_int ? a.to == v1::DTYPE_I8 : a.symmetric;
  p.qmin = sign ? -levels / 2 : 0;
  p.qmax = sign ? levels / 2 - 1 : levels - 1;
  if (auto st = Output(spec, p.out, x.dims); !st.ok()) return st;
  return p;
}

Claim SupportsQuant(const KernelSpec& spec) {
  auto p = Validate(spec);
  if (!p.ok()) return Claim::No(std::string(p.status().message()));
  return Claim::Yes();
}

// n values of a small dense tensor as doubles.
std::vector<double> ReadDoubles(const void* src, DType dtype, int64_t n) {
  std::vector<double> out(n);
  const ew::RegClass cls = ew::ClassOf(dtype);
  std::vector<char> reg(n * ew::RegSize(cls));
  if (n > 0) ew::Load(src, dtype, 1, n, reg.data());
  for (int64_t i = 0; i < n; ++i) {
    switch (cls) {
      case ew::RegClass::kF32:
        out[i] = reinterpret_cast<const float*>(reg.data())[i];
        break;
      case ew::RegClass::kF64:
        out[i] = reinterpret_cast<const double*>(reg.data())[i];
        break;
      case ew::RegClass::kI64:
        out[i] = static_cast<double>(reinterpret_cast<const int64_t*>(reg.data())[i]);
        break;
    }
  }
  return out;
}

template <typename T>
inline T QuantizeValue(T x, T s, T zp, T qmin, T qmax) {
  if (std::isnan(x)) return zp;
  const T q = std::nearbyint(x / s) + zp;  // the default rounding mode: half to even
  return q < qmin ? qmin : (q > qmax ? qmax : q);
}

class QuantKernel final : public CpuKernel {
 public:
  static absl::StatusOr<std::unique_ptr<backend::Kernel>> Create(const KernelSpec& spec) {
    auto v = Validate(spec);
    if (!v.ok()) return SpecError(spec, v.status().message());
    const QuantPlan p = *v;
    return std::unique_ptr<backend::Kernel>(new QuantKernel(spec, p));
  }

  std::string implementation() const override {
    if (plan_.blocks) {
      return absl::StrCat("kiln:dequantize_", DTypeName(plan_.in), "_", dq::Best().isa);
    }
    return absl::StrCat("kiln:",
                        spec_.op == v1::OP_QUANTIZE     ? "quantize"
                        : spec_.op == v1::OP_DEQUANTIZE ? "dequantize"
                                                        : "fake_quantize",
                        plan_.channels > 1 || plan_.inner != plan_.total ? "_per_channel" : "");
  }

  absl::Status Run(std::span<const BufferView> inputs,
                   std::span<const BufferView> outputs) override {
    if (auto s = CheckViews(spec_, inputs, outputs); !s.ok()) return s;
    if (plan_.total == 0) return absl::OkStatus();
    if (plan_.blocks) return RunBlocks(inputs[0].host(), outputs[0].host());
    const int64_t c = plan_.channels;
    scale_ = ReadDoubles(inputs[1].host(), spec_.inputs[1].dtype, c);
    zp_ = plan_.has_zp ? ReadDoubles(inputs[2].host(), spec_.inputs[2].dtype, c)
                       : std::vector<double>(c, 0.0);
    if (plan_.to_int || plan_.round_trip) {
      for (int64_t i = 0; i < c; ++i) {
        if (!(scale_[i] > 0) || !std::isfinite(scale_[i])) {
          return SpecError(spec_, "scale", c > 1 ? absl::StrCat(" of channel ", i) : "", " is ",
                           scale_[i], "; it must be positive and finite");
        }
      }
    }
    if (plan_.to_int) {
      for (int64_t i = 0; i < c; ++i) {
        if (zp_[i] < plan_.qmin || zp_[i] > plan_.qmax) {
          return SpecError(spec_, "zero point", c > 1 ? absl::StrCat(" of channel ", i) : "",
                           " is ", zp_[i], ", outside the ", spec_.attrs.quantize().bits(),
                           "-bit grid [", plan_.qmin, ", ", plan_.qmax, "]");
        }
      }
    }
    const void* x = inputs[0].host();
    void* y = outputs[0].host();
    const bool wide = plan_.in == v1::DTYPE_F64 || plan_.out == v1::DTYPE_F64;
    ParallelFor(plan_.total, 16 * kChunk, [&](int64_t b, int64_t e) {
      if (wide) {
        Segments<double>(x, y, b, e);
      } else {
        Segments<float>(x, y, b, e);
      }
    });
    return absl::OkStatus();
  }

 private:
  QuantKernel(const KernelSpec& spec, const QuantPlan& p) : spec_(spec), plan_(p) {}

  // Elements [b, e), in runs of one channel and at most kChunk.
  template <typename T>
  void Segments(const void* x, void* y, int64_t b, int64_t e) const {
    const QuantPlan& p = plan_;
    const ew::RegClass in_cls = ew::ClassOf(p.in), out_cls = ew::ClassOf(p.out);
    alignas(64) T in[kChunk], out[kChunk];
    alignas(64) char reg[kChunk * 8];
    const int64_t in_size = ElementSize(p.in), out_size = ElementSize(p.out);
    for (int64_t i = b; i < e;) {
      const int64_t seg = i / p.inner;
      const int64_t c = seg % p.channels;
      const int64_t n = std::min({e, (seg + 1) * p.inner, i + kChunk}) - i;
      const T s = static_cast<T>(scale_[c]), zp = static_cast<T>(zp_[c]);
      const T qmin = static_cast<T>(p.qmin), qmax = static_cast<T>(p.qmax);
      Widen(static_cast<const char*>(x) + i * in_size, p.in, in_cls, n, reg, in);
      if (p.to_int) {
        for (int64_t j = 0; j < n; ++j) out[j] = QuantizeValue(in[j], s, zp, qmin, qmax);
      } else if (p.round_trip) {
        for (int64_t j = 0; j < n; ++j) out[j] = (QuantizeValue(in[j], s, zp, qmin, qmax) - zp) * s;
      } else {
        for (int64_t j = 0; j < n; ++j) out[j] = (in[j] - zp) * s;
      }
      Narrow(out, out_cls, p.out, n, reg, static_cast<char*>(y) + i * out_size);
      i += n;
    }
  }

  // Storage -> T through the storage's register class.
  template <typename T>
  static void Widen(const void* src, DType dtype, ew::RegClass cls, int64_t n, char* reg, T* dst) {
    ew::Load(src, dtype, 1, n, reg);
    for (int64_t j = 0; j < n; ++j) {
      switch (cls) {
        case ew::RegClass::kF32:
          dst[j] = static_cast<T>(reinterpret_cast<float*>(reg)[j]);
          break;
        case ew::RegClass::kF64:
          dst[j] = static_cast<T>(reinterpret_cast<double*>(reg)[j]);
          break;
        case ew::RegClass::kI64:
          dst[j] = static_cast<T>(reinterpret_cast<int64_t*>(reg)[j]);
          break;
      }
    }
  }
  // T -> storage (integers are already on the grid, so the cast is exact).
  template <typename T>
  static void Narrow(const T* src, ew::RegClass cls, DType dtype, int64_t n, char* reg, void* dst) {
    for (int64_t j = 0; j < n; ++j) {
      switch (cls) {
        case ew::RegClass::kF32:
          reinterpret_cast<float*>(reg)[j] = static_cast<float>(src[j]);
          break;
        case ew::RegClass::kF64:
          reinterpret_cast<double*>(reg)[j] = static_cast<double>(src[j]);
          break;
        case ew::RegClass::kI64:
          reinterpret_cast<int64_t*>(reg)[j] = static_cast<int64_t>(src[j]);
          break;
      }
    }
    ew::Store(reg, dtype, n, dst);
  }

  absl::Status RunBlocks(const void* src, void* dst) const {
    const DTypeLayout layout = LayoutOf(plan_.in);
    const int64_t blocks = plan_.total / layout.block_elems;
    const uint8_t* w = static_cast<const uint8_t*>(src);
    const int64_t per_step = std::max<int64_t>(1, kChunk / layout.block_elems);
    ParallelFor(blocks, 64, [&](int64_t b0, int64_t b1) {
      alignas(64) float buf[kChunk > quant::kQK ? kChunk : quant::kQK];
      alignas(64) double wide[kChunk > quant::kQK ? kChunk : quant::kQK];
      for (int64_t b = b0; b < b1; b += per_step) {
        const int64_t nb = std::min(per_step, b1 - b);
        const int64_t n = nb * layout.block_elems;
        const uint8_t* in = w + b * layout.block_bytes;
        if (plan_.out == v1::DTYPE_F64) {
          quant::DequantizeBlocks(plan_.in, in, nb, wide);  // exact
          std::memcpy(static_cast<double*>(dst) + b * layout.block_elems, wide, n * 8);
          continue;
        }
        dq::Best().decode(plan_.in, in, nb, buf);
        NarrowRow(buf, plan_.out, n,
                  static_cast<char*>(dst) + b * layout.block_elems * ElementSize(plan_.out));
      }
    });
    return absl::OkStatus();
  }

  KernelSpec spec_;
  QuantPlan plan_;
  // Per launch (Launch is not reentrant).
  std::vector<double> scale_, zp_;
};

const CpuOpRegistration kRegistration({
    {v1::OP_QUANTIZE, &SupportsQuant, &QuantKernel::Create},
    {v1::OP_DEQUANTIZE, &SupportsQuant, &QuantKernel::Create},
    {v1::OP_FAKE_QUANTIZE, &SupportsQuant, &QuantKernel::Create},
    {v1::OP_FAKE_QUANTIZE_LSQ, &SupportsQuant, &QuantKernel::Create},
});

}  // namespace
}  // namespace kiln::cpu
