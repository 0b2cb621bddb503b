// The CPU's int8 activation rounding (dq::QuantizeRows, vectorized with AVX2)
// against the scalar contract of dequant_dot.h bit for bit, and the AVX-512
// VNNI q4_k / q5_k loops (two blocks per step, a lone last block) against the
// portable int8 loops for every row count and odd block counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/common/quant_blocks.h"
#include "backends/cpu/dequant_dot.h"
#include "base/half.h"

namespace kiln::int8_rows_test {

namespace dq = ::kiln::cpu::dq;

// The contract: d = amax / 127 (f32), q = round-half-even(x * (1 / d))
// clamped to +-127, q = 0 where amax = 0; a group with a NaN or an infinity
// has d = NaN and q = 0.
float ScalarGroup(const float* x, int64_t count, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite = finite && std::isfinite(x[i]);
  }
  if (!finite) {
    std::fill(q, q + count, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * id), -127.0f, 127.0f));
  }
  return d;
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// Where natural value j of a row is stored (dequant_dot.h, Int8Rows.q).
int64_t StoredAt(DType wt, bool paired, int64_t k, int64_t j) {
  if (!paired) return j;
  if (wt == v1::DTYPE_Q4_K || wt == v1::DTYPE_Q5_K) {
    static constexpr int kSlot[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // its own inverse
    return (j / 256) * 256 + 32 * kSlot[(j % 256) / 32] + j % 32;
  }
  if (wt == v1::DTYPE_Q4_0) {
    const int64_t b = j / 32, i = j % 32;
    if (b % 2 == 0 && b + 1 == k / 32) return j;  // an odd last block stays in order
    const int64_t base = (b / 2) * 64;
    return base + (i < 16 ? 0 : 32) + (b % 2) * 16 + i % 16;
  }
  return j;
}

TEST(Int8RowsTest, QuantizeRowsRoundsAsTheScalarContractBitForBit) {
  constexpr int kRows = 3;
  constexpr int64_t kK = 800;  // 25 groups of 32; q4_0 ends on an odd block
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (DType wt : {v1::DTYPE_Q8_0, v1::DTYPE_Q4_0, v1::DTYPE_Q4_K, v1::DTYPE_Q5_K, v1::DTYPE_Q6_K}) {
    const int64_t group = dq::Int8Group(wt);
    const int64_t k = group == 256 ? 768 : kK;
    std::vector<float> x(kRows * k);
    for (float& v : x) v = u(rng);
    // Row 0, group 0: amax 127 makes d = 1, so these are exact ties.
    const float ties[] = {127.0f, 2.5f, -2.5f, 3.5f, 0.5f, -0.5f, -0.0f, 126.5f, -127.0f};
    std::copy(std::begin(ties), std::end(ties), x.begin());
    // Row 1: an all-zero group (d = 0, q = 0) and values far beyond +-127.
    std::fill(x.begin() + k + group, x.begin() + k + 2 * group, 0.0f);
    x[k + 5] = 1e30f;
    // Row 2: a NaN in group 1 and an infinity in the last group.
    x[2 * k + group + 3] = std::numeric_limits<float>::quiet_NaN();
    x[3 * k - 1] = -std::numeric_limits<float>::infinity();
    for (bool paired : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(wt), paired ? " paired" : ""));
      dq::Int8Rows out;
      dq::QuantizeRows(wt, x.data(), k, kRows, k, paired, out);
      const bool stored_paired = out.paired;
      for (int r = 0; r < kRows; ++r) {
        std::vector<int8_t> q(k);
        std::vector<float> d(k / group);
        for (int64_t g = 0; g < k / group; ++g) {
          d[g] = ScalarGroup(x.data() + r * k + g * group, group, q.data() + g * group);
        }
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(out.q[r * k + StoredAt(wt, stored_paired, k, j)], q[j]) << "row " << r << " value " << j;
        }
        for (int64_t b = 0; b < k / dq::kInt8Block; ++b) {
          const float want = d[b * dq::kInt8Block / group];
          ASSERT_TRUE(SameFloat(out.d[r * (k / 32) + b], want))
              << "row " << r << " block " << b << ": " << out.d[r * (k / 32) + b] << " vs " << want;
          if (wt == v1::DTYPE_Q4_K || wt == v1::DTYPE_Q5_K) {
            int32_t s = 0;
            for (int i = 0; i < 32; ++i) s += q[32 * b + i];
            ASSERT_TRUE(SameFloat(out.sums[r * (k / 32) + b], want * static_cast<float>(s)));
          }
        }
      }
      if (wt == v1::DTYPE_Q4_K) {
        EXPECT_EQ(out.q[0], 127);  // 127 / 1
        EXPECT_EQ(out.q[1], 2);    // 2.5 rounds to even
        EXPECT_EQ(out.q[2], -2);
        EXPECT_EQ(out.q[3], 4);
        EXPECT_EQ(out.q[4], 0);
        EXPECT_EQ(out.q[5], 0);
      }
    }
  }
}

