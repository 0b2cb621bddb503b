// MatMul and FusedMatMul: the shared-memory tiled kernel (matmul.comp) for
// f32/f16/bf16; a subgroup-reduction kernel (matvec.comp) for matrix-vector
// products whose operands both run along K (decoding); and on devices with
// VK_NV_cooperative_matrix (fp16 16x16x16) a cooperative-matrix kernel
// (matmul_coop_nv.comp) for f16 products whose M, N and K are multiples of
// 16. Tiles are chosen from the device's limits and the problem size.
#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "engine/base/status.h"

namespace kiln::vulkan {
namespace {

using backend::Claim;
using backend::KernelSpec;

struct MatMulPush {
  uint32_t M = 0, N = 0, K = 0, batch = 1, batch_rank = 0, bias_count = 1;
  uint32_t batch_dims[4] = {}, a_strides[4] = {}, b_strides[4] = {};
};
static_assert(sizeof(MatMulPush) == 72);

struct MatMulPlan {
  MatMulPush push;
  bool ta = false, tb = false, has_bias = false, has_residual = false;
  uint32_t act = 0;  // UnaryKind; 0 and IDENTITY mean none
};

absl::StatusOr<MatMulPlan> Plan(const KernelSpec& spec) {
  MatMulPlan p;
  if (spec.op == v1::OP_MATMUL) {
    p.ta = spec.attrs.matmul().transpose_a();
    p.tb = spec.attrs.matmul().transpose_b();
  } else {
    const auto& f = spec.attrs.fused_matmul();
    p.ta = f.transpose_a(), p.tb = f.transpose_b();
    p.has_bias = f.has_bias(), p.has_residual = f.has_residual();
    p.act = f.activation() == v1::UNARY_IDENTITY ? 0 : static_cast<uint32_t>(f.activation());
  }
  if (spec.inputs.size() != 2u + p.has_bias + p.has_residual || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError("operand count");
  }
  Dims a = spec.inputs[0].dims, b = spec.inputs[1].dims;
  if (a.empty() || b.empty()) return absl::InvalidArgumentError("scalar operand");
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t ra = a.size(), rb = b.size();
  const int64_t m = p.ta ? a[ra - 1] : a[ra - 2], k = p.ta ? a[ra - 2] : a[ra - 1];
  const int64_t kb = p.tb ? b[rb - 1] : b[rb - 2], n = p.tb ? b[rb - 2] : b[rb - 1];
  if (k != kb) return absl::InvalidArgumentError("contracting dims differ");
  // Right-aligned batch dims with broadcast strides, collapsed into runs.
  const size_t r = std::max(ra, rb) - 2;
  std::vector<int64_t> dims, as, bs;
  int64_t a_stride = m * k, b_stride = k * n;
  std::vector<int64_t> ad(r, 1), bd(r, 1);
  std::copy(a.begin(), a.end() - 2, ad.begin() + (r - (ra - 2)));
  std::copy(b.begin(), b.end() - 2, bd.begin() + (r - (rb - 2)));
  std::vector<int64_t> full_dims(r), full_as(r), full_bs(r);
  for (size_t d = r; d-- > 0;) {
    if (ad[d] != bd[d] && ad[d] != 1 && bd[d] != 1) return absl::InvalidArgumentError("batch");
    full_dims[d] = std::max(ad[d], bd[d]);
    if (ad[d] == 0 || bd[d] == 0) full_dims[d] = 0;
    full_as[d] = ad[d] == 1 ? 0 : a_stride;
    full_bs[d] = bd[d] == 1 ? 0 : b_stride;
    a_stride *= ad[d];
    b_stride *= bd[d];
  }
  int64_t batch = 1;
  for (size_t d = 0; d < r; ++d) {
    batch *= full_dims[d];
    if (full_dims[d] == 1) continue;
    if (!dims.empty() && as.back() == full_as[d] * full_dims[d] &&
        bs.back() == full_bs[d] * full_dims[d]) {
      dims.back() *= full_dims[d];
      as.back() = full_as[d];
      bs.back() = full_bs[d];
      continue;
    }
    dims.push_back(full_dims[d]);
    as.push_back(full_as[d]);
    bs.push_back(full_bs[d]);
  }
  MatMulPush& push = p.push;
  push.M = static_cast<uint32_t>(m);
  push.N = static_cast<uint32_t>(n);
  push.K = static_cast<uint32_t>(k);
  push.batch = static_cast<uint32_t>(batch);
  if (dims.size() > 4) return absl::InvalidArgumentError("more than 4 batch runs");
  push.batch_rank = static_cast<uint32_t>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    push.batch_dims[d] = static_cast<uint32_t>(dims[d]);
    push.a_strides[d] = static_cast<uint32_t>(as[d]);
    push.b_strides[d] = static_cast<uint32_t>(bs[d]);
  }
  if (p.has_bias)
    push.bias_count = static_cast<uint32_t>(std::max<int64_t>(1, spec.inputs[2].num_elements()));
  return p;
}

struct Tile {
  uint32_t bm, bn, bk, tm, tn;
  uint32_t invocations() const { return (bm / tm) * (bn / tn); }
};

// The largest tile the device fits that still yields a few tiles of work.
// x @ W with an unbatched W and a plain A is one [batch * M, K] @ [K, N]
// product: bigger tiles, one batch.
void FoldBatch(MatMulPlan& p) {
  MatMulPush& q = p.push;
  for (uint32_t d = 0; d < q.batch_rank; ++d) {
    if (q.b_strides[d] != 0) return;
  }
  if (p.ta || q.batch <= 1) return;
  q.M *= q.batch;
  q.batch = 1;
  q.batch_rank = 0;
}

Tile ChooseTile(const DeviceCaps& caps, const MatMulPush& p) {
  const Tile candidates[] = {
      {128, 128, 16, 8, 8}, {64, 64, 16, 4, 4}, {32, 32, 16, 2, 2}, {16, 16, 16, 1, 1}};
  const bool gpu = caps.type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ||
                   caps.type == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
  for (const Tile& t : candidates) {
    const uint32_t shared = t.bk * (t.bm + t.bn + 2) * 4;
    if (t.invocations() > caps.max_workgroup_invocations ||
        t.invocations() > caps.max_workgroup_size[0] || shared > caps.max_shared_memory) {
      continue;
    }
    if (t.bm == 128 && (!gpu || std::min(p.M, p.N) < 512)) continue;
    if (t.bm == 64 && std::min(p.M, p.N) < 64) continue;
    if (t.bm == 32 && std::min(p.M, p.N) < 16 && std::max(p.M, p.N) < 256) continue;
    return t;
  }
  return candidates[3];
}

bool CoopEligible(const DeviceCaps& caps, const KernelSpec& spec, const MatMulPlan& p) {
  if (std::getenv("KILN_VULKAN_NO_COOPMAT") != nullptr) return false;
  return caps.coop_nv_f16_16x16x16 && caps.float16 && caps.storage16 && caps.vulkan_memory_model &&
         spec.outputs[0].dtype == v1::DTYPE_F16 && p.push.M % 16 == 0 && p.push.N % 16 == 0 &&
         p.push.K % 16 == 0 && p.push.K > 0 && caps.subgroup_size >= 16 &&
         4 * caps.subgroup_size <= caps.max_workgroup_invocations;
}

// A subgroup per output, lanes over K: when one side is a vector and both
// operands are contiguous along K.
bool MatVecEligible(const DeviceCaps& caps, const MatMulPlan& p) {
  const MatMulPush& q = p.push;
  return caps.subgroup_arithmetic && caps.subgroup_size >= 4 && (q.M == 1 || q.N == 1) &&
         (!p.ta || q.M == 1) && (p.tb || q.N == 1) && q.K >= 4 * caps.subgroup_size &&
         Workgroup1D(caps) % caps.subgroup_size == 0;
}

Claim SupportsMatMul(const VulkanDevice& d, const KernelSpec& spec) {
  absl::StatusOr<MatMulPlan> p = Plan(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("vulkan matmul: ", p.status().message()));
  if (!MatVecEligible(d.caps(), *p)) FoldBatch(*p);
  const DType dt = spec.outputs[0].dtype;
  for (const auto& t : spec.inputs) {
    if (t.dtype != dt) return Claim::No("vulkan matmul: operands differ in dtype");
  }
  if (dt != v1::DTYPE_BF16 || !d.caps().storage16) {
    if (Claim c = FloatKernelDType(d, spec, dt, "matmul"); !c.native) return c;
  }
  if (p->has_residual && spec.inputs.back().num_elements() != spec.outputs[0].num_elements()) {
    return Claim::No("vulkan matmul: the residual must match the result");
  }
  const Tile t = ChooseTile(d.caps(), p->push);
  if ((p->push.N + t.bn - 1) / t.bn > d.caps().max_workgroup_count[0] ||
      (p->push.M + t.bm - 1) / t.bm > d.caps().max_workgroup_count[1]) {
    return Claim::No("vulkan matmul: the result has more tiles than the device's grid allows");
  }
  return Claim::Yes();
}

class MatMulKernel final : public VulkanKernel {
 public:
  // tile_m == 0: the matvec kernel, `tile_n` outputs per workgroup.
  MatMulKernel(VulkanDevice& d, const KernelSpec& spec, std::shared_ptr<const Pipeline> p,
               MatMulPlan plan, uint32_t tile_m, uint32_t tile_n, std::string impl)
      : VulkanKernel(d, spec, std::move(impl)),
        pipeline_(std::move(p)),
        plan_(plan),
        tile_m_(tile_m),
        tile_n_(tile_n) {}

