// MatMul and FusedMatMul through cuBLASLt, for f32 (no TF32: results match
// the f32 references), f16 and bf16 (f32 accumulation). Row-major products
// are column-major ones transposed: C^T = op(B)^T op(A)^T, so cuBLASLt's A
// is our B. Batch dims broadcast NumPy-style: collapsed into runs, the
// innermost run is one strided-batched call (stride 0 where an operand
// broadcasts), outer runs are separate calls; x @ W with an unbatched W is a
// single [batch * M, K] @ [K, N] product.
//
// Epilogues: cuBLASLt's own where they are exact (bias; ReLU; a residual
// without an activation as C with beta = 1; GELU, which cuBLASLt computes in
// its tanh form, for GeluTanh in f16, bf16 and TF32 only: on an H100 its
// tanh is ~5e-5 relative off, below a 16-bit result's resolution but not an
// f32 one's). Other activations (GELU with erf, SiLU, ...), GeluTanh of an
// exact f32 product, and an activation followed by a residual run as an
// NVRTC elementwise kernel in place on the result, generated from the same
// region codegen.
//
// Algorithms: the heuristic's first choice, queried once per shape and
// operand alignment and cached for the process, and (the one a prepare
// asks for) in the kernel level of the compile cache as a "cublaslt-algo"
// entry (prepare_cache.h), checked with cublasLtMatmulAlgoCheck when loaded:
// a warm start queries no heuristic.
#include <algorithm>
#include <array>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/cuda/codegen_elementwise.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/loaded_libraries.h"
#include "backends/cuda/matmul_plan.h"
#include "backends/cuda/prepare_cache.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

// The kernel-cache entry kind of a chosen algorithm (prepare_cache.h).
constexpr char kAlgoEntry[] = "cublaslt-algo";

// A device address as the pointer cuBLASLt takes.
void* Ptr(CUdeviceptr p) {
  return reinterpret_cast<void*>(p);  // NOLINT(performance-no-int-to-ptr): device addresses
}

// Whether cuBLASLt's epilogue computes the plan's activation as exactly as
// its result type needs.
bool LtActivation(const MatMulPlan& p) {
  return p.act == v1::UNARY_RELU || (p.act == v1::UNARY_GELU_TANH && !p.exact_f32);
}
// Whether an elementwise kernel finishes the result (act, then residual).
bool NeedsPostKernel(const MatMulPlan& p) {
  if (p.act == v1::UNARY_KIND_UNSPECIFIED) return false;
  return !LtActivation(p) || p.has_residual;
}

