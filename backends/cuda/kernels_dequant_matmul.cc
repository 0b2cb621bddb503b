// DequantMatMul on CUDA (kernels/dequant_matmul.cu): f32/f16/bf16 activations
// times a GGUF block-quantized weight (q8_0, q4_0, q4_k, q5_k, q6_k), the
// dequantization fused into the kernel. A weight stored [N, K] with M <=
// 8 takes the matvec kernel (a block of 4 warps per 2, 4 or 8 weight rows,
// the blocks read once for all rows of x; q4_k / q8_0 with f32 activations
// only up to 2 rows); with more rows the tensor-core kernel
// (mma.sync on the codes, scales applied in f32 per group, f32 activations
// as bf16 hi + lo; sm_80 and newer, else the matvec kernel up to 32 rows);
// everything else ([K, N] weights, or older devices past 32 rows) the tiled
// kernel (32 x 64 tiles, weight tiles decoded into shared memory, FMA).
// f16 / bf16 activations with many rows may instead take the lt path: the
// weight dequantized into a workspace of the activation type, then a
// cuBLASLt GEMM (f32 accumulation); not run on a GPU yet, so only where
// KILN_DEQUANT_PATH=lt asks.
// KILN_DEQUANT_PATH=matvec|mma|tiled|lt and KILN_DEQUANT_SPLITS=n override the
// choices where the shape allows (benchmarks time each).
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backends/common/dequant_matmul_shape.h"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/dequant_plan.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::DequantMatMulShape;
using backend::KernelSpec;

// dequant_matmul.cu's DQ_MV_R weight rows per block of DQ_MV_WARPS warps
// (the instances in the shared module); 4 and 8 are modules of their own
// (KILN_DEQUANT_MVR).
constexpr int kMatVecRowsPerBlock = 2;
constexpr unsigned kMatVecThreads = 128;
// Up to 32 rows of x may take the matvec kernel (the weights re-read per 8
// rows, mostly from L2); on sm_80+ rows past 8 take the tensor-core kernel,
// and for q4_k / q8_0 weights with f32 activations rows past 2 (MatVecMaxM).
constexpr int64_t kMatVecMaxM = 32, kMatVecMaxMWithMma = 8;
// dequant_matmul.cu's DQ_MMA_ROWS weight rows per block of 4 warps.
constexpr int64_t kMmaRows = 64;
constexpr unsigned kMmaThreads = 128;
constexpr int64_t kTileM = 32, kTileN = 64;
constexpr unsigned kTileThreads = 256;

// The lt path's cuBLASLt workspace, at the front of the stream's workspace;
// the dequantized weight follows it.
constexpr int64_t kLtWorkspaceBytes = int64_t{32} << 20;
// Rows of x from which f16 / bf16 activations would take the lt path by
// default: 0 = never. On an H100 (docs/benchmarks.md "dqv10") the mma kernel
// took 518-2244 us for 14336 x 4096 / 4096 x 14336 at M = 128 and 512 with
// bf16 activations against 46-88 us for PyTorch's bf16 F.linear, but the lt
// path itself has not run on a GPU: opt-in (KILN_DEQUANT_PATH=lt) until it has.
constexpr int64_t kLtMinRows = 0;

enum class Path { kMatVec, kMma, kTiled, kLt };

bool HasMma(const CudaDevice& d) { return d.caps().cc_major >= 8; }

// The tensor-core kernel serves batches of more than 2 rows by default: it
// passed CudaDequantMatMulTest.TensorCoresEveryBlockType on an H100 (stop 25)
// and is 3-5x faster than the matvec / tiled kernels at M 16..512
// (docs/benchmarks.md "Coordinator, stop 25"). KILN_DEQUANT_MMA=0 turns it off
// (batches then take the matvec kernel up to 32 rows and the tiled one above).
bool MmaByDefault() {
  const char* on = std::getenv("KILN_DEQUANT_MMA");
  return on == nullptr || std::string_view(on) != "0";
}

