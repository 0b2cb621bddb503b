// ConvTranspose2d: x [N, C, H, W], w [C, O/g, kH, kW] (PyTorch's layout),
// optional bias [O]; out[n, o, y, x] sums x[n, c, i, j] * w[c, o', p, q] over
// the group's input channels c and the taps with y = i*stride - pad_low +
// p*dilation (same for x). Computed in gather form (each output element reads
// the inputs that reach it), so threads own disjoint outputs and every sum
// runs in the same order: deterministic. Accumulates in f64 for f64 inputs,
// f32 otherwise (f16 / bf16 widened, rounded once at the end).
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

std::vector<double> Widen(DType dt, const void* p, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = LoadAsDouble(dt, p, i);
  return out;
}

int64_t At(const google::protobuf::RepeatedField<int64_t>& v, int i, int64_t def) {
  return v.empty() ? def : v.size() == 1 ? v[0] : v[i];
}

Claim SupportsConvTranspose(const KernelSpec& spec) {
  if (spec.inputs.size() < 2 || spec.inputs.size() > 3) return Claim::No("expects x, w and an optional bias");
  if (!IsFloat(spec.inputs[0].dtype)) return Claim::No("conv_transpose2d takes floats");
  return Claim::Yes();
}

KernelOr CreateConvTranspose(const KernelSpec& spec) {
  if (auto s = CheckArity(spec, 2, 3, 1); !s.ok()) return s;
  const auto& x = spec.inputs[0];
  const auto& w = spec.inputs[1];
  const auto& a = spec.attrs.conv_transpose2d();
  if (x.rank() != 4 || w.rank() != 4 || w.dtype != x.dtype) {
    return SpecError(spec, "x and w must be rank-4 ", DTypeName(x.dtype), ", got ", TypeString(x), " and ", TypeString(w));
  }
  const int64_t groups = a.groups() == 0 ? 1 : a.groups();
  const int64_t n = x.dims[0], c = x.dims[1], h = x.dims[2], wd = x.dims[3];
  const int64_t opg = w.dims[1], kh = w.dims[2], kw = w.dims[3];
  if (groups < 1 || c % groups != 0 || w.dims[0] != c) {
    return SpecError(spec, "w must be [", c, ", O/groups, kH, kW] with ", c, " channels divisible by groups=", groups,
                     ", got ", TypeString(w));
  }
  const int64_t o = opg * groups, cpg = c / groups;
  int64_t stride[2], dil[2], lo[2];
  for (int i = 0; i < 2; ++i) {
    stride[i] = At(a.stride(), i, 1);
    dil[i] = At(a.dilation(), i, 1);
    lo[i] = At(a.pad_low(), i, 0);
  }
  const auto& out_desc = spec.outputs[0];
  if (out_desc.rank() != 4 || out_desc.dims[0] != n || out_desc.dims[1] != o || out_desc.dtype != x.dtype) {
    return SpecError(spec, "output must be ", DTypeName(x.dtype), "[", n, ", ", o, ", H', W'], got ", TypeString(out_desc));
  }
  const int64_t oh = out_desc.dims[2], ow = out_desc.dims[3];
  const bool has_bias = spec.inputs.size() == 3;
  if (has_bias && (spec.inputs[2].dims != Dims{o} || spec.inputs[2].dtype != x.dtype)) {
    return SpecError(spec, "bias must be ", DTypeName(x.dtype), "[", o, "], got ", TypeString(spec.inputs[2]));
  }
  const DType dt = x.dtype;
  return FnKernel::Make(
      spec, absl::StrCat("cpu:conv_transpose2d_direct_", DTypeName(dt)), [=](auto inputs, auto outputs) -> absl::Status {
        if (n * o * oh * ow == 0) return absl::OkStatus();
        const std::vector<double> xv = Widen(dt, HostPtr(inputs[0]), n * c * h * wd);
        const std::vector<double> wv = Widen(dt, HostPtr(inputs[1]), c * opg * kh * kw);
        const std::vector<double> bv = has_bias ? Widen(dt, HostPtr(inputs[2]), o) : std::vector<double>();
        void* out = HostPtr(outputs[0]);
        const bool f64 = dt == v1::DTYPE_F64;
        ParallelFor(n * o, 1, [&](int64_t b, int64_t e) {
          for (int64_t no = b; no < e; ++no) {
            const int64_t ni = no / o, oc = no % o, g = oc / opg, ocg = oc % opg;
            for (int64_t y = 0; y < oh; ++y) {
              for (int64_t xo = 0; xo < ow; ++xo) {
                double acc64 = has_bias ? bv[oc] : 0.0;
                float acc32 = static_cast<float>(acc64);
                for (int64_t p = 0; p < kh; ++p) {
                  const int64_t ty = y + lo[0] - p * dil[0];
                  if (ty < 0 || ty % stride[0] != 0 || ty / stride[0] >= h) continue;
                  const int64_t iy = ty / stride[0];
                  for (int64_t q = 0; q < kw; ++q) {
                    const int64_t tx = xo + lo[1] - q * dil[1];
                    if (tx < 0 || tx % stride[1] != 0 || tx / stride[1] >= wd) continue;
                    const int64_t ix = tx / stride[1];
                    for (int64_t ci = 0; ci < cpg; ++ci) {
                      const int64_t ch = g * cpg + ci;
                      const double prod = xv[((ni * c + ch) * h + iy) * wd + ix] * wv[((ch * opg + ocg) * kh + p) * kw + q];
                      if (f64) {
                        acc64 += prod;
                      } else {
                        acc32 += static_cast<float>(prod);
                      }
                    }
                  }
                }
                StoreFloatFromDouble(dt, out, ((ni * o + oc) * oh + y) * ow + xo, f64 ? acc64 : acc32);
              }
            }
          }
        });
        return absl::OkStatus();
      });
}

const CpuOpRegistration kRegistration({
    {v1::OP_CONV_TRANSPOSE2D, SupportsConvTranspose, CreateConvTranspose},
});

}  // namespace
}  // namespace kiln::cpu
