// The reference GGUF block decoding (backends/common/quant_blocks.h) on blocks
// built byte by byte, each expected value worked out by hand from ggml's
// layout (the comments show the arithmetic).
#include "backends/common/quant_blocks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kiln::quant {
namespace {

// f16 bit patterns of the scales used below.
constexpr uint16_t kHalf0_25 = 0x3400, kHalf0_5 = 0x3800, kHalf1 = 0x3C00, kHalf2 = 0x4000;

void PutHalf(std::vector<uint8_t>& b, size_t at, uint16_t h) {
  b[at] = static_cast<uint8_t>(h & 0xff);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

std::vector<float> Decode(DType dtype, const std::vector<uint8_t>& bytes) {
  const DTypeLayout l = LayoutOf(dtype);
  const int64_t blocks = static_cast<int64_t>(bytes.size()) / l.block_bytes;
  std::vector<float> y(blocks * l.block_elems, -999.0f);
  DequantizeBlocks(dtype, bytes.data(), blocks, y.data());
  // The exact (double) form agrees wherever float is exact, as in every block here.
  std::vector<double> yd(y.size());
  DequantizeBlocks(dtype, bytes.data(), blocks, yd.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(static_cast<double>(y[i]), yd[i]) << i;
  return y;
}

TEST(QuantBlocksTest, LoadHalfIsLittleEndianBinary16) {
  const uint8_t one[2] = {0x00, 0x3C}, minus_two[2] = {0x00, 0xC0}, tiny[2] = {0x01, 0x00};
  EXPECT_EQ(LoadHalf(one), 1.0f);
  EXPECT_EQ(LoadHalf(minus_two), -2.0f);
  EXPECT_EQ(LoadHalf(tiny), 5.9604644775390625e-8f);  // the smallest subnormal, 2^-24
}

TEST(QuantBlocksTest, Q8_0IsScaleTimesSignedByte) {
  std::vector<uint8_t> b(2 * 34, 0);
  PutHalf(b, 0, kHalf0_5);
  const int8_t qs[5] = {-128, -1, 0, 1, 127};
  for (int i = 0; i < 5; ++i) b[2 + i] = static_cast<uint8_t>(qs[i]);
  PutHalf(b, 34, kHalf2);  // second block: d = 2, qs[31] = 3
  b[34 + 2 + 31] = 3;
  const std::vector<float> y = Decode(v1::DTYPE_Q8_0, b);
  EXPECT_EQ(y[0], -64.0f);  // 0.5 * -128
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.5f);
  EXPECT_EQ(y[4], 63.5f);
  EXPECT_EQ(y[31], 0.0f);
  EXPECT_EQ(y[32 + 31], 6.0f);  // 2 * 3
  EXPECT_EQ(y[32], 0.0f);
}

TEST(QuantBlocksTest, Q4_0LowNibblesFirstHalfHighNibblesSecond) {
  std::vector<uint8_t> b(18, 0);
  PutHalf(b, 0, kHalf2);
  b[2 + 0] = 0x0F;   // element 0: (15 - 8) * 2 = 14; element 16: (0 - 8) * 2 = -16
  b[2 + 1] = 0x88;   // elements 1 and 17: (8 - 8) * 2 = 0
  b[2 + 15] = 0xF3;  // element 15: (3 - 8) * 2 = -10; element 31: (15 - 8) * 2 = 14
  const std::vector<float> y = Decode(v1::DTYPE_Q4_0, b);
  EXPECT_EQ(y[0], 14.0f);
  EXPECT_EQ(y[16], -16.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[17], 0.0f);
  EXPECT_EQ(y[15], -10.0f);
  EXPECT_EQ(y[31], 14.0f);
  EXPECT_EQ(y[2], -16.0f);  // nibble 0: (0 - 8) * 2
}

// The 12 scale bytes used for q4_k and q5_k: sc[0] = 3, m[0] = 5 (low six
// bits of bytes 0 and 4); sc[4] = (byte 8 & 15) | (byte 0 >> 6) << 4 = 1 | 16
// = 17, m[4] = (byte 8 >> 4) | (byte 4 >> 6) << 4 = 2 | 32 = 34; all others 0.
void PutKScales(std::vector<uint8_t>& b) {
  b[4 + 0] = 0x43;  // 01 000011
  b[4 + 4] = 0x85;  // 10 000101
  b[4 + 8] = 0x21;
}

TEST(QuantBlocksTest, Q4_KSixBitScalesAndMins) {
  std::vector<uint8_t> b(144, 0);
  PutHalf(b, 0, kHalf1);    // d
  PutHalf(b, 2, kHalf0_5);  // dmin
  PutKScales(b);
  b[16 + 0] = 0x2A;   // element 0 (sub-block 0): low nibble 10; element 32 (sub-block 1): 2
  b[16 + 64] = 0x07;  // element 128 (sub-block 4): low nibble 7; element 160 (sub-block 5): 0
  const std::vector<float> y = Decode(v1::DTYPE_Q4_K, b);
  EXPECT_EQ(y[0], 27.5f);     // 1 * 3 * 10 - 0.5 * 5
  EXPECT_EQ(y[1], -2.5f);     // 1 * 3 * 0 - 0.5 * 5
  EXPECT_EQ(y[32], 0.0f);     // sc[1] = m[1] = 0
  EXPECT_EQ(y[128], 102.0f);  // 1 * 17 * 7 - 0.5 * 34
  EXPECT_EQ(y[129], -17.0f);  // 0 - 0.5 * 34
  EXPECT_EQ(y[160], 0.0f);
  EXPECT_EQ(y[255], 0.0f);
}

TEST(QuantBlocksTest, Q5_KAddsTheHighBitPlane) {
  std::vector<uint8_t> b(176, 0);
  PutHalf(b, 0, kHalf1);
  PutHalf(b, 2, kHalf0_5);
  PutKScales(b);
  b[16 + 0] = 0x11;   // qh[0]: bit 0 -> element 0 gets +16; bit 4 -> element 128 (pair 2, low)
  b[16 + 1] = 0x02;   // qh[1]: bit 1 -> element 33 (sub-block 1) gets +16, but sc[1] = 0
  b[48 + 0] = 0x2A;   // element 0: low nibble 10
  b[48 + 64] = 0x07;  // element 128: low nibble 7
  const std::vector<float> y = Decode(v1::DTYPE_Q5_K, b);
  EXPECT_EQ(y[0], 75.5f);  // 1 * 3 * (10 + 16) - 2.5
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[33], 0.0f);
  EXPECT_EQ(y[128], 374.0f);  // 1 * 17 * (7 + 16) - 17
  EXPECT_EQ(y[129], -17.0f);
}

TEST(QuantBlocksTest, Q6_KLowNibblesTwoHighBitsSignedScales) {
  std::vector<uint8_t> b(210, 0);
  b[0] = 0x5A;        // ql[0]: element 0 low nibble 10, element 64 high nibble 5
  b[32] = 0x0F;       // ql[32]: element 32 low nibble 15, element 96 high nibble 0
  b[64] = 0x01;       // ql[64]: element 128 (second half) low nibble 1
  b[128 + 0] = 0xE4;  // qh[0] = 11 10 01 00: pairs 0, 1, 2, 3 for elements 0, 32, 64, 96
  const int8_t scales[16] = {2, 0, -3, 0, 1, 0, -1, 0, 4, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 16; ++i) b[192 + i] = static_cast<uint8_t>(scales[i]);
  PutHalf(b, 208, kHalf0_25);
  const std::vector<float> y = Decode(v1::DTYPE_Q6_K, b);
  EXPECT_EQ(y[0], -11.0f);    // 0.25 * 2 * ((10 | 0 << 4) - 32)
  EXPECT_EQ(y[1], -16.0f);    // 0.25 * 2 * (0 - 32)
  EXPECT_EQ(y[16], 0.0f);     // scales[1] = 0
  EXPECT_EQ(y[32], 0.75f);    // 0.25 * -3 * ((15 | 1 << 4) - 32)
  EXPECT_EQ(y[64], 1.25f);    // 0.25 * 1 * ((5 | 2 << 4) - 32)
  EXPECT_EQ(y[96], -4.0f);    // 0.25 * -1 * ((0 | 3 << 4) - 32)
  EXPECT_EQ(y[128], -31.0f);  // 0.25 * 4 * (1 - 32)
  EXPECT_EQ(y[129], -32.0f);  // 0.25 * 4 * (0 - 32)
  EXPECT_EQ(y[144], 0.0f);    // scales[9] = 0
}

}  // namespace
}  // namespace kiln::quant
