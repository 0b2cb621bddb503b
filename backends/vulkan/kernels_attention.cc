// Attention (attention.comp): blocked, online softmax, every MaskKind,
// softcap, additive bias with broadcast, custom boolean masks, GQA/MQA.
// Block sizes are chosen from the head dims and the device's shared memory.
#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "backends/vulkan/vk_util.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

constexpr int64_t kMaxHeadDim = 256;

struct AttentionPush {
  uint32_t mask;
  uint32_t B, Hq, Hkv, Sq, Sk, D, Dv;
  uint32_t prefix, window;
  float scale, softcap;
  uint32_t keep_sq;
  uint32_t bias_strides[4];
};
static_assert(sizeof(AttentionPush) == 68);

struct AttentionConfig {
  uint32_t wg, br, bc, dmax;
};

uint32_t Pow2Ceil(uint64_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Shared bytes of attention.comp for a block configuration.
uint64_t SharedBytes(uint32_t br, uint32_t bc, uint32_t dmax) {
  return 4ull * (br * dmax + 2ull * bc * dmax + br * bc + 3ull * br);
}

std::optional<AttentionConfig> Choose(const DeviceCaps& caps, int64_t sq, int64_t d, int64_t dv) {
  const uint32_t dmax = std::max<uint32_t>(32, Pow2Ceil(std::max<int64_t>({d, dv, 1})));
  const uint32_t wg = std::min<uint32_t>(128, Workgroup1D(caps));
  const std::pair<uint32_t, uint32_t> blocks[] = {{32, 32}, {16, 32}, {16, 16},
                                                  {8, 16},  {8, 8},   {4, 8}};
  for (auto [br, bc] : blocks) {
    if (br > wg || SharedBytes(br, bc, dmax) > caps.max_shared_memory) continue;
    // Short query blocks (decoding) do not need tall workgroups.
    if (sq <= 4) br = 4;
    return AttentionConfig{wg, br, bc, dmax};
  }
  return std::nullopt;
}

Claim SupportsAttention(const VulkanDevice& dev, const KernelSpec& spec) {
  const auto& a = spec.attrs.attention();
  const bool extra = a.mask() == v1::MASK_CUSTOM || a.mask() == v1::MASK_BIAS;
  if (spec.inputs.size() != (extra ? 4u : 3u) || spec.outputs.size() != 1) {
    return Claim::No("malformed spec");
  }
  if (a.mask() < v1::MASK_NONE || a.mask() > v1::MASK_BIAS) return Claim::No("unknown mask kind");
  const DType dt = spec.inputs[0].dtype;
  for (int i = 0; i < 3; ++i) {
    if (spec.inputs[i].dtype != dt || spec.inputs[i].dims.size() != 4) {
      return Claim::No("vulkan attention: q, k, v must share a dtype and be rank 4");
    }
  }
  if (!(dt == v1::DTYPE_BF16 && dev.caps().storage16)) {
    if (Claim c = FloatKernelDType(dev, spec, dt, "attention"); !c.native) return c;
  }
  const Dims& q = spec.inputs[0].dims;
  const Dims& k = spec.inputs[1].dims;
  const Dims& v = spec.inputs[2].dims;
  if (k[1] == 0 ? q[1] != 0 : q[1] % k[1] != 0) return Claim::No("vulkan attention: Hq % Hkv");
  if (q[3] > kMaxHeadDim || v[3] > kMaxHeadDim) {
    return Claim::No(absl::StrCat("vulkan attention handles head dims up to ", kMaxHeadDim));
  }
  if (a.mask() == v1::MASK_BIAS && (spec.inputs[3].dtype != dt || spec.inputs[3].dims.size() > 4)) {
    return Claim::No("vulkan attention: the bias must share q's dtype and have rank <= 4");
  }
  if (a.mask() == v1::MASK_CUSTOM && spec.inputs[3].dtype != v1::DTYPE_BOOL) {
    return Claim::No("vulkan attention: a custom mask must be bool");
  }
  const std::optional<AttentionConfig> cfg = Choose(dev.caps(), q[2], q[3], v[3]);
  if (!cfg) return Claim::No("vulkan attention: the head dims do not fit shared memory");
  const auto& count = dev.caps().max_workgroup_count;
  if ((q[2] + cfg->br - 1) / cfg->br > count[0] || q[1] > count[1] || q[0] > count[2]) {
    return Claim::No("vulkan attention: the problem exceeds the device's grid");
  }
  return Claim::Yes();
}

class AttentionKernel final : public VulkanKernel {
 public:
  AttentionKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
                  AttentionPush push, uint32_t br, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)), pipeline_(std::move(p)), push_(push), br_(br) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const BufferBinding dummy = out[0];  // bound for the absent mask operand, never read
    BufferBinding b[6] = {in[0], in[1], in[2], dummy, dummy, out[0]};
    const auto mask = spec_.attrs.attention().mask();
    if (mask == v1::MASK_BIAS) b[3] = in[3];
    if (mask == v1::MASK_CUSTOM) {
      b[4] = in[3];
      b[4].range = AlignUp(b[4].range, 4);  // bool bytes are read as words
    }
    return s.Dispatch(*pipeline_, b, 0b100000, &push_, sizeof(push_), (push_.Sq + br_ - 1) / br_,
                      push_.Hq, push_.B);
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  AttentionPush push_;
  uint32_t br_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateAttention(VulkanDevice& dev,
                                                                 const KernelSpec& spec,
                                                                 backend::PrepareContext&) {
  const auto& a = spec.attrs.attention();
  const Dims& q = spec.inputs[0].dims;
  const Dims& k = spec.inputs[1].dims;
  const Dims& v = spec.inputs[2].dims;
  AttentionPush p{};
  p.mask = static_cast<uint32_t>(a.mask());
  p.B = static_cast<uint32_t>(q[0]);
  p.Hq = static_cast<uint32_t>(q[1]);
  p.Hkv = static_cast<uint32_t>(std::max<int64_t>(k[1], 1));
  p.Sq = static_cast<uint32_t>(q[2]);
  p.Sk = static_cast<uint32_t>(k[2]);
  p.D = static_cast<uint32_t>(q[3]);
  p.Dv = static_cast<uint32_t>(v[3]);
  p.prefix = static_cast<uint32_t>(std::clamp<int64_t>(a.prefix(), 0, INT32_MAX));
  p.window = static_cast<uint32_t>(std::clamp<int64_t>(a.window(), 0, INT32_MAX));
  p.scale = static_cast<float>(a.has_scale() ? a.scale()
                               : q[3] > 0    ? 1.0 / std::sqrt(double(q[3]))
                                             : 1.0);
  p.softcap = static_cast<float>(a.softcap());
  if (a.mask() == v1::MASK_CUSTOM) {
    p.keep_sq = spec.inputs[3].dims.size() == 3 ? p.Sk : 0;
  }
  if (a.mask() == v1::MASK_BIAS) {
    const Dims& bias = spec.inputs[3].dims;
    int64_t stride = 1;
    for (int i = 3, j = static_cast<int>(bias.size()) - 1; i >= 0; --i, --j) {
      const int64_t size = j >= 0 ? bias[j] : 1;
      p.bias_strides[i] = size == 1 ? 0 : static_cast<uint32_t>(stride);
      stride *= size;
    }
  }
  const std::optional<AttentionConfig> cfg = Choose(dev.caps(), q[2], q[3], v[3]);
  if (!cfg) return absl::InternalError("no attention block configuration fits");
  const DType dt = spec.inputs[0].dtype;
  KILN_ASSIGN_OR_RETURN(
      auto pipeline,
      EmbeddedPipeline(dev, absl::StrCat("attention_", DTypeSuffix(dt)), 6, sizeof(AttentionPush),
                       {cfg->wg, cfg->br, cfg->bc, cfg->dmax}));
  const std::string mask = absl::AsciiStrToLower(v1::MaskKind_Name(a.mask()).substr(5));
  return std::unique_ptr<backend::Kernel>(std::make_unique<AttentionKernel>(
      dev, spec, std::move(pipeline), p, cfg->br,
      absl::StrCat("spirv:attention_", DTypeSuffix(dt), "_", mask, "_d", cfg->dmax)));
}

const VulkanOpRegistration kAttentionRegistration({
    {v1::OP_ATTENTION, &SupportsAttention, &CreateAttention},
});

}  // namespace
}  // namespace kiln::vulkan
