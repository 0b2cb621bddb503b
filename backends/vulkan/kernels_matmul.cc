// MatMul and FusedMatMul: the shared-memory tiled kernel (matmul.comp) for
// f32/f16/bf16; a subgroup-reduction kernel (matvec.comp) for matrix-vector
// products whose operands both run along K (decoding); and on devices with
// VK_NV_cooperative_matrix (fp16 16x16x16) a cooperative-matrix kernel
// (matmul_coop_nv.comp: shared-memory staged, double-buffered) for f16
// products whose M, N and K are multiples of 16. Tiles are chosen from the
// device's limits and the problem size.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "backends/vulkan/vk_kernel.h"
#include "base/status.h"

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

// 128 x 128 tiles only when they make at least this many workgroups: on a
// large GPU (the H200 has 132 SMs) fewer leave SMs idle, and 64 x 64 tiles
// of the same product (4x the workgroups) finish sooner.
// KILN_VULKAN_MIN_TILES128 overrides it (0: the old rule, size only).
int64_t MinTiles128() {
  static const int64_t n = [] {
    const char* env = std::getenv("KILN_VULKAN_MIN_TILES128");
    return env != nullptr ? std::atoll(env) : int64_t{256};
  }();
  return n;
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
    const int64_t tiles128 = int64_t{(p.M + 127) / 128} * ((p.N + 127) / 128) * p.batch;
    if (t.bm == 128 && (!gpu || std::min(p.M, p.N) < 512 || tiles128 < MinTiles128())) continue;
    if (t.bm == 64 && std::min(p.M, p.N) < 64) continue;
    if (t.bm == 32 && std::min(p.M, p.N) < 16 && std::max(p.M, p.N) < 256) continue;
    return t;
  }
  return candidates[3];
}

// A cooperative-matrix tile (matmul_coop_nv.comp): bm x bn outputs per
// workgroup of sg_m x sg_n subgroups of 32, K staged bk deep in `stages`
// shared buffers; group_m tile rows are visited together (L2 reuse); `order`
// is the shader's fragment load order.
struct CoopTile {
  uint32_t bm, bn, bk, sg_m, sg_n, group_m, stages = 2, order = 0;
  uint32_t invocations() const { return sg_m * sg_n * 32; }
  // The shader's shared array: the staged A and B tiles (rows padded by 16
  // bytes), or the epilogue scratch if larger.
  uint32_t shared_bytes(bool ta, bool tb) const {
    const uint32_t a = (ta ? bk : bm) * ((ta ? bm : bk) / 8 + 1);
    const uint32_t b = (tb ? bn : bk) * ((tb ? bk : bn) / 8 + 1);
    return std::max(stages * (a + b), sg_m * sg_n * 80) * 16;
  }
  bool Fits(const DeviceCaps& caps, bool ta, bool tb) const {
    return bm % (16 * sg_m) == 0 && bn % (16 * sg_n) == 0 && bk % 16 == 0 && bk > 0 &&
           group_m > 0 && (stages == 1 || stages == 2) && order <= 1 &&
           invocations() <= caps.max_workgroup_invocations &&
           invocations() <= caps.max_workgroup_size[0] &&
           shared_bytes(ta, tb) <= caps.max_shared_memory;
  }
};

// KILN_VULKAN_COOP_TILE=BMxBNxBKxSG_MxSG_NxGROUP_M[xSTAGESxORDER] (tuning):
// that tile where it fits; otherwise the largest tile that still gives a few
// waves of work.
CoopTile ChooseCoopTile(const DeviceCaps& caps, const MatMulPlan& p) {
  if (const char* env = std::getenv("KILN_VULKAN_COOP_TILE"); env != nullptr) {
    CoopTile t{};
    if (std::sscanf(env, "%ux%ux%ux%ux%ux%ux%ux%u", &t.bm, &t.bn, &t.bk, &t.sg_m, &t.sg_n,
                    &t.group_m, &t.stages, &t.order) >= 6 &&
        t.Fits(caps, p.ta, p.tb)) {
      return t;
    }
  }
  // Measured on the H200 (docs/benchmarks.md): 128 x 128 tiles staged 64
  // deep in one buffer beat double-buffered 16- and 32-deep stages (48 KiB
  // of shared memory allows no deeper double buffer) and 64 x 64 subgroup
  // blocks; small products need the smaller tiles to fill the GPU.
  const CoopTile candidates[] = {{128, 128, 64, 2, 4, 8, 1, 0},
                                 {128, 64, 32, 2, 2, 8, 2, 0},
                                 {64, 64, 64, 2, 2, 8, 1, 0},
                                 {32, 32, 32, 2, 2, 8, 2, 0}};
  const uint64_t batch = p.push.batch;
  for (const CoopTile& t : candidates) {
    if (!t.Fits(caps, p.ta, p.tb)) continue;
    const uint64_t tiles = batch * ((p.push.M + t.bm - 1) / t.bm) * ((p.push.N + t.bn - 1) / t.bn);
    if (tiles >= 256) return t;
  }
  return candidates[3];
}

// The device runs matmul_coop_nv.comp itself: 16x16x16 f16 cooperative
// matrices in subgroups of 32.
bool CoopHardware(const DeviceCaps& caps) {
  return caps.coop_nv_f16_16x16x16 && caps.float16 && caps.subgroup_size == 32;
}

// KILN_VULKAN_COOP_EMULATE=1: elsewhere its emulation stands in (tests).
bool CoopEmulated() {
  const char* env = std::getenv("KILN_VULKAN_COOP_EMULATE");
  return env != nullptr && *env == '1';
}

// Eligible for matmul_coop_nv.comp: f16 with M, N, K multiples of 16, and
// storage offsets that keep the shader's 16-byte vectors aligned.
bool CoopEligible(const DeviceCaps& caps, const KernelSpec& spec, const MatMulPlan& p) {
  if (std::getenv("KILN_VULKAN_NO_COOPMAT") != nullptr) return false;
  return (CoopHardware(caps) || CoopEmulated()) && caps.storage16 && caps.vulkan_memory_model &&
         spec.outputs[0].dtype == v1::DTYPE_F16 && p.push.M % 16 == 0 && p.push.N % 16 == 0 &&
         p.push.K % 16 == 0 && p.push.K > 0 && caps.min_storage_offset_alignment % 16 == 0 &&
         CoopTile{32, 32, 32, 2, 2, 8}.Fits(caps, p.ta, p.tb);
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
    const CoopTile t = ChooseCoopTile(caps, plan);
    const bool emulated = !CoopHardware(caps);
    KILN_ASSIGN_OR_RETURN(
        auto pipeline,
        EmbeddedPipeline(
            d, emulated ? "matmul_coop_emu_f16" : "matmul_coop_nv_f16", 5, sizeof(MatMulPush),
            {t.invocations(), t.bm, t.bn, t.bk, t.sg_m, t.sg_n, plan.ta, plan.tb, plan.act,
             plan.has_bias, plan.has_residual, t.group_m, t.stages, t.order}));
    return std::unique_ptr<backend::Kernel>(std::make_unique<MatMulKernel>(
        d, spec, std::move(pipeline), plan, t.bm, t.bn,
        absl::StrCat("spirv:matmul_coopmat", emulated ? "_emulated" : "", "_f16_", t.bm, "x", t.bn,
                     epilogue)));
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

const VulkanOpRegistration kMatmulRegistration({
    {v1::OP_MATMUL, &SupportsMatMul, &CreateMatMul},
    {v1::OP_FUSED_MATMUL, &SupportsMatMul, &CreateMatMul},
});

}  // namespace
}  // namespace kiln::vulkan
