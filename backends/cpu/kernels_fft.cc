// Fft / Rfft / Irfft along the last (complex: second-to-last) axis. Complex
// tensors end in a dim of 2 (re, im). Definitions (numpy's, with `normalize`
// choosing the 1/n scaling):
//   fft:   X[k] = sum_t x[t] e^{-2 pi i k t / n}   (inverse: e^{+...})
//   rfft:  the first n/2 + 1 bins of fft of a real x
//   irfft: the real x of length n whose rfft is X (Hermitian completion)
// and normalize = true multiplies the result by 1/n (numpy's ifft and irfft
// are normalize = true; its fft and rfft normalize = false). An axis longer
// than n is cut to n, a shorter one padded with zeros.
//
// Computed in f64 (narrower types widened, rounded once): a power-of-two n by
// an iterative radix-2 transform, any other n by Bluestein's chirp-z through
// a power-of-two transform, so every size costs O(n log n).
#include <cmath>
#include <complex>
#include <numbers>
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
using cd = std::complex<double>;

// In place, a.size() a power of two; sign -1 forward, +1 inverse (unscaled).
void Radix2(std::vector<cd>& a, int sign) {
  const size_t n = a.size();
  for (size_t i = 1, j = 0; i < n; ++i) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (size_t len = 2; len <= n; len <<= 1) {
    const double ang = sign * 2 * std::numbers::pi / static_cast<double>(len);
    for (size_t i = 0; i < n; i += len) {
      for (size_t k = 0; k < len / 2; ++k) {
        // Twiddles from the angle directly (no running product): error stays ~ulp * log n.
        const cd w = std::polar(1.0, ang * static_cast<double>(k));
        const cd u = a[i + k], v = a[i + k + len / 2] * w;
        a[i + k] = u + v;
        a[i + k + len / 2] = u - v;
      }
    }
  }
}

// A length-n DFT of `x` (size n) by radix-2 or Bluestein; unscaled.
std::vector<cd> Dft(const std::vector<cd>& x, int sign) {
  const size_t n = x.size();
  if (n <= 1) return x;
  if ((n & (n - 1)) == 0) {
    std::vector<cd> a = x;
    Radix2(a, sign);
    return a;
  }
  size_t m = 1;
  while (m < 2 * n - 1) m <<= 1;
  // chirp[k] = e^{sign * i pi k^2 / n}, k^2 taken mod 2n so the angle stays small.
  std::vector<cd> chirp(n);
  for (size_t k = 0; k < n; ++k) {
    const uint64_t k2 = (static_cast<uint64_t>(k) * k) % (2 * n);
    chirp[k] = std::polar(1.0, sign * std::numbers::pi * static_cast<double>(k2) / static_cast<double>(n));
  }
  std::vector<cd> a(m), b(m);
  for (size_t k = 0; k < n; ++k) a[k] = x[k] * chirp[k];
  b[0] = std::conj(chirp[0]);
  for (size_t k = 1; k < n; ++k) b[k] = b[m - k] = std::conj(chirp[k]);
  Radix2(a, -1);
  Radix2(b, -1);
  for (size_t k = 0; k < m; ++k) a[k] *= b[k];
  Radix2(a, +1);
  std::vector<cd> out(n);
  for (size_t k = 0; k < n; ++k) out[k] = a[k] / static_cast<double>(m) * chirp[k];
  return out;
}

Claim SupportsFft(const KernelSpec& spec) {
  if (spec.inputs.size() != 1) return Claim::No("expects one input");
  if (!IsFloat(spec.inputs[0].dtype)) return Claim::No("the ffts take floats");
  return Claim::Yes();
}

