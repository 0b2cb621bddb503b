#include "backends/cuda/codegen_elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/half.h"

namespace kiln::cuda {
namespace {

using backend::ElementwiseRegion;
using backend::KernelSpec;
using backend::PlanRegionIndexing;
using backend::RegionIndexExpr;
using backend::RegionIndexPlan;
using backend::RegionInstr;
using backend::RegionValueDTypes;

// How a value lives in registers.
enum class CType { kFloat, kInt, kInt64 };

CType CTypeOf(DType d) {
  if (d == v1::DTYPE_I64) return CType::kInt64;
  if (d == v1::DTYPE_F32 || d == v1::DTYPE_F16 || d == v1::DTYPE_BF16) return CType::kFloat;
  return CType::kInt;  // i8, u8, i16, i32, bool (0/1)
}

const char* CudaType(CType t) {
  switch (t) {
    case CType::kFloat:
      return "float";
    case CType::kInt:
      return "int";
    case CType::kInt64:
      return "long long";
  }
  return "?";
}
const char* UnsignedType(CType t) { return t == CType::kInt64 ? "unsigned long long" : "unsigned"; }

// The element type of a tensor of `d` in memory; "" for types not served.
const char* BufferType(DType d) {
  switch (d) {
    case v1::DTYPE_F32:
      return "float";
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      return "unsigned short";
    case v1::DTYPE_I16:
      return "short";
    case v1::DTYPE_I8:
      return "signed char";
    case v1::DTYPE_U8:
    case v1::DTYPE_BOOL:
      return "unsigned char";
    case v1::DTYPE_I32:
      return "int";
    case v1::DTYPE_I64:
      return "long long";
    default:
      return "";
  }
}

std::string FloatLit(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isfinite(f) && static_cast<float>(static_cast<int>(f)) == f && std::fabs(f) < 1e6f &&
      !(f == 0.0f && std::signbit(f))) {
    return absl::StrCat(static_cast<int>(f), ".0f");
  }
  return absl::StrFormat("__int_as_float(0x%08x)", bits);
}

std::string IntLit(int64_t v, CType t) {
  if (t == CType::kInt64) {
    if (v == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807LL - 1LL)";
    return absl::StrCat(v, "LL");
  }
  if (v == std::numeric_limits<int32_t>::min()) return "(-2147483647 - 1)";
  return absl::StrCat(v);
}

// The value `x` (already in its ctype) rounded to what `d` can store.
std::string RoundTo(const std::string& x, DType d) {
  switch (d) {
    case v1::DTYPE_F16:
      return absl::StrCat("k_round_f16(", x, ")");
    case v1::DTYPE_BF16:
      return absl::StrCat("k_round_bf16(", x, ")");
    case v1::DTYPE_I8:
      return absl::StrCat("static_cast<int>(static_cast<signed char>(", x, "))");
    case v1::DTYPE_I16:
      return absl::StrCat("static_cast<int>(static_cast<short>(", x, "))");
    case v1::DTYPE_U8:
      return absl::StrCat("((", x, ") & 0xff)");
    case v1::DTYPE_BOOL:
      return absl::StrCat("((", x, ") != 0 ? 1 : 0)");
    default:
      return x;
  }
}

std::pair<int64_t, int64_t> IntRange(DType d) {
  switch (d) {
    case v1::DTYPE_I8:
      return {-128, 127};
    case v1::DTYPE_U8:
      return {0, 255};
    case v1::DTYPE_I16:
      return {-32768, 32767};
    case v1::DTYPE_I32:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case v1::DTYPE_BOOL:
      return {0, 1};
    default:
      return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

// Two's-complement wrapping a OP b (signed overflow is undefined in C++).
std::string Wrap(const std::string& a, const char* op, const std::string& b, CType t) {
  return absl::StrCat("static_cast<", CudaType(t), ">(static_cast<", UnsignedType(t), ">(", a, ") ",
                      op, " static_cast<", UnsignedType(t), ">(", b, "))");
}

// The IR's cast of `x` (a value of dtype `from`) to `to`.
std::string Cast(const std::string& x, DType from, DType to) {
  const CType cf = CTypeOf(from), ct = CTypeOf(to);
  if (to == v1::DTYPE_BOOL) {
    if (cf == CType::kFloat) return absl::StrCat("(k_nonzero(", x, ") ? 1 : 0)");
    return absl::StrCat("((", x, ") != 0 ? 1 : 0)");
  }
  if (ct == CType::kFloat) {
    const std::string f = cf == CType::kFloat ? x : absl::StrCat("static_cast<float>(", x, ")");
    return RoundTo(f, to);
  }
  if (cf == CType::kFloat) {  // truncate toward zero, saturate, NaN -> 0
    const auto [lo, hi] = IntRange(to);
    const std::string type = CudaType(ct);
    return absl::StrCat("(isnan(", x, ") ? ", IntLit(0, ct), " : (", x,
                        " <= ", FloatLit(static_cast<float>(lo)), " ? ", IntLit(lo, ct), " : (", x,
                        " >= ", FloatLit(static_cast<float>(hi)), " ? ", IntLit(hi, ct),
                        " : static_cast<", type, ">(", x, "))))");
  }
  if (ct == CType::kInt64) {
    return cf == CType::kInt64 ? x : absl::StrCat("static_cast<long long>(", x, ")");
  }
  const std::string narrowed = cf == CType::kInt64 ? absl::StrCat("static_cast<int>(", x, ")") : x;
  return RoundTo(narrowed, to);
}

std::string UnaryFloat(v1::UnaryKind k, const std::string& x) {
  auto call = [&](const char* f) { return absl::StrCat(f, "(", x, ")"); };
  switch (k) {
    case v1::UNARY_IDENTITY:
      return x;
    case v1::UNARY_RELU:
      return absl::StrCat("(", x, " < 0.0f ? 0.0f : ", x, ")");
    case v1::UNARY_GELU:
      return call("k_gelu");
    case v1::UNARY_GELU_TANH:
      return call("k_gelu_tanh");
    case v1::UNARY_SILU:
      return call("k_silu");
    case v1::UNARY_SIGMOID:
      return call("k_sigmoid");
    case v1::UNARY_TANH:
      return call("tanhf");
    case v1::UNARY_EXP:
      return call("expf");
    case v1::UNARY_LOG:
      return call("logf");
    case v1::UNARY_SQRT:
      return call("sqrtf");
    case v1::UNARY_RSQRT:
      return call("k_rsqrt");
    case v1::UNARY_NEG:
      return absl::StrCat("(-", x, ")");
    case v1::UNARY_ABS:
      return call("fabsf");
    case v1::UNARY_SIN:
      return call("sinf");
    case v1::UNARY_COS:
      return call("cosf");
    case v1::UNARY_ERF:
      return call("erff");
    case v1::UNARY_FLOOR:
      return call("floorf");
    case v1::UNARY_CEIL:
      return call("ceilf");
    case v1::UNARY_ROUND:
      return call("rintf");
    case v1::UNARY_SIGN:
      return call("k_sign");
    case v1::UNARY_RECIPROCAL:
      return absl::StrCat("(1.0f / ", x, ")");
    case v1::UNARY_SOFTPLUS:
      return call("k_softplus");
    default:
      return "";
  }
}

std::string UnaryInt(v1::UnaryKind k, const std::string& x, CType t) {
  const std::string zero = IntLit(0, t), one = IntLit(1, t);
  switch (k) {
    case v1::UNARY_IDENTITY:
      return x;
    case v1::UNARY_RELU:
      return absl::StrCat("(", x, " < ", zero, " ? ", zero, " : ", x, ")");
    case v1::UNARY_NEG:
      return Wrap(zero, "-", x, t);
    case v1::UNARY_ABS:
      return absl::StrCat("(", x, " < ", zero, " ? ", Wrap(zero, "-", x, t), " : ", x, ")");
    case v1::UNARY_SIGN:
      return absl::StrCat("((", x, " > ", zero, " ? ", one, " : ", zero, ") - (", x, " < ", zero,
                          " ? ", one, " : ", zero, "))");
    default:
      return "";
  }
}

std::string BinaryExpr(v1::BinaryKind k, const std::string& a, const std::string& b, CType t) {
  if (t == CType::kFloat) {
    switch (k) {
      case v1::BINARY_ADD:
        return absl::StrCat("(", a, " + ", b, ")");
      case v1::BINARY_SUB:
        return absl::StrCat("(", a, " - ", b, ")");
      case v1::BINARY_MUL:
        return absl::StrCat("(", a, " * ", b, ")");
      case v1::BINARY_DIV:
        return absl::StrCat("(", a, " / ", b, ")");
      case v1::BINARY_MAX:
        return absl::StrCat("k_max(", a, ", ", b, ")");
      case v1::BINARY_MIN:
        return absl::StrCat("k_min(", a, ", ", b, ")");
      case v1::BINARY_POW:
        return absl::StrCat("powf(", a, ", ", b, ")");
      default:
        return "";
    }
  }
  const std::string zero = IntLit(0, t), minus1 = IntLit(-1, t);
  switch (k) {
    case v1::BINARY_ADD:
      return Wrap(a, "+", b, t);
    case v1::BINARY_SUB:
      return Wrap(a, "-", b, t);
    case v1::BINARY_MUL:
      return Wrap(a, "*", b, t);
    case v1::BINARY_DIV:  // x / 0 = 0; x / -1 negates (INT_MIN wraps), never a trapping divide
      return absl::StrCat("(", b, " == ", zero, " ? ", zero, " : (", b, " == ", minus1, " ? ",
                          Wrap(zero, "-", a, t), " : ", a, " / ", b, "))");
    case v1::BINARY_MAX:
      return absl::StrCat("(", a, " > ", b, " ? ", a, " : ", b, ")");
    case v1::BINARY_MIN:
      return absl::StrCat("(", a, " < ", b, " ? ", a, " : ", b, ")");
    default:
      return "";
  }
}

const char* CompareOp(v1::CompareKind k) {
  switch (k) {
    case v1::COMPARE_EQ:
      return "==";
    case v1::COMPARE_NE:
      return "!=";
    case v1::COMPARE_LT:
      return "<";
    case v1::COMPARE_LE:
      return "<=";
    case v1::COMPARE_GT:
      return ">";
    case v1::COMPARE_GE:
      return ">=";
    default:
      return "";
  }
}

// One instruction's expression, rounded to its dtype; "" if unsupported.
// `round` false leaves an f16/bf16 result in f32, for a value that is only
// stored (the store rounds it to the same bits: rounding twice is rounding
// once, and it costs instructions in kernels meant to run at copy speed).
std::string InstrExpr(const RegionInstr& in, const std::vector<std::string>& names,
                      bool round = true) {
  const DType dt = in.dtype;
  const CType ct = CTypeOf(dt);
  auto arg = [&](int k) { return names[in.args[k]]; };
  const bool lowp = dt == v1::DTYPE_F16 || dt == v1::DTYPE_BF16;
  auto rounded = [&](const std::string& e) { return round || !lowp ? RoundTo(e, dt) : e; };
  switch (in.op) {
    case v1::OP_UNARY: {
      const auto kind = static_cast<v1::UnaryKind>(in.kind);
      // f16/bf16 results take the cheaper GELU (k_gelu_lowp: exact to their precision).
      const std::string e = ct != CType::kFloat ? UnaryInt(kind, arg(0), ct)
                            : (kind == v1::UNARY_GELU && lowp)
                                ? absl::StrCat("k_gelu_lowp(", arg(0), ")")
                                : UnaryFloat(kind, arg(0));
      return e.empty() ? e : rounded(e);
    }
    case v1::OP_BINARY: {
      const std::string e = BinaryExpr(static_cast<v1::BinaryKind>(in.kind), arg(0), arg(1), ct);
      return e.empty() ? e : rounded(e);
    }
    case v1::OP_COMPARE: {
      const char* op = CompareOp(static_cast<v1::CompareKind>(in.kind));
      if (*op == '\0') return "";
      return absl::StrCat("(", arg(0), " ", op, " ", arg(1), " ? 1 : 0)");
    }
    case v1::OP_WHERE:
      return absl::StrCat("(", arg(0), " != 0 ? ", arg(1), " : ", arg(2), ")");
    case v1::OP_CAST:
      if (!round && lowp) {  // the store rounds: the f32 value of the source
        return CTypeOf(in.arg_dtype) == CType::kFloat
                   ? arg(0)
                   : absl::StrCat("static_cast<float>(", arg(0), ")");
      }
      return Cast(arg(0), in.arg_dtype, dt);
    case v1::OP_CLAMP: {
      const std::string x = arg(0);
      if (ct == CType::kFloat) {
        std::string e = x;
        if (in.has_hi) {
          const std::string hi = FloatLit(static_cast<float>(in.hi));
          e = absl::StrCat("(", x, " > ", hi, " ? ", hi, " : ", e, ")");
        }
        if (in.has_lo) {
          const std::string lo = FloatLit(static_cast<float>(in.lo));
          e = absl::StrCat("(", x, " < ", lo, " ? ", lo, " : ", e, ")");
        }
        return rounded(e);
      }
      // Integers: the nearest integers inside the bounds, within the type.
      const auto [tmin, tmax] = IntRange(dt);
      std::string e = x;
      if (in.has_hi) {
        const double hi =
            std::clamp(std::floor(in.hi), static_cast<double>(tmin), static_cast<double>(tmax));
        const std::string h = IntLit(static_cast<int64_t>(hi), ct);
        e = absl::StrCat("(", x, " > ", h, " ? ", h, " : ", e, ")");
      }
      if (in.has_lo) {
        const double lo =
            std::clamp(std::ceil(in.lo), static_cast<double>(tmin), static_cast<double>(tmax));
        const std::string l = IntLit(static_cast<int64_t>(lo), ct);
        e = absl::StrCat("(", x, " < ", l, " ? ", l, " : ", e, ")");
      }
      return e;
    }
    case v1::OP_CONSTANT: {
      const double v = in.scalar;
      if (dt == v1::DTYPE_BOOL) return v != 0 ? "1" : "0";
      if (ct == CType::kFloat) {
        float r = static_cast<float>(v);
        if (dt == v1::DTYPE_F16) r = HalfToFloat(FloatToHalf(r));
        if (dt == v1::DTYPE_BF16) r = Bf16ToFloat(FloatToBf16(r));
        return FloatLit(r);
      }
      if (std::isnan(v)) return IntLit(0, ct);
      const auto [lo, hi] = IntRange(dt);
      const double t = std::trunc(std::clamp(v, static_cast<double>(lo), static_cast<double>(hi)));
      return IntLit(static_cast<int64_t>(t), ct);
    }
    default:
      return "";
  }
}

}  // namespace

std::string ElementwiseUnsupported(const KernelSpec& spec, const ElementwiseRegion& region) {
  if (spec.outputs.size() != region.results.size() || spec.outputs.empty()) {
    return "outputs do not match the region's results";
  }
  for (const auto& t : spec.outputs) {
    if (t.dims != spec.outputs[0].dims) return "outputs differ in shape";
  }
  for (const auto& t : spec.inputs) {
    if (t.dims.size() > spec.outputs[0].dims.size()) return "an input outranks the output";
  }
  for (DType d : RegionValueDTypes(region)) {
    if (d == v1::DTYPE_F64) return "f64 arithmetic is not supported by cuda kernels";
    if (*BufferType(d) == '\0') return absl::StrCat(DTypeName(d), " is not a dense type served");
  }
  std::vector<std::string> names(region.num_values(), "x");
  for (size_t j = 0; j < region.instrs.size(); ++j) {
    const RegionInstr& in = region.instrs[j];
    if (InstrExpr(in, names).empty()) {
      return absl::StrCat("no code for instruction ", j, " (", v1::OpKind_Name(in.op), " on ",
                          DTypeName(in.dtype), ")");
    }
  }
  return "";
}

std::string GenerateElementwise(const KernelSpec& spec, const ElementwiseRegion& region) {
  const int n = static_cast<int>(spec.inputs.size());
  const int64_t total = spec.outputs[0].num_elements();
  // 32-bit indices where every offset fits (most tensors): cheaper division.
  const bool narrow = total < (int64_t{1} << 31);
  const char* index_type = narrow ? "unsigned" : "unsigned long long";
  const char* suffix = narrow ? "u" : "ULL";
  std::string src = KernelSource("");
  std::vector<std::string> params;
  params.reserve(spec.inputs.size() + spec.outputs.size());
  for (int i = 0; i < n; ++i) {
    params.push_back(absl::StrCat("const ", BufferType(spec.inputs[i].dtype), "* in", i));
  }
  for (size_t k = 0; k < spec.outputs.size(); ++k) {
    params.push_back(absl::StrCat(BufferType(spec.outputs[k].dtype), "* out", k));
  }
  const RegionIndexPlan plan = PlanRegionIndexing(spec);
  std::vector<bool> used(n, false);
  for (const RegionInstr& in : region.instrs) {
    for (int k = 0; k < in.num_args; ++k) {
      if (in.args[k] < n) used[in.args[k]] = true;
    }
  }
  const std::vector<int64_t> out_strides = RowMajorStrides(plan.dims);
  bool coords = false;
  std::vector<int> kind(n, 0);  // 0 = same index, 1 = scalar, 2 = general
  for (int i = 0; i < n; ++i) {
    bool same = true, scalar = true;
    for (size_t k = 0; k < plan.dims.size(); ++k) {
      same = same && plan.strides[i][k] == out_strides[k];
      scalar = scalar && plan.strides[i][k] == 0;
    }
    kind[i] = same ? 0 : scalar ? 1 : 2;
    coords = coords || (used[i] && kind[i] == 2);
  }
  // The vectorized path: no input read through a broadcast index, so each
  // thread takes `width` consecutive elements with one access of at most 16
  // bytes per operand (width = 16 / the widest operand element). It runs
  // when every such operand's base pointer is 16-byte aligned (checked in
  // the kernel: planned buffers may sit at any offset); the tail and
  // unaligned launches take the scalar loop.
  int64_t widest = 1;
  for (int i = 0; i < n; ++i) {
    if (used[i] && kind[i] == 0)
      widest = std::max<int64_t>(widest, ElementSize(spec.inputs[i].dtype));
  }
  for (const auto& t : spec.outputs) widest = std::max<int64_t>(widest, ElementSize(t.dtype));
  const int64_t width = 16 / widest;
  const bool vectorize = !coords && width > 1 && total >= width;
  // Instructions whose value is only stored, not read by a later one: the
  // store's conversion rounds them (InstrExpr's `round`).
  std::vector<bool> stored_only(region.instrs.size(), false);
  for (int r : region.results) stored_only[r] = true;
  for (const RegionInstr& in : region.instrs) {
    for (int k = 0; k < in.num_args; ++k) {
      if (in.args[k] >= n) stored_only[in.args[k] - n] = false;
    }
  }

  // The per-element statements: loads (`raw(i)` is input i's element),
  // the instructions, and `store(k, value)` per result.
  auto body = [&](const std::function<std::string(int)>& raw,
                  const std::function<std::string(size_t, const std::string&)>& store_to,
                  const char* indent) {
    std::string b;
    std::vector<std::string> names(n + region.instrs.size());
    for (int i = 0; i < n; ++i) {
      names[i] = absl::StrCat("v", i);
      if (!used[i]) continue;
      const std::string r = raw(i);
      std::string load;
      switch (spec.inputs[i].dtype) {
        case v1::DTYPE_F16:
          load = absl::StrCat("k_f16_to_f32(", r, ")");
          break;
        case v1::DTYPE_BF16:
          load = absl::StrCat("k_bf16_to_f32(", r, ")");
          break;
        case v1::DTYPE_I8:
        case v1::DTYPE_I16:
        case v1::DTYPE_U8:
          load = absl::StrCat("static_cast<int>(", r, ")");
          break;
        case v1::DTYPE_BOOL:
          load = absl::StrCat("(", r, " != 0 ? 1 : 0)");
          break;
        default:
          load = r;
          break;
      }
      absl::StrAppend(&b, indent, "const ", CudaType(CTypeOf(spec.inputs[i].dtype)), " ", names[i],
                      " = ", load, ";\n");
    }
    for (size_t j = 0; j < region.instrs.size(); ++j) {
      const RegionInstr& in = region.instrs[j];
      names[n + j] = absl::StrCat("v", n + j);
      absl::StrAppend(&b, indent, "const ", CudaType(CTypeOf(in.dtype)), " ", names[n + j], " = ",
                      InstrExpr(in, names, !stored_only[j]), ";\n");
    }
    // Every load happens before any store: an output may alias an input.
    for (size_t k = 0; k < region.results.size(); ++k) {
      const std::string v = names[n + region.results[k]];
      std::string store;
      switch (spec.outputs[k].dtype) {
        case v1::DTYPE_F16:
          store = absl::StrCat("k_f32_to_f16(", v, ")");
          break;
        case v1::DTYPE_BF16:
          store = absl::StrCat("k_f32_to_bf16(", v, ")");
          break;
        case v1::DTYPE_I8:
          store = absl::StrCat("static_cast<signed char>(", v, ")");
          break;
        case v1::DTYPE_I16:
          store = absl::StrCat("static_cast<short>(", v, ")");
          break;
        case v1::DTYPE_U8:
          store = absl::StrCat("static_cast<unsigned char>(", v, ")");
          break;
        case v1::DTYPE_BOOL:
          store = absl::StrCat("static_cast<unsigned char>(", v, " != 0 ? 1 : 0)");
          break;
        default:
          store = v;
          break;
      }
      absl::StrAppend(&b, indent, store_to(k, store), ";\n");
    }
    return b;
  };
  auto scalar_raw = [&](int i) {
    return absl::StrCat("in", i, "[", RegionIndexExpr(plan, i, kind[i], suffix), "]");
  };
  auto scalar_store = [](size_t k, const std::string& v) {
    return absl::StrCat("out", k, "[i] = ", v);
  };

  if (vectorize) {
    // One aligned struct per vectorized operand type.
    for (int i = 0; i < n; ++i) {
      if (!used[i] || kind[i] != 0) continue;
      absl::StrAppend(&src, "struct alignas(", width * ElementSize(spec.inputs[i].dtype),
                      ") kiln_vin", i, " { ", BufferType(spec.inputs[i].dtype), " a[", width,
                      "]; };\n");
    }
    for (size_t k = 0; k < spec.outputs.size(); ++k) {
      absl::StrAppend(&src, "struct alignas(", width * ElementSize(spec.outputs[k].dtype),
                      ") kiln_vout", k, " { ", BufferType(spec.outputs[k].dtype), " a[", width,
                      "]; };\n");
    }
  }
  absl::StrAppend(&src, "extern \"C\" __global__ void ", kElementwiseEntry, "(",
                  absl::StrJoin(params, ", "), ") {\n");
  absl::StrAppend(&src, "  const ", index_type, " step = static_cast<", index_type,
                  ">(gridDim.x) * blockDim.x;\n");
  absl::StrAppend(&src, "  ", index_type, " first = static_cast<", index_type,
                  ">(blockIdx.x) * blockDim.x + threadIdx.x;\n");
  if (vectorize) {
    std::vector<std::string> ptrs;
    for (int i = 0; i < n; ++i) {
      if (used[i] && kind[i] == 0)
        ptrs.push_back(absl::StrCat("reinterpret_cast<k_u64>(in", i, ")"));
    }
    for (size_t k = 0; k < spec.outputs.size(); ++k) {
      ptrs.push_back(absl::StrCat("reinterpret_cast<k_u64>(out", k, ")"));
    }
    const int64_t nvec = total / width;
    // Two vectors per trip, both loaded before either is computed: twice
    // the bytes in flight per thread (one load at a time, with the math of
    // the other waiting on it, leaves the memory system underfed).
    absl::StrAppend(&src, "  if (((", absl::StrJoin(ptrs, " | "), ") & 15ull) == 0ull) {\n");
    absl::StrAppend(&src, "    for (", index_type, " w = first; w < ", nvec, suffix,
                    "; w += 2", suffix, " * step) {\n");
    absl::StrAppend(&src, "      const ", index_type, " e[2] = {w * ", width, suffix, ", (w + step) * ",
                    width, suffix, "};\n      const bool two = w + step < ", nvec, suffix, ";\n");
    for (int i = 0; i < n; ++i) {
      if (!used[i] || kind[i] != 0) continue;
      absl::StrAppend(&src, "      kiln_vin", i, " a", i, "[2];\n      a", i,
                      "[0] = *reinterpret_cast<const kiln_vin", i, "*>(in", i,
                      " + e[0]);\n      if (two) a", i, "[1] = *reinterpret_cast<const kiln_vin", i,
                      "*>(in", i, " + e[1]);\n");
    }
    absl::StrAppend(&src, "#pragma unroll\n      for (int u = 0; u < 2; ++u) {\n",
                    "        if (u == 1 && !two) break;\n");
    for (size_t k = 0; k < spec.outputs.size(); ++k) {
      absl::StrAppend(&src, "        kiln_vout", k, " o", k, ";\n");
    }
    absl::StrAppend(&src, "#pragma unroll\n        for (int l = 0; l < ", width, "; ++l) {\n");
    absl::StrAppend(
        &src,
        body(
            [&](int i) { return kind[i] == 0 ? absl::StrCat("a", i, "[u].a[l]") : scalar_raw(i); },
            [](size_t k, const std::string& v) { return absl::StrCat("o", k, ".a[l] = ", v); },
            "          "));
    absl::StrAppend(&src, "        }\n");
    for (size_t k = 0; k < spec.outputs.size(); ++k) {
      absl::StrAppend(&src, "        *reinterpret_cast<kiln_vout", k, "*>(out", k, " + e[u]) = o",
                      k, ";\n");
    }
    absl::StrAppend(&src, "      }\n");
    absl::StrAppend(&src, "    }\n    first += ", nvec * width, suffix, ";\n  }\n");
  }
  absl::StrAppend(&src, "  for (", index_type, " i = first; i < ", total, suffix,
                  "; i += step) {\n");
  if (coords) {
    absl::StrAppend(&src, "    ", index_type, " rem = i;\n");
    for (size_t k = plan.dims.size(); k-- > 0;) {
      if (k == 0) {
        absl::StrAppend(&src, "    const ", index_type, " c0 = rem;\n");
      } else {
        absl::StrAppend(&src, "    const ", index_type, " c", k, " = rem % ", plan.dims[k], suffix,
                        ";\n    rem /= ", plan.dims[k], suffix, ";\n");
      }
    }
  }
  absl::StrAppend(&src, body(scalar_raw, scalar_store, "    "));
  absl::StrAppend(&src, "  }\n}\n");
  return src;
}

}  // namespace kiln::cuda
