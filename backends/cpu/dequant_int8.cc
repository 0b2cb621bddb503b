// Int8 activations for DequantMatMul (dequant_dot.h): the per-32 rounding of
// the activation rows, shared by every ISA so the f64 references can mirror it,
// and the portable dot products over it.
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"

namespace kiln::cpu::dq {
namespace {

// The weight offset the int32 dot products fold in per 4 values (0: none).
int OffsetOf(DType wtype) {
  switch (wtype) {
    case v1::DTYPE_Q8_0:
      return 128;  // the kernels flip the weights' sign bit: w + 128 is unsigned
    case v1::DTYPE_Q4_0:
      return 8;
    case v1::DTYPE_Q6_K:
      return 32;
    default:
      return 0;
  }
}

// One group of `count` values (32 or 256): d = amax / 127, q =
// round-half-even(x / d) computed as x * (1 / d), in f32. A group holding a NaN
// or an infinity gets d = NaN and q = 0, so its rows' results are NaN (never a
// silently finite number).
#if defined(__AVX2__)
// With AVX2 (the backend's baseline ISA), bit for bit what the portable loop
// below computes: the max of |x| is order-free, x * id rounds once, and
// vcvtps2dq rounds half to even under the default MXCSR as nearbyint does. The
// scalar loop took ~4 us per 4096 values, ~2% of a 4096 x 4096 q4_k matvec.
// REQUIRES: count a multiple of 32.
float QuantizeBlock(const float* x, int8_t* q, int64_t count = kInt8Block) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 vmax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t i = 0; i < count; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    vmax = _mm256_max_ps(vmax, a);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
  }
  if (_mm256_movemask_ps(bad) != 0) {
    std::memset(q, 0, count);
    return std::numeric_limits<float>::quiet_NaN();
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float amax = _mm_cvtss_f32(m);
  const float d = amax / 127.0f;
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  // vpackssdw / vpacksswb interleave 4-value groups per 128-bit lane.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < count; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), id));
      v[j] = _mm256_min_epi32(_mm256_max_epi32(v[j], lo), hi);
    }
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(b, order));
  }
  return d;
}
#else
float QuantizeBlock(const float* x, int8_t* q, int64_t count = kInt8Block) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite &= std::isfinite(x[i]);
  }
  if (!finite) {
    std::memset(q, 0, count);
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float v = std::nearbyint(x[i] * id);
    q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return d;
}
#endif

}  // namespace

void QuantizeRows(DType wtype, const float* x, int64_t ldx, int rows, int64_t k, bool paired,
                  Int8Rows& out) {
  out.wtype = wtype;
  out.rows = rows;
  out.k = k;
  const bool kquant_mins = wtype == v1::DTYPE_Q4_K || wtype == v1::DTYPE_Q5_K;
  // Only q4_0 and q4_k / q5_k have a paired layout; q8_0 and q6_k stay in order.
  paired = paired && (kquant_mins || wtype == v1::DTYPE_Q4_0);
  out.paired = paired;
  const int64_t nb = k / kInt8Block;
  const int offset = OffsetOf(wtype);
  if (static_cast<int64_t>(out.q.size()) < rows * k) out.q.resize(rows * k);
  if (static_cast<int64_t>(out.d.size()) < rows * nb) out.d.resize(rows * nb);
  if (kquant_mins && static_cast<int64_t>(out.sums.size()) < rows * nb) out.sums.resize(rows * nb);
  if (offset != 0 && static_cast<int64_t>(out.offsets.size()) < rows * k / 4) {
    out.offsets.resize(rows * k / 4);
  }
  alignas(64) int8_t tmp[quant::kQK];
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    int8_t* qr = out.q.data() + r * k;
    float* dr = out.d.data() + r * nb;
    if (kquant_mins) {
      // One scale per 256 (q8_K), repeated over its 8 sub-blocks of 32. Paired:
      // sub-blocks 0 2 1 3 4 6 5 7 of each 256, the nibbles of 64 weight bytes.
      static constexpr int kOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
      for (int64_t s = 0; s < k; s += quant::kQK) {
        const float d = QuantizeBlock(xr + s, paired ? tmp : qr + s, quant::kQK);
        for (int j = 0; j < 8; ++j) dr[s / kInt8Block + j] = d;
        if (!paired) continue;
        for (int slot = 0; slot < 8; ++slot) {
          std::memcpy(qr + s + 32 * slot, tmp + 32 * kOrder[slot], 32);
        }
      }
    } else if (!paired) {
      for (int64_t b = 0; b < nb; ++b) dr[b] = QuantizeBlock(xr + b * kInt8Block, qr + b * kInt8Block);
    } else {  // q4_0: pairs of blocks as their 16-byte halves interleave
      int64_t b = 0;
      for (; b + 1 < nb; b += 2) {
        dr[b] = QuantizeBlock(xr + b * 32, tmp);
        dr[b + 1] = QuantizeBlock(xr + b * 32 + 32, tmp + 32);
        int8_t* o = qr + b * 32;
        std::memcpy(o, tmp, 16);
        std::memcpy(o + 16, tmp + 32, 16);
        std::memcpy(o + 32, tmp + 16, 16);
        std::memcpy(o + 48, tmp + 48, 16);
      }
      if (b < nb) dr[b] = QuantizeBlock(xr + b * 32, qr + b * 32);
    }
    if (kquant_mins) {
      // Natural sub-block j's sum, wherever `paired` stored it.
      float* sr = out.sums.data() + r * nb;
      for (int64_t b = 0; b < nb; ++b) {
        int64_t at = b * 32;
        if (paired) {
          static constexpr int kSlot[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // its own inverse
          at = (b / 8) * quant::kQK + 32 * kSlot[b % 8];
        }
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += qr[at + i];
        sr[b] = dr[b] * static_cast<float>(s);
      }
    }
    if (offset != 0) {
      int32_t* cr = out.offsets.data() + r * (k / 4);
      for (int64_t g = 0; g < k / 4; ++g) {
        cr[g] = -offset * (qr[4 * g] + qr[4 * g + 1] + qr[4 * g + 2] + qr[4 * g + 3]);
      }
    }
  }
}

