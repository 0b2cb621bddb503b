// AVX-512 VNNI dot products of GGUF weight rows with int8 activations
// (dequant_dot.h, "Int8 activations"). Compiled with -mavx512f/bw/dq/vl and
// -mavx512vnni (CMakeLists.txt); runs only where dq::BestInt8() found them.
//
// vpdpbusd multiplies unsigned bytes by signed bytes and adds each 4 products
// into an int32 lane. The weights are the unsigned side: q4_0 / q4_k / q5_k /
// q6_k quants are unsigned before their offset, and q8_0's signed quants become
// unsigned by flipping the sign bit (w + 128). The offsets (8, 32, 128) times
// the sums of each 4 activations are precomputed per call (Int8Rows.offsets)
// and start the accumulation, so each lane ends as the exact sum of 4 products
// of the signed weights. 64 weights per instruction: their int32 lanes are
// converted once and multiplied by a vector holding each lane's scale (weight
// scale x activation scale), so the per-weight work is integer. Each weight
// block is decoded once for all the activation rows of a call (R <= 8, a
// template parameter so the accumulators stay in registers), and the block
// scales are unpacked with vector operations.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"

namespace kiln::cpu::dq {
namespace {

// How far ahead of the block being multiplied the loops ask for weight lines,
// for R activation rows (DotK4 serves 1-2 rows, DotK4OneBlock 3 or more). With one or two rows the HW prefetcher alone left the
// q4_k matvec at ~65% of a plain read and 2 KB ahead did no better under a
// loaded host's memory latency; 8 KB brought q4_k and q8_0 to 74-76% and
// 76-94% of the read in the same runs (docs/benchmarks.md, q4k10b). With more
// rows the loops are bound by their work, and 8 KB of lines on top of the rows'
// int8 activations (4 KB each at K = 4096) crowd L1: M = 8 ran 20% slower.
template <int R>
constexpr int64_t kPrefetchBytes = R <= 2 ? 8192 : 2048;

inline __m512i Load64(const void* p) { return _mm512_loadu_si512(p); }
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float Half(const uint8_t* p) { return _cvtsh_ss(U16(p)); }
// The f16 values at p and q as lanes 0 and 1.
inline __m128 Half2(const uint8_t* p, const uint8_t* q) {
  return _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(U16(p)), U16(q), 1));
}
// Two floats at p as lanes 0 and 1.
inline __m128 Load2(const float* p) {
  return _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The 16-lane index that repeats lane a eight times, then lane b.
inline __m512i Pick2(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

inline float Sum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// The activation rows of a call, as the kernels read them.
template <int R>
struct RowPtrs {
  const int8_t* q[R];
  const float* dx[R];
  const float* sums[R];
  const int32_t* off[R];
  explicit RowPtrs(const Int8Rows& xq) {
    const int64_t k = xq.k, nb = k / kInt8Block;
    for (int r = 0; r < R; ++r) {
      q[r] = xq.q.data() + r * k;
      dx[r] = xq.d.data() + r * nb;
      sums[r] = xq.sums.empty() ? nullptr : xq.sums.data() + r * nb;
      off[r] = xq.offsets.empty() ? nullptr : xq.offsets.data() + r * (k / 4);
    }
  }
};

// Accumulator chains per activation row: enough independent FMAs in flight.
template <int R>
constexpr int kChains = R == 1 ? 4 : R <= 4 ? 2 : 1;

template <int R>
inline void Finish(__m512 (&acc)[R][kChains<R>], float* out) {
  for (int r = 0; r < R; ++r) {
    __m512 a = acc[r][0];
    for (int c = 1; c < kChains<R>; ++c) a = _mm512_add_ps(a, acc[r][c]);
    out[r] = _mm512_reduce_add_ps(a);
  }
}

// The eight 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a q4_k / q5_k
// block (quant::ScaleMinK4) from its 12 bytes, for two blocks at once: t holds
// each block's 12 scale bytes (and 4 more) in one 128-bit lane; the result has
// block 0's scales and mins in bytes 0-15 and block 1's in bytes 16-31. Vector
// operations on the word formulas of dequant_dot_avx512.cc, one 32-bit lane
// each (w0 w1 w2 are the scale bytes 0-3, 4-7, 8-11).
inline __m256i ScaleMinBytes2(__m256i t) {
  const __m256i lo = _mm256_and_si256(t, _mm256_set1_epi8(0x3f));
  const __m256i w22 = _mm256_shuffle_epi32(t, _MM_SHUFFLE(3, 3, 2, 2));
  const __m256i b = _mm256_and_si256(_mm256_srlv_epi32(w22, _mm256_setr_epi32(0, 4, 0, 0, 0, 4, 0, 0)),
                                     _mm256_set1_epi8(0x0f));
  const __m256i c = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(t, 6), _mm256_set1_epi8(0x03)), 4);
  return _mm256_unpacklo_epi32(lo, _mm256_or_si256(b, c));
}

