// Which attention kernel serves a shape on a CUDA device (kernels_attention.cc):
// host-side, so it is tested without a GPU.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_device.h"
#include "base/dtype.h"

namespace kiln::cuda {

struct AttentionPath {
  enum Kind {
    kRows,   // nvrtc:attention_rows_<dt>: a warp per query row
    kFlash,  // kiln:flash_attn_fwd_<dt>: tensor cores, f16/bf16, D == Dv in {64, 128}
    kSplit,  // nvrtc:attention_decode_split<n>_<dt>: split-K over the keys, then a combine
  };
  Kind kind = kRows;
  int64_t splits = 1;  // kSplit: key ranges per query row
};

// Decoding shapes (Sq <= 8 query rows over Sk >= 256 keys) split the keys;
// f16/bf16 with D == Dv in {64, 128} take the tensor-core kernel when its
// shared memory and grid fit `caps`; everything else the row kernel.
AttentionPath PlanAttentionPath(DType dtype, int64_t B, int64_t Hq, int64_t Sq, int64_t Sk,
                                int64_t D, int64_t Dv, const DeviceCaps& caps);

// Dynamic shared memory of the tensor-core kernel for head dim D (Q, K and V
// tiles of 64 x (D + 8) halves).
int64_t FlashSharedBytes(int64_t head_dim);

}  // namespace kiln::cuda