namespace {

// The portable dot products over natural-order int8 rows: exact int32 sums per
// scale group, scales applied in f32.
float DotRowGeneric(DType wtype, const uint8_t* row, const Int8Rows& xq, int r) {
  const int64_t k = xq.k, nb = k / kInt8Block;
  const int8_t* q = xq.q.data() + r * k;
  const float* d = xq.d.data() + r * nb;
  float acc = 0;
  switch (wtype) {
    case v1::DTYPE_Q8_0:
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + 34 * b;
        const int8_t* w = reinterpret_cast<const int8_t*>(blk + 2);
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += w[i] * q[32 * b + i];
        acc += quant::LoadHalf(blk) * d[b] * static_cast<float>(s);
      }
      return acc;
    case v1::DTYPE_Q4_0:
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + 18 * b;
        int32_t s = 0;
        for (int i = 0; i < 16; ++i) {
          s += ((blk[2 + i] & 15) - 8) * q[32 * b + i] + ((blk[2 + i] >> 4) - 8) * q[32 * b + 16 + i];
        }
        acc += quant::LoadHalf(blk) * d[b] * static_cast<float>(s);
      }
      return acc;
    case v1::DTYPE_Q4_K:
    case v1::DTYPE_Q5_K: {
      const bool five = wtype == v1::DTYPE_Q5_K;
      const int64_t bytes = five ? 176 : 144;
      const float* sums = xq.sums.data() + r * nb;
      for (int64_t sb = 0; sb < k / quant::kQK; ++sb) {
        const uint8_t* blk = row + bytes * sb;
        const float dd = quant::LoadHalf(blk), dmin = quant::LoadHalf(blk + 2);
        const uint8_t* qh = blk + 16;
        const uint8_t* qs = blk + (five ? 48 : 16);
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          quant::ScaleMinK4(j, blk + 4, &sc, &m);
          const int p = j / 2, shift = (j % 2) * 4;
          int32_t s = 0;
          for (int l = 0; l < 32; ++l) {
            int u = (qs[32 * p + l] >> shift) & 15;
            if (five && ((qh[l] >> j) & 1)) u += 16;
            s += u * q[256 * sb + 32 * j + l];
          }
          const int64_t b = 8 * sb + j;
          acc += dd * static_cast<float>(sc) * d[b] * static_cast<float>(s) -
                 dmin * static_cast<float>(m) * sums[b];
        }
      }
      return acc;
    }
    case v1::DTYPE_Q6_K:
      for (int64_t sb = 0; sb < k / quant::kQK; ++sb) {
        const uint8_t* blk = row + 210 * sb;
        const float dd = quant::LoadHalf(blk + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
        int32_t s[16] = {};
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = blk + 64 * h;
          const uint8_t* qh = blk + 128 + 32 * h;
          for (int l = 0; l < 32; ++l) {
            const int e = 128 * h + l;
            const int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            const int8_t* qq = q + 256 * sb;
            s[e / 16] += q1 * qq[e];
            s[(e + 32) / 16] += q2 * qq[e + 32];
            s[(e + 64) / 16] += q3 * qq[e + 64];
            s[(e + 96) / 16] += q4 * qq[e + 96];
          }
        }
        for (int g = 0; g < 16; ++g) {
          acc += dd * static_cast<float>(sc[g]) * d[8 * sb + g / 2] * static_cast<float>(s[g]);
        }
      }
      return acc;
    default:
      return 0;  // REQUIRES: a block type
  }
}

void DotRowsInt8Generic(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                        const Int8Rows& xq, float* y, int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int r = 0; r < xq.rows; ++r) y[r * ldy + n] = DotRowGeneric(xq.wtype, w + n * row_bytes, xq, r);
  }
}

}  // namespace

const Int8Kernels& GenericInt8() {
  static const Int8Kernels k{"generic", false, &DotRowsInt8Generic};
  return k;
}

}  // namespace kiln::cpu::dq