// The vpshufb control that, applied to a ScaleMinBytes vector broadcast to the
// four 128-bit lanes, gives scale byte a in every int16 of lanes 0-1 (int32
// lanes 0-7) and scale byte b in lanes 2-3, zero-extended (index 0x80 gives 0).
inline __m512i ScaleShuffle(int a, int b) {
  const __m256i ia = _mm256_set1_epi16(static_cast<int16_t>(0x8000 | a));
  const __m256i ib = _mm256_set1_epi16(static_cast<int16_t>(0x8000 | b));
  return _mm512_inserti64x4(_mm512_castsi256_si512(ia), ib, 1);
}

// One block's eight 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a q4_k / q5_k
// block (quant::ScaleMinK4) from its 12 bytes at blk, with vector operations
// (the word formulas of dequant_dot_avx512.cc, one 32-bit lane each: w0 w1 w2
// are the scale bytes 0-3, 4-7, 8-11).
inline __m128i ScaleMinBytes(const uint8_t* blk) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));  // w0 w1 w2 -
  const __m128i lo = _mm_and_si128(t, _mm_set1_epi8(0x3f));
  const __m128i w22 = _mm_shuffle_epi32(t, _MM_SHUFFLE(3, 3, 2, 2));
  const __m128i b = _mm_and_si128(_mm_srlv_epi32(w22, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi8(0x0f));
  const __m128i c = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(t, 6), _mm_set1_epi8(0x03)), 4);
  return _mm_unpacklo_epi32(lo, _mm_or_si128(b, c));
}

