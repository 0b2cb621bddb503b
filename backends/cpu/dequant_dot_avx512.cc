// AVX-512 decoding of the GGUF block types (layouts in
// backends/common/quant_blocks.h). Compiled with -mavx512f/bw/dq/vl (see
// CMakeLists.txt); nothing here runs unless dq::Best() found those on the CPU.
//
// Each decoder walks one block and hands out 16 decoded weights at a time with
// their element offset in the block; DotRows multiplies them into register
// accumulators (one row: four independent chains, so the FMA latency is
// hidden), or DotRows of several rows and Decode store them to L1 first.
// GCC 12 reports its own intrinsics' _mm512_undefined_* temporaries as
// (maybe-)uninitialized once they are inlined here (a known false positive).
// Clang (the sanitizer and fuzz builds) has no -Wmaybe-uninitialized and
// fails the build on an unknown warning under -Werror: GCC only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"

namespace kiln::cpu::dq {
namespace {

inline float Half(const uint8_t* p) {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
}
inline __m512i Bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

struct Q8_0 {
  static constexpr int kElems = 32, kBytes = 34;
  template <typename F>
  static inline void Block(const uint8_t* b, F&& f) {
    const __m512 d = _mm512_set1_ps(Half(b));
    const __m128i* q = reinterpret_cast<const __m128i*>(b + 2);
    f.template operator()<0>(
        _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)))));
    f.template operator()<16>(
        _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1)))));
  }
};

