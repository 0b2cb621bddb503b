// DequantMatMul on CUDA (kernels/dequant_matmul.cu): f32/f16/bf16 activations
// times a GGUF block-quantized weight (q8_0, q4_0, q4_k, q5_k, q6_k), the
// dequantization fused into the kernel. A weight stored [N, K] with M <=
// 8 takes the matvec kernel (a block of 4 warps per 2 weight rows, the
// blocks read once for all rows of x); with more rows the tensor-core kernel
// (mma.sync on the codes, scales applied in f32 per group, f32 activations
// as bf16 hi + lo; sm_80 and newer, else the matvec kernel up to 32 rows);
// everything else ([K, N] weights, or older devices past 32 rows) the tiled
// kernel (32 x 64 tiles, weight tiles decoded into shared memory, FMA).
// KILN_DEQUANT_PATH=matvec|mma|tiled and KILN_DEQUANT_SPLITS=n override the
// choices where the shape allows (benchmarks time each).
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backends/common/dequant_matmul_shape.h"
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
// rows, mostly from L2); on sm_80+ rows past 8 take the tensor-core kernel.
constexpr int64_t kMatVecMaxM = 32, kMatVecMaxMWithMma = 8;
// dequant_matmul.cu's DQ_MMA_ROWS weight rows per block of 4 warps.
constexpr int64_t kMmaRows = 64;
constexpr unsigned kMmaThreads = 128;
constexpr int64_t kTileM = 32, kTileN = 64;
constexpr unsigned kTileThreads = 256;

enum class Path { kMatVec, kMma, kTiled };

bool HasMma(const CudaDevice& d) { return d.caps().cc_major >= 8; }

// The tensor-core kernel serves batches of more than 8 rows by default: it
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
  }
  if (!s.transpose_b) return Path::kTiled;
  if (HasMma(d) && MmaByDefault()) return s.m <= kMatVecMaxMWithMma ? Path::kMatVec : Path::kMma;
  return s.m <= kMatVecMaxM ? Path::kMatVec : Path::kTiled;
}

// The matvec instance's rows of x per pass: the least of 1, 4, 8 >= M
// (fewer accumulators, more warps resident), else 8. Three instances per
// block and activation type keep the module's NVRTC compile short.
int MatVecRows(int64_t m) { return m <= 1 ? 1 : m <= 4 ? 4 : 8; }

// The mma kernel's ksteps loaded ahead: 2, or 1 where KILN_DEQUANT_MMA_PREFETCH=1
// asks (a benchmark's comparison).
int MmaPrefetch() {
  const char* env = std::getenv("KILN_DEQUANT_MMA_PREFETCH");
  return env != nullptr && std::string_view(env) == "1" ? 1 : 2;
}

// The mma instance's n8 tiles of x per block (8 NT rows of x).
int MmaTiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// Weight rows per block of the matvec kernel: 2, or 4 / 8 where
// KILN_DEQUANT_MV_ROWS asks (a benchmark's sweep; M = 1 only, the other
// instances keep 2).
int MatVecRowsPerBlock(int64_t m) {
  if (const char* env = std::getenv("KILN_DEQUANT_MV_ROWS"); env != nullptr && m == 1) {
    const std::string_view v(env);
    if (v == "4") return 4;
    if (v == "8") return 8;
  }
  return kMatVecRowsPerBlock;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

Claim SupportsDequantMatMul(const CudaDevice& d, const KernelSpec& spec) {
  absl::StatusOr<DequantMatMulShape> s = backend::DequantMatMulShapeOf(spec);
  if (!s.ok()) return Claim::No(absl::StrCat("cuda dequant_matmul: ", s.status().message()));
  bool fits = true;
  switch (PathFor(d, *s)) {
    case Path::kMatVec:
      fits = CeilDiv(s->n, MatVecRowsPerBlock(s->m)) <= d.caps().max_grid_x;
      break;
    case Path::kMma:
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
    switch (path_) {
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
  LoadedFunction fn_, reduce_;
  DequantMatMulShape shape_;
  Path path_;
  int splits_;
  int mv_rows_;  // the matvec kernel's weight rows per block
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
  const int mv_rows = MatVecRowsPerBlock(shape.m);
  std::string kind;
  switch (path) {
    case Path::kMatVec:
      kind = absl::StrCat("matvec_",
                          mv_rows == kMatVecRowsPerBlock ? "" : absl::StrCat("r", mv_rows, "_"),
                          "m", MatVecRows(shape.m));
      break;
    case Path::kMma: kind = absl::StrCat("mma_n", MmaTiles(shape.m)); break;
    case Path::kTiled: kind = "matmul"; break;
  }
  const std::string suffix = absl::StrCat(DTypeName(shape.wtype), "_", DTypeSuffix(shape.act));
  const std::string entry = absl::StrCat("kiln_dequant_", kind, "_", suffix);
  // The mma variants and the matvec ones with 4 or 8 rows per block are
  // modules of their own (dequant_matmul.cu's KILN_DEQUANT_MMA /
  // KILN_DEQUANT_MVR), the rest one module.
  const bool own_mv = path == Path::kMatVec && mv_rows != kMatVecRowsPerBlock;
  const int prefetch = MmaPrefetch();
  const std::string module =
      path == Path::kMma ? absl::StrCat(entry.substr(5), prefetch == 1 ? "_pf1" : "")
      : own_mv           ? entry.substr(5)
                         : std::string("dequant_matmul");
  const std::string source =
      path == Path::kMma ? DequantMmaSource(shape.wtype, shape.act, MmaTiles(shape.m), prefetch)
      : own_mv ? DequantMatVecSource(shape.wtype, shape.act, MatVecRows(shape.m), mv_rows)
               : KernelSource("dequant_matmul.cu");
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn, LoadFunction(d, module, source, entry, context));
  std::string impl = absl::StrCat("nvrtc:dequant_", kind, "_", suffix);
  LoadedFunction reduce;
  int splits = 1;
  if (path == Path::kMma) {
    KILN_ASSIGN_OR_RETURN(splits, MmaSplits(d, fn.fn, shape));
    if (splits > 1) {
      KILN_ASSIGN_OR_RETURN(
          reduce, LoadFunction(d, module, source,
                               absl::StrCat("kiln_dequant_mma_reduce_", DTypeSuffix(shape.act)),
                               context));
      absl::StrAppend(&impl, "_split", splits);
    }
    if (prefetch == 1) absl::StrAppend(&impl, "_pf1");
  }
  if (path == Path::kTiled) absl::StrAppend(&impl, shape.transpose_b ? "_nk_" : "_kn_", "32x64");
  return std::unique_ptr<backend::Kernel>(std::make_unique<DequantMatMulKernel>(
      d, spec, std::move(fn), std::move(reduce), shape, path, splits, mv_rows, std::move(impl)));
}

const CudaOpRegistration kDequantMatmulRegistration({
    {v1::OP_DEQUANT_MATMUL, &SupportsDequantMatMul, &CreateDequantMatMul},
});

}  // namespace
}  // namespace kiln::cuda
