#include "backends/cpu/elementwise_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/simd_math.h"
#include "base/half.h"

namespace kiln::cpu::ew {
namespace {

using simd::MapF32;
using simd::Set;

template <typename T>
void ConvertTo(const T* src, int64_t stride, int64_t n, int64_t* dst) {
  if (stride == 0) {
    std::fill(dst, dst + n, static_cast<int64_t>(src[0]));  // NOLINT(bugprone-signed-char-misuse)
    return;
  }
  // Sign extension of signed sources is the point.
  for (int64_t i = 0; i < n; ++i)
    dst[i] = static_cast<int64_t>(src[i]);  // NOLINT(bugprone-signed-char-misuse)
}

void HalfToF32(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

void F32ToHalf(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

// FloatToBf16 without the branch, so the loop vectorizes.
inline uint16_t Bf16Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

void F32ToBf16(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16Bits(src[i]);
}

void Bf16ToF32(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

// Two's-complement wrap into T, then sign (or zero) extension back.
template <typename T>
void WrapTo(int64_t* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(v[i]);  // NOLINT(bugprone-signed-char-misuse)
}

// Saturating, NaN -> 0, truncating float -> integer of `to`'s range.
template <typename F>
void FloatToInt(const F* x, DType to, int64_t* y, int64_t n) {
  if (to == v1::DTYPE_BOOL) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] != 0;
    return;
  }
  double lo = 0, hi = 0;
  switch (to) {
    case v1::DTYPE_I8:
      lo = -128, hi = 127;
      break;
    case v1::DTYPE_U8:
      lo = 0, hi = 255;
      break;
    case v1::DTYPE_I16:
      lo = -32768, hi = 32767;
      break;
    case v1::DTYPE_I32:
      lo = -2147483648.0, hi = 2147483647.0;
      break;
    default:
      lo = -9223372036854775808.0, hi = 9223372036854775808.0;
      break;
  }
  const bool is_i64 = to == v1::DTYPE_I64;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    int64_t r;
    if (std::isnan(v)) {
      r = 0;
    } else if (v <= lo) {
      r = static_cast<int64_t>(lo);
    } else if (v >= hi) {
      r = is_i64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(hi);
    } else {
      r = static_cast<int64_t>(v);
    }
    y[i] = r;
  }
}

template <typename T>
void BinaryFloat(int kind, const T* a, const T* b, T* y, int64_t n) {
  switch (kind) {
    case v1::BINARY_ADD:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
      return;
    case v1::BINARY_SUB:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
      return;
    case v1::BINARY_MUL:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
      return;
    case v1::BINARY_DIV:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] / b[i];
      return;
    case v1::BINARY_MAX:
      for (int64_t i = 0; i < n; ++i) {
        const T m = a[i] > b[i] ? a[i] : b[i];
        y[i] = std::isnan(a[i]) ? a[i] : m;
      }
      return;
    case v1::BINARY_MIN:
      for (int64_t i = 0; i < n; ++i) {
        const T m = a[i] < b[i] ? a[i] : b[i];
        y[i] = std::isnan(a[i]) ? a[i] : m;
      }
      return;
    case v1::BINARY_POW:
      for (int64_t i = 0; i < n; ++i) y[i] = std::pow(a[i], b[i]);
      return;
    default:
      return;
  }
}

void BinaryInt(int kind, const int64_t* a, const int64_t* b, int64_t* y, int64_t n) {
  using U = uint64_t;
  switch (kind) {
    case v1::BINARY_ADD:
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int64_t>(U(a[i]) + U(b[i]));
      return;
    case v1::BINARY_SUB:
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int64_t>(U(a[i]) - U(b[i]));
      return;
    case v1::BINARY_MUL:
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int64_t>(U(a[i]) * U(b[i]));
      return;
    case v1::BINARY_DIV:
      for (int64_t i = 0; i < n; ++i) {
        if (b[i] == 0) {
          y[i] = 0;
        } else if (b[i] == -1) {
          y[i] = static_cast<int64_t>(U(0) - U(a[i]));
        } else {
          y[i] = a[i] / b[i];
        }
      }
      return;
    case v1::BINARY_MAX:
      for (int64_t i = 0; i < n; ++i) y[i] = std::max(a[i], b[i]);
      return;
    case v1::BINARY_MIN:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(a[i], b[i]);
      return;
    default:
      return;
  }
}

template <typename T>
void CompareT(int kind, const T* a, const T* b, int64_t* y, int64_t n) {
  switch (kind) {
    case v1::COMPARE_EQ:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] == b[i];
      return;
    case v1::COMPARE_NE:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] != b[i];
      return;
    case v1::COMPARE_LT:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] < b[i];
      return;
    case v1::COMPARE_LE:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] <= b[i];
      return;
    case v1::COMPARE_GT:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] > b[i];
      return;
    case v1::COMPARE_GE:
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] >= b[i];
      return;
    default:
      return;
  }
}

