#include "backends/cpu/dequant_dot.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "backends/common/quant_blocks.h"

namespace kiln::cpu::dq {
namespace {

void DecodeGeneric(DType dtype, const uint8_t* src, int64_t blocks, float* dst) {
  quant::DequantizeBlocks(dtype, src, blocks, dst);
}

// Decodes one block at a time into a stack buffer (L1), then one dot product
// per activation row with eight partial sums (so the compiler vectorizes it).
void DotRowsGeneric(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                    int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy) {
  const DTypeLayout layout = LayoutOf(dtype);
  const int64_t be = layout.block_elems, blocks = k / be;
  alignas(64) float buf[quant::kQK];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    float acc[kMaxDotRows][8] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      quant::DequantizeBlocks(dtype, row + b * layout.block_bytes, 1, buf);
      for (int r = 0; r < rows; ++r) {
        const float* xb = x + r * ldx + b * be;
        for (int64_t j = 0; j < be; j += 8) {
          for (int l = 0; l < 8; ++l) acc[r][l] += buf[j + l] * xb[j + l];
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      float s = 0;
      for (int l = 0; l < 8; ++l) s += acc[r][l];
      y[r * ldy + n] = s;
    }
  }
}

bool HasAvx512() {
  // KILN_CPU_NO_AVX512=1 forces the portable path (its ctest run checks it on
  // machines that have AVX-512).
  const char* off = std::getenv("KILN_CPU_NO_AVX512");
  if (off != nullptr && std::string_view(off) == "1") return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

bool HasAvx512Vnni() {
  __builtin_cpu_init();
  return HasAvx512() && __builtin_cpu_supports("avx512vnni");
}

bool Avx2Allowed() {
  const char* off = std::getenv("KILN_CPU_DQ_GENERIC");
  if (off != nullptr && std::string_view(off) == "1") return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

const Kernels& Generic() {
  static const Kernels k{"generic", &DotRowsGeneric, &DecodeGeneric};
  return k;
}

const Kernels& Best() {
  static const Kernels k = HasAvx512()    ? Kernels{"avx512", &DotRowsAvx512, &DecodeAvx512}
                           : Avx2Allowed() ? Kernels{"avx2", &DotRowsAvx2, &DecodeGeneric}
                                           : Generic();
  return k;
}

const Int8Kernels& BestInt8() {
  static const Int8Kernels k = HasAvx512Vnni() ? Int8Kernels{"avx512vnni", true, &DotRowsInt8Avx512}
                               : Avx2Allowed() ? Int8Kernels{"avx2", false, &DotRowsInt8Avx2}
                                               : GenericInt8();
  return k;
}

}  // namespace kiln::cpu::dq
