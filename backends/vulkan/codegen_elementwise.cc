#include "backends/vulkan/codegen_elementwise.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backends/vulkan/embedded_shaders.h"
#include "backends/vulkan/vk_kernel.h"
#include "base/half.h"

namespace kiln::vulkan {
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

const char* GlslType(CType t) {
  switch (t) {
    case CType::kFloat:
      return "float";
    case CType::kInt:
      return "int";
    case CType::kInt64:
      return "int64_t";
  }
  return "?";
}

// The element type of a storage buffer of `d`.
const char* BufferType(DType d) {
  switch (d) {
    case v1::DTYPE_F32:
      return "float";
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      return "uint16_t";
    case v1::DTYPE_I16:
      return "int16_t";
    case v1::DTYPE_I8:
      return "int8_t";
    case v1::DTYPE_U8:
    case v1::DTYPE_BOOL:
      return "uint8_t";
    case v1::DTYPE_I32:
      return "int";
    case v1::DTYPE_I64:
      return "int64_t";
    default:
      return "?";
  }
}

std::string FloatLit(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isfinite(f) && static_cast<float>(static_cast<int>(f)) == f && std::fabs(f) < 1e6f &&
      !(f == 0.0f && std::signbit(f))) {
    return absl::StrCat(static_cast<int>(f), ".0");
  }
  return absl::StrFormat("uintBitsToFloat(0x%08xu)", bits);
}