// Random q4_k / q5_k blocks with f16 d and dmin near 1e-2.
std::vector<uint8_t> RandomKBlocks(DType wt, int64_t blocks, std::mt19937& rng) {
  const DTypeLayout l = LayoutOf(wt);
  std::vector<uint8_t> w(blocks * l.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.5e-2f, 2e-2f);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int h = 0; h < 2; ++h) {
      const uint16_t v = FloatToHalf(scale(rng));
      std::memcpy(w.data() + b * l.block_bytes + 2 * h, &v, 2);
    }
  }
  return w;
}

TEST(Int8RowsTest, Avx512KQuantStepsMatchThePortableLoopsForEveryRowCount) {
  const dq::Int8Kernels& best = dq::BestInt8();
  if (std::string(best.isa) != "avx512vnni") GTEST_SKIP() << "no AVX-512 VNNI here (" << best.isa << ")";
  const dq::Int8Kernels& generic = dq::GenericInt8();
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  constexpr int64_t kN = 5;
  for (DType wt : {v1::DTYPE_Q4_K, v1::DTYPE_Q5_K}) {
    for (int64_t blocks : {1, 2, 3, 5, 16}) {  // odd counts end on a lone block
      const int64_t k = 256 * blocks;
      const DTypeLayout l = LayoutOf(wt);
      const int64_t row_bytes = blocks * l.block_bytes;
      const std::vector<uint8_t> w = RandomKBlocks(wt, kN * blocks, rng);
      for (int rows = 1; rows <= dq::kMaxDotRows; ++rows) {
        for (bool with_nan : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(wt), " K ", k, " rows ", rows, with_nan ? " NaN" : ""));
          std::vector<float> x(rows * k);
          for (float& v : x) v = u(rng);
          // The last row's last block holds a NaN: that row's results are NaN.
          if (with_nan) x[rows * k - 7] = std::numeric_limits<float>::quiet_NaN();
          dq::Int8Rows xb, xg;
          dq::QuantizeRows(wt, x.data(), k, rows, k, best.paired, xb);
          dq::QuantizeRows(wt, x.data(), k, rows, k, generic.paired, xg);
          std::vector<float> yb(rows * kN, -1.0f), yg(rows * kN, -2.0f);
          best.dot_rows(w.data(), row_bytes, 0, kN, xb, yb.data(), kN);
          generic.dot_rows(w.data(), row_bytes, 0, kN, xg, yg.data(), kN);
          float scale = 1.0f;
          for (float g : yg) {
            if (std::isfinite(g)) scale = std::max(scale, std::fabs(g));
          }
          for (int r = 0; r < rows; ++r) {
            for (int64_t n = 0; n < kN; ++n) {
              const float b = yb[r * kN + n], g = yg[r * kN + n];
              if (with_nan && r == rows - 1) {
                EXPECT_TRUE(std::isnan(b) && std::isnan(g)) << "row " << r << " n " << n << ": " << b << ", " << g;
                continue;
              }
              // Both are exact integer sums scaled in f32; only the order of
              // the f32 accumulation differs.
              EXPECT_NEAR(b, g, 1e-5f * scale * static_cast<float>(blocks)) << "row " << r << " n " << n;
            }
          }
        }
      }
    }
  }
}

}  // namespace kiln::int8_rows_test
