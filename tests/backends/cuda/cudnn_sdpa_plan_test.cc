// Which attention shapes go to cuDNN's fused attention and the key its plans
// are cached under (no GPU, no cuDNN needed): f16/bf16 with no mask or a
// causal one, head dims multiples of 8, GQA, decoding; everything else (other
// masks, softcap, f32, odd head dims, causal with more queries than keys)
// falls back to Kiln's kernels.
#include "backends/cuda/cudnn_sdpa_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "backends/cuda/cudnn_api.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::cuda {
namespace {

constexpr size_t k914 = 91400;

SdpaShape Shape(DType dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D,
                int mask) {
  SdpaShape s;
  s.dtype = dt;
  s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Sq = Sq, s.Sk = Sk, s.D = D, s.Dv = D;
  s.mask = mask;
  return s;
}

TEST(CudnnSdpaPlan, ServesHalfTypesWithoutMaskOrCausal) {
  for (DType dt : {v1::DTYPE_BF16, v1::DTYPE_F16}) {
    for (int mask : {v1::MASK_NONE, v1::MASK_BIDIRECTIONAL, v1::MASK_CAUSAL}) {
      for (int64_t d : {64, 128, 96, 8, 256}) {
        EXPECT_TRUE(CudnnSdpaServes(Shape(dt, 4, 32, 32, 2048, 2048, d, mask), 9, 0, k914).ok())
            << d;
      }
      // S not a multiple of 64 / 128, GQA and MQA, causal with fewer queries than keys.
      EXPECT_TRUE(CudnnSdpaServes(Shape(dt, 2, 4, 2, 100, 150, 64, mask), 9, 0, k914).ok());
      EXPECT_TRUE(CudnnSdpaServes(Shape(dt, 2, 8, 1, 65, 129, 128, mask), 9, 0, k914).ok());
    }
  }
}

TEST(CudnnSdpaPlan, FallsBackWhereCudnnCannotExpressTheCase) {
  const auto refused = [](const SdpaShape& s, int cc = 9, size_t version = k914) {
    const absl::Status st = CudnnSdpaServes(s, cc, 0, version);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
    EXPECT_TRUE(absl::StartsWith(st.message(), "cudnn sdpa: ")) << st;
    return !st.ok();
  };
  const SdpaShape base = Shape(v1::DTYPE_BF16, 2, 4, 2, 100, 150, 64, v1::MASK_NONE);
  for (int mask : {v1::MASK_PREFIX, v1::MASK_SLIDING_WINDOW, v1::MASK_CUSTOM, v1::MASK_BIAS}) {
    SdpaShape s = base;
    s.mask = mask;
    EXPECT_TRUE(refused(s)) << mask;
  }
  SdpaShape s = base;
  s.softcap = 30;
  EXPECT_TRUE(refused(s));
  s = base;
  s.dtype = v1::DTYPE_F32;
  EXPECT_TRUE(refused(s));
  for (int64_t d : {60, 264}) {  // not a multiple of 8; past 256
    s = base;
    s.D = s.Dv = d;
    EXPECT_TRUE(refused(s)) << d;
  }
  s = base;
  s.D = s.Dv = 192;  // served on sm_90 (256), not on sm_80 (128)
  EXPECT_TRUE(CudnnSdpaServes(s, 9, 0, k914).ok());
  EXPECT_TRUE(refused(s, 8));
  s = base;
  s.Dv = 72;  // D != Dv is fine when both are multiples of 8
  EXPECT_TRUE(CudnnSdpaServes(s, 9, 0, k914).ok());
  s = base;
  s.mask = v1::MASK_CAUSAL;
  s.Sq = 200, s.Sk = 150;  // rows with no key under the end-aligned causal mask
  EXPECT_TRUE(refused(s));
  s = base;
  s.Hq = 6, s.Hkv = 4;
  EXPECT_TRUE(refused(s));
  s = base;
  s.Sq = s.Sk = 1;
  EXPECT_TRUE(refused(s));
  EXPECT_TRUE(refused(base, 7));         // Turing
  EXPECT_TRUE(refused(base, 9, 80906));  // cuDNN 8
  s = base;
  s.B = 0;
  EXPECT_TRUE(refused(s));
}

TEST(CudnnSdpaPlan, ServesDecodingAndLongSequences) {
  // One query row over a long cache (GQA), and S 4096 whose score matrix has
  // 2^31 elements (never stored, so no limit) while the operands fit 32 bits.
  EXPECT_TRUE(
      CudnnSdpaServes(Shape(v1::DTYPE_BF16, 8, 32, 8, 1, 8192, 128, v1::MASK_CAUSAL), 9, 0, k914)
          .ok());
  EXPECT_TRUE(
      CudnnSdpaServes(Shape(v1::DTYPE_BF16, 4, 32, 32, 4096, 4096, 128, v1::MASK_NONE), 9, 0, k914)
          .ok());
  EXPECT_FALSE(
      CudnnSdpaServes(Shape(v1::DTYPE_BF16, 64, 64, 64, 4096, 4096, 128, v1::MASK_NONE), 9, 0, k914)
          .ok());
}

TEST(CudnnSdpaPlan, KeyNamesEveryComponentAndSeparatesWhatDiffers) {
  const SdpaShape base = Shape(v1::DTYPE_BF16, 4, 32, 8, 2048, 2048, 128, v1::MASK_CAUSAL);
  const std::string key = CudnnSdpaKey(base, k914);
  EXPECT_EQ(key,
            "cudnn_sdpa_fwd;graph=1;cudnn=91400;dtype=bf16;b=4;hq=32;hkv=8;sq=2048;sk=2048;d=128;"
            "dv=128;q_strides=8388608,262144,128,1;k_strides=2097152,262144,128,1;"
            "v_strides=2097152,262144,128,1;o_strides=8388608,262144,128,1;mask=MASK_CAUSAL;"
            "shift=0");
  std::set<std::string> keys = {key};
  auto differs = [&](SdpaShape s, size_t version = k914) {
    EXPECT_TRUE(keys.insert(CudnnSdpaKey(s, version)).second) << CudnnSdpaKey(s, version);
  };
  differs(base, 91900);
  SdpaShape s = base;
  s.dtype = v1::DTYPE_F16;
  differs(s);
  s = base;
  s.mask = v1::MASK_NONE;
  differs(s);
  s = base;
  s.Sq = 1024;  // also moves the causal diagonal: shift=1024
  differs(s);
  EXPECT_TRUE(absl::StrContains(CudnnSdpaKey(s, k914), ";shift=1024")) << CudnnSdpaKey(s, k914);
  for (int64_t SdpaShape::*dim : {&SdpaShape::B, &SdpaShape::Hq, &SdpaShape::Hkv, &SdpaShape::Sk,
                                  &SdpaShape::D, &SdpaShape::Dv}) {
    s = base;
    s.*dim *= 2;
    differs(s);
  }
  // The scale is a value passed at execution, not part of the plan.
  EXPECT_EQ(CudnnSdpaKey(base, k914), key);
}

TEST(CudnnSdpaPlan, KilnCudnnOffSwitch) {
  EXPECT_FALSE(CudnnDisabledBy(nullptr));
  EXPECT_FALSE(CudnnDisabledBy("1"));
  EXPECT_FALSE(CudnnDisabledBy(""));
  for (const char* off : {"0", "off", "OFF", "false", "no"}) {
    EXPECT_TRUE(CudnnDisabledBy(off)) << off;
  }
  EXPECT_EQ(CudnnVersionText(91400), "9.14.0");
  EXPECT_EQ(CudnnVersionText(91901), "9.19.1");
}

}  // namespace
}  // namespace kiln::cuda
