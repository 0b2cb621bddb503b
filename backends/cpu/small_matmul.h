// f32 matrix products with few rows (M <= SmallMatMulMaxM()): an own
// register-blocked micro-kernel, for the batch-1..64 layers of a served model
// where oneDNN's setup and its blocking for large M cost more than the
// product (MLP 784x512 at M = 1: 103 us through oneDNN, ~8 GFLOP/s).
//
// B (K x N) is read in column panels of kSmallPanel floats: panel p holds
// columns [16p, 16p + 16), row after row (K rows of 16 floats, the columns
// past N zero). PackB makes that layout once (for constant and param weights,
// backends/packing.h); unpacked, the kernel reads a row-major B in place with
// a row stride of N (and packs only a partial last panel, or a transposed B,
// per call into scratch).
//
// The epilogue runs in registers: c = act(a @ b + bias) + residual; a
// transcendental act (SmallActAfterStore) runs over the tile's rows of C
// right after the tile stored them.
//
// Each ISA's loops live in their own file compiled with its own -m flags
// (small_matmul_avx2.cc, small_matmul_avx512.cc); BestSmallMatMulIsa() picks
// one at run time from the CPU (KILN_CPU_NO_AVX512=1 forces AVX2).
// KILN_CPU_SMALL_MATMUL=0 turns the path off (oneDNN runs every matmul).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/v1/graph.pb.h"

namespace kiln::cpu {

inline constexpr int64_t kSmallMatMulMaxM = 64;
// On AVX-512 the kernel also takes products of up to this many rows, with B
// packed (the encoder's M = seq = 128 at batch 1), where it measured faster
// than oneDNN's matmul (docs/benchmarks.md, enc12b).
inline constexpr int64_t kSmallMatMulLargeMaxM = 128;
inline constexpr int64_t kSmallPanel = 16;

enum class SmallMatMulIsa { kAvx2, kAvx512 };
const char* SmallMatMulIsaName(SmallMatMulIsa isa);
// The widest ISA this CPU runs (and KILN_CPU_NO_AVX512 allows).
SmallMatMulIsa BestSmallMatMulIsa();
// False when KILN_CPU_SMALL_MATMUL=0 (read once).
bool SmallMatMulEnabled();
// The most rows a product on `isa` may have for this kernel: kSmallMatMulMaxM
// on AVX2, kSmallMatMulLargeMaxM on AVX-512; KILN_CPU_SMALL_MATMUL_MAX_M
// (read once) overrides both, to measure the crossover against oneDNN.
int64_t SmallMatMulMaxM(SmallMatMulIsa isa);

// Activations the epilogue computes in registers.
enum class SmallAct { kNone, kRelu, kGelu, kGeluTanh, kSilu, kSigmoid, kTanh };
// The epilogue activation for `kind`; false when it has none (the caller
// keeps oneDNN for that product).
bool SmallActOf(v1::UnaryKind kind, SmallAct* act);
// True for the activations that run over a register tile's rows after the
// tile stored act's argument to C (the transcendental ones); the residual is
// then read after C was written, so it must not share C's memory.
inline bool SmallActAfterStore(SmallAct act) {
  return act != SmallAct::kNone && act != SmallAct::kRelu;
}

// One product C[m, n] = act(A[m, k] @ B[k, n] + bias) + residual.
struct SmallMatMulArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // row r at a + r * lda
  int64_t lda = 0;
  // B as panels: panel p, row kk at b + p * b_panel_stride + kk * b_row_stride.
  // Packed: b_panel_stride = k * 16, b_row_stride = 16. Row-major in place:
  // b_panel_stride = 16, b_row_stride = ldb.
  const float* b = nullptr;
  int64_t b_panel_stride = 0, b_row_stride = 0;
  // When set, the last panel (N % 16 != 0) is read from here instead, with a
  // row stride of 16 (a row-major B cannot be read 16 wide past column N).
  const float* b_last_panel = nullptr;
  const float* bias = nullptr;      // [n] or null
  const float* residual = nullptr;  // row r at residual + r * ldr, or null
  int64_t ldr = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  SmallAct act = SmallAct::kNone;
};

// Bytes of B packed into panels.
inline int64_t PackedBFloats(int64_t k, int64_t n) {
  return (n + kSmallPanel - 1) / kSmallPanel * kSmallPanel * k;
}
// Packs B (row-major [k, n], or [n, k] when `transposed`) into panels.
// `out` has PackedBFloats(k, n) floats.
void PackB(const float* b, int64_t k, int64_t n, bool transposed, float* out);
// Packs columns [16 * panel, min(n, 16 * panel + 16)) of a row-major [k, n] B
// into one zero-padded panel of k * 16 floats.
void PackBPanel(const float* b, int64_t k, int64_t n, int64_t panel, float* out);

// Computes panels [panel_begin, panel_end) of the product on this thread.
void SmallMatMulAvx2(const SmallMatMulArgs& args, int64_t panel_begin, int64_t panel_end);
void SmallMatMulAvx512(const SmallMatMulArgs& args, int64_t panel_begin, int64_t panel_end);

// The whole product, its panels split over the OpenMP team when it is large
// enough to pay for the wake-up.
void SmallMatMul(SmallMatMulIsa isa, const SmallMatMulArgs& args);

}  // namespace kiln::cpu