KernelOr CreateFft(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 1, 1, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& o = spec.outputs[0];
  const v1::OpKind op = spec.op;
  const v1::FftAttrs& a = op == v1::OP_FFT ? spec.attrs.fft() : op == v1::OP_RFFT ? spec.attrs.rfft() : spec.attrs.irfft();
  const bool complex_in = op != v1::OP_RFFT, complex_out = op != v1::OP_IRFFT;
  const int64_t in_rank_axis = complex_in ? x.rank() - 2 : x.rank() - 1;
  if (in_rank_axis < 0 || (complex_in && x.dims.back() != 2) || o.dtype != x.dtype) {
    return SpecError(spec, "unexpected operand ", TypeString(x), " for ", v1::OpKind_Name(op));
  }
  const int64_t len = x.dims[in_rank_axis];  // input points along the axis
  const int64_t out_len = o.dims[complex_out ? o.rank() - 2 : o.rank() - 1];
  // The transform length: fft/rfft n (default the axis), irfft the output length.
  const int64_t n = op == v1::OP_IRFFT ? out_len : (a.n() ? a.n() : len);
  const int64_t rows = Product(x.dims, 0, in_rank_axis);
  if (Product(o.dims, 0, complex_out ? o.rank() - 2 : o.rank() - 1) != rows) {
    return SpecError(spec, "output ", TypeString(o), " does not match input ", TypeString(x));
  }
  const bool inverse = op == v1::OP_IRFFT || (op == v1::OP_FFT && a.inverse());
  const double scale = a.normalize() && n > 0 ? 1.0 / static_cast<double>(n) : 1.0;
  const DType dt = x.dtype;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:", op == v1::OP_FFT ? "fft" : op == v1::OP_RFFT ? "rfft" : "irfft", "_", DTypeName(dt)),
      [=](auto inputs, auto outputs) -> absl::Status {
        if (rows * out_len == 0) return absl::OkStatus();
        const void* xp = HostPtr(inputs[0]);
        void* yp = HostPtr(outputs[0]);
        ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
          std::vector<cd> v(static_cast<size_t>(n));
          for (int64_t r = b; r < e; ++r) {
            std::fill(v.begin(), v.end(), cd{});
            if (op == v1::OP_IRFFT) {
              // Hermitian completion: bins 0..n/2 from the input (zeros past
              // its length), the rest their conjugates; bin 0 (and n/2 for
              // even n) contribute their real parts only, as numpy's irfft.
              for (int64_t k = 0; k <= n / 2 && k < len; ++k) {
                v[k] = cd(LoadAsDouble(dt, xp, (r * len + k) * 2), LoadAsDouble(dt, xp, (r * len + k) * 2 + 1));
              }
              v[0] = cd(v[0].real(), 0);
              if (n % 2 == 0 && n > 0) v[n / 2] = cd(v[n / 2].real(), 0);
              for (int64_t k = 1; k < (n + 1) / 2; ++k) v[n - k] = std::conj(v[k]);
            } else {
              for (int64_t t = 0; t < std::min(n, len); ++t) {
                v[t] = complex_in ? cd(LoadAsDouble(dt, xp, (r * len + t) * 2), LoadAsDouble(dt, xp, (r * len + t) * 2 + 1))
                                  : cd(LoadAsDouble(dt, xp, r * len + t), 0);
              }
            }
            const std::vector<cd> y = Dft(v, inverse ? +1 : -1);
            for (int64_t k = 0; k < out_len; ++k) {
              const cd z = y[k] * scale;
              if (complex_out) {
                StoreFloatFromDouble(dt, yp, (r * out_len + k) * 2, z.real());
                StoreFloatFromDouble(dt, yp, (r * out_len + k) * 2 + 1, z.imag());
              } else {
                StoreFloatFromDouble(dt, yp, r * out_len + k, z.real());
              }
            }
          }
        });
        return absl::OkStatus();
      });
}

const CpuOpRegistration kRegistration({
    {v1::OP_FFT, SupportsFft, CreateFft},
    {v1::OP_RFFT, SupportsFft, CreateFft},
    {v1::OP_IRFFT, SupportsFft, CreateFft},
});

}  // namespace
}  // namespace kiln::cpu