inline __m512 Iota() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// The 4- and 5-bit types decode through a table: the 16 (or 32) values a
// (sub-)block's quants can take are computed once with the same arithmetic as
// decoding each quant (so the results are identical), and vpermps picks them by
// the quant's bits. That replaces a convert and an FMA per 16 weights (port 0,
// the bottleneck) with one permute (port 5); vpermps reads only the index's low
// four bits, so a low nibble needs no mask.
struct Q4_0 {
  static constexpr int kElems = 32, kBytes = 18;
  template <typename F>
  static inline void Block(const uint8_t* b, F&& f) {
    // d * (i - 8) for i = 0..15
    const __m512 table =
        _mm512_mul_ps(_mm512_set1_ps(Half(b)), _mm512_sub_ps(Iota(), _mm512_set1_ps(8.0f)));
    const __m512i v = Bytes16(b + 2);
    f.template operator()<0>(_mm512_permutexvar_ps(v, table));
    f.template operator()<16>(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
  }
};

// q4_k (kHigh = false) and q5_k (kHigh = true).
template <bool kHigh>
struct K4Or5 {
  static constexpr int kElems = 256, kBytes = kHigh ? 176 : 144;
  // d_j * i - m_j for i = 0..15 (lo) and 16..31 (hi, q5_k only).
  struct Table {
    __m512 lo, hi;
  };
  static inline Table TableOf(float d, float m) {
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m), iota = Iota();
    Table t;
    t.lo = _mm512_fmsub_ps(dv, iota, mv);
    if constexpr (kHigh) t.hi = _mm512_fmsub_ps(dv, _mm512_add_ps(iota, _mm512_set1_ps(16)), mv);
    return t;
  }
  static inline __m512 Lookup(__m512i q, const Table& t) {
    if constexpr (kHigh) return _mm512_permutex2var_ps(t.lo, q, t.hi);  // 5-bit index
    return _mm512_permutexvar_ps(q, t.lo);
  }
  // Moves bit kBit of each lane to bit 4.
  template <int kBit>
  static inline __m512i BitTo4(__m512i h) {
    if constexpr (kBit <= 4) return _mm512_slli_epi32(h, 4 - kBit);
    return _mm512_srli_epi32(h, kBit - 4);
  }
  template <int P, int H, typename F>
  static inline void Quarter(const uint8_t* qs, const uint8_t* qh, const Table& t0, const Table& t1,
                             F&& f) {
    const __m512i v = Bytes16(qs + 32 * P + 16 * H);
    __m512i lo = v, hi = _mm512_srli_epi32(v, 4);
    if constexpr (kHigh) {
      // Bit 2P (low nibble) and 2P+1 (high) of qh become index bit 4; the
      // permutes read five bits, so the nibbles need masking here.
      const __m512i h = Bytes16(qh + 16 * H), sixteen = _mm512_set1_epi32(16);
      const __m512i mask = _mm512_set1_epi32(15);
      lo = _mm512_or_si512(_mm512_and_si512(lo, mask), _mm512_and_si512(BitTo4<2 * P>(h), sixteen));
      hi = _mm512_or_si512(_mm512_and_si512(hi, mask),
                           _mm512_and_si512(BitTo4<2 * P + 1>(h), sixteen));
    }
    f.template operator()<64 * P + 16 * H>(Lookup(lo, t0));
    f.template operator()<64 * P + 32 + 16 * H>(Lookup(hi, t1));
  }
  template <int P, typename F>
  static inline void Pair(const uint8_t* qs, const uint8_t* qh, const float* ds, const float* ms,
                          F&& f) {
    const Table t0 = TableOf(ds[2 * P], ms[2 * P]), t1 = TableOf(ds[2 * P + 1], ms[2 * P + 1]);
    Quarter<P, 0>(qs, qh, t0, t1, f);
    Quarter<P, 1>(qs, qh, t0, t1, f);
  }
  template <typename F>
  static inline void Block(const uint8_t* b, F&& f) {
    // The eight 6-bit scales and mins (quant::ScaleMinK4) unpacked four at a
    // time from the 12 bytes as three little-endian words w0 w1 w2:
    // sc[0..3] = w0 & 63, m[0..3] = w1 & 63 (per byte), sc[4..7] = low nibbles
    // of w2 with the top two bits of w0 above them, m[4..7] = high nibbles of w2
    // with the top two bits of w1.
    uint32_t w[3];
    std::memcpy(w, b + 4, 12);
    const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
    const uint64_t sc =
        (w[0] & six) | static_cast<uint64_t>((w[2] & nib) | (((w[0] >> 6) & two) << 4)) << 32;
    const uint64_t mn =
        (w[1] & six) | static_cast<uint64_t>(((w[2] >> 4) & nib) | (((w[1] >> 6) & two) << 4))
                           << 32;
    alignas(32) float ds[8], ms[8];
    const __m256 scf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const __m256 mnf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
    _mm256_store_ps(ds, _mm256_mul_ps(_mm256_set1_ps(Half(b)), scf));
    _mm256_store_ps(ms, _mm256_mul_ps(_mm256_set1_ps(Half(b + 2)), mnf));
    // Keep ds/ms in memory: the tables then broadcast them with plain loads
    // (vbroadcastss from memory runs on the load ports), where the compiler
    // would otherwise shuffle them out of a register on port 5, which the
    // table lookups already saturate.
    asm volatile("" : : "r"(ds), "r"(ms) : "memory");
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kHigh ? 48 : 16);
    Pair<0>(qs, qh, ds, ms, f);
    Pair<1>(qs, qh, ds, ms, f);
    Pair<2>(qs, qh, ds, ms, f);
    Pair<3>(qs, qh, ds, ms, f);
  }
};

struct Q6_K {
  static constexpr int kElems = 256, kBytes = 210;
  template <int E, typename F>
  static inline void Emit(__m512i q, float d, const int8_t* sc, F&& f) {
    const __m512 s = _mm512_set1_ps(d * static_cast<float>(sc[E / 16]));
    f.template operator()<E>(
        _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32)))));
  }
  template <int Hf, int L0, typename F>
  static inline void Sixteen(const uint8_t* b, float d, const int8_t* sc, F&& f) {
    const __m512i a = Bytes16(b + 64 * Hf + L0), c = Bytes16(b + 64 * Hf + 32 + L0);
    const __m512i h = Bytes16(b + 128 + 32 * Hf + L0);
    const __m512i m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
    const __m512i q1 =
        _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_slli_epi32(_mm512_and_si512(h, m2), 4));
    const __m512i q2 =
        _mm512_or_si512(_mm512_and_si512(c, m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), m2), 4));
    const __m512i q3 =
        _mm512_or_si512(_mm512_srli_epi32(a, 4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 4), m2), 4));
    const __m512i q4 =
        _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(_mm512_srli_epi32(h, 6), 4));
    Emit<128 * Hf + L0>(q1, d, sc, f);
    Emit<128 * Hf + 32 + L0>(q2, d, sc, f);
    Emit<128 * Hf + 64 + L0>(q3, d, sc, f);
    Emit<128 * Hf + 96 + L0>(q4, d, sc, f);
  }
  template <typename F>
  static inline void Block(const uint8_t* b, F&& f) {
    const float d = Half(b + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    Sixteen<0, 0>(b, d, sc, f);
    Sixteen<0, 16>(b, d, sc, f);
    Sixteen<1, 0>(b, d, sc, f);
    Sixteen<1, 16>(b, d, sc, f);
  }
};

