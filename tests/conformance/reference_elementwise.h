// f64 reference semantics of the elementwise ops (unary .. clamp) and an
// interpreter for elementwise regions (FusedElementwise), shared by the
// elementwise, fused and loss case files. Each instruction's result is rounded
// to its dtype, as the IR defines: a region computes what its unfused nodes
// would. Regions are read by the decoder every backend uses
// (backends/common/elementwise_region.h); only the arithmetic is written here.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/common/elementwise_region.h"
#include "tests/conformance/reference_util.h"

namespace kiln::conformance::ref {

inline double UnaryValue(int kind, double x) {
  const double inv_sqrt2 = 0.70710678118654752440;
  switch (kind) {
    case v1::UNARY_IDENTITY:
      return x;
    case v1::UNARY_RELU:
      return std::isnan(x) ? x : std::max(x, 0.0);
    case v1::UNARY_GELU:
      if (std::isinf(x)) return x > 0 ? x : 0.0;
      return 0.5 * x * std::erfc(-x * inv_sqrt2);
    case v1::UNARY_GELU_TANH: {
      if (std::isinf(x)) return x > 0 ? x : 0.0;
      const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
      return 0.5 * x * (1.0 + std::tanh(u));
    }
    case v1::UNARY_SILU:
      if (std::isinf(x)) return x > 0 ? x : 0.0;
      return x / (1.0 + std::exp(-x));
    case v1::UNARY_SIGMOID:
      return 1.0 / (1.0 + std::exp(-x));
    case v1::UNARY_TANH:
      return std::tanh(x);
    case v1::UNARY_EXP:
      return std::exp(x);
    case v1::UNARY_LOG:
      return std::log(x);
    case v1::UNARY_SQRT:
      return std::sqrt(x);
    case v1::UNARY_RSQRT:
      return 1.0 / std::sqrt(x);
    case v1::UNARY_NEG:
      return -x;
    case v1::UNARY_ABS:
      return std::fabs(x);
    case v1::UNARY_SIN:
      return std::sin(x);
    case v1::UNARY_COS:
      return std::cos(x);
    case v1::UNARY_ERF:
      return std::erf(x);
    case v1::UNARY_FLOOR:
      return std::floor(x);
    case v1::UNARY_CEIL:
      return std::ceil(x);
    case v1::UNARY_ROUND:
      return std::nearbyint(x);
    case v1::UNARY_SIGN:
      return x > 0 ? 1.0 : (x < 0 ? -1.0 : x);
    case v1::UNARY_RECIPROCAL:
      return 1.0 / x;
    case v1::UNARY_SOFTPLUS:
      return x > 30 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    default:
      return NAN;
  }
}

inline double BinaryValue(int kind, double a, double b, DType dtype) {
  if (!IsFloat(dtype)) {
    const int64_t x = static_cast<int64_t>(a), y = static_cast<int64_t>(b);
    switch (kind) {
      case v1::BINARY_ADD:
        return WrapInt(static_cast<long double>(x) + y, dtype);
      case v1::BINARY_SUB:
        return WrapInt(static_cast<long double>(x) - y, dtype);
      case v1::BINARY_MUL:
        return WrapInt(static_cast<long double>(x) * y, dtype);
      case v1::BINARY_DIV:
        return y == 0 ? 0 : WrapInt(static_cast<long double>(x / y), dtype);
      case v1::BINARY_MAX:
        return std::max(x, y);
      case v1::BINARY_MIN:
        return std::min(x, y);
      default:
        return NAN;
    }
  }
  switch (kind) {
    case v1::BINARY_ADD:
      return a + b;
    case v1::BINARY_SUB:
      return a - b;
    case v1::BINARY_MUL:
      return a * b;
    case v1::BINARY_DIV:
      return a / b;
    case v1::BINARY_MAX:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case v1::BINARY_MIN:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case v1::BINARY_POW:
      return std::pow(a, b);
    default:
      return NAN;
  }
}

inline double CompareValue(int kind, double a, double b) {
  switch (kind) {
    case v1::COMPARE_EQ:
      return a == b;
    case v1::COMPARE_NE:
      return a != b;
    case v1::COMPARE_LT:
      return a < b;
    case v1::COMPARE_LE:
      return a <= b;
    case v1::COMPARE_GT:
      return a > b;
    case v1::COMPARE_GE:
      return a >= b;
    default:
      return NAN;
  }
}

// Clamp: NaN passes; integer results are the nearest integer inside the bounds.
inline double ClampValue(const backend::RegionInstr& c, double x) {
  if (std::isnan(x)) return x;
  const bool is_int = !IsFloat(c.dtype);
  if (c.has_lo && x < c.lo) x = is_int ? std::ceil(c.lo) : c.lo;
  if (c.has_hi && x > c.hi) x = is_int ? std::floor(c.hi) : c.hi;
  return is_int ? CastValue(x, v1::DTYPE_F64, c.dtype) : RoundTo(x, c.dtype);
}

// Rounds an op's exact result to its dtype.
inline double Store(double v, DType dtype) {
  return IsFloat(dtype) ? RoundTo(v, dtype) : WrapInt(v, dtype);
}

// One instruction over scalar values (`vals` holds every value so far).
inline double InstrValue(const backend::RegionInstr& in, const std::vector<double>& vals) {
  auto a = [&](int k) { return vals[in.args[k]]; };
  switch (in.op) {
    case v1::OP_UNARY: {
      const double x = a(0);
      if (IsFloat(in.dtype)) return RoundTo(UnaryValue(in.kind, x), in.dtype);
      switch (in.kind) {  // signed integers
        case v1::UNARY_RELU:
          return std::max(x, 0.0);
        case v1::UNARY_NEG:
          return WrapInt(-static_cast<long double>(x), in.dtype);
        case v1::UNARY_ABS:
          return WrapInt(std::fabs(static_cast<long double>(x)), in.dtype);
        case v1::UNARY_SIGN:
          return (x > 0) - (x < 0);
        default:
          return x;
      }
    }
    case v1::OP_BINARY:
      return Store(BinaryValue(in.kind, a(0), a(1), in.dtype), in.dtype);
    case v1::OP_COMPARE:
      return CompareValue(in.kind, a(0), a(1));
    case v1::OP_WHERE:
      return a(0) != 0 ? a(1) : a(2);
    case v1::OP_CAST:
      return CastValue(a(0), in.arg_dtype, in.dtype);
    case v1::OP_CLAMP:
      return ClampValue(in, a(0));
    case v1::OP_CONSTANT:
      return CastValue(in.scalar, v1::DTYPE_F64, in.dtype);
    default:
      return NAN;
  }
}

// Evaluates a decoded region element by element over the broadcast of its
// inputs.
inline std::vector<HostTensor> RegionReference(const backend::ElementwiseRegion& region,
                                               const std::vector<HostTensor>& inputs) {
  Dims out;
  for (const HostTensor& t : inputs) out = Broadcast(out, t.dims());
  std::vector<HostTensor> outs;
  for (size_t k = 0; k < region.results.size(); ++k) outs.push_back(F64(out));
  const size_t nin = inputs.size();
  std::vector<double> vals(region.num_values());
  const int64_t n = NumElements(out);
  for (int64_t e = 0; e < n; ++e) {
    for (size_t i = 0; i < nin; ++i)
      vals[i] = At(inputs[i], BroadcastIndex(out, inputs[i].dims(), e));
    for (size_t j = 0; j < region.instrs.size(); ++j) {
      vals[nin + j] = InstrValue(region.instrs[j], vals);
    }
    for (size_t k = 0; k < region.results.size(); ++k) {
      outs[k].SetFromDouble(e, vals[nin + region.results[k]]);
    }
  }
  return outs;
}

// The reference of any elementwise spec (a ReferenceFn): FusedElementwise, or
// a standalone op as its one-instruction region. A spec the decoder rejects
// is a broken case: it fails the test.
inline std::vector<HostTensor> ElementwiseReference(const backend::KernelSpec& spec,
                                                    const std::vector<HostTensor>& inputs) {
  absl::StatusOr<backend::ElementwiseRegion> region = backend::DecodeSpec(spec);
  if (!region.ok()) {
    ADD_FAILURE() << spec.name << ": " << region.status();
    return {};
  }
  return RegionReference(*region, inputs);
}

// Instruction builders.
inline v1::FusedInstr UnaryInstr(int kind, int a, DType dtype) {
  v1::FusedInstr f;
  f.set_op(v1::OP_UNARY);
  f.mutable_unary()->set_kind(static_cast<v1::UnaryKind>(kind));
  f.add_args(a);
  f.set_dtype(dtype);
  return f;
}
inline v1::FusedInstr BinaryInstr(int kind, int a, int b, DType dtype) {
  v1::FusedInstr f;
  f.set_op(v1::OP_BINARY);
  f.mutable_binary()->set_kind(static_cast<v1::BinaryKind>(kind));
  f.add_args(a);
  f.add_args(b);
  f.set_dtype(dtype);
  return f;
}
inline v1::FusedInstr CompareInstr(int kind, int a, int b) {
  v1::FusedInstr f;
  f.set_op(v1::OP_COMPARE);
  f.mutable_compare()->set_kind(static_cast<v1::CompareKind>(kind));
  f.add_args(a);
  f.add_args(b);
  f.set_dtype(v1::DTYPE_BOOL);
  return f;
}
inline v1::FusedInstr WhereInstr(int c, int a, int b, DType dtype) {
  v1::FusedInstr f;
  f.set_op(v1::OP_WHERE);
  f.add_args(c);
  f.add_args(a);
  f.add_args(b);
  f.set_dtype(dtype);
  return f;
}
inline v1::FusedInstr CastInstr(int a, DType to) {
  v1::FusedInstr f;
  f.set_op(v1::OP_CAST);
  f.mutable_cast()->set_to(to);
  f.add_args(a);
  f.set_dtype(to);
  return f;
}
inline v1::FusedInstr ClampInstr(int a, DType dtype, const v1::ClampAttrs& c) {
  v1::FusedInstr f;
  f.set_op(v1::OP_CLAMP);
  *f.mutable_clamp() = c;
  f.add_args(a);
  f.set_dtype(dtype);
  return f;
}
inline v1::FusedInstr ConstantInstr(double v, DType dtype) {
  v1::FusedInstr f;
  f.set_op(v1::OP_CONSTANT);
  f.set_scalar(v);
  f.set_dtype(dtype);
  return f;
}

}  // namespace kiln::conformance::ref
