// Which attention kernel serves a shape on a CUDA device (kernels_attention.cc):
// host-side, so it is tested without a GPU.
#pragma once

#include <cstdint>
#include <string>

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

// The 16-byte decode kernel (kernels/attention.cu, attention_decode16): a
// block of kDecodeWarps warps per (batch, kv head, key split, row tile), the
// row tile being R query rows that read the kv head (R in {1, 2, 4, 8}).
constexpr int kDecodeWarps = 4;

// R for `group_rows` = (Hq / Hkv) * Sq rows per kv head: the smallest power
// of two that holds them, at most 8 (more rows take several tiles).
int DecodeRowsPerBlock(int64_t group_rows);

// The 16-byte decode kernel's load ring (kernels/attention_decode.cu): each
// warp's K/V pieces travel by cp.async `steps` per pass, `passes` passes per
// ring (passes - 1 in flight); `min_blocks` is the blocks per SM its
// __launch_bounds__ asks the register allocation for. The defaults are the
// kernel's; KILN_DECODE_RING=<steps>x<passes>[x<min_blocks>] overrides them
// for a benchmark's sweep.
struct DecodeRing {
  int steps = 4, passes = 3, min_blocks = 1;
};
inline constexpr DecodeRing kDefaultDecodeRing{};

// The source of the 16-byte decode kernel for f16 or bf16 `dtype`, head dim
// D in {64, 128, 256} and R rows per block: kernels/attention_decode.cu and
// one instantiation, entry point kiln_attention_decode16_<dt>_d<D>_r<R>
// (and kiln_decode_counters_zero); a ring other than the default is defined
// ahead of the source.
std::string DecodeAttentionSource(DType dtype, int64_t head_dim, int rows_per_block,
                                  DecodeRing ring = kDefaultDecodeRing);

// The keys one pass of the block's warps takes (kDecodeWarps x keys per warp
// step x steps per pass), for head dim D and R rows per block.
int64_t DecodeKeysPerPass(int64_t head_dim, int rows_per_block,
                          DecodeRing ring = kDefaultDecodeRing);

// Key splits for the 16-byte decode kernel: as many as fill the device's
// `resident_blocks` (blocks of the kernel resident at once, all SMs) in one
// wave with B * Hkv * tiles blocks per split, at least 1, and no more than
// leaves each split one pass of `keys_per_pass` of the `keys` a row sees.
int64_t DecodeSplits(int64_t B, int64_t Hkv, int64_t tiles, int64_t keys, int64_t keys_per_pass,
                     int64_t resident_blocks);

// Estimated time of a decoding shape (Sq <= 8, f16/bf16) on the two paths that
// serve it, from the bytes of K and V (read once by either) and each path's
// bandwidth measured on the H100 (docs/cuda.md, "Single-row decode
// attention"), scaled to the device's DRAM bandwidth: Kiln's 16-byte split-K
// kernel (one launch whose last block per row tile combines the splits, a
// serial tail costed as the second launch it replaced) reaches a fixed
// fraction of the DRAM bandwidth whatever B and H (the splits fill the
// device); cuDNN's fused kernel parallelises over query heads and query tiles
// only, so its bandwidth grows with B * Hq * ceil(Sq / 64) until it saturates.
struct DecodeCost {
  double own_us = 0, cudnn_us = 0;
};
DecodeCost EstimateDecodeCost(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk,
                              int64_t D, int64_t Dv, int64_t element_bytes,
                              const DeviceCaps& caps);

// The tensor-core decode kernel (kernels/attention_decode.cu,
// attention_decode_mma): a block of kDecodeWarps warps per (batch, kv head,
// key split, row tile) with kDecodeMmaRows query rows per tile (the N of its
// mma.sync tiles), K/V through a cp.async ring of `steps` x 16 keys per pass
// and `passes` passes per warp in dynamic shared memory. It serves the
// decoding shapes the 16-byte kernel does whose kv head is read by at least
// kDecodeMmaMinRows query rows (GQA groups x query rows; DecodeUsesMma);
// KILN_DECODE_MMA=0 keeps the 16-byte kernel everywhere, =1 takes the
// tensor-core kernel for one row too (a benchmark's comparisons).
constexpr int kDecodeMmaRows = 8;
constexpr int64_t kDecodeMmaMinRows = 2;
// The kernel source's own ring (no defines): 1 x 3, 102 KiB at D 128 (two
// blocks per SM), 198 KiB at D 256.
inline constexpr DecodeRing kDefaultDecodeMmaRing{1, 3, 1};

// The ring a prepare uses for `dtype` and head dim D: 2 x 2 (32 keys per
// pass, 136 KiB, one block per SM, so the splits make ~1 block per SM) for
// bf16 at D 128, the one variant an H100 ran at 2 x 2 (attention_fwd's GQA
// cases, checked against the f64 reference: 0.1021 ms against 0.1053 at
// 1 x 3, docs/benchmarks.md "gqa8"); kDefaultDecodeMmaRing, which the GPU
// tests ran at every dtype and head dim, elsewhere.
DecodeRing DefaultDecodeMmaRing(DType dtype, int64_t head_dim);

// KILN_DECODE_MMA's setting: unset (the rule), 0 or 1.
enum class DecodeMmaMode { kAuto, kOff, kOn };

// Whether `group_rows` = (Hq / Hkv) * Sq rows per kv head take the
// tensor-core decode kernel under `mode`.
bool DecodeUsesMma(int64_t group_rows, DecodeMmaMode mode = DecodeMmaMode::kAuto);

// The source of the tensor-core decode kernel for f16 or bf16 `dtype` and
// head dim D in {64, 128, 256}: kernels/attention_decode.cu and one
// instantiation, entry point kiln_attention_decode_mma_<dt>_d<D> (and
// kiln_decode_counters_zero); a ring other than the default is defined
// ahead of the source.
std::string DecodeMmaAttentionSource(DType dtype, int64_t head_dim,
                                     DecodeRing ring = kDefaultDecodeMmaRing);

// Its dynamic shared memory: the warps' rings, or the warps' merge area if
// larger.
int64_t DecodeMmaSharedBytes(int64_t head_dim, DecodeRing ring = kDefaultDecodeMmaRing);

// The keys one pass of its block's warps takes.
int64_t DecodeMmaKeysPerPass(DecodeRing ring = kDefaultDecodeMmaRing);

// Dynamic shared memory of the tensor-core kernel for head dim D (Q, K and V
// tiles of 64 x (D + 8) halves).
int64_t FlashSharedBytes(int64_t head_dim);

// Dynamic shared memory of the tiled f32 kernel for head dim D (Q 32 x (D + 4),
// K and V 64 x (D + 4), P 32 x 68 floats).
int64_t TiledSharedBytes(int64_t head_dim);

}  // namespace kiln::cuda
