// The shape of a DequantMatMul launch, for the GPU backends: activations
// [..., M, K] (f32, f16 or bf16) times a block-quantized weight (q8_0, q4_0,
// q4_k, q5_k, q6_k, GGUF's layouts: quant_blocks.h) stored [N, K]
// (transpose_b, GGUF's linear layer) or [K, N], giving [..., M, N] in the
// activations' dtype. The blocks run along the weight's stored rows (its
// last dim), which must be whole blocks; the leading dims of x fold into M.
// The same rules as the CPU kernel (backends/cpu/kernels_dequant_matmul.cc).
//
// Header-only and thread-safe (a pure function of the spec).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "base/checked_int.h"

namespace kiln::backend {

struct DequantMatMulShape {
  DType act = v1::DTYPE_F32;  // activation and result dtype
  DType wtype = v1::DTYPE_Q8_0;
  bool transpose_b = false;  // weight [N, K]
  int64_t m = 0, n = 0, k = 0;
  int64_t block_elems = 0, block_bytes = 0;
  int64_t row_bytes = 0;     // bytes of one stored weight row
  int64_t weight_bytes = 0;  // the whole weight
};

inline std::string DequantMatMulTypeString(const TensorDesc& d) {
  std::string s = DTypeName(d.dtype) + "[";
  for (size_t i = 0; i < d.dims.size(); ++i) absl::StrAppend(&s, i ? ", " : "", d.dims[i]);
  return s + "]";
}

// The launch's shape, or INVALID_ARGUMENT saying what is wrong with the spec.
inline absl::StatusOr<DequantMatMulShape> DequantMatMulShapeOf(const KernelSpec& spec) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (spec.inputs.size() != 2 || spec.outputs.size() != 1) {
    return bad("dequant_matmul takes x and a weight and gives one result, got ", spec.inputs.size(),
               " operands and ", spec.outputs.size(), " results");
  }
  const TensorDesc& x = spec.inputs[0];
  const TensorDesc& w = spec.inputs[1];
  DequantMatMulShape s;
  s.act = x.dtype;
  s.wtype = w.dtype;
  s.transpose_b = spec.attrs.dequant_matmul().transpose_b();
  if (x.dtype != v1::DTYPE_F32 && x.dtype != v1::DTYPE_F16 && x.dtype != v1::DTYPE_BF16) {
    return bad("activations must be f32, f16 or bf16, got ", DequantMatMulTypeString(x));
  }
  if (!IsQuantized(w.dtype)) {
    return bad("weights must be block-quantized (q8_0, q4_0, q4_k, q5_k, q6_k), got ",
               DequantMatMulTypeString(w));
  }
  if (x.rank() < 1 || w.rank() != 2) {
    return bad("expects activations [..., K] and a weight [N, K] or [K, N], got ",
               DequantMatMulTypeString(x), " and ", DequantMatMulTypeString(w));
  }
  const DTypeLayout layout = LayoutOf(w.dtype);
  s.block_elems = layout.block_elems;
  s.block_bytes = layout.block_bytes;
  s.k = x.dims.back();
  s.n = s.transpose_b ? w.dims[0] : w.dims[1];
  if ((s.transpose_b ? w.dims[1] : w.dims[0]) != s.k) {
    return bad("K differs: activations ", DequantMatMulTypeString(x), ", weight ",
               DequantMatMulTypeString(w), s.transpose_b ? " (transpose_b: [N, K])" : " ([K, N])");
  }
  if (w.dims[1] % s.block_elems != 0 || w.dims[0] < 0 || s.k < 0) {
    return bad("weight ", DequantMatMulTypeString(w), ": its rows of ", w.dims[1],
               " elements are not whole ", s.block_elems, "-element ", DTypeName(w.dtype),
               " blocks");
  }
  CheckedInt m = 1;
  for (size_t i = 0; i + 1 < x.dims.size(); ++i) m = m * x.dims[i];
  const CheckedInt row_bytes = CheckedInt(w.dims[1] / s.block_elems) * s.block_bytes;
  const CheckedInt w_bytes = row_bytes * w.dims[0];
  const CheckedInt io = m * s.k + m * s.n;
  if (!m.ok() || !w_bytes.ok() || !io.ok() || !(io * 4).ok()) {
    return bad("sizes overflow int64: ", DequantMatMulTypeString(x), " @ ",
               DequantMatMulTypeString(w));
  }
  s.m = m.get();
  s.row_bytes = row_bytes.get();
  s.weight_bytes = w_bytes.get();
  const TensorDesc& y = spec.outputs[0];
  Dims want(x.dims.begin(), x.dims.end() - 1);
  want.push_back(s.n);
  if (y.dtype != x.dtype || y.dims != want) {
    TensorDesc expect{x.dtype, want};
    return bad("result is ", DequantMatMulTypeString(y), " but the op computes ",
               DequantMatMulTypeString(expect));
  }
  return s;
}

}  // namespace kiln::backend