struct Store {
  float* dst;
  template <int E>
  inline void operator()(__m512 w) {
    _mm512_storeu_ps(dst + E, w);
  }
};

// Accumulates 16 decoded weights at block offset E into each row's
// accumulator; a single row spreads over kChains independent sums.
template <int kRows, int kChains>
struct Fma {
  __m512 (&acc)[kRows][kChains];
  const float* xb;
  int64_t ldx;
  template <int E>
  inline void operator()(__m512 w) {
    constexpr int c = (E / 16) % kChains;
    for (int r = 0; r < kRows; ++r) {
      acc[r][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xb + r * ldx + E), acc[r][c]);
    }
  }
};

constexpr int64_t kPrefetchBytes = 2048;

// One activation row: each block is decoded in registers and multiplied
// straight into four independent accumulator chains.
template <typename B>
void DotRow1(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k, const float* x,
             float* y) {
  const int64_t blocks = k / B::kElems;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    __m512 acc[1][4] = {
        {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()}};
    for (int64_t b = 0; b < blocks; ++b) {
      // Rows are contiguous: a hint kPrefetchBytes ahead keeps more lines in
      // flight than the hardware prefetcher alone (it reads past the last row
      // harmlessly: prefetches do not fault).
      _mm_prefetch(reinterpret_cast<const char*>(row + b * B::kBytes + kPrefetchBytes),
                   _MM_HINT_T0);
      B::Block(row + b * B::kBytes, Fma<1, 4>{acc, x + b * B::kElems, 0});
    }
    y[n] = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0][0], acc[0][1]), _mm512_add_ps(acc[0][2], acc[0][3])));
  }
}

// Several rows: each block is decoded once into an L1 buffer and then
// multiplied into every row's accumulator (decoding straight into kRows
// accumulators ran out of registers). K is walked in tiles of kKTile so the
// activation rows' slice stays in L1 while a tile of weight rows passes it
// (untiled, 8 rows x 16 KiB of x streamed from L2 and bounded the loop);
// partial sums wait in memory between tiles.
constexpr int64_t kKTile = 1024;
constexpr int64_t kNTile = 16;

