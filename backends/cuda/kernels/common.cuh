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
// Round to nearest even; a NaN keeps its sign and payload's top bits, made
// quiet (as the CPU's FloatToBf16). sm_80+ rounds with one cvt instruction
// (the integer form costs five more per element in bandwidth-bound kernels),
// and the NaN case is a select, not a branch: a branch per element split the
// vectorized loops into blocks and cost bf16 GELU 20% against f16 on an H100.
__device__ __forceinline__ unsigned short k_f32_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  const unsigned short nan = static_cast<unsigned short>((u >> 16) | 0x40u);
#if __CUDA_ARCH__ >= 800
  unsigned short b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
#else
  u += 0x7fffu + ((u >> 16) & 1u);
  const unsigned short b = static_cast<unsigned short>(u >> 16);
#endif
  return (__float_as_uint(f) & 0x7fffffffu) > 0x7f800000u ? nan : b;
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
// GELU for f16/bf16 results: 0.5 x (1 + erf(x / sqrt 2)) where x >= -3
// (+inf included: erf is 1 there), whose cancellation error there (< 1e-4
// relative) is below half an f16 ulp, at a third of erfc's cost; k_gelu's
// erfc form below -3 and for NaN (the comparison is false).
__device__ __forceinline__ float k_gelu_lowp(float x) {
  if (x >= -3.0f) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  return k_gelu(x);
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

// Integer storage types and double-precision block sums (the reductions
// that accumulate in f64 or in wrapping 64-bit integers: Reduce's general
// path, Cumsum, ArgMax, the losses).
typedef signed char k_i8;
typedef unsigned char k_u8;
typedef short k_i16;
typedef int k_i32;

// A value as its accumulation type: f64 for the float types, i64 for the
// integers (sums and products then wrap through u64, as the dtype does).
__device__ __forceinline__ double k_acc(const float* p, k_i64 i) { return p[i]; }
__device__ __forceinline__ double k_acc(const k_f16* p, k_i64 i) { return k_f16_to_f32(p[i].bits); }
__device__ __forceinline__ double k_acc(const k_bf16* p, k_i64 i) { return k_bf16_to_f32(p[i].bits); }
__device__ __forceinline__ k_i64 k_acc(const k_i8* p, k_i64 i) { return p[i]; }
__device__ __forceinline__ k_i64 k_acc(const k_u8* p, k_i64 i) { return p[i]; }
__device__ __forceinline__ k_i64 k_acc(const k_i16* p, k_i64 i) { return p[i]; }
__device__ __forceinline__ k_i64 k_acc(const k_i32* p, k_i64 i) { return p[i]; }
__device__ __forceinline__ k_i64 k_acc(const k_i64* p, k_i64 i) { return p[i]; }
// Stores of an accumulated value: floats round (f64 -> f32 -> storage),
// integers wrap to the dtype's width.
__device__ __forceinline__ void k_put(float* p, k_i64 i, double v) { p[i] = static_cast<float>(v); }
__device__ __forceinline__ void k_put(k_f16* p, k_i64 i, double v) { k_store(p, i, static_cast<float>(v)); }
__device__ __forceinline__ void k_put(k_bf16* p, k_i64 i, double v) { k_store(p, i, static_cast<float>(v)); }
__device__ __forceinline__ void k_put(k_i8* p, k_i64 i, k_i64 v) { p[i] = static_cast<k_i8>(v); }
__device__ __forceinline__ void k_put(k_u8* p, k_i64 i, k_i64 v) { p[i] = static_cast<k_u8>(v); }
__device__ __forceinline__ void k_put(k_i16* p, k_i64 i, k_i64 v) { p[i] = static_cast<k_i16>(v); }
__device__ __forceinline__ void k_put(k_i32* p, k_i64 i, k_i64 v) { p[i] = static_cast<k_i32>(v); }
__device__ __forceinline__ void k_put(k_i64* p, k_i64 i, k_i64 v) { p[i] = v; }
__device__ __forceinline__ bool k_isnan(double v) { return isnan(v); }
__device__ __forceinline__ bool k_isnan(k_i64) { return false; }
__device__ __forceinline__ double k_add(double a, double b) { return a + b; }
__device__ __forceinline__ k_i64 k_add(k_i64 a, k_i64 b) {
  return static_cast<k_i64>(static_cast<k_u64>(a) + static_cast<k_u64>(b));
}
__device__ __forceinline__ double k_mul(double a, double b) { return a * b; }
__device__ __forceinline__ k_i64 k_mul(k_i64 a, k_i64 b) {
  return static_cast<k_i64>(static_cast<k_u64>(a) * static_cast<k_u64>(b));
}

__device__ __forceinline__ double k_warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// `scratch` holds 32 doubles; every thread gets the result.
__device__ __forceinline__ double k_block_sum_f64(double v, double* scratch) {
  v = k_warp_sum_f64(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : 0.0;
  return k_warp_sum_f64(v);
}

// 16-byte vector access: K_VEC<T>::N elements of T at p + i, where p + i is
// 16-byte aligned (the caller checks the base pointers and keeps i a
// multiple of N), converted to / from f32 registers.
struct alignas(16) k_v16 { unsigned x, y, z, w; };
template <typename T> struct K_VEC;
template <> struct K_VEC<float> { enum { N = 4 }; };
template <> struct K_VEC<k_f16> { enum { N = 8 }; };
template <> struct K_VEC<k_bf16> { enum { N = 8 }; };
__device__ __forceinline__ float k_half_word(const k_f16*, unsigned short h) { return k_f16_to_f32(h); }
__device__ __forceinline__ float k_half_word(const k_bf16*, unsigned short h) { return k_bf16_to_f32(h); }
__device__ __forceinline__ unsigned short k_word_half(const k_f16*, float v) { return k_f32_to_f16(v); }
__device__ __forceinline__ unsigned short k_word_half(const k_bf16*, float v) { return k_f32_to_bf16(v); }
// Unpacked to / packed from f32 registers: a row kept as packed vectors
// needs half the registers of its f32 values for f16/bf16.
__device__ __forceinline__ void k_unpack(const float*, const k_v16& u, float* v) {
  v[0] = __uint_as_float(u.x), v[1] = __uint_as_float(u.y);
  v[2] = __uint_as_float(u.z), v[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ k_v16 k_pack(const float*, const float* v) {
  k_v16 u;
  u.x = __float_as_uint(v[0]), u.y = __float_as_uint(v[1]);
  u.z = __float_as_uint(v[2]), u.w = __float_as_uint(v[3]);
  return u;
}
template <typename H>
__device__ __forceinline__ void k_unpack(const H* tag, const k_v16& u, float* v) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = k_half_word(tag, static_cast<unsigned short>(w[k] & 0xffffu));
    v[2 * k + 1] = k_half_word(tag, static_cast<unsigned short>(w[k] >> 16));
  }
}
template <typename H>
__device__ __forceinline__ k_v16 k_pack(const H* tag, const float* v) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[k] = static_cast<unsigned>(k_word_half(tag, v[2 * k])) |
           (static_cast<unsigned>(k_word_half(tag, v[2 * k + 1])) << 16);
  }
  k_v16 u;
  u.x = w[0], u.y = w[1], u.z = w[2], u.w = w[3];
  return u;
}
template <typename T>
__device__ __forceinline__ k_v16 k_ldraw(const T* p, k_i64 i) {
  return *reinterpret_cast<const k_v16*>(p + i);
}
template <typename T>
__device__ __forceinline__ void k_straw(T* p, k_i64 i, const k_v16& u) {
  *reinterpret_cast<k_v16*>(p + i) = u;
}
template <typename T>
__device__ __forceinline__ void k_ldv(const T* p, k_i64 i, float* v) {
  k_unpack(p, k_ldraw(p, i), v);
}
template <typename T>
__device__ __forceinline__ void k_stv(T* p, k_i64 i, const float* v) {
  k_straw(p, i, k_pack(p, v));
}