// q4_k / q5_k for 3 or more activation rows: one block per step (the loop
// before the two-block step below, kept for R >= 3: with 8 rows the two-block
// step ran 13% slower from memory, 1.32-1.40 vs 1.18-1.20 ms for 4096 x 4096 on
// one thread, though faster from L2). The activation layout and the
// arithmetic are DotK4's.
template <bool kFive, int R>
void DotK4OneBlock(const uint8_t* row, int64_t blocks, const RowPtrs<R>& x, float* out) {
  constexpr int64_t kBytes = kFive ? 176 : 144;
  __m512 acc[R][kChains<R>];
  __m256 mins[R];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kChains<R>; ++c) acc[r][c] = _mm512_setzero_ps();
    mins[r] = _mm256_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i pick[4] = {Pick2(0, 2), Pick2(1, 3), Pick2(4, 6), Pick2(5, 7)};
  // q5_k: the fifth bit of the low nibbles of qs[32p + l] is bit 2p of qh[l],
  // of the high nibbles bit 2p + 1; per vector, one bit per 32-byte half.
  const __m512i bit[4] = {
      _mm512_inserti64x4(_mm512_set1_epi8(0x01), _mm256_set1_epi8(0x04), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x02), _mm256_set1_epi8(0x08), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x10), _mm256_set1_epi8(0x40), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x20), _mm256_set1_epi8(static_cast<char>(0x80)), 1)};
  const __m512i sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R>), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R> + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R> + 128), _MM_HINT_T0);
    const __m512i smi = _mm512_cvtepu8_epi32(ScaleMinBytes(blk + 4));  // 0-7 scales, 8-15 mins
    // Each int32 lane's two int16 halves hold its sub-block's scale.
    const __m512i scw = _mm512_or_si512(smi, _mm512_slli_epi32(smi, 16));
    const __m256 mn = _mm256_mul_ps(_mm256_set1_ps(Half(blk + 2)),
                                    _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(smi, 1)));
    const float dd = Half(blk);
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m512i v0 = Load64(qs), v1 = Load64(qs + 64);
    __m512i u[4] = {_mm512_and_si512(v0, low4), _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4),
                    _mm512_and_si512(v1, low4), _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4)};
    if constexpr (kFive) {
      const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
      for (int i = 0; i < 4; ++i) {
        u[i] = _mm512_mask_add_epi8(u[i], _mm512_test_epi8_mask(h, bit[i]), u[i], sixteen);
      }
    }
    __m512i sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = _mm512_permutexvar_epi32(pick[i], scw);
    constexpr int c = 0;  // R >= 3: the rows' own chains hide the FMA latency
    for (int r = 0; r < R; ++r) {
      mins[r] = _mm256_fmadd_ps(mn, Load8(x.sums[r] + 8 * b), mins[r]);
      const int8_t* xb = x.q[r] + 256 * b;
      __m512i is = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_maddubs_epi16(u[0], Load64(xb)), sc[0]);
      __m512i it = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_maddubs_epi16(u[1], Load64(xb + 64)), sc[1]);
      is = _mm512_dpwssd_epi32(is, _mm512_maddubs_epi16(u[2], Load64(xb + 128)), sc[2]);
      it = _mm512_dpwssd_epi32(it, _mm512_maddubs_epi16(u[3], Load64(xb + 192)), sc[3]);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(is, it)),
                                  _mm512_set1_ps(dd * x.dx[r][8 * b]), acc[r][c]);
    }
  }
  Finish<R>(acc, out);
  for (int r = 0; r < R; ++r) out[r] -= Sum8(mins[r]);
}