template <typename T>
void WhereT(const int64_t* c, const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = c[i] != 0 ? a[i] : b[i];
}

template <typename T>
void ClampT(T lo, T hi, const T* x, T* y, int64_t n) {
  // Written so that NaN fails both comparisons and passes through.
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i] < lo ? lo : x[i];
    y[i] = v > hi ? hi : v;
  }
}

double GeluF64(double x) {
  if (x < -40) return -0.0;  // x * Phi(x) underflows; also the limit at -inf
  return 0.5 * x * std::erfc(-x * 0.70710678118654752440);
}

double GeluTanhF64(double x) {
  if (x < -1000) return -0.0;
  const double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

double SignF64(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : x); }

}  // namespace

RegClass ClassOf(DType d) {
  switch (d) {
    case v1::DTYPE_F32:
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      return RegClass::kF32;
    case v1::DTYPE_F64:
      return RegClass::kF64;
    default:
      return RegClass::kI64;
  }
}

void Load(const void* src, DType dtype, int64_t stride, int64_t n, void* dst) {
  if (n <= 0) return;
  if (stride == 0 && ClassOf(dtype) != RegClass::kI64) {
    // One element: convert it once, then fill.
    if (ClassOf(dtype) == RegClass::kF64) {
      std::fill(static_cast<double*>(dst), static_cast<double*>(dst) + n,
                *static_cast<const double*>(src));
      return;
    }
    float v;
    Load(src, dtype, 1, 1, &v);
    std::fill(static_cast<float*>(dst), static_cast<float*>(dst) + n, v);
    return;
  }
  int64_t* d64 = static_cast<int64_t*>(dst);
  switch (dtype) {
    case v1::DTYPE_F32:
      std::memcpy(dst, src, n * 4);
      return;
    case v1::DTYPE_F64:
      std::memcpy(dst, src, n * 8);
      return;
    case v1::DTYPE_F16:
      HalfToF32(static_cast<const uint16_t*>(src), n, static_cast<float*>(dst));
      return;
    case v1::DTYPE_BF16:
      Bf16ToF32(static_cast<const uint16_t*>(src), n, static_cast<float*>(dst));
      return;
    case v1::DTYPE_I8:
      ConvertTo(static_cast<const int8_t*>(src), stride, n, d64);
      return;
    case v1::DTYPE_U8:
      ConvertTo(static_cast<const uint8_t*>(src), stride, n, d64);
      return;
    case v1::DTYPE_I16:
      ConvertTo(static_cast<const int16_t*>(src), stride, n, d64);
      return;
    case v1::DTYPE_I32:
      ConvertTo(static_cast<const int32_t*>(src), stride, n, d64);
      return;
    case v1::DTYPE_I64:
      ConvertTo(static_cast<const int64_t*>(src), stride, n, d64);
      return;
    case v1::DTYPE_BOOL: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      if (stride == 0) {
        std::fill(d64, d64 + n, s[0] != 0 ? 1 : 0);
        return;
      }
      for (int64_t i = 0; i < n; ++i) d64[i] = s[i] != 0;
      return;
    }
    default:
      return;
  }
}

