// The CUDA DequantMatMul kernels' sources (kernels_dequant_matmul.cc), for
// the NVRTC compile test.
#pragma once

#include <string>

#include "base/dtype.h"

namespace kiln::cuda {

// The module of the tensor-core kernel kiln_dequant_mma_n<tiles>_<w>_<x>
// (and its split-K reduction kiln_dequant_mma_reduce_<x>): dequant_matmul.cu
// with that one variant instantiated. `wtype` a GGUF block type, `act` f32,
// f16 or bf16, `tiles` 2, 4 or 8.
std::string DequantMmaSource(DType wtype, DType act, int tiles);

}  // namespace kiln::cuda