// q4_k (kFive = false) and q5_k, with one activation scale per 256 (Int8Group:
// x.dx holds it 8 times per block). The activations are `paired` (sub-blocks
// 0 2 1 3 4 6 5 7): the low nibbles of qs[0, 64) are sub-blocks 0 and 2, the
// high ones 1 and 3, and likewise 4 6 / 5 7 for qs[64, 128). Per 64 weights
// vpmaddubsw (unsigned quants x int8 activations: int16 sums of pairs, at most
// 2 * 31 * 127, no saturation) and vpmaddwd / vpdpwssd by the 6-bit sub-block
// scales (int16 pairs into int32 lanes): the block's sum d_x sum_j sc_j sum q x
// is integer up to one conversion and one FMA by d * d_x per block. The mins
// leave the per-weight work: sum (d sc q - dmin m) x^ = ... - dmin m sum x^,
// with sum x^ per 32 precomputed (Int8Rows.sums), subtracted in the same
// accumulators.
// Two blocks per step, so the per-block setup that fills half a vector (the
// scale and min unpacking, the f16 d / dmin, the mins' conversion and their
// FMA with the sums) runs once for both; a lone last block goes through the
// same step with block 1's factors zero (kLone).
template <bool kFive, int R>
void DotK4(const uint8_t* row, int64_t blocks, const RowPtrs<R>& x, float* out) {
  constexpr int64_t kBytes = kFive ? 176 : 144;
  static_assert(R <= 2, "3+ rows: DotK4OneBlock");
  constexpr int C = 2;  // accumulator chains per row
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i shuf[4] = {ScaleShuffle(0, 2), ScaleShuffle(1, 3), ScaleShuffle(4, 6), ScaleShuffle(5, 7)};
  // d, dmin of blocks 0 and 1 are lanes 0 1 2 3: dmin per block for 8 lanes each.
  const __m512i dmin_lanes = Pick2(1, 3);
  const __m512i d1_lanes = _mm512_set1_epi32(2);
  // q5_k: the fifth bit of the low nibbles of qs[32p + l] is bit 2p of qh[l],
  // of the high nibbles bit 2p + 1; per vector, one bit per 32-byte half.
  const __m512i bit[4] = {
      _mm512_inserti64x4(_mm512_set1_epi8(0x01), _mm256_set1_epi8(0x04), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x02), _mm256_set1_epi8(0x08), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x10), _mm256_set1_epi8(0x40), 1),
      _mm512_inserti64x4(_mm512_set1_epi8(0x20), _mm256_set1_epi8(static_cast<char>(0x80)), 1)};
  const __m512i sixteen = _mm512_set1_epi8(16);
  // The unsigned quants of the block at blk, 64 per vector in the paired order.
  auto quants = [&](const uint8_t* blk, __m512i (&u)[4]) __attribute__((always_inline)) {
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m512i v0 = Load64(qs), v1 = Load64(qs + 64);
    u[0] = _mm512_and_si512(v0, low4);
    u[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4);
    u[2] = _mm512_and_si512(v1, low4);
    u[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4);
    if constexpr (kFive) {
      const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
      for (int i = 0; i < 4; ++i) {
        u[i] = _mm512_mask_add_epi8(u[i], _mm512_test_epi8_mask(h, bit[i]), u[i], sixteen);
      }
    }
  };
  // sum_j sc_j sum_l q x over one block's 256 weights, in 16 int32 lanes.
  auto dot = [&](const __m512i (&u)[4], const __m512i (&sc)[4], const int8_t* xb)
                 __attribute__((always_inline)) {
    __m512i s = _mm512_madd_epi16(_mm512_maddubs_epi16(u[0], Load64(xb)), sc[0]);
    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u[1], Load64(xb + 64)), sc[1]);
    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u[2], Load64(xb + 128)), sc[2]);
    return _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u[3], Load64(xb + 192)), sc[3]);
  };
  auto step = [&]<bool kLone>(int64_t b) __attribute__((always_inline)) {
    const uint8_t* b0 = row + b * kBytes;
    const uint8_t* b1 = kLone ? b0 : b0 + kBytes;
    if constexpr (!kLone) {
      for (int64_t p = 0; p < 2 * kBytes; p += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(b0 + kPrefetchBytes<R> + p), _MM_HINT_T0);
      }
    }
    const __m256i smb = ScaleMinBytes2(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 4))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 4)), 1));
    const __m512i z = _mm512_castsi256_si512(smb);
    const __m512i s0 = _mm512_shuffle_i32x4(z, z, 0x00), s1 = _mm512_shuffle_i32x4(z, z, 0x55);
    // The mins of both blocks (bytes 8-15 and 24-31) as 16 floats times dmin.
    const __m512 mf = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm256_castsi256_si128(_mm256_permute4x64_epi64(smb, _MM_SHUFFLE(3, 1, 3, 1)))));
    uint32_t h0, h1;
    std::memcpy(&h0, b0, 4);
    std::memcpy(&h1, b1, 4);
    const __m512 dd = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1)));
    const __m512 mn = _mm512_mul_ps(mf, _mm512_permutexvar_ps(dmin_lanes, dd));
    const __m512 d0 = _mm512_broadcastss_ps(_mm512_castps512_ps128(dd));
    const __m512 d1 = kLone ? _mm512_setzero_ps() : _mm512_permutexvar_ps(d1_lanes, dd);
    // Row r's mins of both blocks and its product with block 0 / block 1.
    auto first = [&](int r, const __m512i (&u)[4], const __m512i (&sc)[4]) __attribute__((always_inline)) {
      const float* sums = x.sums[r] + 8 * b;
      // A lone block's lanes 8-15 (its own mins again) meet zero sums.
      const __m512 xs = kLone ? _mm512_maskz_loadu_ps(0x00ff, sums) : _mm512_loadu_ps(sums);
      acc[r][C - 1] = _mm512_fnmadd_ps(mn, xs, acc[r][C - 1]);
      acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot(u, sc, x.q[r] + 256 * b)),
                                  _mm512_mul_ps(d0, _mm512_set1_ps(x.dx[r][8 * b])), acc[r][0]);
    };
    auto second = [&](int r, const __m512i (&u)[4], const __m512i (&sc)[4]) __attribute__((always_inline)) {
      acc[r][C - 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot(u, sc, x.q[r] + 256 * b + 256)),
                                      _mm512_mul_ps(d1, _mm512_set1_ps(x.dx[r][8 * b + 8])), acc[r][C - 1]);
    };
    __m512i u[4], sc[4];
    quants(b0, u);
    for (int i = 0; i < 4; ++i) sc[i] = _mm512_shuffle_epi8(s0, shuf[i]);
    if constexpr (kLone) {
      for (int r = 0; r < R; ++r) first(r, u, sc);
    } else {
      __m512i u1[4], sc1[4];
      quants(b1, u1);
      for (int i = 0; i < 4; ++i) sc1[i] = _mm512_shuffle_epi8(s1, shuf[i]);
      for (int r = 0; r < R; ++r) first(r, u, sc), second(r, u1, sc1);
    }
  };
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) step.template operator()<false>(b);
  if (b < blocks) step.template operator()<true>(b);
  for (int r = 0; r < R; ++r) {
    __m512 a = acc[r][0];
    for (int c = 1; c < C; ++c) a = _mm512_add_ps(a, acc[r][c]);
    out[r] = _mm512_reduce_add_ps(a);
  }
}