Path PathFor(const CudaDevice& d, const DequantMatMulShape& s) {
  // KILN_DEQUANT_PATH: a benchmark's choice, honoured where the kernel
  // serves the shape (the matvec and mma kernels need [N, K] weights, mma
  // sm_80; the tiled one serves everything).
  if (const char* force = std::getenv("KILN_DEQUANT_PATH"); force != nullptr) {
    const std::string_view f(force);
    if (f == "tiled") return Path::kTiled;
    if (f == "matvec" && s.transpose_b) return Path::kMatVec;
    if (f == "mma" && s.transpose_b && HasMma(d)) return Path::kMma;
    if (f == "lt" && s.transpose_b && HasMma(d) && s.act != v1::DTYPE_F32) return Path::kLt;
  }
  if (!s.transpose_b) return Path::kTiled;
  if (kLtMinRows > 0 && HasMma(d) && MmaByDefault() && s.act != v1::DTYPE_F32 &&
      s.m >= kLtMinRows) {
    return Path::kLt;
  }
  if (HasMma(d) && MmaByDefault()) {
    // 3..8 rows of x on the tensor cores' one-tile instance where an H100 ran
    // and timed it (q4_k / q8_0, f32 activations: 1.3-3.5x faster than the
    // matvec m4 / m8 instances); elsewhere the matvec kernel up to 8.
    const bool mma_small = s.act == v1::DTYPE_F32 &&
                           (s.wtype == v1::DTYPE_Q4_K || s.wtype == v1::DTYPE_Q8_0);
    return s.m <= (mma_small ? 2 : kMatVecMaxMWithMma) ? Path::kMatVec : Path::kMma;
  }
  return s.m <= kMatVecMaxM ? Path::kMatVec : Path::kTiled;
}

// The matvec instance's rows of x per pass: the least of 1, 4, 8 >= M
// (fewer accumulators, more warps resident), else 8. Three instances per
// block and activation type keep the module's NVRTC compile short.
int MatVecRows(int64_t m) { return m <= 1 ? 1 : m <= 4 ? 4 : 8; }

// The mma kernel's ksteps loaded ahead: 2, or 1 where KILN_DEQUANT_MMA_PREFETCH=1
// asks (faster in 9 of 14 of round 1's comparisons on an H100, but only the
// 2 form ran the GPU tests, so it stays the default).
int MmaPrefetch() {
  const char* env = std::getenv("KILN_DEQUANT_MMA_PREFETCH");
  return env != nullptr && std::string_view(env) == "1" ? 1 : 2;
}