void Store(const void* src, DType dtype, int64_t n, void* dst) {
  if (n <= 0) return;
  const int64_t* s64 = static_cast<const int64_t*>(src);
  switch (dtype) {
    case v1::DTYPE_F32:
      std::memcpy(dst, src, n * 4);
      return;
    case v1::DTYPE_F64:
    case v1::DTYPE_I64:
      std::memcpy(dst, src, n * 8);
      return;
    case v1::DTYPE_F16:
      F32ToHalf(static_cast<const float*>(src), n, static_cast<uint16_t*>(dst));
      return;
    case v1::DTYPE_BF16:
      F32ToBf16(static_cast<const float*>(src), n, static_cast<uint16_t*>(dst));
      return;
    case v1::DTYPE_I8:
      for (int64_t i = 0; i < n; ++i) static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(s64[i]);
      return;
    case v1::DTYPE_U8:
      for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(s64[i]);
      return;
    case v1::DTYPE_I16:
      for (int64_t i = 0; i < n; ++i) static_cast<int16_t*>(dst)[i] = static_cast<int16_t>(s64[i]);
      return;
    case v1::DTYPE_I32:
      for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(s64[i]);
      return;
    case v1::DTYPE_BOOL:
      for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = s64[i] != 0;
      return;
    default:
      return;
  }
}

void RoundToDType(void* values, DType dtype, int64_t n) {
  int64_t* v64 = static_cast<int64_t*>(values);
  float* f = static_cast<float*>(values);
  switch (dtype) {
    case v1::DTYPE_F16: {
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(h));
      }
      for (; i < n; ++i) f[i] = HalfToFloat(FloatToHalf(f[i]));
      return;
    }
    case v1::DTYPE_BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(Bf16Bits(f[i])) << 16;
        std::memcpy(f + i, &bits, 4);
      }
      return;
    case v1::DTYPE_I8:
      WrapTo<int8_t>(v64, n);
      return;
    case v1::DTYPE_U8:
      WrapTo<uint8_t>(v64, n);
      return;
    case v1::DTYPE_I16:
      WrapTo<int16_t>(v64, n);
      return;
    case v1::DTYPE_I32:
      WrapTo<int32_t>(v64, n);
      return;
    case v1::DTYPE_BOOL:
      for (int64_t i = 0; i < n; ++i) v64[i] = v64[i] != 0;
      return;
    default:
      return;
  }
}

void Fill(RegClass cls, DType dtype, double value, int64_t n, void* dst) {
  if (n <= 0) return;
  switch (cls) {
    case RegClass::kF32: {
      float v = static_cast<float>(value);
      RoundToDType(&v, dtype, 1);
      std::fill(static_cast<float*>(dst), static_cast<float*>(dst) + n, v);
      return;
    }
    case RegClass::kF64:
      std::fill(static_cast<double*>(dst), static_cast<double*>(dst) + n, value);
      return;
    case RegClass::kI64: {
      int64_t v;
      FloatToInt(&value, dtype, &v, 1);
      std::fill(static_cast<int64_t*>(dst), static_cast<int64_t*>(dst) + n, v);
      return;
    }
  }
}

bool UnarySupported(int kind, DType dtype) {
  if (kind <= v1::UNARY_KIND_UNSPECIFIED || kind > v1::UNARY_SOFTPLUS) return false;
  if (IsFloat(dtype)) return true;
  if (!IsSignedInteger(dtype)) return false;
  return kind == v1::UNARY_IDENTITY || kind == v1::UNARY_RELU || kind == v1::UNARY_NEG ||
         kind == v1::UNARY_ABS || kind == v1::UNARY_SIGN;
}

bool BinarySupported(int kind, DType dtype) {
  if (kind <= v1::BINARY_KIND_UNSPECIFIED || kind > v1::BINARY_POW) return false;
  if (IsFloat(dtype)) return true;
  return IsInteger(dtype) && kind != v1::BINARY_POW;
}