 protected:
  absl::Status Record(VulkanStream& s, std::span<const BufferBinding> in,
                      std::span<const BufferBinding> out) override {
    const BufferBinding dummy = out[0];  // bound for absent operands, never read
    size_t next = 2;
    BufferBinding b[5] = {in[0], in[1], dummy, dummy, out[0]};
    if (plan_.has_bias) b[2] = in[next++];
    if (plan_.has_residual) b[3] = in[next++];
    const MatMulPush& p = plan_.push;
    if (tile_m_ == 0) {
      const uint64_t outputs = uint64_t{p.batch} * p.M * p.N;
      return s.Dispatch(*pipeline_, b, 0b10000, &p, sizeof(p),
                        Groups1D(device_.caps(), outputs, tile_n_));
    }
    const uint32_t gz = std::min<uint32_t>(p.batch, device_.caps().max_workgroup_count[2]);
    return s.Dispatch(*pipeline_, b, 0b10000, &p, sizeof(p), (p.N + tile_n_ - 1) / tile_n_,
                      (p.M + tile_m_ - 1) / tile_m_, gz);
  }

 private:
  std::shared_ptr<const Pipeline> pipeline_;
  MatMulPlan plan_;
  uint32_t tile_m_, tile_n_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateMatMul(VulkanDevice& d,
                                                              const KernelSpec& spec,
                                                              backend::PrepareContext&) {
  KILN_ASSIGN_OR_RETURN(MatMulPlan plan, Plan(spec));
  const DType dt = spec.outputs[0].dtype;
  const DeviceCaps& caps = d.caps();
  std::string epilogue;
  if (plan.has_bias) epilogue += "+bias";
  if (plan.act != 0) {
    epilogue += absl::StrCat("+", v1::UnaryKind_Name(static_cast<v1::UnaryKind>(plan.act)));
  }
  if (plan.has_residual) epilogue += "+residual";
  if (MatVecEligible(caps, plan)) {
    const uint32_t wg = Workgroup1D(caps);
    KILN_ASSIGN_OR_RETURN(
        auto pipeline,
        EmbeddedPipeline(d, absl::StrCat("matvec_", DTypeSuffix(dt)), 5, sizeof(MatMulPush),
                         {wg, plan.act, plan.has_bias, plan.has_residual}));
    return std::unique_ptr<backend::Kernel>(std::make_unique<MatMulKernel>(
        d, spec, std::move(pipeline), plan, 0, wg / caps.subgroup_size,
        absl::StrCat("spirv:matvec_", DTypeSuffix(dt), epilogue)));
  }
  FoldBatch(plan);
  if (CoopEligible(caps, spec, plan)) {
    // 2 x 2 subgroups, 2 x 2 fragments each: a 64 x 64 tile.
    const uint32_t sg = caps.subgroup_size, fm = 2, fn = 2;
    KILN_ASSIGN_OR_RETURN(auto pipeline,
                          EmbeddedPipeline(d, "matmul_coop_nv_f16", 5, sizeof(MatMulPush),
                                           {4 * sg, 2, 2, fm, fn, plan.ta, plan.tb, plan.act,
                                            plan.has_bias, plan.has_residual}));
    return std::unique_ptr<backend::Kernel>(
        std::make_unique<MatMulKernel>(d, spec, std::move(pipeline), plan, 2 * fm * 16, 2 * fn * 16,
                                       absl::StrCat("spirv:matmul_coopmat_f16", epilogue)));
  }
  const Tile t = ChooseTile(caps, plan.push);
  KILN_ASSIGN_OR_RETURN(
      auto pipeline,
      EmbeddedPipeline(d, absl::StrCat("matmul_", DTypeSuffix(dt)), 5, sizeof(MatMulPush),
                       {t.invocations(), t.bm, t.bn, t.bk, t.tm, t.tn, plan.ta, plan.tb, plan.act,
                        plan.has_bias, plan.has_residual}));
  return std::unique_ptr<backend::Kernel>(std::make_unique<MatMulKernel>(
      d, spec, std::move(pipeline), plan, t.bm, t.bn,
      absl::StrCat("spirv:matmul_", DTypeSuffix(dt), "_", t.bm, "x", t.bn, epilogue)));
}

const VulkanOpRegistration kRegistration({
    {v1::OP_MATMUL, &SupportsMatMul, &CreateMatMul},
    {v1::OP_FUSED_MATMUL, &SupportsMatMul, &CreateMatMul},
});

}  // namespace
}  // namespace kiln::vulkan
