// Shared by every Kiln CUDA kernel; prepended to each source before NVRTC
// compiles it (KernelSource). No CUDA headers: the kernels build with NVRTC
// alone, and f16/bf16 are converted here (round to nearest even; NaN stays
// NaN), so every device rounds alike and as the CPU reference does.
//
// Math is CUDA's (IEEE division and square root, denormals kept: NVRTC's
// defaults, no fast math), in the forms the Vulkan kernels use (kmath.glsl),
// which are exact at the infinities.
typedef long long k_i64;
typedef unsigned long long k_u64;

struct k_f16 { unsigned short bits; };
struct k_bf16 { unsigned short bits; };

#define K_NAN __int_as_float(0x7fc00000)
#define K_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float k_f16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short k_f32_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float k_bf16_to_f32(unsigned short b) {
  return __uint_as_float(static_cast<unsigned>(b) << 16);
}
__device__ __forceinline__ unsigned short k_f32_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
__device__ __forceinline__ float k_round_f16(float x) { return k_f16_to_f32(k_f32_to_f16(x)); }
__device__ __forceinline__ float k_round_bf16(float x) { return k_bf16_to_f32(k_f32_to_bf16(x)); }

// Loads and stores of the float storage types, in f32 registers.
__device__ __forceinline__ float k_load(const float* p, k_i64 i) { return p[i]; }
__device__ __forceinline__ float k_load(const k_f16* p, k_i64 i) { return k_f16_to_f32(p[i].bits); }
__device__ __forceinline__ float k_load(const k_bf16* p, k_i64 i) { return k_bf16_to_f32(p[i].bits); }
__device__ __forceinline__ void k_store(float* p, k_i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void k_store(k_f16* p, k_i64 i, float v) { p[i].bits = k_f32_to_f16(v); }
__device__ __forceinline__ void k_store(k_bf16* p, k_i64 i, float v) { p[i].bits = k_f32_to_bf16(v); }
// v rounded to what T stores.
__device__ __forceinline__ float k_round(const float*, float v) { return v; }
__device__ __forceinline__ float k_round(const k_f16*, float v) { return k_round_f16(v); }
__device__ __forceinline__ float k_round(const k_bf16*, float v) { return k_round_bf16(v); }

__device__ __forceinline__ bool k_nonzero(float x) { return (__float_as_uint(x) & 0x7fffffffu) != 0u; }
__device__ __forceinline__ float k_max(float a, float b) { return (isnan(a) || isnan(b)) ? K_NAN : fmaxf(a, b); }
__device__ __forceinline__ float k_min(float a, float b) { return (isnan(a) || isnan(b)) ? K_NAN : fminf(a, b); }
__device__ __forceinline__ float k_sign(float x) {
  if (isnan(x) || !k_nonzero(x)) return x;
  return signbit(x) ? -1.0f : 1.0f;
}
__device__ __forceinline__ float k_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float k_silu(float x) {
  if (isinf(x)) return x > 0.0f ? x : 0.0f;
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float k_gelu(float x) {
  if (isinf(x)) return x > 0.0f ? x : 0.0f;
  return 0.5f * x * erfcf(-x * 0.70710678118654752f);
}
__device__ __forceinline__ float k_gelu_tanh(float x) {
  if (isinf(x)) return x > 0.0f ? x : 0.0f;
  const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}
__device__ __forceinline__ float k_softplus(float x) {
  if (isnan(x)) return x;
  return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}
__device__ __forceinline__ float k_rsqrt(float x) { return 1.0f / sqrtf(x); }

// Block-wide sums and maxima over blockDim.x threads (a multiple of 32, at
// most 1024). `scratch` holds 32 floats; every thread gets the result.
__device__ __forceinline__ float k_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float k_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = k_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float k_block_sum(float v, float* scratch) {
  v = k_warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read from a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return k_warp_sum(v);
}
__device__ __forceinline__ float k_block_max(float v, float* scratch) {
  v = k_warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : -K_INF;
  return k_warp_max(v);
}