void UnaryF32(int kind, const float* x, float* y, int64_t n) {
  switch (kind) {
    case v1::UNARY_IDENTITY:
      if (x != y) std::memcpy(y, x, n * 4);
      return;
    case v1::UNARY_RELU:
      // max(0, x) returns x when x is NaN (second operand), as NumPy's maximum.
      MapF32(x, y, n, [](__m256 v) { return _mm256_max_ps(_mm256_setzero_ps(), v); });
      return;
    case v1::UNARY_GELU:
      MapF32(x, y, n, simd::Gelu);
      return;
    case v1::UNARY_GELU_TANH:
      MapF32(x, y, n, simd::GeluTanh);
      return;
    case v1::UNARY_SILU:
      MapF32(x, y, n, simd::Silu);
      return;
    case v1::UNARY_SIGMOID:
      MapF32(x, y, n, simd::Sigmoid);
      return;
    case v1::UNARY_TANH:
      MapF32(x, y, n, simd::Tanh);
      return;
    case v1::UNARY_EXP:
      MapF32(x, y, n, simd::Exp);
      return;
    case v1::UNARY_LOG:
      MapF32(x, y, n, simd::Log);
      return;
    case v1::UNARY_SQRT:
      MapF32(x, y, n, [](__m256 v) { return _mm256_sqrt_ps(v); });
      return;
    case v1::UNARY_RSQRT:
      // Exact division, not the 12-bit rsqrt estimate: rsqrt(0) = inf, rsqrt(inf) = 0.
      MapF32(x, y, n, [](__m256 v) { return _mm256_div_ps(Set(1.0f), _mm256_sqrt_ps(v)); });
      return;
    case v1::UNARY_NEG:
      MapF32(x, y, n, [](__m256 v) { return _mm256_xor_ps(v, Set(-0.0f)); });
      return;
    case v1::UNARY_ABS:
      MapF32(x, y, n, simd::Abs);
      return;
    case v1::UNARY_SIN:
      for (int64_t i = 0; i < n; ++i) y[i] = std::sin(x[i]);
      return;
    case v1::UNARY_COS:
      for (int64_t i = 0; i < n; ++i) y[i] = std::cos(x[i]);
      return;
    case v1::UNARY_ERF:
      MapF32(x, y, n, simd::Erf);
      return;
    case v1::UNARY_FLOOR:
      MapF32(x, y, n, [](__m256 v) {
        return _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      });
      return;
    case v1::UNARY_CEIL:
      MapF32(x, y, n, [](__m256 v) {
        return _mm256_round_ps(v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
      });
      return;
    case v1::UNARY_ROUND:
      MapF32(x, y, n, [](__m256 v) {
        return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      });
      return;
    case v1::UNARY_SIGN:
      MapF32(x, y, n, [](__m256 v) {
        const __m256 pos =
            _mm256_and_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ), Set(1.0f));
        const __m256 neg =
            _mm256_and_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ), Set(-1.0f));
        const __m256 keep =
            _mm256_or_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ), simd::IsNan(v));
        return _mm256_blendv_ps(_mm256_or_ps(pos, neg), v, keep);
      });
      return;
    case v1::UNARY_RECIPROCAL:
      MapF32(x, y, n, [](__m256 v) { return _mm256_div_ps(Set(1.0f), v); });
      return;
    case v1::UNARY_SOFTPLUS:
      MapF32(x, y, n, simd::Softplus);
      return;
    default:
      return;
  }
}