template <typename B, int kRows>
void DotRowsT(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k,
              const float* x, int64_t ldx, float* y, int64_t ldy) {
  constexpr int64_t kTileBlocks = kKTile / B::kElems;
  const int64_t blocks = k / B::kElems;
  alignas(64) float buf[B::kElems], buf1[B::kElems];
  alignas(64) __m512 part[kNTile][kRows];
  for (int64_t t0 = n0; t0 < n1; t0 += kNTile) {
    const int64_t t1 = std::min(n1, t0 + kNTile);
    for (int64_t i = 0; i < t1 - t0; ++i) {
      for (int r = 0; r < kRows; ++r) part[i][r] = _mm512_setzero_ps();
    }
    for (int64_t kb = 0; kb < blocks; kb += kTileBlocks) {
      const int64_t kb1 = std::min(blocks, kb + kTileBlocks);
      int64_t n = t0;
      // Two weight rows at a time: each activation load feeds two FMAs. (The
      // empty asm pins the loaded x in a register; without it the compiler
      // folds the load into both FMAs and reads x twice.)
      for (; n + 1 < t1; n += 2) {
        const uint8_t* row0 = w + n * row_bytes;
        const uint8_t* row1 = row0 + row_bytes;
        __m512 acc0[kRows], acc1[kRows];
        for (int r = 0; r < kRows; ++r) acc0[r] = part[n - t0][r], acc1[r] = part[n + 1 - t0][r];
        for (int64_t b = kb; b < kb1; ++b) {
          _mm_prefetch(reinterpret_cast<const char*>(row0 + b * B::kBytes + kPrefetchBytes),
                       _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(row1 + b * B::kBytes + kPrefetchBytes),
                       _MM_HINT_T0);
          B::Block(row0 + b * B::kBytes, Store{buf});
          B::Block(row1 + b * B::kBytes, Store{buf1});
          const float* xb = x + b * B::kElems;
          for (int j = 0; j < B::kElems; j += 16) {
            const __m512 w0 = _mm512_load_ps(buf + j), w1 = _mm512_load_ps(buf1 + j);
            for (int r = 0; r < kRows; ++r) {
              __m512 xv = _mm512_loadu_ps(xb + r * ldx + j);
              asm("" : "+v"(xv));
              acc0[r] = _mm512_fmadd_ps(w0, xv, acc0[r]);
              acc1[r] = _mm512_fmadd_ps(w1, xv, acc1[r]);
            }
          }
        }
        for (int r = 0; r < kRows; ++r) part[n - t0][r] = acc0[r], part[n + 1 - t0][r] = acc1[r];
      }
      for (; n < t1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        __m512 acc[kRows];
        for (int r = 0; r < kRows; ++r) acc[r] = part[n - t0][r];
        for (int64_t b = kb; b < kb1; ++b) {
          _mm_prefetch(reinterpret_cast<const char*>(row + b * B::kBytes + kPrefetchBytes),
                       _MM_HINT_T0);
          B::Block(row + b * B::kBytes, Store{buf});
          const float* xb = x + b * B::kElems;
          for (int j = 0; j < B::kElems; j += 16) {
            const __m512 wv = _mm512_load_ps(buf + j);
            for (int r = 0; r < kRows; ++r) {
              acc[r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xb + r * ldx + j), acc[r]);
            }
          }
        }
        for (int r = 0; r < kRows; ++r) part[n - t0][r] = acc[r];
      }
    }
    for (int64_t n = t0; n < t1; ++n) {
      for (int r = 0; r < kRows; ++r) y[r * ldy + n] = _mm512_reduce_add_ps(part[n - t0][r]);
    }
  }
}

// q4_k, one activation row: the table lookups above cost a permute per 16
// weights plus eight table builds per super-block, and bound the matvec at
// about half of what a core reads. Here (as in dequant_dot_avx2.cc) the mins
// come out of the per-weight work: sum_i (d sc_j q_i - dmin m_j) x_i =
// d sc_j sum_i q_i x_i - dmin m_j sum_i x_i, with the sub-block sums of x (xs)
// computed once per call for all the rows; the eight scales and mins are
// unpacked together; each sub-block's quants are converted and multiplied
// into a partial sum that its scale multiplies once. The products d sc and
// dmin m are exact in f32, so only the order of f32 additions differs.
float DotQ4KRow(const uint8_t* row, int64_t blocks, const float* x, const float* xs) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m256 mins_acc = _mm256_setzero_ps();
  const __m512i low4 = _mm512_set1_epi32(15);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * 144;
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + 128), _MM_HINT_T0);
    // The scales and mins as in K4Or5::Block.
    uint32_t w[3];
    std::memcpy(w, blk + 4, 12);
    const uint32_t six = 0x3f3f3f3f, nib = 0x0f0f0f0f, two = 0x03030303;
    const uint64_t sc =
        (w[0] & six) | static_cast<uint64_t>((w[2] & nib) | (((w[0] >> 6) & two) << 4)) << 32;
    const uint64_t mn =
        (w[1] & six) | static_cast<uint64_t>(((w[2] >> 4) & nib) | (((w[1] >> 6) & two) << 4)) << 32;
    const __m256 scf = _mm256_mul_ps(
        _mm256_set1_ps(Half(blk)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc)))));
    const __m256 mnf = _mm256_mul_ps(
        _mm256_set1_ps(Half(blk + 2)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn)))));
    mins_acc = _mm256_fmadd_ps(mnf, _mm256_loadu_ps(xs + 8 * b), mins_acc);
    alignas(32) float scales[8];
    _mm256_store_ps(scales, scf);
    const uint8_t* qs = blk + 16;
    const float* xb = x + 256 * b;
    for (int p = 0; p < 4; ++p) {
      // Sub-block 2p: the low nibbles of qs[32p, 32p + 32); 2p + 1: the high ones.
      const __m512i v0 = Bytes16(qs + 32 * p), v1 = Bytes16(qs + 32 * p + 16);
      __m512 s0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v0, low4)), _mm512_loadu_ps(xb + 64 * p));
      __m512 s1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v0, 4)), _mm512_loadu_ps(xb + 64 * p + 32));
      s0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v1, low4)), _mm512_loadu_ps(xb + 64 * p + 16), s0);
      s1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v1, 4)), _mm512_loadu_ps(xb + 64 * p + 48), s1);
      acc0 = _mm512_fmadd_ps(_mm512_set1_ps(scales[2 * p]), s0, acc0);
      acc1 = _mm512_fmadd_ps(_mm512_set1_ps(scales[2 * p + 1]), s1, acc1);
    }
  }
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(mins_acc), _mm256_extractf128_ps(mins_acc, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - _mm_cvtss_f32(m);
}