Claim SupportsMatMul(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<MatMulPlan> p = PlanMatMul(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda matmul: ", p.status().message()));
  const DType dt = spec.outputs[0].dtype;
  for (const auto& t : spec.inputs) {
    if (t.dtype != dt) return Claim::No("cuda matmul: operands differ in dtype");
  }
  if (Claim c = FloatDType(dt, "matmul"); !c.native) return c;
  if (p->K == 0) return Claim::No("cuda matmul: an empty contraction (K = 0)");
  if (p->has_residual && spec.inputs.back().dims != spec.outputs[0].dims) {
    return Claim::No("cuda matmul: the residual must match the result");
  }
  if (p->has_bias && spec.inputs[2].num_elements() != p->N) {
    return Claim::No("cuda matmul: the bias must be [N]");
  }
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
  if (p->M > kMaxDim || p->N > kMaxDim || p->K > kMaxDim || p->count > kMaxDim) {
    return Claim::No("cuda matmul: a dimension exceeds cuBLASLt's 32-bit sizes");
  }
  return Claim::Yes();
}

cudaDataType_t LtType(DType d) {
  switch (d) {
    case v1::DTYPE_F16:
      return CUDA_R_16F;
    case v1::DTYPE_BF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

class MatMulKernel final : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<MatMulKernel>> Create(CudaDevice& d, const KernelSpec& spec,
                                                              MatMulPlan plan, std::string impl,
                                                              backend::PrepareContext& context) {
    auto k =
        std::unique_ptr<MatMulKernel>(new MatMulKernel(d, spec, std::move(plan), std::move(impl)));
    KILN_RETURN_IF_ERROR(k->Init(context));
    return k;
  }

  ~MatMulKernel() override {
    const CublasLtApi& lt = CublasLt();
    if (desc_ != nullptr) lt.cublasLtMatmulDescDestroy(desc_);
    for (cublasLtMatrixLayout_t l : {a_, b_, c_}) {
      if (l != nullptr) lt.cublasLtMatrixLayoutDestroy(l);
    }
  }

  void SetPost(LoadedFunction post) { post_ = std::move(post); }

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    const CublasLtApi& lt = CublasLt();
    const int64_t elem = ElementSize(spec_.outputs[0].dtype);
    const CUdeviceptr a = in[0], b = in[1];
    const CUdeviceptr bias = plan_.has_bias ? in[2] : 0;
    const CUdeviceptr residual = plan_.has_residual ? in.back() : 0;
    const CUdeviceptr d = out[0];
    // The alignment every call's operands share (cuBLASLt picks kernels by it).
    uint64_t bits = 256 | a | b | d | (lt_residual_ ? residual : 0) | bias;
    for (const auto& c : plan_.calls) bits |= (c[0] | c[1] | c[2]) * elem;
    const uint32_t align = static_cast<uint32_t>(bits & (~bits + 1));
    KILN_ASSIGN_OR_RETURN(cublasLtMatmulAlgo_t algo, Algorithm(align));
    if (plan_.has_bias) {
      void* bp = Ptr(bias);
      KILN_RETURN_IF_ERROR(
          device_.CheckCublas(lt.cublasLtMatmulDescSetAttribute(
                                  desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)),
                              "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
    }
    // A residual that memory planning put in the result's own buffer (in
    // place): the GEMM writes to scratch behind the workspace, else it would
    // overwrite the residual before the post kernel reads it.
    const int64_t out_bytes = spec_.outputs[0].num_elements() * elem;
    const bool residual_in_place = post_.fn != nullptr && plan_.has_residual &&
                                   residual < d + static_cast<CUdeviceptr>(out_bytes) &&
                                   d < residual + static_cast<CUdeviceptr>(out_bytes);
    const int64_t scratch_at = (kWorkspaceBytes + 255) / 256 * 256;
    KILN_ASSIGN_OR_RETURN(CUdeviceptr ws, s.Workspace(residual_in_place ? scratch_at + out_bytes
                                                                        : kWorkspaceBytes));
    const CUdeviceptr gemm_out = residual_in_place ? ws + scratch_at : d;
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t handle, device_.LtHandle());
    const float alpha = 1.0f, beta = lt_residual_ ? 1.0f : 0.0f;
    for (const auto& c : plan_.calls) {
      // cuBLASLt's A is our B, its B our A (C^T = B^T A^T).
      const void* lt_a = Ptr(b + c[1] * elem);
      const void* lt_b = Ptr(a + c[0] * elem);
      void* dp = Ptr(gemm_out + c[2] * elem);
      const void* cp = lt_residual_ ? Ptr(residual + c[2] * elem) : dp;
      KILN_RETURN_IF_ERROR(device_.CheckCublas(
          lt.cublasLtMatmul(handle, desc_, &alpha, lt_a, a_, lt_b, b_, &beta, cp, c_, dp, c_, &algo,
                            Ptr(ws), kWorkspaceBytes, s.stream()),
          "cublasLtMatmul"));
    }
    if (post_.fn == nullptr) return absl::OkStatus();
    CUdeviceptr ptrs[3] = {gemm_out, residual, d};
    void* args[3] = {&ptrs[0], &ptrs[1], &ptrs[2]};
    if (!plan_.has_residual) args[1] = &ptrs[2];
    const int64_t total = spec_.outputs[0].num_elements();
    return LaunchKernel(s, post_.fn, GridFor(device_.caps(), total, 256), 1, 1, 256, 0, args);
  }

 private:
  MatMulKernel(CudaDevice& d, const KernelSpec& spec, MatMulPlan plan, std::string impl)
      : CudaKernel(d, spec, std::move(impl)), plan_(std::move(plan)) {}

  absl::Status Layout(cublasLtMatrixLayout_t* l, uint64_t rows, uint64_t cols, int64_t ld,
                      int64_t stride) {
    const CublasLtApi& lt = CublasLt();
    const DType dt = spec_.outputs[0].dtype;
    KILN_RETURN_IF_ERROR(
        device_.CheckCublas(lt.cublasLtMatrixLayoutCreate(l, LtType(dt), rows, cols, ld),
                            "cublasLtMatrixLayoutCreate"));
    if (plan_.count > 1) {
      const int32_t count = static_cast<int32_t>(plan_.count);
      KILN_RETURN_IF_ERROR(
          device_.CheckCublas(lt.cublasLtMatrixLayoutSetAttribute(
                                  *l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                              "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)"));
      KILN_RETURN_IF_ERROR(device_.CheckCublas(
          lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                              &stride, sizeof(stride)),
          "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)"));
    }
    return absl::OkStatus();
  }

  absl::Status Init(backend::PrepareContext& context) {
    // An empty result launches nothing (CudaKernel::Launch): no descriptors.
    if (spec_.outputs[0].num_elements() == 0) return absl::OkStatus();
    KILN_RETURN_IF_ERROR(LoadCublasLt());
    const CublasLtApi& lt = CublasLt();
    const MatMulPlan& p = plan_;
    // CUBLAS_COMPUTE_32F computes f32 products in f32; TF32 tensor cores
    // only where the compile options allowed them (MatMulPlan::tf32).
    const cublasComputeType_t compute = p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate"));
    const cublasOperation_t op_a = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
        "cublasLtMatmulDescSetAttribute(TRANSA)"));
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
        "cublasLtMatmulDescSetAttribute(TRANSB)"));
    const bool post = NeedsPostKernel(p);
    const bool relu = !post && p.act == v1::UNARY_RELU;
    const bool gelu = !post && p.act == v1::UNARY_GELU_TANH;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (p.has_bias)
      epi = relu   ? CUBLASLT_EPILOGUE_RELU_BIAS
            : gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                   : CUBLASLT_EPILOGUE_BIAS;
    else if (relu)
      epi = CUBLASLT_EPILOGUE_RELU;
    else if (gelu)
      epi = CUBLASLT_EPILOGUE_GELU;
    epilogue_ = epi;
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
    lt_residual_ = p.has_residual && !post;
    const int64_t M = p.M, N = p.N, K = p.K;
    // cuBLASLt's A = our B as stored; its B = our A as stored; C/D = [M, N] row-major.
    KILN_RETURN_IF_ERROR(p.tb ? Layout(&a_, K, N, K, p.b_stride)
                              : Layout(&a_, N, K, N, p.b_stride));
    KILN_RETURN_IF_ERROR(p.ta ? Layout(&b_, M, K, M, p.a_stride)
                              : Layout(&b_, K, M, K, p.a_stride));
    KILN_RETURN_IF_ERROR(Layout(&c_, N, M, N, M * N));
    shape_key_ =
        absl::StrCat(DTypeName(spec_.outputs[0].dtype), "|", M, "x", N, "x", K, "|", p.ta, p.tb,
                     "|", p.count, ",", p.a_stride, ",", p.b_stride, "|epi=", static_cast<int>(epi),
                     "|c=", lt_residual_, p.tf32 ? "|tf32" : "");
    // Fail at prepare, not at the first run, when no algorithm serves the shape.
    return Algorithm(256, &context).status();
  }

  // The algorithm for operands aligned to `align` bytes: this kernel's, the
  // device's, `context`'s kernel cache's (when given), else the heuristic's.
  absl::StatusOr<cublasLtMatmulAlgo_t> Algorithm(uint32_t align,
                                                 backend::PrepareContext* context = nullptr) {
    if (auto it = algos_.find(align); it != algos_.end()) return it->second;
    const std::string key = absl::StrCat(shape_key_, "|align=", align);
    if (std::optional<cublasLtMatmulAlgo_t> known = device_.FindAlgo(key)) {
      if (context != nullptr) ++context->kernel_cache_hits;
      return algos_[align] = *known;
    }
    SlowStepLog slow(absl::StrCat(device_.info().id, ": cuBLASLt algorithm for ", key));
    const CublasLtApi& lt = CublasLt();
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t handle, device_.LtHandle());
    backend::KernelBinaryCache* binaries = context != nullptr ? context->binaries : nullptr;
    // The heuristic's answer depends on the GPU model and cuBLASLt's
    // version, not on the device's ordinal.
    const std::string disk_key =
        binaries == nullptr
            ? std::string()
            : PrepareCacheKey(
                  kAlgoEntry,
                  {{"shape", key},
                   {"device", absl::StrCat(device_.info().name, "|", device_.caps().arch,
                                           "|sm=", device_.caps().sm_count)},
                   {"cublaslt", absl::StrCat(lt.cublasLtGetVersion())}});
    if (binaries != nullptr) {
      if (std::optional<cublasLtMatmulAlgo_t> cached =
              CachedAlgorithm(*binaries, disk_key, handle)) {
        ++context->kernel_cache_hits;
        slow.set_outcome("from the cache (checked)");
        device_.KeepAlgo(key, *cached);
        return algos_[align] = *cached;
      }
    }
    KILN_ASSIGN_OR_RETURN(const cublasLtMatmulAlgo_t algo,
                          device_.LtHeuristicAlgo(desc_, a_, b_, c_, kWorkspaceBytes, align, key));
    if (context != nullptr) ++context->kernel_cache_misses;
    slow.set_outcome("from the heuristic");
    if (binaries != nullptr) {
      binaries->Store(
          disk_key, EncodePrepareEntry(kAlgoEntry, disk_key,
                                       std::string_view(reinterpret_cast<const char*>(&algo),
                                                        sizeof(algo))));
    }
    device_.KeepAlgo(key, algo);
    return algos_[align] = algo;
  }

  // The algorithm of `disk_key`'s entry when it decodes and cuBLASLt accepts
  // it for this product within the workspace; nullopt otherwise (the
  // heuristic then chooses again and the entry is overwritten).
  std::optional<cublasLtMatmulAlgo_t> CachedAlgorithm(backend::KernelBinaryCache& binaries,
                                                      const std::string& disk_key,
                                                      cublasLtHandle_t handle) {
    const std::optional<std::string> entry = binaries.Lookup(disk_key);
    if (!entry) return std::nullopt;
    const std::optional<std::string> bytes = DecodePrepareEntry(kAlgoEntry, disk_key, *entry);
    if (!bytes || bytes->size() != sizeof(cublasLtMatmulAlgo_t)) return std::nullopt;
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, bytes->data(), sizeof(algo));
    cublasLtMatmulHeuristicResult_t check{};
    if (CublasLt().cublasLtMatmulAlgoCheck(handle, desc_, a_, b_, c_, c_, &algo, &check) !=
            CUBLAS_STATUS_SUCCESS ||
        check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kWorkspaceBytes) {
      return std::nullopt;
    }
    return algo;
  }

  MatMulPlan plan_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtEpilogue_t epilogue_ = CUBLASLT_EPILOGUE_DEFAULT;
  bool lt_residual_ = false;
  std::string shape_key_;  // the product, its layouts and its epilogue
  absl::flat_hash_map<uint32_t, cublasLtMatmulAlgo_t> algos_;  // by operand alignment
  LoadedFunction post_;
};