// The mma instance's n8 tiles of x per block (8 NT rows of x): one for
// M <= 8 (where it beat the matvec kernel's 4- and 8-row instances 1.3-3.5x
// on an H100 for q4_k / q8_0, its time flat in M).
int MmaTiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// Weight rows per block of the matvec kernel (KILN_DEQUANT_MV_ROWS=2|4|8
// overrides it for a benchmark's sweep). One row of x: 8 for q4_k, 4 for
// q8_0, the fastest of 2 / 4 / 8 on an H100 (docs/benchmarks.md "dqv10":
// q4_k 14336 x 4096 at 0.35 / 0.41 / 0.47 of copy, q8_0 0.70 / 0.74 / 0.68);
// the types not timed there and more rows of x keep 2.
int MatVecRowsPerBlock(int64_t m, DType wtype) {
  if (const char* env = std::getenv("KILN_DEQUANT_MV_ROWS"); env != nullptr) {
    const std::string_view v(env);
    if (v == "2") return 2;
    if (v == "4") return 4;
    if (v == "8") return 8;
  }
  if (m > 1) return kMatVecRowsPerBlock;
  return wtype == v1::DTYPE_Q4_K ? 8 : wtype == v1::DTYPE_Q8_0 ? 4 : kMatVecRowsPerBlock;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

Claim SupportsDequantMatMul(const CudaDevice& d, const KernelSpec& spec) {
  absl::StatusOr<DequantMatMulShape> s = backend::DequantMatMulShapeOf(spec);
  if (!s.ok()) return Claim::No(absl::StrCat("cuda dequant_matmul: ", s.status().message()));
  bool fits = true;
  switch (PathFor(d, *s)) {
    case Path::kMatVec:
      fits = CeilDiv(s->n, MatVecRowsPerBlock(s->m, s->wtype)) <= d.caps().max_grid_x;
      break;
    case Path::kMma:
    case Path::kLt:  // its fallback for misaligned x or y is the mma kernel
      fits = CeilDiv(s->n, kMmaRows) <= d.caps().max_grid_x &&
             CeilDiv(s->m, 8 * MmaTiles(s->m)) <= 65535;
      break;
    case Path::kTiled:
      fits = CeilDiv(s->n, kTileN) <= d.caps().max_grid_x && CeilDiv(s->m, kTileM) <= 65535;
      break;
  }
  if (!fits) return Claim::No("cuda dequant_matmul: the result has more tiles than a grid holds");
  return Claim::Yes();
}

class DequantMatMulKernel final : public CudaKernel {
 public:
  DequantMatMulKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn,
                      LoadedFunction reduce, DequantMatMulShape shape, Path path, int splits,
                      int mv_rows, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        fn_(std::move(fn)),
        reduce_(std::move(reduce)),
        shape_(shape),
        path_(path),
        splits_(splits),
        mv_rows_(mv_rows) {}

  ~DequantMatMulKernel() override {
    if (path_ != Path::kLt) return;
    const CublasLtApi& lt = CublasLt();
    if (desc_ != nullptr) lt.cublasLtMatmulDescDestroy(desc_);
    for (cublasLtMatrixLayout_t l : {a_, b_, c_}) {
      if (l != nullptr) lt.cublasLtMatrixLayoutDestroy(l);
    }
  }

  // The lt path's GEMM: y^T [N, M] = W [N, K] x^T in cuBLASLt's column-major
  // terms (W stored [N, K] row-major is K x N, transposed; x [M, K] is K x M;
  // y [M, N] is N x M), f32 accumulation, the algorithm for 16-byte aligned
  // operands chosen once here. `to` decodes the weight into the workspace.
  absl::Status InitLt(LoadedFunction to) {
    to_ = std::move(to);
    KILN_RETURN_IF_ERROR(LoadCublasLt());
    const CublasLtApi& lt = CublasLt();
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate"));
    const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
        "cublasLtMatmulDescSetAttribute(TRANSA)"));
    KILN_RETURN_IF_ERROR(device_.CheckCublas(
        lt.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
        "cublasLtMatmulDescSetAttribute(TRANSB)"));
    const cudaDataType_t type = shape_.act == v1::DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const uint64_t m = shape_.m, n = shape_.n, k = shape_.k;
    KILN_RETURN_IF_ERROR(device_.CheckCublas(lt.cublasLtMatrixLayoutCreate(&a_, type, k, n, k),
                                             "cublasLtMatrixLayoutCreate(A)"));
    KILN_RETURN_IF_ERROR(device_.CheckCublas(lt.cublasLtMatrixLayoutCreate(&b_, type, k, m, k),
                                             "cublasLtMatrixLayoutCreate(B)"));
    KILN_RETURN_IF_ERROR(device_.CheckCublas(lt.cublasLtMatrixLayoutCreate(&c_, type, n, m, n),
                                             "cublasLtMatrixLayoutCreate(C)"));
    KILN_ASSIGN_OR_RETURN(algo_, device_.LtHeuristicAlgo(
                                     desc_, a_, b_, c_, kLtWorkspaceBytes, 16,
                                     absl::StrCat("dequant_matmul ", m, "x", n, "x", k)));
    return absl::OkStatus();
  }

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr x = in[0], w = in[1], y = out[0];
    // The kernels read the blocks in 16-bit words at least (every block size
    // is even) and the activations in whole elements: a misaligned view
    // would fault the device.
    const unsigned esize = shape_.act == v1::DTYPE_F32 ? 4 : 2;
    if (w % 2 != 0 || x % esize != 0 || y % esize != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda dequant_matmul needs the weight 2-byte aligned and x, y aligned to their ",
          esize, "-byte elements; got addresses ", w % 16, ", ", x % 16, ", ", y % 16,
          " mod 16"));
    }
    int64_t m = shape_.m, n = shape_.n, k = shape_.k, row_bytes = shape_.row_bytes;
    Path path = path_;
    if (path == Path::kLt) {
      // cuBLASLt's algorithm wants x and y 16-byte aligned: else the mma kernel.
      if ((x | y) % 16 == 0) return EnqueueLt(s, x, w, y);
      path = Path::kMma;
    }
    switch (path) {
      case Path::kMatVec: {
        void* args[] = {&x, &w, &y, &m, &n, &k, &row_bytes};
        const unsigned grid = static_cast<unsigned>(CeilDiv(n, mv_rows_));
        return LaunchKernel(s, fn_.fn, grid, 1, 1, kMatVecThreads, 0, args);
      }
      case Path::kMma: {
        // Split K: the partial sums in the stream's workspace, then summed.
        CUdeviceptr part = 0;
        if (splits_ > 1) {
          KILN_ASSIGN_OR_RETURN(part, s.Workspace(int64_t{splits_} * m * n * 4));
        }
        int splits = splits_;
        void* args[] = {&x, &w, &y, &part, &m, &n, &k, &row_bytes, &splits};
        KILN_RETURN_IF_ERROR(LaunchKernel(
            s, fn_.fn, static_cast<unsigned>(CeilDiv(n, kMmaRows)),
            static_cast<unsigned>(CeilDiv(m, 8 * MmaTiles(m))), static_cast<unsigned>(splits),
            kMmaThreads, 0, args));
        if (splits_ == 1) return absl::OkStatus();
        int64_t mn = m * n;
        void* rargs[] = {&part, &y, &mn, &splits};
        return LaunchKernel(s, reduce_.fn, GridFor(device_.caps(), mn, 256), 1, 1, 256, 0,
                            rargs);
      }
      case Path::kLt: break;  // handled above
      case Path::kTiled: {
        int trans_b = shape_.transpose_b;
        void* args[] = {&x, &w, &y, &m, &n, &k, &row_bytes, &trans_b};
        return LaunchKernel(s, fn_.fn, static_cast<unsigned>(CeilDiv(n, kTileN)),
                            static_cast<unsigned>(CeilDiv(m, kTileM)), 1, kTileThreads, 0, args);
      }
    }
    return absl::InternalError("cuda dequant_matmul: unknown path");
  }

 private:
  // The weight decoded into the stream's workspace (behind cuBLASLt's own),
  // then one GEMM.
  absl::Status EnqueueLt(CudaStream& s, CUdeviceptr x, CUdeviceptr w, CUdeviceptr y) {
    int64_t n = shape_.n, k = shape_.k, row_bytes = shape_.row_bytes;
    KILN_ASSIGN_OR_RETURN(CUdeviceptr ws, s.Workspace(kLtWorkspaceBytes + n * k * 2));
    CUdeviceptr wd = ws + kLtWorkspaceBytes;
    void* args[] = {&w, &wd, &n, &k, &row_bytes};
    KILN_RETURN_IF_ERROR(
        LaunchKernel(s, to_.fn, GridFor(device_.caps(), n * (k / 32), 256), 1, 1, 256, 0, args));
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t handle, device_.LtHandle());
    const float alpha = 1.0f, beta = 0.0f;
    auto ptr = [](CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); };
    return device_.CheckCublas(
        CublasLt().cublasLtMatmul(handle, desc_, &alpha, ptr(wd), a_, ptr(x), b_, &beta, ptr(y),
                                  c_, ptr(y), c_, &algo_, ptr(ws), kLtWorkspaceBytes, s.stream()),
        "cublasLtMatmul");
  }

  LoadedFunction fn_, reduce_;
  DequantMatMulShape shape_;
  Path path_;
  int splits_;
  int mv_rows_;  // the matvec kernel's weight rows per block
  // The lt path: the dequantize kernel and the GEMM's descriptors.
  LoadedFunction to_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

}  // namespace

