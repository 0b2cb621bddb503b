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
    kTiled,  // nvrtc:flash_attn_simt_f32: f32 query tiles on the SIMT units, D == Dv in {64, 128}
  };
  Kind kind = kRows;
  int64_t splits = 1;  // kSplit: key ranges per query row
};

// Decoding shapes (Sq <= 8 query rows over Sk >= 256 keys) split the keys;
// f16/bf16 with D == Dv in {64, 128} take the tensor-core kernel and f32 with
// D == Dv in {64, 128} the tiled SIMT kernel when their shared memory and
// grid fit `caps`; everything else the row kernel.
AttentionPath PlanAttentionPath(DType dtype, int64_t B, int64_t Hq, int64_t Sq, int64_t Sk,
                                int64_t D, int64_t Dv, const DeviceCaps& caps);

// Dynamic shared memory of the tensor-core kernel for head dim D (Q, K and V
// tiles of 64 x (D + 8) halves).
int64_t FlashSharedBytes(int64_t head_dim);

// Dynamic shared memory of the tiled f32 kernel for head dim D (Q 32 x (D + 4),
// K and V 64 x (D + 4), P 32 x 68 floats).
int64_t TiledSharedBytes(int64_t head_dim);

}  // namespace kiln::cuda
