// The CUDA DequantMatMul kernels' sources (kernels_dequant_matmul.cc), for
// the NVRTC compile test.
#pragma once

#include <string>

#include "base/dtype.h"

namespace kiln::cuda {

// The module of the tensor-core kernel kiln_dequant_mma_n<tiles>_<w>_<x>
// (and its split-K reduction kiln_dequant_mma_reduce_<x>): dequant_matmul.cu
// with that one variant instantiated. `wtype` a GGUF block type, `act` f32,
// f16 or bf16, `tiles` 1, 2, 4 or 8, `prefetch` the ksteps each lane loads
// ahead (dequant_matmul.cu's DQ_MMA_PF: 2, or 1).
std::string DequantMmaSource(DType wtype, DType act, int tiles, int prefetch = 2);

// The module of kiln_dequant_to_<w>_<x>: the weight decoded into f16 / bf16
// [N, K] (the lt path's workspace for a cuBLASLt GEMM).
std::string DequantToSource(DType wtype, DType act);

// The module of the matvec kernel kiln_dequant_matvec_r<rows>_m<mr>_<w>_<x>
// (`rows` weight rows per block, 4 or 8; `mr` rows of x per pass, 1, 4, 8).
std::string DequantMatVecSource(DType wtype, DType act, int mr, int rows);

}  // namespace kiln::cuda
