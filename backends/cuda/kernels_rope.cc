// Rope (kernels/rope.cu) for f32, f16 and bf16: x [B, H, S, D], optional
// integer positions [S] or [B, S] (default s + position_offset), every
// RopeAttrs field (theta, interleaved pairs, a partial rotary_dim).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct RopePlan {
  int64_t b = 0, h = 0, s = 0, d = 0, rotary = 0, offset = 0;
  bool interleaved = false, pos_per_batch = false;
  double theta = 10000;
  int pos_kind = 0;  // rope.cu's: 0 none, 1 i8, 2 u8, 3 i16, 4 i32, 5 i64
};

absl::StatusOr<RopePlan> PlanRope(const KernelSpec& spec) {
  if (spec.inputs.empty() || spec.inputs.size() > 2 || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("rope takes x and optional positions");
  }
  const backend::TensorDesc& x = spec.inputs[0];
  if (x.dims.size() != 4) return absl::InvalidArgumentError("x must be [B, H, S, D]");
  if (spec.outputs[0].dtype != x.dtype || spec.outputs[0].dims != x.dims) {
    return absl::InvalidArgumentError("the result must match x");
  }
  const auto& a = spec.attrs.rope();
  RopePlan p;
  p.b = x.dims[0], p.h = x.dims[1], p.s = x.dims[2], p.d = x.dims[3];
  p.rotary = a.rotary_dim() == 0 ? p.d : a.rotary_dim();
  if (p.rotary < 0 || p.rotary > p.d || p.rotary % 2 != 0) {
    return absl::InvalidArgumentError("rotary_dim must be even and at most D");
  }
  p.interleaved = a.interleaved();
  p.theta = a.has_theta() ? a.theta() : 10000.0;
  if (!(p.theta > 0)) return absl::InvalidArgumentError("theta must be positive");
  p.offset = a.position_offset();
  if (spec.inputs.size() == 2) {
    const backend::TensorDesc& pos = spec.inputs[1];
    switch (pos.dtype) {
      case v1::DTYPE_I8:
        p.pos_kind = 1;
        break;
      case v1::DTYPE_U8:
        p.pos_kind = 2;
        break;
      case v1::DTYPE_I16:
        p.pos_kind = 3;
        break;
      case v1::DTYPE_I32:
        p.pos_kind = 4;
        break;
      case v1::DTYPE_I64:
        p.pos_kind = 5;
        break;
      default:
        return absl::InvalidArgumentError("positions must be integers");
    }
    if (pos.dims != Dims{p.s} && pos.dims != Dims{p.b, p.s}) {
      return absl::InvalidArgumentError("positions must be [S] or [B, S]");
    }
    p.pos_per_batch = pos.dims.size() == 2;
  }
  return p;
}

Claim SupportsRope(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<RopePlan> p = PlanRope(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda rope: ", p.status().message()));
  return FloatDType(spec.inputs[0].dtype, "rope");
}

class RopeKernel final : public CudaKernel {
 public:
  RopeKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, RopePlan plan)
      : CudaKernel(d, spec, absl::StrCat("nvrtc:rope_", DTypeSuffix(spec.inputs[0].dtype))),
        fn_(std::move(fn)),
        plan_(plan) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], y = out[0], pos = plan_.pos_kind != 0 ? in[1] : 0;
    int pos_kind = plan_.pos_kind, per_batch = plan_.pos_per_batch, interleaved = plan_.interleaved;
    int64_t h = plan_.h, sl = plan_.s, d = plan_.d, rotary = plan_.rotary, offset = plan_.offset;
    int64_t rows = plan_.b * plan_.h * plan_.s;
    double theta = plan_.theta;
    const int64_t per_row = rotary / 2 + (d - rotary);
    if (rows == 0 || per_row == 0) return absl::OkStatus();
    void* args[] = {&x, &y,      &pos,         &pos_kind, &per_batch, &h,   &sl,
                    &d, &rotary, &interleaved, &theta,    &offset,    &rows};
    return LaunchKernel(s, fn_.fn, GridFor(device_.caps(), rows * per_row, 256), 1, 1, 256, 0,
                        args);
  }

 private:
  LoadedFunction fn_;
  RopePlan plan_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateRope(CudaDevice& d, const KernelSpec& spec,
                                                            backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(RopePlan plan, PlanRope(spec));
  KILN_ASSIGN_OR_RETURN(
      LoadedFunction fn,
      LoadFunction(d, "rope", KernelSource("rope.cu"),
                   absl::StrCat("kiln_rope_", DTypeSuffix(spec.inputs[0].dtype)), context));
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<RopeKernel>(d, spec, std::move(fn), plan));
}

const CudaOpRegistration kRopeRegistration({
    {v1::OP_ROPE, &SupportsRope, &CreateRope},
});

}  // namespace
}  // namespace kiln::cuda
