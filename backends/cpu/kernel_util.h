// Small helpers shared by the CPU kernel files: spec checks, error messages
// naming the node, axis and layout arithmetic, dtype dispatch. Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/elementwise_ops.h"
#include "base/half.h"

namespace kiln::cpu {

// x is NaN; false for integer types (generic code over floats and ints).
template <typename T>
inline bool IsNanValue(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(x);
  } else {
    return false;
  }
}

inline bool IsDense(DType d) { return IsKnownDType(d) && !IsQuantized(d); }
inline bool IsF16OrBf16(DType d) { return d == v1::DTYPE_F16 || d == v1::DTYPE_BF16; }

inline int64_t Product(std::span<const int64_t> dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= dims[i];
  return n;
}
inline int64_t Product(std::span<const int64_t> dims) { return Product(dims, 0, dims.size()); }

inline bool NormalizeAxis(int64_t axis, int64_t rank, int64_t* out) {
  if (axis < -rank || axis >= rank) return false;
  *out = axis < 0 ? axis + rank : axis;
  return true;
}

// INVALID_ARGUMENT naming the node: "<label>: <message>".
template <typename... Args>
absl::Status SpecError(const backend::KernelSpec& spec, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(spec.label, ": ", args...));
}

inline std::string TypeString(const backend::TensorDesc& d) {
  return absl::StrCat(DTypeName(d.dtype), DimsToString(d.dims));
}

inline absl::Status CheckArity(const backend::KernelSpec& spec, size_t min_in, size_t max_in,
                               size_t num_out) {
  if (spec.inputs.size() < min_in || spec.inputs.size() > max_in) {
    return SpecError(spec, "expects ", min_in, "..", max_in, " inputs, got ", spec.inputs.size());
  }
  if (spec.outputs.size() != num_out) {
    return SpecError(spec, "expects ", num_out, " outputs, got ", spec.outputs.size());
  }
  return absl::OkStatus();
}

// The spec's output must be exactly what the kernel computes: the kernel
// writes by its own arithmetic, so a disagreement would write out of bounds.
inline absl::Status CheckOutput(const backend::KernelSpec& spec, size_t i, DType dtype,
                                const Dims& dims) {
  const backend::TensorDesc& o = spec.outputs[i];
  if (o.dtype != dtype || o.dims != dims) {
    return SpecError(spec, "output ", i, " is ", TypeString(o), " but the kernel computes ",
                     DTypeName(dtype), DimsToString(dims));
  }
  return absl::OkStatus();
}

