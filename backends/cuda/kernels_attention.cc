// Attention (kernels/attention.cu): flash-style, one warp per query row with
// an online softmax (no Sq x Sk buffer); every MaskKind, scale, softcap,
// additive bias with broadcast, custom boolean masks, GQA/MQA; f32, f16 and
// bf16 with head dims up to 256. Decoding (Sq = 1) is the same kernel: a
// warp per (batch, head).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

static_assert(v1::MASK_CAUSAL == 1 && v1::MASK_PREFIX == 2 && v1::MASK_SLIDING_WINDOW == 4 &&
                  v1::MASK_CUSTOM == 5 && v1::MASK_BIAS == 6,
              "kernels/attention.cu numbers the mask kinds as graph.proto does");

constexpr int64_t kMaxHeadDim = 256;

// attention.cu's parameter block (passed by value).
struct AttnParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  int64_t mask = 0, prefix = 0, window = 0, mask_per_query = 0;
  int64_t bias_stride[4] = {};
  float scale = 1, softcap = 0;
};

absl::StatusOr<AttnParams> PlanAttention(const KernelSpec& spec) {
  const auto& a = spec.attrs.attention();
  if (!v1::MaskKind_IsValid(a.mask())) return absl::InvalidArgumentError("unknown mask kind");
  const bool operand = a.mask() == v1::MASK_CUSTOM || a.mask() == v1::MASK_BIAS;
  if (spec.inputs.size() != (operand ? 4u : 3u) || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("mask ", v1::MaskKind_Name(a.mask()), " takes ",
                                                   operand ? 4 : 3, " operands"));
  }
  const DType dt = spec.inputs[0].dtype;
  for (int i = 0; i < 3; ++i) {
    if (spec.inputs[i].rank() != 4) return absl::InvalidArgumentError("q, k, v must be rank 4");
    if (spec.inputs[i].dtype != dt) return absl::InvalidArgumentError("q, k, v dtypes differ");
  }
  const Dims& q = spec.inputs[0].dims;
  const Dims& k = spec.inputs[1].dims;
  const Dims& v = spec.inputs[2].dims;
  AttnParams p;
  p.B = q[0], p.Hq = q[1], p.Sq = q[2], p.D = q[3];
  p.Hkv = k[1], p.Sk = k[2], p.Dv = v[3];
  if (k[0] != p.B || v[0] != p.B || v[1] != p.Hkv || v[2] != p.Sk || k[3] != p.D) {
    return absl::InvalidArgumentError("q, k, v shapes disagree");
  }
  if (p.Hq > 0 && (p.Hkv == 0 || p.Hq % p.Hkv != 0)) {
    return absl::InvalidArgumentError("query heads must be a multiple of kv heads");
  }
  if (spec.outputs[0].dtype != dt || spec.outputs[0].dims != Dims{p.B, p.Hq, p.Sq, p.Dv}) {
    return absl::InvalidArgumentError("result must be [B, Hq, Sq, Dv] of q's dtype");
  }
  p.scale = static_cast<float>(a.has_scale() ? a.scale() : p.D > 0 ? 1.0 / std::sqrt(p.D) : 1.0);
  p.softcap = static_cast<float>(a.softcap());
  p.mask = a.mask();
  p.prefix = a.prefix();
  p.window = a.window();
  if (a.mask() == v1::MASK_SLIDING_WINDOW && p.window <= 0) {
    return absl::InvalidArgumentError("window must be positive");
  }
  if (a.mask() == v1::MASK_CUSTOM) {
    const backend::TensorDesc& m = spec.inputs[3];
    if (m.dtype != v1::DTYPE_BOOL) return absl::InvalidArgumentError("custom mask must be bool");
    p.mask_per_query = m.rank() == 3;
    const bool ok = (m.rank() == 2 && m.dims == Dims{p.B, p.Sk}) ||
                    (m.rank() == 3 && m.dims == Dims{p.B, p.Sq, p.Sk});
    if (!ok) return absl::InvalidArgumentError("custom mask must be [B, Sk] or [B, Sq, Sk]");
  }
  if (a.mask() == v1::MASK_BIAS) {
    const backend::TensorDesc& m = spec.inputs[3];
    if (m.dtype != dt) return absl::InvalidArgumentError("bias dtype must match q");
    if (m.rank() > 4) return absl::InvalidArgumentError("bias rank exceeds 4");
    const int64_t full[4] = {p.B, p.Hq, p.Sq, p.Sk};
    int64_t stride = 1;
    for (int i = 3, j = static_cast<int>(m.rank()) - 1; i >= 0; --i, --j) {
      const int64_t size = j >= 0 ? m.dims[j] : 1;
      if (size != full[i] && size != 1) {
        return absl::InvalidArgumentError("bias does not broadcast to [B, Hq, Sq, Sk]");
      }
      p.bias_stride[i] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }
  return p;
}

Claim SupportsAttention(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<AttnParams> p = PlanAttention(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda attention: ", p.status().message()));
  if (Claim c = FloatDType(spec.inputs[0].dtype, "attention"); !c.native) return c;
  if (p->D > kMaxHeadDim || p->Dv > kMaxHeadDim) {
    return Claim::No(absl::StrCat("cuda attention serves head dims up to ", kMaxHeadDim));
  }
  return Claim::Yes();
}

class AttentionKernel final : public CudaKernel {
 public:
  AttentionKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn, AttnParams params,
                  std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), params_(params) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr q = in[0], k = in[1], v = in[2], extra = in.size() > 3 ? in[3] : 0, o = out[0];
    AttnParams p = params_;
    void* args[] = {&q, &k, &v, &extra, &o, &p};
    constexpr unsigned kWarps = 4;
    const int64_t rows = p.B * p.Hq * p.Sq;
    const int64_t blocks =
        std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, device_.caps().max_grid_x);
    return LaunchKernel(s, fn_.fn, static_cast<unsigned>(blocks), 1, 1, 32 * kWarps, 0, args);
  }

 private:
  LoadedFunction fn_;
  AttnParams params_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateAttention(CudaDevice& d,
                                                                 const KernelSpec& spec,
                                                                 backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(AttnParams p, PlanAttention(spec));
  const std::string dt = DTypeSuffix(spec.inputs[0].dtype);
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn,
                        LoadFunction(d, "attention", KernelSource("attention.cu"),
                                     absl::StrCat("kiln_attention_", dt), context));
  return std::unique_ptr<backend::Kernel>(std::make_unique<AttentionKernel>(
      d, spec, std::move(fn), p, absl::StrCat("nvrtc:attention_rows_", dt)));
}

const CudaOpRegistration kRegistration({
    {v1::OP_ATTENTION, &SupportsAttention, &CreateAttention},
});

}  // namespace
}  // namespace kiln::cuda
