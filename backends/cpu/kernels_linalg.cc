// DenseSolve: x = A^-1 b for each matrix of a batch, A [..., n, n], b [..., n]
// or [..., n, k]. LU with partial pivoting in f64 (f16 / bf16 / f32 inputs are
// widened and the result rounded once), one thread per system. A matrix whose
// elimination meets a zero pivot (exactly singular), or whose inputs are not
// finite, fails the launch naming the node and the batch element; an
// ill-conditioned one is solved as LAPACK's gesv would, without a warning.
#include <cmath>
#include <cstring>
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

Claim SupportsDenseSolve(const KernelSpec& spec) {
  if (spec.inputs.size() != 2) return Claim::No("expects A and b");
  if (!IsFloat(spec.inputs[0].dtype)) return Claim::No("dense_solve takes floats");
  return Claim::Yes();
}

KernelOr CreateDenseSolve(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 2, 2, 1); !s.ok()) return s;
  const auto& a = spec.inputs[0];
  const auto& b = spec.inputs[1];
  if (a.rank() < 2 || a.dims[a.rank() - 1] != a.dims[a.rank() - 2]) {
    return SpecError(spec, "A must be [..., n, n], got ", TypeString(a));
  }
  const int64_t n = a.dims.back();
  const bool vec = b.rank() == a.rank() - 1;
  if (b.dtype != a.dtype || (!vec && b.rank() != a.rank()) ||
      !std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin()) || b.dims[a.rank() - 2] != n) {
    return SpecError(spec, "b must be ", DTypeName(a.dtype), "[..., ", n, "] or [..., ", n, ", k] with A's batch, got ",
                     TypeString(b));
  }
  if (auto s = CheckOutput(spec, 0, b.dtype, b.dims); !s.ok()) return s;
  const int64_t batch = Product(a.dims, 0, a.rank() - 2);
  const int64_t k = vec ? 1 : b.dims.back();
  const DType dt = a.dtype;
  const std::string label = spec.label;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:dense_solve_lu_", DTypeName(dt)), [=](auto inputs, auto outputs) -> absl::Status {
        if (batch * n == 0) return absl::OkStatus();
        const void* ap = HostPtr(inputs[0]);
        const void* bp = HostPtr(inputs[1]);
        void* xp = HostPtr(outputs[0]);
        std::vector<int64_t> failed(static_cast<size_t>(batch), -1);  // column of the zero pivot; -2 not finite
        ParallelFor(batch, 1, [&](int64_t lo, int64_t hi) {
          std::vector<double> m(static_cast<size_t>(n * n)), r(static_cast<size_t>(n * k));
          for (int64_t t = lo; t < hi; ++t) {
            bool finite = true;
            for (int64_t i = 0; i < n * n; ++i) finite &= std::isfinite(m[i] = LoadAsDouble(dt, ap, t * n * n + i));
            for (int64_t i = 0; i < n * k; ++i) finite &= std::isfinite(r[i] = LoadAsDouble(dt, bp, t * n * k + i));
            if (!finite) {
              failed[t] = -2;
              continue;
            }
            for (int64_t col = 0; col < n && failed[t] == -1; ++col) {
              int64_t piv = col;
              for (int64_t row = col + 1; row < n; ++row) {
                if (std::abs(m[row * n + col]) > std::abs(m[piv * n + col])) piv = row;
              }
              if (m[piv * n + col] == 0) {
                failed[t] = col;
                break;
              }
              if (piv != col) {
                for (int64_t j = 0; j < n; ++j) std::swap(m[col * n + j], m[piv * n + j]);
                for (int64_t j = 0; j < k; ++j) std::swap(r[col * k + j], r[piv * k + j]);
              }
              const double inv = 1.0 / m[col * n + col];
              for (int64_t row = col + 1; row < n; ++row) {
                const double f = m[row * n + col] * inv;
                if (f == 0) continue;
                for (int64_t j = col; j < n; ++j) m[row * n + j] -= f * m[col * n + j];
                for (int64_t j = 0; j < k; ++j) r[row * k + j] -= f * r[col * k + j];
              }
            }
            if (failed[t] != -1) continue;
            for (int64_t row = n - 1; row >= 0; --row) {
              for (int64_t j = 0; j < k; ++j) {
                double s = r[row * k + j];
                for (int64_t c = row + 1; c < n; ++c) s -= m[row * n + c] * r[c * k + j];
                r[row * k + j] = s / m[row * n + row];
              }
            }
            for (int64_t i = 0; i < n * k; ++i) StoreFloatFromDouble(dt, xp, t * n * k + i, r[i]);
          }
        });
        for (int64_t t = 0; t < batch; ++t) {
          if (failed[t] == -2) {
            return absl::InvalidArgumentError(
                absl::StrCat(label, ": dense_solve system ", t, " has a non-finite value in A or b"));
          }
          if (failed[t] >= 0) {
            return absl::InvalidArgumentError(absl::StrCat(label, ": dense_solve matrix ", t,
                                                           " is singular (no nonzero pivot in column ",
                                                           failed[t], " after elimination)"));
          }
        }
        return absl::OkStatus();
      });
}

const CpuOpRegistration kRegistration({
    {v1::OP_DENSE_SOLVE, SupportsDenseSolve, CreateDenseSolve},
});

}  // namespace
}  // namespace kiln::cpu
