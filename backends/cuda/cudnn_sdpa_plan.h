// Which attention shapes cuDNN's fused flash-attention forward serves on a
// CUDA device, and the key its execution plans are cached under
// (cudnn_sdpa.h). Host-side only, so it is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "base/dtype.h"

namespace kiln::cuda {

// One attention forward as cuDNN sees it: dense row-major operands
// Q [B, Hq, Sq, D], K [B, Hkv, Sk, D], V [B, Hkv, Sk, Dv], O [B, Hq, Sq, Dv].
struct SdpaShape {
  DType dtype = DType{};
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  int mask = 0;        // v1::MaskKind
  double softcap = 0;  // 0: none
};

// The revision of the op graph cudnn_sdpa.cc builds; part of every plan key.
inline constexpr int kCudnnSdpaGraphVersion = 1;

// OK when cuDNN's fused attention can serve `s` on a device of compute
// capability `cc_major`.`cc_minor` with cuDNN `cudnn_version` (91400 for
// 9.14.0); otherwise UNIMPLEMENTED saying why, and Kiln's own kernels serve
// the shape. cuDNN serves f16/bf16, no mask (NONE, BIDIRECTIONAL) or a causal mask (aligned to the
// end of the keys, as Kiln's kernels align it, with Sq <= Sk so every query
// row sees a key), no softcap, head dims that are multiples of 8 up to 128
// (256 on sm_90), GQA/MQA (Hq a multiple of Hkv), on sm_80 and newer, and not
// Sq == Sk == 1. Every shape it serves goes to cuDNN: it was faster than
// Kiln's kernels on every shape measured, decoding included (docs/cuda.md,
// "cuDNN attention").
absl::Status CudnnSdpaServes(const SdpaShape& s, int cc_major, int cc_minor, size_t cudnn_version);

// The plan-cache key: the ordered, named components {graph version, cuDNN
// version, dtype, B, Hq, Hkv, Sq, Sk, D, Dv, the four operands' strides,
// mask, causal shift}, e.g.
// "cudnn_sdpa_fwd;graph=1;cudnn=91400;dtype=bf16;b=4;hq=32;...".
std::string CudnnSdpaKey(const SdpaShape& s, size_t cudnn_version);

}  // namespace kiln::cuda
