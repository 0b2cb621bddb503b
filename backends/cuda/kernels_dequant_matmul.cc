// DequantMatMul on CUDA (kernels/dequant_matmul.cu): f32/f16/bf16 activations
// times a GGUF block-quantized weight (q8_0, q4_0, q4_k, q5_k, q6_k), the
// dequantization fused into the kernel. A weight stored [N, K] with M <=
// kMatVecMaxM takes the matvec kernel (a block of 4 warps per 2 weight rows,
// the blocks read once per 8 rows of x); everything else the tiled kernel
// (32 x 64 tiles, weight tiles decoded into shared memory).
#include "absl/strings/str_cat.h"
#include "backends/common/dequant_matmul_shape.h"
#include "backends/cuda/cuda_kernel.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::DequantMatMulShape;
using backend::KernelSpec;

// dequant_matmul.cu's DQ_MV_R weight rows per block of DQ_MV_WARPS warps.
constexpr int64_t kMatVecRowsPerBlock = 2;
constexpr unsigned kMatVecThreads = 128;
// Up to 32 rows of x take the matvec kernel (the weights re-read per 8 rows,
// mostly from L2): the FMA-tiled one decodes a 64-row weight tile per 32
// rows of x with a quarter of its threads and took 5-20x PyTorch bf16's time
// at M = 32 on an H100; the crossover is not yet timed (docs/benchmarks.md,
// dqc10).
constexpr int64_t kMatVecMaxM = 32;
constexpr int64_t kTileM = 32, kTileN = 64;
constexpr unsigned kTileThreads = 256;

bool UseMatVec(const DequantMatMulShape& s) { return s.transpose_b && s.m <= kMatVecMaxM; }

// The matvec instance's rows of x per pass: the least of 1, 4, 8 >= M
// (fewer accumulators, more warps resident), else 8. Three instances per
// block and activation type keep the module's NVRTC compile short.
int MatVecRows(int64_t m) { return m <= 1 ? 1 : m <= 4 ? 4 : 8; }

Claim SupportsDequantMatMul(const CudaDevice& d, const KernelSpec& spec) {
  absl::StatusOr<DequantMatMulShape> s = backend::DequantMatMulShapeOf(spec);
  if (!s.ok()) return Claim::No(absl::StrCat("cuda dequant_matmul: ", s.status().message()));
  if (UseMatVec(*s) ? (s->n + kMatVecRowsPerBlock - 1) / kMatVecRowsPerBlock > d.caps().max_grid_x
                     : ((s->n + kTileN - 1) / kTileN > d.caps().max_grid_x ||
                        (s->m + kTileM - 1) / kTileM > 65535)) {
    return Claim::No("cuda dequant_matmul: the result has more tiles than a grid holds");
  }
  return Claim::Yes();
}

class DequantMatMulKernel final : public CudaKernel {
 public:
  DequantMatMulKernel(CudaDevice& d, const KernelSpec& spec, LoadedFunction fn,
                      DequantMatMulShape shape, std::string impl)
      : CudaKernel(d, spec, std::move(impl)), fn_(std::move(fn)), shape_(shape) {}

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
    if (UseMatVec(shape_)) {
      void* args[] = {&x, &w, &y, &m, &n, &k, &row_bytes};
      const unsigned grid =
          static_cast<unsigned>((n + kMatVecRowsPerBlock - 1) / kMatVecRowsPerBlock);
      return LaunchKernel(s, fn_.fn, grid, 1, 1, kMatVecThreads, 0, args);
    }
    int trans_b = shape_.transpose_b;
    void* args[] = {&x, &w, &y, &m, &n, &k, &row_bytes, &trans_b};
    return LaunchKernel(s, fn_.fn, static_cast<unsigned>((n + kTileN - 1) / kTileN),
                        static_cast<unsigned>((m + kTileM - 1) / kTileM), 1, kTileThreads, 0, args);
  }

 private:
  LoadedFunction fn_;
  DequantMatMulShape shape_;
};

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateDequantMatMul(
    CudaDevice& d, const KernelSpec& spec, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(DequantMatMulShape shape, backend::DequantMatMulShapeOf(spec));
  const std::string path =
      UseMatVec(shape) ? absl::StrCat("matvec_m", MatVecRows(shape.m)) : "matmul";
  const std::string entry = absl::StrCat("kiln_dequant_", path, "_", DTypeName(shape.wtype), "_",
                                         DTypeSuffix(shape.act));
  KILN_ASSIGN_OR_RETURN(LoadedFunction fn, LoadFunction(d, "dequant_matmul",
                                                        KernelSource("dequant_matmul.cu"), entry,
                                                        context));
  std::string impl = absl::StrCat("nvrtc:dequant_", path, "_", DTypeName(shape.wtype), "_",
                                  DTypeSuffix(shape.act));
  if (!UseMatVec(shape)) absl::StrAppend(&impl, shape.transpose_b ? "_nk_" : "_kn_", "32x64");
  return std::unique_ptr<backend::Kernel>(
      std::make_unique<DequantMatMulKernel>(d, spec, std::move(fn), shape, std::move(impl)));
}

const CudaOpRegistration kDequantMatmulRegistration({
    {v1::OP_DEQUANT_MATMUL, &SupportsDequantMatMul, &CreateDequantMatMul},
});

}  // namespace
}  // namespace kiln::cuda
