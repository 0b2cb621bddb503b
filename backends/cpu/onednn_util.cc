#include "backends/cpu/onednn_util.h"

#include <immintrin.h>

#include <cstring>

#include "backends/cpu/parallel.h"
#include "base/half.h"

namespace kiln::cpu {

dnnl::engine& DnnlEngine() {
  static auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

std::optional<dnnl::memory::data_type> DnnlType(DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return dnnl::memory::data_type::f32;
    case v1::DTYPE_F16: return dnnl::memory::data_type::f16;
    case v1::DTYPE_BF16: return dnnl::memory::data_type::bf16;
    case v1::DTYPE_I32: return dnnl::memory::data_type::s32;
    case v1::DTYPE_I8: return dnnl::memory::data_type::s8;
    case v1::DTYPE_U8: return dnnl::memory::data_type::u8;
    default: return std::nullopt;
  }
}

void ConvertToF32(DType dtype, const void* src, float* dst, int64_t n) {
  if (dtype == v1::DTYPE_F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == v1::DTYPE_F16) {
    // F16C is part of x86-64-v3, the CPU backend's baseline.
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) dst[i] = HalfToFloat(s[i]);
    return;
  }
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
}

void ConvertFromF32(const float* src, DType dtype, void* dst, int64_t n) {
  if (dtype == v1::DTYPE_F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  if (dtype == v1::DTYPE_F16) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
    for (; i < n; ++i) d[i] = FloatToHalf(src[i]);
    return;
  }
  for (; i < n; ++i) d[i] = FloatToBf16(src[i]);
}

namespace {
constexpr int64_t kConvertGrain = 1 << 16;
}  // namespace

void ParallelConvertToF32(DType dtype, const void* src, float* dst, int64_t n) {
  const int64_t size = ElementSize(dtype);
  ParallelFor(n, kConvertGrain, [&](int64_t b, int64_t e) {
    ConvertToF32(dtype, static_cast<const char*>(src) + b * size, dst + b, e - b);
  });
}

void ParallelConvertFromF32(const float* src, DType dtype, void* dst, int64_t n) {
  const int64_t size = ElementSize(dtype);
  ParallelFor(n, kConvertGrain, [&](int64_t b, int64_t e) {
    ConvertFromF32(src + b, dtype, static_cast<char*>(dst) + b * size, e - b);
  });
}

float LoadF32(DType dtype, const void* base, int64_t index) {
  switch (dtype) {
    case v1::DTYPE_F16: return HalfToFloat(static_cast<const uint16_t*>(base)[index]);
    case v1::DTYPE_BF16: return Bf16ToFloat(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

}  // namespace kiln::cpu
