// DequantMatMul: f32/f16/bf16 activations times a GGUF block-quantized weight
// (q8_0, q4_0, q4_k, q5_k, q6_k), the dequantization fused into the kernel
// (the f32 weights are never written anywhere). Two shaders, the block type a
// specialization constant of each:
// - dequant_matvec.comp: a weight stored [N, K] and M <= 4 (decoding): a
//   workgroup per weight row, the row's quant groups decoded in registers once
//   and multiplied into every activation row.
// - dequant_matmul.comp: anything else (batches, prefill, a [K, N] weight):
//   32 x 64 output tiles, each K step decoding a weight tile into shared
//   memory once per workgroup.
// The weights are read as 16-bit words (every block size is even), so the
// device needs 16-bit storage.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "backends/common/dequant_matmul_shape.h"
#include "backends/vulkan/vk_kernel.h"
#include "base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::DequantMatMulShape;
using backend::KernelSpec;

constexpr int64_t kMatVecRows = 4;  // dequant_matvec.comp's ROWS
constexpr uint32_t kTileM = 32, kTileN = 64, kTileThreads = 256;  // dequant_matmul.comp
constexpr uint32_t kMatVecThreads = 64;

struct DequantPush {
  uint32_t M = 0, N = 0, K = 0, row_bytes = 0;
};
static_assert(sizeof(DequantPush) == 16);

// dequant_blocks.glsl's DQ_* numbering.
uint32_t ShaderWType(DType wtype) {
  switch (wtype) {
    case v1::DTYPE_Q8_0:
      return 0;
    case v1::DTYPE_Q4_0:
      return 1;
    case v1::DTYPE_Q4_K:
      return 2;
    case v1::DTYPE_Q5_K:
      return 3;
    default:
      return 4;  // q6_k (the shape check admits block types only)
  }
}

bool UseMatVec(const DequantMatMulShape& s) { return s.transpose_b && s.m <= kMatVecRows; }

Claim SupportsDequantMatMul(const VulkanDevice& d, const KernelSpec& spec) {
  absl::StatusOr<DequantMatMulShape> s = backend::DequantMatMulShapeOf(spec);
  if (!s.ok()) return Claim::No(absl::StrCat("vulkan dequant_matmul: ", s.status().message()));
  const DeviceCaps& caps = d.caps();
  if (!caps.storage16) {
    return Claim::No("vulkan dequant_matmul reads the blocks as 16-bit words: it needs "
                     "storageBuffer16BitAccess");
  }
  // The shaders index in 32 bits.
  constexpr int64_t kMax = int64_t{1} << 32;
  if (s->weight_bytes >= kMax || s->m * s->k >= kMax || s->m * s->n >= kMax) {
    return Claim::No("vulkan dequant_matmul: a tensor has 2^32 or more elements or bytes");
  }
  if (kTileThreads > caps.max_workgroup_invocations || kTileThreads > caps.max_workgroup_size[0] ||
      (32 * (kTileM + 1) + 32 * (kTileN + 1)) * 4 > caps.max_shared_memory) {
    return Claim::No("vulkan dequant_matmul: the device's workgroups are too small for its tiles");
  }
  if (!UseMatVec(*s) && ((s->n + kTileN - 1) / kTileN > caps.max_workgroup_count[0] ||
                         (s->m + kTileM - 1) / kTileM > caps.max_workgroup_count[1])) {
    return Claim::No("vulkan dequant_matmul: the result has more tiles than the device's grid");
  }
  return Claim::Yes();
}

class DequantMatMulKernel final : public VulkanKernel {
 public:
  DequantMatMulKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
                      DequantMatMulShape shape, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)), pipeline_(std::move(p)), shape_(shape) {
    push_.M = static_cast<uint32_t>(shape.m);
    push_.N = static_cast<uint32_t>(shape.n);
    push_.K = static_cast<uint32_t>(shape.k);
    push_.row_bytes = static_cast<uint32_t>(shape.row_bytes);
  }

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const BufferBinding b[3] = {in[0], in[1], out[0]};
    if (UseMatVec(shape_)) {
      const uint32_t groups = std::clamp<uint32_t>(push_.N, 1, device_.caps().max_workgroup_count[0]);
      return s.Dispatch(*pipeline_, b, 0b100, &push_, sizeof(push_), groups);
    }
    return s.Dispatch(*pipeline_, b, 0b100, &push_, sizeof(push_), (push_.N + kTileN - 1) / kTileN,
                      (push_.M + kTileM - 1) / kTileM, 1);
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  DequantMatMulShape shape_;
  DequantPush push_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateDequantMatMul(VulkanDevice& d,
                                                                     const KernelSpec& spec,
                                                                     backend::PrepareContext&) {
  KILN_ASSIGN_OR_RETURN(DequantMatMulShape shape, backend::DequantMatMulShapeOf(spec));
  const std::string act = DTypeSuffix(shape.act), wt = DTypeName(shape.wtype);
  if (UseMatVec(shape)) {
    const uint32_t wg = std::min(kMatVecThreads, Workgroup1D(d.caps()));
    KILN_ASSIGN_OR_RETURN(auto pipeline,
                          EmbeddedPipeline(d, absl::StrCat("dequant_matvec_", act), 3,
                                           sizeof(DequantPush), {wg, ShaderWType(shape.wtype)}));
    return std::unique_ptr<backend::Kernel>(std::make_unique<DequantMatMulKernel>(
        d, spec, std::move(pipeline), shape, absl::StrCat("spirv:dequant_matvec_", wt, "_", act)));
  }
  KILN_ASSIGN_OR_RETURN(
      auto pipeline,
      EmbeddedPipeline(d, absl::StrCat("dequant_matmul_", act), 3, sizeof(DequantPush),
                       {kTileThreads, ShaderWType(shape.wtype), shape.transpose_b}));
  return std::unique_ptr<backend::Kernel>(std::make_unique<DequantMatMulKernel>(
      d, spec, std::move(pipeline), shape,
      absl::StrCat("spirv:dequant_matmul_", wt, "_", act, shape.transpose_b ? "_nk_" : "_kn_",
                   kTileM, "x", kTileN)));
}

const VulkanOpRegistration kDequantMatmulRegistration({
    {v1::OP_DEQUANT_MATMUL, &SupportsDequantMatMul, &CreateDequantMatMul},
});

}  // namespace
}  // namespace kiln::vulkan
