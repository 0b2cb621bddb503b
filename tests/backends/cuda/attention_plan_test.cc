// Which attention kernel serves a shape on a CUDA device (no GPU needed):
// the tensor-core kernel for f16/bf16 head dims 64 and 128, the tiled SIMT
// kernel for f32 at those head dims, split-K for decoding shapes, the row
// kernel for the rest.
#include <gtest/gtest.h>

#include "backends/cuda/attention_plan.h"

namespace kiln::cuda {
namespace {

DeviceCaps H100() {
  DeviceCaps c;
  c.cc_major = 9;
  c.sm_count = 132;
  c.max_grid_x = 2147483647;
  c.max_shared_per_block_optin = 227 << 10;
  c.arch = "sm_90";
  return c;
}

TEST(AttentionPlan, TensorCoresForHalfTypesAtHeadDims64And128) {
  const DeviceCaps caps = H100();
  for (DType dt : {v1::DTYPE_BF16, v1::DTYPE_F16}) {
    for (int64_t d : {64, 128}) {
      EXPECT_EQ(PlanAttentionPath(dt, 4, 32, 2048, 2048, d, d, caps).kind, AttentionPath::kFlash);
      EXPECT_EQ(PlanAttentionPath(dt, 1, 1, 9, 9, d, d, caps).kind, AttentionPath::kFlash);
    }
    // Other head dims, Dv != D, and f32 keep the row kernel.
    EXPECT_EQ(PlanAttentionPath(dt, 4, 32, 512, 512, 96, 96, caps).kind, AttentionPath::kRows);
    EXPECT_EQ(PlanAttentionPath(dt, 4, 32, 512, 512, 64, 128, caps).kind, AttentionPath::kRows);
    EXPECT_EQ(PlanAttentionPath(dt, 4, 32, 512, 512, 256, 256, caps).kind, AttentionPath::kRows);
  }
  EXPECT_NE(PlanAttentionPath(v1::DTYPE_F32, 4, 32, 512, 512, 64, 64, caps).kind,
            AttentionPath::kFlash);
  // Shared memory: three 64 x (D + 8) tiles of halves.
  EXPECT_EQ(FlashSharedBytes(128), 3 * 64 * 136 * 2);
  DeviceCaps small = caps;
  small.max_shared_per_block_optin = 48 << 10;
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_BF16, 1, 8, 256, 256, 128, 128, small).kind,
            AttentionPath::kRows);
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_BF16, 1, 8, 256, 256, 64, 64, small).kind,
            AttentionPath::kFlash);
  // A grid past the device's limit.
  DeviceCaps narrow = caps;
  narrow.max_grid_x = 65535;
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_BF16, 64, 64, 8192, 8192, 64, 64, narrow).kind,
            AttentionPath::kRows);
}

TEST(AttentionPlan, TiledSimtKernelForF32AtHeadDims64And128) {
  const DeviceCaps caps = H100();
  for (int64_t d : {64, 128}) {
    EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 8, 12, 128, 128, d, d, caps).kind,
              AttentionPath::kTiled);
    EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 1, 1, 9, 9, d, d, caps).kind, AttentionPath::kTiled);
    EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 2, 16, 4096, 4096, d, d, caps).kind,
              AttentionPath::kTiled);
  }
  // Other head dims and Dv != D keep the row kernel; decoding still splits.
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 8, 12, 128, 128, 96, 96, caps).kind,
            AttentionPath::kRows);
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 8, 12, 128, 128, 64, 128, caps).kind,
            AttentionPath::kRows);
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 1, 32, 1, 4096, 64, 64, caps).kind,
            AttentionPath::kSplit);
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 0, 12, 128, 128, 64, 64, caps).kind,
            AttentionPath::kRows);
  // Shared memory: Q 32 x (D + 4), K and V 64 x (D + 4), P 32 x 68 floats.
  EXPECT_EQ(TiledSharedBytes(64), (32 * 68 + 2 * 64 * 68 + 32 * 68) * 4);
  DeviceCaps small = caps;
  small.max_shared_per_block_optin = 64 << 10;
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 1, 8, 256, 256, 64, 64, small).kind,
            AttentionPath::kTiled);
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_F32, 1, 8, 256, 256, 128, 128, small).kind,
            AttentionPath::kRows);
}