namespace {

// dequant_matmul.cu's macro arguments for a block type and an activation
// type: "q4_k, DQ_Q4_K, f32, float".
std::string VariantArgs(DType wtype, DType act) {
  static constexpr const char* kBlockMacro[] = {"DQ_Q8_0", "DQ_Q4_0", "DQ_Q4_K", "DQ_Q5_K",
                                                "DQ_Q6_K"};
  int block = 0;
  switch (wtype) {
    case v1::DTYPE_Q8_0: block = 0; break;
    case v1::DTYPE_Q4_0: block = 1; break;
    case v1::DTYPE_Q4_K: block = 2; break;
    case v1::DTYPE_Q5_K: block = 3; break;
    default: block = 4; break;
  }
  const char* type = act == v1::DTYPE_F32 ? "float" : (act == v1::DTYPE_F16 ? "k_f16" : "k_bf16");
  return absl::StrCat(DTypeName(wtype), ", ", kBlockMacro[block], ", ", DTypeSuffix(act), ", ",
                      type);
}

}  // namespace

std::string DequantMmaSource(DType wtype, DType act, int tiles, int prefetch) {
  const char* type = act == v1::DTYPE_F32 ? "float" : (act == v1::DTYPE_F16 ? "k_f16" : "k_bf16");
  return absl::StrCat("#define DQ_MMA_ONLY 1\n", prefetch == 1 ? "#define DQ_MMA_PF 1\n" : "",
                      KernelSource("dequant_matmul.cu"),
                      "\nKILN_DEQUANT_MMA(", VariantArgs(wtype, act), ", ", tiles,
                      ")\nKILN_DEQUANT_MMA_REDUCE(", DTypeSuffix(act), ", ", type, ")\n");
}