void UnaryF64(int kind, const double* x, double* y, int64_t n) {
  auto map = [&](auto f) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  };
  switch (kind) {
    case v1::UNARY_IDENTITY:
      if (x != y) std::memcpy(y, x, n * 8);
      return;
    case v1::UNARY_RELU:
      map([](double v) { return v > 0 || std::isnan(v) ? v : 0.0; });
      return;
    case v1::UNARY_GELU:
      map(GeluF64);
      return;
    case v1::UNARY_GELU_TANH:
      map(GeluTanhF64);
      return;
    case v1::UNARY_SILU:
      map([](double v) { return v < -1000 ? -0.0 : v / (1.0 + std::exp(-v)); });
      return;
    case v1::UNARY_SIGMOID:
      map([](double v) { return 1.0 / (1.0 + std::exp(-v)); });
      return;
    case v1::UNARY_TANH:
      map([](double v) { return std::tanh(v); });
      return;
    case v1::UNARY_EXP:
      map([](double v) { return std::exp(v); });
      return;
    case v1::UNARY_LOG:
      map([](double v) { return std::log(v); });
      return;
    case v1::UNARY_SQRT:
      map([](double v) { return std::sqrt(v); });
      return;
    case v1::UNARY_RSQRT:
      map([](double v) { return 1.0 / std::sqrt(v); });
      return;
    case v1::UNARY_NEG:
      map([](double v) { return -v; });
      return;
    case v1::UNARY_ABS:
      map([](double v) { return std::fabs(v); });
      return;
    case v1::UNARY_SIN:
      map([](double v) { return std::sin(v); });
      return;
    case v1::UNARY_COS:
      map([](double v) { return std::cos(v); });
      return;
    case v1::UNARY_ERF:
      map([](double v) { return std::erf(v); });
      return;
    case v1::UNARY_FLOOR:
      map([](double v) { return std::floor(v); });
      return;
    case v1::UNARY_CEIL:
      map([](double v) { return std::ceil(v); });
      return;
    case v1::UNARY_ROUND:
      map([](double v) { return std::nearbyint(v); });
      return;
    case v1::UNARY_SIGN:
      map(SignF64);
      return;
    case v1::UNARY_RECIPROCAL:
      map([](double v) { return 1.0 / v; });
      return;
    case v1::UNARY_SOFTPLUS:
      map([](double v) {
        return (v > 0 || std::isnan(v) ? v : 0.0) + std::log1p(std::exp(-std::fabs(v)));
      });
      return;
    default:
      return;
  }
}

void UnaryI64(int kind, const int64_t* x, int64_t* y, int64_t n) {
  using U = uint64_t;
  switch (kind) {
    case v1::UNARY_IDENTITY:
      if (x != y) std::memcpy(y, x, n * 8);
      return;
    case v1::UNARY_RELU:
      for (int64_t i = 0; i < n; ++i) y[i] = std::max<int64_t>(x[i], 0);
      return;
    case v1::UNARY_NEG:
      for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int64_t>(U(0) - U(x[i]));
      return;
    case v1::UNARY_ABS:
      // abs(INT_MIN) wraps to INT_MIN, as NumPy's.
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0 ? static_cast<int64_t>(U(0) - U(x[i])) : x[i];
      return;
    case v1::UNARY_SIGN:
      for (int64_t i = 0; i < n; ++i) y[i] = (x[i] > 0) - (x[i] < 0);
      return;
    default:
      return;
  }
}

void Unary(RegClass cls, int kind, const void* x, void* y, int64_t n) {
  switch (cls) {
    case RegClass::kF32:
      UnaryF32(kind, static_cast<const float*>(x), static_cast<float*>(y), n);
      return;
    case RegClass::kF64:
      UnaryF64(kind, static_cast<const double*>(x), static_cast<double*>(y), n);
      return;
    case RegClass::kI64:
      UnaryI64(kind, static_cast<const int64_t*>(x), static_cast<int64_t*>(y), n);
      return;
  }
}

void Binary(RegClass cls, int kind, const void* a, const void* b, void* y, int64_t n) {
  switch (cls) {
    case RegClass::kF32:
      BinaryFloat(kind, static_cast<const float*>(a), static_cast<const float*>(b),
                  static_cast<float*>(y), n);
      return;
    case RegClass::kF64:
      BinaryFloat(kind, static_cast<const double*>(a), static_cast<const double*>(b),
                  static_cast<double*>(y), n);
      return;
    case RegClass::kI64:
      BinaryInt(kind, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b),
                static_cast<int64_t*>(y), n);
      return;
  }
}