TEST(AttentionPlan, DecodingSplitsTheKeys) {
  const DeviceCaps caps = H100();
  // One query row per (batch, head) over 32k keys: enough splits to fill
  // the device, at most 256, each of at least 32 keys.
  AttentionPath p = PlanAttentionPath(v1::DTYPE_BF16, 1, 32, 1, 32768, 128, 128, caps);
  EXPECT_EQ(p.kind, AttentionPath::kSplit);
  EXPECT_EQ(p.splits, 256);
  p = PlanAttentionPath(v1::DTYPE_F32, 8, 32, 1, 4096, 128, 128, caps);
  EXPECT_EQ(p.kind, AttentionPath::kSplit);
  EXPECT_EQ(p.splits, (132 * 64 + 255) / 256);
  p = PlanAttentionPath(v1::DTYPE_BF16, 1, 1, 1, 300, 80, 80, caps);
  EXPECT_EQ(p.kind, AttentionPath::kSplit);
  EXPECT_EQ(p.splits, (300 + 31) / 32);
  // Many rows need no split; short key ranges and long query runs do not split.
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_BF16, 512, 64, 8, 4096, 128, 128, caps).splits, 1);
  EXPECT_NE(PlanAttentionPath(v1::DTYPE_BF16, 1, 32, 1, 255, 128, 128, caps).kind,
            AttentionPath::kSplit);
  EXPECT_NE(PlanAttentionPath(v1::DTYPE_BF16, 1, 32, 9, 4096, 128, 128, caps).kind,
            AttentionPath::kSplit);
  // Empty shapes never split.
  EXPECT_EQ(PlanAttentionPath(v1::DTYPE_BF16, 0, 32, 1, 4096, 128, 128, caps).kind,
            AttentionPath::kRows);
}

TEST(AttentionPlan, DecodeKernelTakesTheGqaGroupPerBlock) {
  // The query rows that read one kv head, in tiles of 1, 2, 4 or 8.
  EXPECT_EQ(DecodeRowsPerBlock(1), 1);
  EXPECT_EQ(DecodeRowsPerBlock(2), 2);
  EXPECT_EQ(DecodeRowsPerBlock(3), 4);
  EXPECT_EQ(DecodeRowsPerBlock(4), 4);
  EXPECT_EQ(DecodeRowsPerBlock(5), 8);
  EXPECT_EQ(DecodeRowsPerBlock(32), 8);
  // 4 warps x (256 / D) keys per step x 4 steps per pass (the default ring).
  EXPECT_EQ(DecodeKeysPerPass(128, 4), 4 * 2 * 4);
  EXPECT_EQ(DecodeKeysPerPass(64, 1), 4 * 4 * 4);
  EXPECT_EQ(DecodeKeysPerPass(256, 8), 4 * 1 * 4);
  EXPECT_EQ(DecodeKeysPerPass(128, 4, DecodeRing{2, 5}), 4 * 2 * 2);
}

