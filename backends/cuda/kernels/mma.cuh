// Warp-level tensor-core helpers shared by the kernels that use mma.sync
// (flash_attention.cu, attention_decode.cu), included with
// `#include "mma.cuh"` (KernelSource splices it in). sm_80+ (bf16 mma).
// K_MMA_HOST: a host emulation (tests/backends/cuda/*_host_test.cc) brings
// its own.
#ifndef K_MMA_HOST
__device__ __forceinline__ unsigned k_mma_saddr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void k_ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(k_mma_saddr(p)));
}
__device__ __forceinline__ void k_ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(k_mma_saddr(p)));
}

// C += A B for one m16n8k16 tile; IsF16 picks f16 or bf16 operands.
template <bool IsF16>
__device__ __forceinline__ void k_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                      unsigned b1) {
  if (IsF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Two floats as one register of two halves, `lo` in the low half.
template <bool IsF16>
__device__ __forceinline__ unsigned k_pack2(float lo, float hi) {
  unsigned r;
  if (IsF16) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}
// The warp's 8 x 8 matrix of halves transposed: lane (g, t) = (lane / 4,
// lane % 4) holds row g, columns 2t and 2t + 1 (the low half first), the
// layout of an mma accumulator's pair, before and after.
__device__ __forceinline__ unsigned k_movmatrix_trans(unsigned x) {
  unsigned r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}
#endif  // K_MMA_HOST
