#include "backends/common/quant_blocks.h"

#include <cstring>

#include "base/half.h"

namespace kiln::quant {
namespace {

template <typename T>
void Q8_0(const uint8_t* b, T* y) {
  const T d = LoadHalf(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<T>(qs[i]);
}

template <typename T>
void Q4_0(const uint8_t* b, T* y) {
  const T d = LoadHalf(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<T>((qs[i] & 15) - 8);
    y[i + 16] = d * static_cast<T>((qs[i] >> 4) - 8);
  }
}

// q4_k and q5_k (qh == nullptr for q4_k).
template <typename T>
void K4Or5(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, T* y) {
  const T d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  for (int p = 0; p < 4; ++p) {
    uint8_t sc0, m0, sc1, m1;
    ScaleMinK4(2 * p, scales, &sc0, &m0);
    ScaleMinK4(2 * p + 1, scales, &sc1, &m1);
    const T d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
    const uint8_t* q = qs + 32 * p;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 15, hi = q[l] >> 4;
      if (qh != nullptr) {
        lo += ((qh[l] >> (2 * p)) & 1) << 4;
        hi += ((qh[l] >> (2 * p + 1)) & 1) << 4;
      }
      y[64 * p + l] = d0 * static_cast<T>(lo) - min0;
      y[64 * p + 32 + l] = d1 * static_cast<T>(hi) - min1;
    }
  }
}

template <typename T>
void Q6_K(const uint8_t* b, T* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const T d = LoadHalf(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = ql[64 * h + l], hi = ql[64 * h + l + 32], bits = qh[32 * h + l];
      const int q[4] = {(lo & 15) | ((bits & 3) << 4), (hi & 15) | (((bits >> 2) & 3) << 4),
                        (lo >> 4) | (((bits >> 4) & 3) << 4), (hi >> 4) | (((bits >> 6) & 3) << 4)};
      for (int j = 0; j < 4; ++j) {
        const int e = 128 * h + 32 * j + l;
        y[e] = d * static_cast<T>(sc[e / 16]) * static_cast<T>(q[j] - 32);
      }
    }
  }
}

}  // namespace

float LoadHalf(const uint8_t* p) { return HalfToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

template <typename T>
void Decode(DType dtype, const uint8_t* src, int64_t blocks, T* dst) {
  const DTypeLayout layout = LayoutOf(dtype);
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * layout.block_bytes;
    T* y = dst + i * layout.block_elems;
    switch (dtype) {
      case v1::DTYPE_Q8_0:
        Q8_0(b, y);
        break;
      case v1::DTYPE_Q4_0:
        Q4_0(b, y);
        break;
      case v1::DTYPE_Q4_K:
        K4Or5(b, nullptr, b + 16, y);
        break;
      case v1::DTYPE_Q5_K:
        K4Or5(b, b + 16, b + 48, y);
        break;
      case v1::DTYPE_Q6_K:
        Q6_K(b, y);
        break;
      default:
        return;  // REQUIRES: a block type (callers check)
    }
  }
}

void DequantizeBlocks(DType dtype, const uint8_t* src, int64_t blocks, float* dst) {
  Decode(dtype, src, blocks, dst);
}
void DequantizeBlocks(DType dtype, const uint8_t* src, int64_t blocks, double* dst) {
  Decode(dtype, src, blocks, dst);
}

}  // namespace kiln::quant