// The in-place finish of a result: y = act(y) [+ residual], as a region.
absl::StatusOr<LoadedFunction> PostKernel(CudaDevice& d, const KernelSpec& spec,
                                          const MatMulPlan& p, backend::PrepareContext& context) {
  const backend::TensorDesc& out = spec.outputs[0];
  KernelSpec ew;
  ew.name = ew.label = spec.label;
  ew.op = v1::OP_FUSED_ELEMENTWISE;
  ew.inputs = {out, out};
  ew.outputs = {out};
  auto* region = ew.attrs.mutable_fused_elementwise();
  v1::Attrs act;
  act.mutable_unary()->set_kind(p.act);
  const int x = 0, r = 1;
  *region->add_instrs() =
      backend::InstrFor(v1::OP_UNARY, act, std::span<const int>(&x, 1), out.dtype);
  if (p.has_residual) {
    v1::Attrs add;
    add.mutable_binary()->set_kind(v1::BINARY_ADD);
    const int args[2] = {2, r};
    *region->add_instrs() = backend::InstrFor(v1::OP_BINARY, add, args, out.dtype);
  }
  region->add_results(region->instrs_size() - 1);
  KILN_ASSIGN_OR_RETURN(backend::ElementwiseRegion decoded, backend::DecodeSpec(ew));
  if (std::string why = ElementwiseUnsupported(ew, decoded); !why.empty()) {
    return absl::InternalError(absl::StrCat("cuda matmul epilogue: ", why));
  }
  return LoadFunction(d, "matmul_epilogue", GenerateElementwise(ew, decoded), kElementwiseEntry,
                      context);
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateMatMul(CudaDevice& d, const KernelSpec& spec,
                                                              backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(MatMulPlan plan, PlanMatMul(spec));
  const DType dt = spec.outputs[0].dtype;
  std::string epilogue;
  if (plan.has_bias) epilogue += "+bias";
  if (plan.act != v1::UNARY_KIND_UNSPECIFIED) {
    epilogue += absl::StrCat("+", absl::AsciiStrToLower(v1::UnaryKind_Name(plan.act).substr(6)));
  }
  if (plan.has_residual) epilogue += "+residual";
  const bool post = NeedsPostKernel(plan);
  const std::string impl = absl::StrCat("cublasLt:gemm_", plan.tf32 ? "tf32" : DTypeSuffix(dt),
                                        epilogue, post ? " (nvrtc epilogue)" : "");
  LoadedFunction fn;
  if (post) {
    KILN_ASSIGN_OR_RETURN(fn, PostKernel(d, spec, plan, context));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<MatMulKernel> k,
                        MatMulKernel::Create(d, spec, std::move(plan), impl, context));
  k->SetPost(std::move(fn));
  return std::unique_ptr<backend::Kernel>(std::move(k));
}

const CudaOpRegistration kMatmulRegistration({
    {v1::OP_MATMUL, &SupportsMatMul, &CreateMatMul},
    {v1::OP_FUSED_MATMUL, &SupportsMatMul, &CreateMatMul},
});

}  // namespace
}  // namespace kiln::cuda