// q6_k: per half of 128, 64 bytes of ql give elements [0, 64) (low nibbles,
// with qh bits 0-1 for the first 32 and 2-3 for the next) and [64, 128) (high
// nibbles, bits 4-5 and 6-7): natural order. A scale per 16 weights (4 lanes).
template <int R>
void DotQ6K(const uint8_t* row, int64_t blocks, const RowPtrs<R>& x, float* out) {
  constexpr int C = kChains<R>;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const __m512i low4 = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30);
  // Lane l of vector i has the scale of group 4i + l / 4; dx per 32 is dx[g / 2].
  const __m512i pick[4] = {
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
      _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
      _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
      _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 210;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R>), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R> + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R> + 128), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R> + 192), _MM_HINT_T0);
    const __m512 sc = _mm512_mul_ps(
        _mm512_set1_ps(Half(blk + 208)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)))));
    __m512i u[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i l = Load64(blk + 64 * h);
      const __m256i hr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m512i hs = _mm512_inserti64x4(_mm512_castsi256_si512(hr), _mm256_srli_epi16(hr, 2), 1);
      u[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_and_si512(_mm512_slli_epi16(hs, 4), top2));
      u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                     _mm512_and_si512(hs, top2));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 scale =
          _mm512_mul_ps(sc, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(Load8(x.dx[r] + 8 * b))));
      const int8_t* xb = x.q[r] + 256 * b;
      const int32_t* cb = x.off[r] + 64 * b;
      for (int i = 0; i < 4; ++i) {
        const __m512i s = _mm512_dpbusd_epi32(Load64(cb + 16 * i), u[i], Load64(xb + 64 * i));
        acc[r][i % C] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pick[i], scale), acc[r][i % C]);
      }
    }
  }
  Finish<R>(acc, out);
}

