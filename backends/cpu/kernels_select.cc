// TopK (values and indices of the k largest or smallest along an axis) and
// ScatterAdd (Gather's adjoint: out = x, then out[.., idx[j], ..] += upd[.., j, ..]).
//
// TopK orders by value, descending for the largest (ascending for the
// smallest), ties by the lower index first, NaN above +inf (so NaNs lead the
// largest and trail the smallest), as torch.topk and ONNX's sorted TopK.
// Values are copied bit for bit from the input (no conversion on the way).
// ScatterAdd accumulates in the data type (float sums in the order of j, on
// one thread per output row so the result is deterministic).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_util.h"
#include "backends/cpu/parallel.h"
#include "base/half.h"

namespace kiln::cpu {
namespace {

using backend::Claim;
using backend::KernelSpec;
using KernelOr = absl::StatusOr<std::unique_ptr<backend::Kernel>>;

int64_t LoadIndex(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case v1::DTYPE_I8: return static_cast<const int8_t*>(p)[i];
    case v1::DTYPE_U8: return static_cast<const uint8_t*>(p)[i];
    case v1::DTYPE_I16: return static_cast<const int16_t*>(p)[i];
    case v1::DTYPE_I32: return static_cast<const int32_t*>(p)[i];
    default: return static_cast<const int64_t*>(p)[i];
  }
}

Claim SupportsTopK(const KernelSpec& spec) {
  if (spec.inputs.size() != 1) return Claim::No("expects one input");
  const DType dt = spec.inputs[0].dtype;
  if (!IsFloat(dt) && !IsInteger(dt)) {
    return Claim::No(absl::StrCat("cpu topk takes floats and integers, not ", DTypeName(dt)));
  }
  return Claim::Yes();
}

KernelOr CreateTopK(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 2); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& a = spec.attrs.topk();
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(a.has_axis() ? a.axis() : -1, x.rank(), &axis)) {
    return SpecError(spec, "topk axis out of range for ", TypeString(x));
  }
  const int64_t n = x.dims[axis], k = a.k();
  if (k < 0 || k > n) return SpecError(spec, "k=", k, " is outside [0, ", n, "]");
  const DType index = a.index_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_I64 : a.index_dtype();
  Dims out = x.dims;
  out[axis] = k;
  if (auto s = CheckOutput(spec, 0, x.dtype, out); !s.ok()) return s;
  if (auto s = CheckOutput(spec, 1, index, out); !s.ok()) return s;
  const int64_t outer = Product(x.dims, 0, axis), inner = Product(x.dims, axis + 1, x.dims.size());
  const DType dt = x.dtype;
  const int64_t es = ElementSize(dt);
  const bool smallest = a.smallest();
  return FnKernel::Make(
      spec, absl::StrCat("cpu:topk_", DTypeName(dt)), [=](auto inputs, auto outputs) -> absl::Status {
        if (outer * inner * k == 0) return absl::OkStatus();
        const char* xp = static_cast<const char*>(HostPtr(inputs[0]));
        char* vp = static_cast<char*>(HostPtr(outputs[0]));
        void* ip = HostPtr(outputs[1]);
        ParallelFor(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
          std::vector<double> key(n);
          std::vector<int64_t> order(n);
          for (int64_t row = b; row < e; ++row) {
            const int64_t o = row / inner, i = row % inner;
            const int64_t base = o * n * inner + i;
            for (int64_t r = 0; r < n; ++r) key[r] = LoadAsDouble(dt, xp, base + r * inner);
            std::iota(order.begin(), order.end(), 0);
            // "a before b": NaN is above every number; equal keys keep index order.
            auto before = [&](int64_t p, int64_t q) {
              const double u = key[p], v = key[q];
              const bool un = std::isnan(u), vn = std::isnan(v);
              if (un || vn) {
                if (un && vn) return p < q;
                return smallest ? vn : un;
              }
              if (u != v) return smallest ? u < v : u > v;
              return p < q;
            };
            std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
            for (int64_t j = 0; j < k; ++j) {
              const int64_t dst = o * k * inner + j * inner + i;
              std::memcpy(vp + dst * es, xp + (base + order[j] * inner) * es, static_cast<size_t>(es));
              if (index == v1::DTYPE_I32) {
                static_cast<int32_t*>(ip)[dst] = static_cast<int32_t>(order[j]);
              } else {
                static_cast<int64_t*>(ip)[dst] = order[j];
              }
            }
          }
        });
        return absl::OkStatus();
      });
}

template <typename T>
void AddRows(T* out, const T* upd, int64_t count) {
  for (int64_t c = 0; c < count; ++c) out[c] += upd[c];
}