std::string DequantToSource(DType wtype, DType act) {
  return absl::StrCat("#define DQ_MMA_ONLY 1\n", KernelSource("dequant_matmul.cu"),
                      "\nKILN_DEQUANT_TO(", VariantArgs(wtype, act), ")\n");
}

std::string DequantMatVecSource(DType wtype, DType act, int mr, int rows) {
  return absl::StrCat("#define DQ_MMA_ONLY 1\n", KernelSource("dequant_matmul.cu"),
                      "\nKILN_DEQUANT_MVR(", VariantArgs(wtype, act), ", ", mr, ", ", rows,
                      ")\n");
}

namespace {

// How many shares of K the mma kernel's grid takes: enough blocks to fill
// what the device holds at once, each share at least 8 ksteps (512 of K),
// at most 32 (the partials are M x N f32 each). KILN_DEQUANT_SPLITS=n
// overrides it (a benchmark's sweep).
absl::StatusOr<int> MmaSplits(CudaDevice& d, CUfunction fn, const DequantMatMulShape& s) {
  const int64_t steps = CeilDiv(s.k, 64);
  if (const char* env = std::getenv("KILN_DEQUANT_SPLITS"); env != nullptr) {
    int64_t v = 0;
    if (absl::SimpleAtoi(env, &v) && v > 0) return static_cast<int>(std::min(v, steps));
  }
  KILN_ASSIGN_OR_RETURN(unsigned resident, ResidentBlocks(d, fn, kMmaThreads));
  const int64_t tiles = CeilDiv(s.n, kMmaRows) * CeilDiv(s.m, 8 * MmaTiles(s.m));
  if (tiles >= resident) return 1;
  const int64_t most = std::min<int64_t>(32, std::max<int64_t>(1, steps / 8));
  return static_cast<int>(std::min(CeilDiv(resident, tiles), most));
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateDequantMatMul(
    CudaDevice& d, const KernelSpec& spec, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(DequantMatMulShape shape, backend::DequantMatMulShapeOf(spec));
  const Path path = PathFor(d, shape);
  // The lt path also loads the mma kernel (its fallback for misaligned x, y).
  const Path kernel_path = path == Path::kLt ? Path::kMma : path;
  const int mv_rows = MatVecRowsPerBlock(shape.m, shape.wtype);
  std::string kind;
  switch (kernel_path) {
    case Path::kMatVec:
      kind = absl::StrCat("matvec_",
                          mv_rows == kMatVecRowsPerBlock ? "" : absl::StrCat("r", mv_rows, "_"),
                          "m", MatVecRows(shape.m));
      break;
    case Path::kMma:
    case Path::kLt: kind = absl::StrCat("mma_n", MmaTiles(shape.m)); break;
    case Path::kTiled: kind = "matmul"; break;
  }
  const std::string suffix = absl::StrCat(DTypeName(shape.wtype), "_", DTypeSuffix(shape.act));
  const std::string entry = absl::StrCat("kiln_dequant_", kind, "_", suffix);
  // The mma variants and the matvec ones with 4 or 8 rows per block are
  // modules of their own (dequant_matmul.cu's KILN_DEQUANT_MMA /
  // KILN_DEQUANT_MVR), the rest one module.
  const bool own_mv = kernel_path == Path::kMatVec && mv_rows != kMatVecRowsPerBlock;
  const int prefetch = MmaPrefetch();
  const std::string module =
      kernel_path == Path::kMma ? absl::StrCat(entry.substr(5), prefetch == 1 ? "_pf1" : "")
      : own_mv                  ? entry.substr(5)
                                : std::string("dequant_matmul");
  const std::string source =
      kernel_path == Path::kMma
          ? DequantMmaSource(shape.wtype, shape.act, MmaTiles(shape.m), prefetch)
      : own_mv ? DequantMatVecSource(shape.wtype, shape.act, MatVecRows(shape.m), mv_rows)
               : KernelSource("dequant_matmul.cu");
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn, LoadFunction(d, module, source, entry, context));
  std::string impl = path == Path::kLt ? absl::StrCat("nvrtc:dequant_to_", suffix, "+cublasLt")
                                       : absl::StrCat("nvrtc:dequant_", kind, "_", suffix);
  LoadedFunction reduce;
  int splits = 1;
  if (kernel_path == Path::kMma) {
    KILN_ASSIGN_OR_RETURN(splits, MmaSplits(d, fn.fn, shape));
    if (splits > 1) {
      KILN_ASSIGN_OR_RETURN(
          reduce, LoadFunction(d, module, source,
                               absl::StrCat("kiln_dequant_mma_reduce_", DTypeSuffix(shape.act)),
                               context));
      if (path == Path::kMma) absl::StrAppend(&impl, "_split", splits);
    }
    if (path == Path::kMma && prefetch == 1) absl::StrAppend(&impl, "_pf1");
  }
  if (path == Path::kTiled) absl::StrAppend(&impl, shape.transpose_b ? "_nk_" : "_kn_", "32x64");
  auto kernel = std::make_unique<DequantMatMulKernel>(d, spec, std::move(fn), std::move(reduce),
                                                      shape, path, splits, mv_rows,
                                                      std::move(impl));
  if (path == Path::kLt) {
    const std::string to_entry = absl::StrCat("kiln_dequant_to_", suffix);
    KILN_ASSIGN_OR_RETURN(LoadedFunction to,
                          LoadFunction(d, to_entry.substr(5), DequantToSource(shape.wtype, shape.act),
                                       to_entry, context));
    KILN_RETURN_IF_ERROR(kernel->InitLt(std::move(to)));
  }
  return std::unique_ptr<backend::Kernel>(std::move(kernel));
}

const CudaOpRegistration kDequantMatmulRegistration({
    {v1::OP_DEQUANT_MATMUL, &SupportsDequantMatMul, &CreateDequantMatMul},
});

}  // namespace
}  // namespace kiln::cuda