// q8_0 (kFour = false) and q4_0, two 32-blocks per vector; an odd last block in
// scalar code (the same exact integer sum). q8_0's lanes 0-7 are block b, 8-15
// block b + 1. q4_0's activations are `paired`: blocks b, b + 1 as b[0:16)
// b+1[0:16) b[16:32) b+1[16:32), which is the low nibbles of both blocks' 16
// bytes, then the high ones: lanes 0-3 and 8-11 are block b, 4-7 and 12-15 b + 1.
template <bool kFour, int R>
void Dot32(const uint8_t* row, int64_t blocks, const RowPtrs<R>& x, float* out) {
  constexpr int64_t kBytes = kFour ? 18 : 34;
  constexpr int C = kChains<R> == 4 ? 2 : kChains<R>;
  __m512 acc[R][kChains<R>];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kChains<R>; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m512i lanes = kFour ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                              : Pick2(0, 1);
  // Blocks b, b + 1 into accumulator chain c (a constant: see DotK4).
  auto pair = [&]<int c>(int64_t b) __attribute__((always_inline)) {
    const uint8_t* blk = row + b * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes<R>), _MM_HINT_T0);
    __m512i u;
    if constexpr (kFour) {
      const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(blk + 20),
                                            reinterpret_cast<const __m128i*>(blk + 2));
      u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low4)),
                             _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), 1);
    } else {
      u = _mm512_xor_si512(
          _mm512_inserti64x4(
              _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2))),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kBytes + 2)), 1),
          flip);
    }
    const __m128 dw = Half2(blk, blk + kBytes);
    for (int r = 0; r < R; ++r) {
      const __m512i s = _mm512_dpbusd_epi32(Load64(x.off[r] + 8 * b), u, Load64(x.q[r] + 32 * b));
      const __m512 scale =
          _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_mul_ps(dw, Load2(x.dx[r] + b))));
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r][c]);
    }
  };
  int64_t b = 0;
  for (; b + 3 < blocks; b += 4) {
    pair.template operator()<0>(b);
    pair.template operator()<C - 1>(b + 2);
  }
  if (b + 1 < blocks) {
    pair.template operator()<0>(b);
    b += 2;
  }
  Finish<R>(acc, out);
  if (b < blocks) {
    const uint8_t* blk = row + b * kBytes;
    for (int r = 0; r < R; ++r) {
      const int8_t* q = x.q[r] + 32 * b;
      int32_t s = 0;
      if constexpr (kFour) {
        for (int i = 0; i < 16; ++i) {
          s += ((blk[2 + i] & 15) - 8) * q[i] + ((blk[2 + i] >> 4) - 8) * q[16 + i];
        }
      } else {
        const int8_t* w = reinterpret_cast<const int8_t*>(blk + 2);
        for (int i = 0; i < 32; ++i) s += w[i] * q[i];
      }
      out[r] += Half(blk) * x.dx[r][b] * static_cast<float>(s);
    }
  }
}

template <int R>
void DotRows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const Int8Rows& xq,
             float* y, int64_t ldy) {
  const RowPtrs<R> x(xq);
  const int64_t k = xq.k;
  float out[R];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    switch (xq.wtype) {
      case v1::DTYPE_Q8_0:
        Dot32<false, R>(row, k / 32, x, out);
        break;
      case v1::DTYPE_Q4_0:
        Dot32<true, R>(row, k / 32, x, out);
        break;
      case v1::DTYPE_Q4_K:
        if constexpr (R <= 2) {
          DotK4<false, R>(row, k / 256, x, out);
        } else {
          DotK4OneBlock<false, R>(row, k / 256, x, out);
        }
        break;
      case v1::DTYPE_Q5_K:
        if constexpr (R <= 2) {
          DotK4<true, R>(row, k / 256, x, out);
        } else {
          DotK4OneBlock<true, R>(row, k / 256, x, out);
        }
        break;
      case v1::DTYPE_Q6_K:
        DotQ6K<R>(row, k / 256, x, out);
        break;
      default:
        return;  // REQUIRES: a block type
    }
    for (int r = 0; r < R; ++r) y[r * ldy + n] = out[r];
  }
}

}  // namespace

void DotRowsInt8Avx512(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                       const Int8Rows& xq, float* y, int64_t ldy) {
  switch (xq.rows) {
    case 1: return DotRows<1>(w, row_bytes, n0, n1, xq, y, ldy);
    case 2: return DotRows<2>(w, row_bytes, n0, n1, xq, y, ldy);
    case 3: return DotRows<3>(w, row_bytes, n0, n1, xq, y, ldy);
    case 4: return DotRows<4>(w, row_bytes, n0, n1, xq, y, ldy);
    case 5: return DotRows<5>(w, row_bytes, n0, n1, xq, y, ldy);
    case 6: return DotRows<6>(w, row_bytes, n0, n1, xq, y, ldy);
    case 7: return DotRows<7>(w, row_bytes, n0, n1, xq, y, ldy);
    case 8: return DotRows<8>(w, row_bytes, n0, n1, xq, y, ldy);
    default: return;  // REQUIRES: 1 <= rows <= kMaxDotRows
  }
}

}  // namespace kiln::cpu::dq