void AddRowsOf(DType dt, void* out, const void* upd, int64_t count) {
  switch (dt) {
    case v1::DTYPE_F32: return AddRows(static_cast<float*>(out), static_cast<const float*>(upd), count);
    case v1::DTYPE_F64: return AddRows(static_cast<double*>(out), static_cast<const double*>(upd), count);
    case v1::DTYPE_I8: return AddRows(static_cast<int8_t*>(out), static_cast<const int8_t*>(upd), count);
    case v1::DTYPE_U8: return AddRows(static_cast<uint8_t*>(out), static_cast<const uint8_t*>(upd), count);
    case v1::DTYPE_I16: return AddRows(static_cast<int16_t*>(out), static_cast<const int16_t*>(upd), count);
    case v1::DTYPE_I32: return AddRows(static_cast<int32_t*>(out), static_cast<const int32_t*>(upd), count);
    case v1::DTYPE_I64: return AddRows(static_cast<int64_t*>(out), static_cast<const int64_t*>(upd), count);
    case v1::DTYPE_F16: case v1::DTYPE_BF16: {
      // Each sum rounds once to the storage type, as a kernel of that type would.
      auto* o = static_cast<uint16_t*>(out);
      const auto* u = static_cast<const uint16_t*>(upd);
      const bool half = dt == v1::DTYPE_F16;
      for (int64_t c = 0; c < count; ++c) {
        const float s = (half ? HalfToFloat(o[c]) : Bf16ToFloat(o[c])) + (half ? HalfToFloat(u[c]) : Bf16ToFloat(u[c]));
        o[c] = half ? FloatToHalf(s) : FloatToBf16(s);
      }
      return;
    }
    default: return;
  }
}

Claim SupportsScatterAdd(const KernelSpec& spec) {
  if (spec.inputs.size() != 3) return Claim::No("expects data, indices and updates");
  if (!IsInteger(spec.inputs[1].dtype)) return Claim::No("scatter_add indices must be integers");
  const DType dt = spec.inputs[0].dtype;
  if (!IsFloat(dt) && !IsInteger(dt)) {
    return Claim::No(absl::StrCat("cpu scatter_add adds floats and integers, not ", DTypeName(dt)));
  }
  return Claim::Yes();
}

KernelOr CreateScatterAdd(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 3, 3, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& idx = spec.inputs[1];
  const auto& upd = spec.inputs[2];
  int64_t axis;
  if (x.rank() == 0 || !NormalizeAxis(spec.attrs.scatter_add().axis(), x.rank(), &axis)) {
    return SpecError(spec, "scatter_add axis out of range for ", TypeString(x));
  }
  Dims want(x.dims.begin(), x.dims.begin() + axis);
  want.insert(want.end(), idx.dims.begin(), idx.dims.end());
  want.insert(want.end(), x.dims.begin() + axis + 1, x.dims.end());
  if (upd.dtype != x.dtype || upd.dims != want) {
    return SpecError(spec, "updates must be ", DTypeName(x.dtype), DimsToString(want), ", got ", TypeString(upd));
  }
  if (auto s = CheckOutput(spec, 0, x.dtype, x.dims); !s.ok()) return s;
  const int64_t pre = Product(x.dims, 0, axis), n = x.dims[axis];
  const int64_t post = Product(x.dims, axis + 1, x.dims.size());
  const int64_t k = Product(idx.dims);
  const int64_t es = ElementSize(x.dtype);
  const DType dt = x.dtype, it = idx.dtype;
  const std::string label = spec.label, data_type = TypeString(x);
  return FnKernel::Make(
      spec, absl::StrCat("cpu:scatter_add_", DTypeName(dt)), [=](auto inputs, auto outputs) -> absl::Status {
        const char* xp = static_cast<const char*>(HostPtr(inputs[0]));
        const void* ip = HostPtr(inputs[1]);
        const char* up = static_cast<const char*>(HostPtr(inputs[2]));
        char* o = static_cast<char*>(HostPtr(outputs[0]));
        // Every index is checked before anything is written.
        std::vector<int64_t> rows(static_cast<size_t>(k));
        for (int64_t j = 0; j < k; ++j) {
          const int64_t v = LoadIndex(it, ip, j);
          const int64_t r = v < 0 ? v + n : v;
          if (r < 0 || r >= n) {
            return absl::OutOfRangeError(absl::StrCat(label, ": scatter_add index ", v, " (at position ", j,
                                                      ") is out of range [", -n, ", ", n, ") for axis ", axis,
                                                      " of ", data_type));
          }
          rows[j] = r;
        }
        if (o != xp) std::memcpy(o, xp, static_cast<size_t>(pre * n * post * es));
        if (pre * k * post == 0) return absl::OkStatus();
        // Parallel over the leading rows only: each owns its slice of the
        // output, and the j loop runs in order inside it (deterministic sums).
        ParallelFor(pre, 1, [&](int64_t b, int64_t e) {
          for (int64_t p = b; p < e; ++p) {
            for (int64_t j = 0; j < k; ++j) {
              AddRowsOf(dt, o + ((p * n + rows[j]) * post) * es, up + ((p * k + j) * post) * es, post);
            }
          }
        });
        return absl::OkStatus();
      });
}

const CpuOpRegistration kRegistration({
    {v1::OP_TOPK, SupportsTopK, CreateTopK},
    {v1::OP_SCATTER_ADD, SupportsScatterAdd, CreateScatterAdd},
});

}  // namespace
}  // namespace kiln::cpu