void DotQ4KRows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k, const float* x,
                float* y) {
  // The sub-block sums of x, once for every row of the range.
  thread_local std::vector<float> xs;
  if (static_cast<int64_t>(xs.size()) < k / 32 + 8) xs.resize(k / 32 + 8);
  for (int64_t j = 0; j < k / 32; ++j) {
    const __m512 s = _mm512_add_ps(_mm512_loadu_ps(x + 32 * j), _mm512_loadu_ps(x + 32 * j + 16));
    xs[j] = _mm512_reduce_add_ps(s);
  }
  for (int64_t n = n0; n < n1; ++n) y[n] = DotQ4KRow(w + n * row_bytes, k / 256, x, xs.data());
}

template <typename B>
void DotRowsFor(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k,
                const float* x, int64_t ldx, int rows, float* y, int64_t ldy) {
  switch (rows) {
    case 1:
      return DotRow1<B>(w, row_bytes, n0, n1, k, x, y);
    case 2:
      return DotRowsT<B, 2>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
    case 3:
      return DotRowsT<B, 3>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
    case 4:
      return DotRowsT<B, 4>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
    case 5:
      return DotRowsT<B, 5>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
    case 6:
      return DotRowsT<B, 6>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
    case 7:
      return DotRowsT<B, 7>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
    default:
      return DotRowsT<B, 8>(w, row_bytes, n0, n1, k, x, ldx, y, ldy);
  }
}

template <typename B>
void DecodeFor(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b) B::Block(src + b * B::kBytes, Store{dst + b * B::kElems});
}

}  // namespace

void DotRowsAvx512(DType dtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                   int64_t k, const float* x, int64_t ldx, int rows, float* y, int64_t ldy) {
  switch (dtype) {
    case v1::DTYPE_Q8_0:
      return DotRowsFor<Q8_0>(w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
    case v1::DTYPE_Q4_0:
      return DotRowsFor<Q4_0>(w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
    case v1::DTYPE_Q4_K:
      if (rows == 1) return DotQ4KRows(w, row_bytes, n0, n1, k, x, y);
      return DotRowsFor<K4Or5<false>>(w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
    case v1::DTYPE_Q5_K:
      return DotRowsFor<K4Or5<true>>(w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
    case v1::DTYPE_Q6_K:
      return DotRowsFor<Q6_K>(w, row_bytes, n0, n1, k, x, ldx, rows, y, ldy);
    default:
      return;  // REQUIRES: a block type
  }
}

void DecodeAvx512(DType dtype, const uint8_t* src, int64_t blocks, float* dst) {
  switch (dtype) {
    case v1::DTYPE_Q8_0:
      return DecodeFor<Q8_0>(src, blocks, dst);
    case v1::DTYPE_Q4_0:
      return DecodeFor<Q4_0>(src, blocks, dst);
    case v1::DTYPE_Q4_K:
      return DecodeFor<K4Or5<false>>(src, blocks, dst);
    case v1::DTYPE_Q5_K:
      return DecodeFor<K4Or5<true>>(src, blocks, dst);
    case v1::DTYPE_Q6_K:
      return DecodeFor<Q6_K>(src, blocks, dst);
    default:
      return;
  }
}

}  // namespace kiln::cpu::dq