TEST(AttentionPlan, DecodeTakesTheTensorCoresForGqaGroups) {
  // Two or more query rows per kv head (a GQA group, or several query rows)
  // take the tensor-core kernel; one row (MHA decoding) the 16-byte kernel;
  // KILN_DECODE_MMA=0 keeps the 16-byte kernel everywhere, =1 takes the
  // tensor-core kernel for one row too.
  EXPECT_FALSE(DecodeUsesMma(1));
  EXPECT_TRUE(DecodeUsesMma(2));
  EXPECT_TRUE(DecodeUsesMma(4));
  EXPECT_TRUE(DecodeUsesMma(32));
  EXPECT_FALSE(DecodeUsesMma(4, DecodeMmaMode::kOff));
  EXPECT_TRUE(DecodeUsesMma(1, DecodeMmaMode::kOn));
  // 4 warps x 16 keys per mma tile x tiles per pass.
  EXPECT_EQ(DecodeMmaKeysPerPass(), 4 * 16 * kDefaultDecodeMmaRing.steps);
  EXPECT_EQ(DecodeMmaKeysPerPass(DecodeRing{2, 3}), 4 * 16 * 2);
  // The rings: 4 warps x passes x (K and V: 16 keys x (D + 8) halves).
  EXPECT_EQ(DecodeMmaSharedBytes(128, DecodeRing{1, 3}), 4 * 3 * 2 * 16 * 136 * 2);
  EXPECT_EQ(DecodeMmaSharedBytes(256, DecodeRing{2, 2}), 4 * 2 * 2 * 32 * 264 * 2);
  // The smallest ring still holds the warps' merge (o of 8 rows x D, m and l, f32).
  EXPECT_GE(DecodeMmaSharedBytes(64, DecodeRing{1, 2}), (4 * 8 * 64 + 2 * 4 * 8) * 4);
  // The source's ring (1 x 3) fits every head dim in an H100's 227 KiB per
  // block, two blocks per SM at D 128; bf16 at D 128 takes 2 x 2 (one block
  // per SM), the only variant a GPU ran at another ring; the rest 1 x 3.
  EXPECT_EQ(DecodeMmaSharedBytes(128), 4 * 3 * 2 * 16 * 136 * 2);
  for (int64_t d : {64, 128, 256}) EXPECT_LE(DecodeMmaSharedBytes(d), 227 * 1024) << d;
  EXPECT_LE(2 * DecodeMmaSharedBytes(128), 228 * 1024);
  const DecodeRing bf16 = DefaultDecodeMmaRing(v1::DTYPE_BF16, 128);
  EXPECT_EQ(bf16.steps, 2);
  EXPECT_EQ(bf16.passes, 2);
  EXPECT_GT(2 * DecodeMmaSharedBytes(128, bf16), 228 * 1024);
  for (DType dt : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (int64_t d : {64, 128, 256}) {
      if (dt == v1::DTYPE_BF16 && d == 128) continue;
      EXPECT_EQ(DefaultDecodeMmaRing(dt, d).steps, 1) << d;
      EXPECT_EQ(DefaultDecodeMmaRing(dt, d).passes, 3) << d;
    }
  }
}

TEST(AttentionPlan, DecodeSplitsFillOneWave) {
  // 396 resident blocks (3 per SM on 132 SMs): B8 KV8 has 64 blocks per split.
  EXPECT_EQ(DecodeSplits(8, 8, 1, 8192, 32, 396), 6);
  // B1 H32: 32 blocks per split.
  EXPECT_EQ(DecodeSplits(1, 32, 1, 32768, 32, 660), 20);
  // More blocks than the device holds: no split.
  EXPECT_EQ(DecodeSplits(64, 32, 1, 4096, 32, 396), 1);
  // Each split keeps at least one pass of keys.
  EXPECT_EQ(DecodeSplits(1, 1, 1, 300, 32, 660), (300 + 31) / 32);
  EXPECT_EQ(DecodeSplits(1, 1, 1, 10, 32, 660), 1);
}

TEST(AttentionPlan, DecodeCostPrefersTheSplitKernelOnLongCaches) {
  DeviceCaps caps = H100();
  caps.memory_clock_khz = 2619000;
  caps.bus_width_bits = 5120;
  // The benchmark's decode cases: cuDNN reads at ~1.8 and ~1.0 TB/s there.
  DecodeCost c = EstimateDecodeCost(8, 32, 8, 1, 8192, 128, 128, 2, caps);
  EXPECT_LT(c.own_us, c.cudnn_us);
  EXPECT_NEAR(c.cudnn_us, 2 + 268.4e6 / 1826e9 * 1e6, 2.0);
  c = EstimateDecodeCost(1, 32, 32, 1, 32768, 128, 128, 2, caps);
  EXPECT_LT(c.own_us, c.cudnn_us);
  EXPECT_NEAR(c.cudnn_us, 2 + 536.9e6 / 997e9 * 1e6, 5.0);
  // A short cache over many heads is launch-bound: cuDNN's one launch wins
  // (the split kernel's combine, now in its last blocks, still a serial tail).
  c = EstimateDecodeCost(8, 32, 8, 1, 256, 128, 128, 2, caps);
  EXPECT_GT(c.own_us, c.cudnn_us);
  // Without the DRAM figures the H100's bandwidth is assumed.
  const DecodeCost h100 = EstimateDecodeCost(1, 32, 32, 1, 32768, 128, 128, 2, H100());
  EXPECT_NEAR(h100.own_us, EstimateDecodeCost(1, 32, 32, 1, 32768, 128, 128, 2, caps).own_us,
              1.0);
}

}  // namespace
}  // namespace kiln::cuda
