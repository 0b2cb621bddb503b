// Helpers for writing conformance cases: spec and tensor builders, broadcast
// index arithmetic, and the f64 reference semantics of casts, integer
// wrapping and storage rounding. Written from the IR's documented semantics,
// independent of any backend's kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/half.h"
#include "tests/conformance/conformance.h"

namespace kiln::conformance::ref {

inline const std::vector<DType>& FloatTypes() {
  static const std::vector<DType> t = {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64};
  return t;
}
inline const std::vector<DType>& IntTypes() {
  static const std::vector<DType> t = {v1::DTYPE_I8, v1::DTYPE_U8, v1::DTYPE_I16, v1::DTYPE_I32,
                                       v1::DTYPE_I64};
  return t;
}
inline const std::vector<DType>& DenseTypes() {
  static const std::vector<DType> t = {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64,
                                       v1::DTYPE_I8,  v1::DTYPE_U8,  v1::DTYPE_I16,  v1::DTYPE_I32,
                                       v1::DTYPE_I64, v1::DTYPE_BOOL};
  return t;
}

inline int64_t NumElements(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

inline std::string Shape(const Dims& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? "x" : "", d[i]);
  return s.empty() ? "scalar" : s;
}

// A spec with the label form the engine uses, so error cases can look for it.
inline backend::KernelSpec Spec(const std::string& name, v1::OpKind op, v1::Attrs attrs,
                                std::vector<backend::TensorDesc> inputs,
                                std::vector<backend::TensorDesc> outputs) {
  backend::KernelSpec s;
  s.name = name;
  s.label = absl::StrCat("node 7 \"", name, "\" (", v1::OpKind_Name(op), ")");
  s.op = op;
  s.attrs = std::move(attrs);
  s.inputs = std::move(inputs);
  s.outputs = std::move(outputs);
  return s;
}

inline HostTensor Values(DType dtype, const Dims& dims, const std::vector<double>& v) {
  HostTensor t = std::move(HostTensor::Create(dtype, dims)).value();
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, v[i % v.size()]);
  return t;
}

// NumPy broadcast of two shapes (REQUIRES: they broadcast).
inline Dims Broadcast(const Dims& a, const Dims& b) {
  const size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat index into `in` (right-aligned, broadcast) of output element `flat`.
inline int64_t BroadcastIndex(const Dims& out, const Dims& in, int64_t flat) {
  int64_t idx = 0, stride = 1;
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t d = out.size() - 1 - k;
    const int64_t coord = flat % out[d];
    flat /= out[d];
    if (k < in.size()) {
      const size_t di = in.size() - 1 - k;
      if (in[di] != 1) idx += coord * stride;
      stride *= in[di];
    }
  }
  return idx;
}

// Multi-index of flat element `flat` of `dims`, and back.
inline std::vector<int64_t> Unravel(int64_t flat, const Dims& dims) {
  std::vector<int64_t> idx(dims.size());
  for (size_t k = dims.size(); k-- > 0;) {
    idx[k] = flat % dims[k];
    flat /= dims[k];
  }
  return idx;
}
inline int64_t Ravel(const std::vector<int64_t>& idx, const Dims& dims) {
  int64_t flat = 0;
  for (size_t k = 0; k < dims.size(); ++k) flat = flat * dims[k] + idx[k];
  return flat;
}

// Two's-complement wrap of an integer value into `dtype` (ints only).
inline double WrapInt(long double v, DType dtype) {
  const int64_t i = static_cast<int64_t>(v);
  switch (dtype) {
    case v1::DTYPE_I8:
      return static_cast<int8_t>(i);
    case v1::DTYPE_U8:
      return static_cast<uint8_t>(i);
    case v1::DTYPE_I16:
      return static_cast<int16_t>(i);
    case v1::DTYPE_I32:
      return static_cast<int32_t>(i);
    case v1::DTYPE_BOOL:
      return i != 0;
    default:
      return static_cast<double>(i);
  }
}

// A value as stored in `dtype`: floats rounded to nearest even, f16 and f32
// overflowing to inf.
inline double RoundTo(double v, DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return static_cast<float>(v);
    case v1::DTYPE_F16:
      return HalfToFloat(FloatToHalf(static_cast<float>(v)));
    case v1::DTYPE_BF16:
      return Bf16ToFloat(FloatToBf16(static_cast<float>(v)));
    default:
      return v;
  }
}

// The IR's cast: float -> int truncates and saturates (NaN -> 0); int -> int
// wraps; -> bool is nonzero; -> float rounds.
inline double CastValue(double v, DType from, DType to) {
  if (to == v1::DTYPE_BOOL) return v != 0 ? 1 : 0;
  if (IsFloat(to)) return RoundTo(v, to);
  if (IsFloat(from)) {
    if (std::isnan(v)) return 0;
    double lo = -9223372036854775808.0, hi = 9223372036854775807.0;
    switch (to) {
      case v1::DTYPE_I8:
        lo = -128, hi = 127;
        break;
      case v1::DTYPE_U8:
        lo = 0, hi = 255;
        break;
      case v1::DTYPE_I16:
        lo = -32768, hi = 32767;
        break;
      case v1::DTYPE_I32:
        lo = -2147483648.0, hi = 2147483647.0;
        break;
      default:
        break;
    }
    return std::trunc(std::min(std::max(v, lo), hi));
  }
  return WrapInt(v, to);
}

// A vector of move-only tensors, built from a braced list so the random
// tensors in it are drawn left to right: Tensors{RandomTensor(..), ...}.
struct Tensors {
  template <typename... Ts>
  Tensors(Ts&&... ts) {  // NOLINT: implicit by design
    (v.push_back(std::forward<Ts>(ts)), ...);
  }
  operator std::vector<HostTensor>() && { return std::move(v); }  // NOLINT
  std::vector<HostTensor> v;
};

// A possibly negative axis of a rank-`rank` tensor as a non-negative one.
inline int64_t Axis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

inline Dims RandomDims(std::mt19937_64& rng, int rank, int64_t max_dim) {
  std::uniform_int_distribution<int64_t> u(1, max_dim);
  Dims d(rank);
  for (auto& x : d) x = u(rng);
  return d;
}

// Value range that is safe and meaningful for a dtype's random inputs.
inline std::pair<double, double> IntRange(DType d) {
  switch (d) {
    case v1::DTYPE_I8:
      return {-128, 127};
    case v1::DTYPE_U8:
      return {0, 255};
    case v1::DTYPE_BOOL:
      return {0, 1};
    default:
      return {-1000, 1000};
  }
}

}  // namespace kiln::conformance::ref