std::string IntLit(int64_t v, CType t) {
  if (t == CType::kInt64) {
    if (v == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807l - 1l)";
    return absl::StrCat(v, "l");
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
      return absl::StrCat("bitfieldExtract(", x, ", 0, 8)");
    case v1::DTYPE_I16:
      return absl::StrCat("bitfieldExtract(", x, ", 0, 16)");
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

// The IR's cast of `x` (a value of dtype `from`) to `to`.
std::string Cast(const std::string& x, DType from, DType to) {
  const CType cf = CTypeOf(from), ct = CTypeOf(to);
  if (to == v1::DTYPE_BOOL) {
    if (cf == CType::kFloat) return absl::StrCat("(k_nonzero(", x, ") ? 1 : 0)");
    return absl::StrCat("((", x, ") != ", cf == CType::kInt64 ? "0l" : "0", " ? 1 : 0)");
  }
  if (ct == CType::kFloat) {
    const std::string f = cf == CType::kFloat ? x : absl::StrCat("float(", x, ")");
    return RoundTo(f, to);
  }
  if (cf == CType::kFloat) {  // truncate toward zero, saturate, NaN -> 0
    const auto [lo, hi] = IntRange(to);
    const std::string glsl = GlslType(ct);
    return absl::StrCat("(isnan(", x, ") ? ", IntLit(0, ct), " : (", x,
                        " <= ", FloatLit(static_cast<float>(lo)), " ? ", IntLit(lo, ct), " : (", x,
                        " >= ", FloatLit(static_cast<float>(hi)), " ? ", IntLit(hi, ct), " : ",
                        glsl, "(", x, "))))");
  }
  if (ct == CType::kInt64) return cf == CType::kInt64 ? x : absl::StrCat("int64_t(", x, ")");
  const std::string narrowed = cf == CType::kInt64 ? absl::StrCat("int(", x, ")") : x;
  return RoundTo(narrowed, to);
}

std::string UnaryFloat(v1::UnaryKind k, const std::string& x) {
  auto call = [&](const char* f) { return absl::StrCat(f, "(", x, ")"); };
  switch (k) {
    case v1::UNARY_IDENTITY:
      return x;
    case v1::UNARY_RELU:
      return absl::StrCat("(", x, " < 0.0 ? 0.0 : ", x, ")");
    case v1::UNARY_GELU:
      return call("k_gelu");
    case v1::UNARY_GELU_TANH:
      return call("k_gelu_tanh");
    case v1::UNARY_SILU:
      return call("k_silu");
    case v1::UNARY_SIGMOID:
      return call("k_sigmoid");
    case v1::UNARY_TANH:
      return call("k_tanh");
    case v1::UNARY_EXP:
      return call("k_exp");
    case v1::UNARY_LOG:
      return call("k_log");
    case v1::UNARY_SQRT:
      return call("k_sqrt");
    case v1::UNARY_RSQRT:
      return call("k_rsqrt");
    case v1::UNARY_NEG:
      return absl::StrCat("(-", x, ")");
    case v1::UNARY_ABS:
      return call("abs");
    case v1::UNARY_SIN:
      return call("k_sin");
    case v1::UNARY_COS:
      return call("k_cos");
    case v1::UNARY_ERF:
      return call("k_erf");
    case v1::UNARY_FLOOR:
      return call("k_floor");
    case v1::UNARY_CEIL:
      return call("k_ceil");
    case v1::UNARY_ROUND:
      return call("roundEven");
    case v1::UNARY_SIGN:
      return call("k_sign");
    case v1::UNARY_RECIPROCAL:
      return call("k_recip");
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
      return absl::StrCat("max(", x, ", ", zero, ")");
    case v1::UNARY_NEG:
      return absl::StrCat("(", zero, " - ", x, ")");
    case v1::UNARY_ABS:
      return absl::StrCat("(", x, " < ", zero, " ? ", zero, " - ", x, " : ", x, ")");
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
        return absl::StrCat("((isnan(", a, ") || isnan(", b, ")) ? K_NAN : max(", a, ", ", b, "))");
      case v1::BINARY_MIN:
        return absl::StrCat("((isnan(", a, ") || isnan(", b, ")) ? K_NAN : min(", a, ", ", b, "))");
      case v1::BINARY_POW:
        return absl::StrCat("k_pow(", a, ", ", b, ")");
      default:
        return "";
    }
  }
  const std::string zero = IntLit(0, t), minus1 = IntLit(-1, t);
  switch (k) {
    case v1::BINARY_ADD:
      return absl::StrCat("(", a, " + ", b, ")");
    case v1::BINARY_SUB:
      return absl::StrCat("(", a, " - ", b, ")");
    case v1::BINARY_MUL:
      return absl::StrCat("(", a, " * ", b, ")");
    case v1::BINARY_DIV:  // x / 0 = 0; x / -1 negates (INT_MIN wraps), never a trapping divide
      return absl::StrCat("(", b, " == ", zero, " ? ", zero, " : (", b, " == ", minus1, " ? ", zero,
                          " - ", a, " : ", a, " / ", b, "))");
    case v1::BINARY_MAX:
      return absl::StrCat("max(", a, ", ", b, ")");
    case v1::BINARY_MIN:
      return absl::StrCat("min(", a, ", ", b, ")");
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

// One instruction's expression, already rounded to its dtype; "" if unsupported.
std::string InstrExpr(const RegionInstr& in, const std::vector<std::string>& names) {
  const DType dt = in.dtype;
  const CType ct = CTypeOf(dt);
  auto arg = [&](int k) { return names[in.args[k]]; };
  switch (in.op) {
    case v1::OP_UNARY: {
      const auto kind = static_cast<v1::UnaryKind>(in.kind);
      if (ct == CType::kFloat) {
        const std::string e = UnaryFloat(kind, arg(0));
        return e.empty() ? e : RoundTo(e, dt);
      }
      const std::string e = UnaryInt(kind, arg(0), ct);
      return e.empty() ? e : RoundTo(e, dt);
    }
    case v1::OP_BINARY: {
      const std::string e = BinaryExpr(static_cast<v1::BinaryKind>(in.kind), arg(0), arg(1), ct);
      return e.empty() ? e : RoundTo(e, dt);
    }
    case v1::OP_COMPARE: {
      const char* op = CompareOp(static_cast<v1::CompareKind>(in.kind));
      if (*op == '\0') return "";
      return absl::StrCat("(", arg(0), " ", op, " ", arg(1), " ? 1 : 0)");
    }
    case v1::OP_WHERE:
      return absl::StrCat("(", arg(0), " != 0 ? ", arg(1), " : ", arg(2), ")");
    case v1::OP_CAST:
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
        return RoundTo(e, dt);
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

std::string ElementwiseUnsupported(const DeviceCaps& caps, const KernelSpec& spec,
                                   const ElementwiseRegion& region) {
  if (spec.outputs.size() != region.results.size() || spec.outputs.empty()) {
    return "outputs do not match the region's results";
  }
  for (const auto& t : spec.outputs) {
    if (t.dims != spec.outputs[0].dims) return "outputs differ in shape";
  }
  for (DType d : RegionValueDTypes(region)) {
    if (d == v1::DTYPE_F64) return "f64 arithmetic is not supported by vulkan kernels";
    if (!StorageOk(caps, d)) return StorageMissing(caps, d);
    if (d == v1::DTYPE_I64 && !caps.int64) return "i64 arithmetic needs shaderInt64";
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

std::string GenerateElementwise(const DeviceCaps& caps, const KernelSpec& spec,
                                const ElementwiseRegion& region, uint32_t workgroup) {
  const int n = static_cast<int>(spec.inputs.size());
  const std::vector<DType> dtypes = RegionValueDTypes(region);
  bool s16 = false, s8 = false, i64 = false;
  for (DType d : dtypes) {
    s16 = s16 || d == v1::DTYPE_F16 || d == v1::DTYPE_BF16 || d == v1::DTYPE_I16;
    s8 = s8 || d == v1::DTYPE_I8 || d == v1::DTYPE_U8 || d == v1::DTYPE_BOOL;
    i64 = i64 || d == v1::DTYPE_I64;
  }
  std::string src = "#version 450\n";
  if (s16) absl::StrAppend(&src, "#extension GL_EXT_shader_16bit_storage : require\n");
  if (s8) absl::StrAppend(&src, "#extension GL_EXT_shader_8bit_storage : require\n");
  if (i64)
    absl::StrAppend(&src, "#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require\n");
  if (caps.preserve_inf_nan32) {
    // IEEE NaN, infinities and signed zeros for f32 (SignedZeroInfNanPreserve, 32 bits).
    absl::StrAppend(&src, "#extension GL_EXT_spirv_intrinsics : require\n",
                    "spirv_execution_mode(capabilities = [4466], 4461, 32);\n");
  }
  absl::StrAppend(&src, EmbeddedText("kmath.glsl"), "\n");
  absl::StrAppend(&src, "layout(local_size_x = ", workgroup, ") in;\n");
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&src, "layout(std430, binding = ", i, ") readonly buffer In", i, " { ",
                    BufferType(spec.inputs[i].dtype), " in", i, "[]; };\n");
  }
  for (size_t k = 0; k < spec.outputs.size(); ++k) {
    absl::StrAppend(&src, "layout(std430, binding = ", n + k, ") writeonly buffer Out", k, " { ",
                    BufferType(spec.outputs[k].dtype), " out", k, "[]; };\n");
  }
  const RegionIndexPlan plan = PlanRegionIndexing(spec);
  const int64_t total = spec.outputs[0].num_elements();
  absl::StrAppend(&src, "void main() {\n  const uint step = gl_NumWorkGroups.x * ", workgroup,
                  "u;\n  for (uint i = gl_GlobalInvocationID.x; i < ", total, "u; i += step) {\n");
  // Which inputs are read, and whether any needs coordinates.
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
  if (coords) {
    absl::StrAppend(&src, "    uint rem = i;\n");
    for (size_t k = plan.dims.size(); k-- > 0;) {
      if (k == 0) {
        absl::StrAppend(&src, "    const uint c0 = rem;\n");
      } else {
        absl::StrAppend(&src, "    const uint c", k, " = rem % ", plan.dims[k],
                        "u;\n    rem /= ", plan.dims[k], "u;\n");
      }
    }
  }
  std::vector<std::string> names(n + region.instrs.size());
  for (int i = 0; i < n; ++i) {
    names[i] = absl::StrCat("v", i);
    if (!used[i]) continue;
    const std::string raw = absl::StrCat("in", i, "[", RegionIndexExpr(plan, i, kind[i], "u"), "]");
    std::string load;
    switch (spec.inputs[i].dtype) {
      case v1::DTYPE_F16:
        load = absl::StrCat("k_f16_to_f32(uint(", raw, "))");
        break;
      case v1::DTYPE_BF16:
        load = absl::StrCat("k_bf16_to_f32(uint(", raw, "))");
        break;
      case v1::DTYPE_I8:
      case v1::DTYPE_I16:
        load = absl::StrCat("int(", raw, ")");
        break;
      case v1::DTYPE_U8:
        load = absl::StrCat("int(uint(", raw, "))");
        break;
      case v1::DTYPE_BOOL:
        load = absl::StrCat("(uint(", raw, ") != 0u ? 1 : 0)");
        break;
      default:
        load = raw;
        break;
    }
    absl::StrAppend(&src, "    const ", GlslType(CTypeOf(spec.inputs[i].dtype)), " ", names[i],
                    " = ", load, ";\n");
  }
  for (size_t j = 0; j < region.instrs.size(); ++j) {
    const RegionInstr& in = region.instrs[j];
    names[n + j] = absl::StrCat("v", n + j);
    absl::StrAppend(&src, "    const ", GlslType(CTypeOf(in.dtype)), " ", names[n + j], " = ",
                    InstrExpr(in, names), ";\n");
  }
  for (size_t k = 0; k < region.results.size(); ++k) {
    const std::string v = names[n + region.results[k]];
    std::string store;
    switch (spec.outputs[k].dtype) {
      case v1::DTYPE_F16:
        store = absl::StrCat("uint16_t(k_f32_to_f16(", v, "))");
        break;
      case v1::DTYPE_BF16:
        store = absl::StrCat("uint16_t(k_f32_to_bf16(", v, "))");
        break;
      case v1::DTYPE_I8:
        store = absl::StrCat("int8_t(", v, ")");
        break;
      case v1::DTYPE_I16:
        store = absl::StrCat("int16_t(", v, ")");
        break;
      case v1::DTYPE_U8:
        store = absl::StrCat("uint8_t(uint(", v, "))");
        break;
      case v1::DTYPE_BOOL:
        store = absl::StrCat("uint8_t(", v, " != 0 ? 1u : 0u)");
        break;
      default:
        store = v;
        break;
    }
    absl::StrAppend(&src, "    out", k, "[i] = ", store, ";\n");
  }
  absl::StrAppend(&src, "  }\n}\n");
  return src;
}

}  // namespace kiln::vulkan