// Launch-time check that every view is a host view large enough for its
// tensor.
inline absl::Status CheckViews(const backend::KernelSpec& spec,
                               std::span<const backend::BufferView> inputs,
                               std::span<const backend::BufferView> outputs) {
  if (inputs.size() != spec.inputs.size() || outputs.size() != spec.outputs.size()) {
    return SpecError(spec, "launched with ", inputs.size(), " inputs and ", outputs.size(),
                     " outputs, built for ", spec.inputs.size(), " and ", spec.outputs.size());
  }
  auto check = [&](const backend::BufferView& v, const backend::TensorDesc& d, const char* what,
                   size_t i) -> absl::Status {
    const int64_t need = d.num_bytes();
    if (need == 0) return absl::OkStatus();
    if (v.buffer == nullptr || v.buffer->host_ptr() == nullptr || v.bytes < need) {
      return SpecError(spec, what, " ", i, " needs a host view of ", need, " bytes");
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (auto s = check(inputs[i], spec.inputs[i], "input", i); !s.ok()) return s;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (auto s = check(outputs[i], spec.outputs[i], "output", i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Host pointer of a view, or nullptr for an empty tensor's missing buffer.
inline void* HostPtr(const backend::BufferView& v) {
  return v.buffer == nullptr || v.buffer->host_ptr() == nullptr ? nullptr : v.host();
}

// Element `i` of a dense buffer of `dt` as double (f16 / bf16 widened exactly;
// integers converted), and a double stored into a float buffer, rounded once.
// For kernels that compute in f64 whatever the storage (DenseSolve, Fft,
// ConvTranspose2d, TopK's ordering).
inline double LoadAsDouble(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case v1::DTYPE_F32: return static_cast<const float*>(p)[i];
    case v1::DTYPE_F64: return static_cast<const double*>(p)[i];
    case v1::DTYPE_F16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case v1::DTYPE_BF16: return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case v1::DTYPE_I8: return static_cast<const int8_t*>(p)[i];
    case v1::DTYPE_U8: case v1::DTYPE_BOOL: return static_cast<const uint8_t*>(p)[i];
    case v1::DTYPE_I16: return static_cast<const int16_t*>(p)[i];
    case v1::DTYPE_I32: return static_cast<const int32_t*>(p)[i];
    default: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
}
// REQUIRES: IsFloat(dt).
inline void StoreFloatFromDouble(DType dt, void* p, int64_t i, double v) {
  switch (dt) {
    case v1::DTYPE_F32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case v1::DTYPE_F16: static_cast<uint16_t*>(p)[i] = FloatToHalf(static_cast<float>(v)); return;
    case v1::DTYPE_BF16: static_cast<uint16_t*>(p)[i] = FloatToBf16(static_cast<float>(v)); return;
    default: static_cast<double*>(p)[i] = v; return;
  }
}

// A tensor seen as [outer, n, inner] around the dims [begin, end).
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisSplit SplitAround(const Dims& dims, size_t begin, size_t end) {
  return {Product(dims, 0, begin), Product(dims, begin, end), Product(dims, end, dims.size())};
}

// NumPy broadcast of several shapes, or an error naming the pair that clashes.
inline absl::StatusOr<Dims> BroadcastShapes(const backend::KernelSpec& spec,
                                            std::span<const backend::TensorDesc> ins) {
  Dims out;
  for (const backend::TensorDesc& t : ins) {
    const size_t rank = std::max(out.size(), t.dims.size());
    Dims next(rank);
    for (size_t i = 0; i < rank; ++i) {
      const int64_t a = i < rank - out.size() ? 1 : out[i - (rank - out.size())];
      const int64_t b = i < rank - t.dims.size() ? 1 : t.dims[i - (rank - t.dims.size())];
      if (a != b && a != 1 && b != 1) {
        return SpecError(spec, "shapes do not broadcast: ", DimsToString(out), " and ",
                         DimsToString(t.dims));
      }
      next[i] = a == 1 ? b : a;
    }
    out = std::move(next);
  }
  return out;
}

// Row conversion between f32 compute and f32/f16/bf16 storage (n elements).
inline void WidenRow(const void* src, DType dtype, int64_t n, float* dst) {
  ew::Load(src, dtype, 1, n, dst);
}
inline void NarrowRow(const float* src, DType dtype, int64_t n, void* dst) {
  ew::Store(src, dtype, n, dst);
}

// A kernel whose body is a closure over what its Create step precomputed.
// The body runs after CheckViews.
class FnKernel final : public CpuKernel {
 public:
  using Body = std::function<absl::Status(std::span<const backend::BufferView> inputs,
                                          std::span<const backend::BufferView> outputs)>;
  static std::unique_ptr<backend::Kernel> Make(const backend::KernelSpec& spec,
                                               std::string implementation, Body body) {
    return std::unique_ptr<backend::Kernel>(
        new FnKernel(spec, std::move(implementation), std::move(body)));
  }
  std::string implementation() const override { return implementation_; }
  absl::Status Run(std::span<const backend::BufferView> inputs,
                   std::span<const backend::BufferView> outputs) override {
    if (auto s = CheckViews(spec_, inputs, outputs); !s.ok()) return s;
    return body_(inputs, outputs);
  }

 private:
  FnKernel(const backend::KernelSpec& spec, std::string implementation, Body body)
      : spec_(spec), implementation_(std::move(implementation)), body_(std::move(body)) {}
  backend::KernelSpec spec_;
  std::string implementation_;
  Body body_;
};

}  // namespace kiln::cpu