void Compare(RegClass cls, int kind, const void* a, const void* b, void* y, int64_t n) {
  int64_t* out = static_cast<int64_t*>(y);
  switch (cls) {
    case RegClass::kF32:
      CompareT(kind, static_cast<const float*>(a), static_cast<const float*>(b), out, n);
      return;
    case RegClass::kF64:
      CompareT(kind, static_cast<const double*>(a), static_cast<const double*>(b), out, n);
      return;
    case RegClass::kI64:
      CompareT(kind, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), out, n);
      return;
  }
}

void Where(RegClass cls, const void* cond, const void* a, const void* b, void* y, int64_t n) {
  const int64_t* c = static_cast<const int64_t*>(cond);
  if (cls == RegClass::kF32) {
    WhereT(c, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(y),
           n);
    return;
  }
  // f64 and i64 move 8-byte patterns alike.
  WhereT(c, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b),
         static_cast<int64_t*>(y), n);
}

void Cast(DType from, DType to, const void* x, void* y, int64_t n) {
  const RegClass cf = ClassOf(from), ct = ClassOf(to);
  const float* xf = static_cast<const float*>(x);
  const double* xd = static_cast<const double*>(x);
  const int64_t* xi = static_cast<const int64_t*>(x);
  float* yf = static_cast<float*>(y);
  double* yd = static_cast<double*>(y);
  int64_t* yi = static_cast<int64_t*>(y);
  if (cf == ct) {
    if (x != y) std::memcpy(y, x, n * RegSize(cf));
    // Bool is not a wrap of i64: cast to bool tests for nonzero.
    RoundToDType(y, to, n);
    return;
  }
  switch (ct) {
    case RegClass::kF32:
      if (cf == RegClass::kF64) {
        for (int64_t i = 0; i < n; ++i) yf[i] = static_cast<float>(xd[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) yf[i] = static_cast<float>(xi[i]);
      }
      RoundToDType(y, to, n);
      return;
    case RegClass::kF64:
      if (cf == RegClass::kF32) {
        for (int64_t i = 0; i < n; ++i) yd[i] = xf[i];
      } else {
        for (int64_t i = 0; i < n; ++i) yd[i] = static_cast<double>(xi[i]);
      }
      return;
    case RegClass::kI64:
      if (cf == RegClass::kF32) {
        FloatToInt(xf, to, yi, n);
      } else {
        FloatToInt(xd, to, yi, n);
      }
      return;
  }
}

void Clamp(RegClass cls, DType dtype, bool has_lo, double lo, bool has_hi, double hi, const void* x,
           void* y, int64_t n) {
  switch (cls) {
    case RegClass::kF32:
      ClampT(has_lo ? static_cast<float>(lo) : -INFINITY,
             has_hi ? static_cast<float>(hi) : INFINITY, static_cast<const float*>(x),
             static_cast<float*>(y), n);
      RoundToDType(y, dtype, n);
      return;
    case RegClass::kF64:
      ClampT(has_lo ? lo : -INFINITY, has_hi ? hi : INFINITY, static_cast<const double*>(x),
             static_cast<double*>(y), n);
      return;
    case RegClass::kI64: {
      // Integer bounds: the smallest integer >= lo and the largest <= hi, in range.
      int64_t ilo = std::numeric_limits<int64_t>::min(), ihi = std::numeric_limits<int64_t>::max();
      if (has_lo) {
        const double c = std::ceil(lo);
        FloatToInt(&c, dtype, &ilo, 1);
      }
      if (has_hi) {
        const double f = std::floor(hi);
        FloatToInt(&f, dtype, &ihi, 1);
      }
      ClampT(ilo, ihi, static_cast<const int64_t*>(x), static_cast<int64_t*>(y), n);
      return;
    }
  }
}

}  // namespace kiln::cpu::ew
