// Attention: every MaskKind, scale, softcap, additive bias with broadcast,
// custom boolean masks, GQA/MQA; f32, f16 and bf16 with head dims up to 256.
// Three paths, chosen per shape at prepare (PlanAttentionPath):
// - kiln:flash_attn_fwd_{f16,bf16} (kernels/flash_attention.cu): tensor
//   cores (mma.sync m16n8k16), 64-row query tiles, for f16/bf16 with
//   D == Dv in {64, 128};
// - nvrtc:attention_decode_split_<dt> (kernels/attention.cu): few query
//   rows over many keys (decoding, Sq <= 8 and Sk >= 256): split-K over the
//   keys, a warp per (row, split) into f32 partials the kernel owns, then a
//   combine kernel; for f16/bf16 at D == Dv in {64, 128, 256} without a
//   custom mask or bias, nvrtc:attention_decode16_split<n>_r<R>_<dt>
//   (kernels/attention_decode.cu): a block per (batch, kv head, split)
//   reading K/V once for the R query rows of the kv head, 16-byte pieces
//   through a cp.async ring, the splits filling one wave of the device, the
//   combine done by the last block of each row tile (one launch); where two
//   or more query rows read each kv head (GQA groups),
//   nvrtc:attention_decode_mma_split<n>_<dt> instead: the same blocks and
//   combine with q.k and p.v on the tensor cores (mma.sync, 8-row tiles);
// - nvrtc:flash_attn_simt_f32 (kernels/attention_tiled.cu): f32 with
//   D == Dv in {64, 128}: 32-row query tiles, register-tiled S and P V on the
//   SIMT units, online softmax;
// - nvrtc:attention_rows_<dt>: a warp per query row, everything else.
// Where cuDNN is present and serves the shape (cudnn_sdpa_plan.h: f16/bf16,
// no mask or causal, no softcap, head dims multiples of 8), and its plan
// finalizes, cudnn:sdpa_fwd_<dt> (cudnn_sdpa.h) runs it instead, with the
// kernel above kept for operands that are not 16-byte aligned; except on the
// decoding shapes the 16-byte decode kernel serves, where EstimateDecodeCost
// (attention_plan.h) picks the path expected faster.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/cuda/attention_plan.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/cudnn_sdpa.h"
#include "backends/cuda/loaded_libraries.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

using backend::Claim;
using backend::KernelSpec;

static_assert(v1::MASK_CAUSAL == 1 && v1::MASK_PREFIX == 2 && v1::MASK_SLIDING_WINDOW == 4 &&
                  v1::MASK_CUSTOM == 5 && v1::MASK_BIAS == 6,
              "kernels/attention.cu numbers the mask kinds as graph.proto does");

constexpr int64_t kMaxHeadDim = 256;
constexpr int kFlashTile = 64;      // flash_attention.cu's BM and BN
constexpr int kFlashThreads = 128;  // its 4 warps
constexpr int kTiledRows = 32;      // attention_tiled.cu's BM, BN and threads
constexpr int kTiledKeys = 64;
constexpr int kTiledThreads = 128;

// attention.cu's parameter block (passed by value).
struct AttnParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  int64_t mask = 0, prefix = 0, window = 0, mask_per_query = 0;
  int64_t bias_stride[4] = {};
  float scale = 1, softcap = 0;
};

absl::StatusOr<AttnParams> PlanAttention(const KernelSpec& spec) {
  const auto& a = spec.attrs.attention();
  if (!v1::MaskKind_IsValid(a.mask())) return absl::InvalidArgumentError("unknown mask kind");
  const bool operand = a.mask() == v1::MASK_CUSTOM || a.mask() == v1::MASK_BIAS;
  if (spec.inputs.size() != (operand ? 4u : 3u) || spec.outputs.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("mask ", v1::MaskKind_Name(a.mask()), " takes ",
                                                   operand ? 4 : 3, " operands"));
  }
  const DType dt = spec.inputs[0].dtype;
  for (int i = 0; i < 3; ++i) {
    if (spec.inputs[i].rank() != 4) return absl::InvalidArgumentError("q, k, v must be rank 4");
    if (spec.inputs[i].dtype != dt) return absl::InvalidArgumentError("q, k, v dtypes differ");
  }
  const Dims& q = spec.inputs[0].dims;
  const Dims& k = spec.inputs[1].dims;
  const Dims& v = spec.inputs[2].dims;
  AttnParams p;
  p.B = q[0], p.Hq = q[1], p.Sq = q[2], p.D = q[3];
  p.Hkv = k[1], p.Sk = k[2], p.Dv = v[3];
  if (k[0] != p.B || v[0] != p.B || v[1] != p.Hkv || v[2] != p.Sk || k[3] != p.D) {
    return absl::InvalidArgumentError("q, k, v shapes disagree");
  }
  if (p.Hq > 0 && (p.Hkv == 0 || p.Hq % p.Hkv != 0)) {
    return absl::InvalidArgumentError("query heads must be a multiple of kv heads");
  }
  if (spec.outputs[0].dtype != dt || spec.outputs[0].dims != Dims{p.B, p.Hq, p.Sq, p.Dv}) {
    return absl::InvalidArgumentError("result must be [B, Hq, Sq, Dv] of q's dtype");
  }
  p.scale = static_cast<float>(a.has_scale() ? a.scale() : p.D > 0 ? 1.0 / std::sqrt(p.D) : 1.0);
  p.softcap = static_cast<float>(a.softcap());
  p.mask = a.mask();
  p.prefix = a.prefix();
  p.window = a.window();
  if (a.mask() == v1::MASK_SLIDING_WINDOW && p.window <= 0) {
    return absl::InvalidArgumentError("window must be positive");
  }
  if (a.mask() == v1::MASK_CUSTOM) {
    const backend::TensorDesc& m = spec.inputs[3];
    if (m.dtype != v1::DTYPE_BOOL) return absl::InvalidArgumentError("custom mask must be bool");
    p.mask_per_query = m.rank() == 3;
    const bool ok = (m.rank() == 2 && m.dims == Dims{p.B, p.Sk}) ||
                    (m.rank() == 3 && m.dims == Dims{p.B, p.Sq, p.Sk});
    if (!ok) return absl::InvalidArgumentError("custom mask must be [B, Sk] or [B, Sq, Sk]");
  }
  if (a.mask() == v1::MASK_BIAS) {
    const backend::TensorDesc& m = spec.inputs[3];
    if (m.dtype != dt) return absl::InvalidArgumentError("bias dtype must match q");
    if (m.rank() > 4) return absl::InvalidArgumentError("bias rank exceeds 4");
    const int64_t full[4] = {p.B, p.Hq, p.Sq, p.Sk};
    int64_t stride = 1;
    for (int i = 3, j = static_cast<int>(m.rank()) - 1; i >= 0; --i, --j) {
      const int64_t size = j >= 0 ? m.dims[j] : 1;
      if (size != full[i] && size != 1) {
        return absl::InvalidArgumentError("bias does not broadcast to [B, Hq, Sq, Sk]");
      }
      p.bias_stride[i] = size == 1 ? 0 : stride;
      stride *= size;
    }
  }
  return p;
}

// flash_attention.cu's parameter block (D is the kernel's template).
struct FlashParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0;
  int64_t mask = 0, prefix = 0, window = 0, mask_per_query = 0;
  int64_t bias_stride[4] = {};
  float scale = 1, softcap = 0;
};

FlashParams ToFlash(const AttnParams& a) {
  FlashParams f;
  f.B = a.B, f.Hq = a.Hq, f.Hkv = a.Hkv, f.Sq = a.Sq, f.Sk = a.Sk;
  f.mask = a.mask, f.prefix = a.prefix, f.window = a.window, f.mask_per_query = a.mask_per_query;
  for (int i = 0; i < 4; ++i) f.bias_stride[i] = a.bias_stride[i];
  f.scale = a.scale, f.softcap = a.softcap;
  return f;
}

// attention_tiled.cu's parameter block.
struct TiledParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0;
  int64_t mask = 0, prefix = 0, window = 0, mask_per_query = 0;
  int64_t bias_stride[4] = {};
  int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, o_stride[3] = {};
  float scale = 1, softcap = 0;
};

// Strides of batch, head and row of a dense [B, H, S, D] operand (the kernel
// takes any strides with D contiguous: [B, S, H, D] operands need no copy).
void DenseStrides(int64_t H, int64_t S, int64_t D, int64_t (&stride)[3]) {
  stride[2] = D;
  stride[1] = S * D;
  stride[0] = H * S * D;
}

TiledParams ToTiled(const AttnParams& a) {
  TiledParams t;
  t.B = a.B, t.Hq = a.Hq, t.Hkv = a.Hkv, t.Sq = a.Sq, t.Sk = a.Sk;
  t.mask = a.mask, t.prefix = a.prefix, t.window = a.window, t.mask_per_query = a.mask_per_query;
  for (int i = 0; i < 4; ++i) t.bias_stride[i] = a.bias_stride[i];
  DenseStrides(a.Hq, a.Sq, a.D, t.q_stride);
  DenseStrides(a.Hkv, a.Sk, a.D, t.k_stride);
  DenseStrides(a.Hkv, a.Sk, a.Dv, t.v_stride);
  DenseStrides(a.Hq, a.Sq, a.Dv, t.o_stride);
  t.scale = a.scale, t.softcap = a.softcap;
  return t;
}

// The split path's 16-byte kernel serves f16/bf16 with D == Dv in {64, 128,
// 256} and no custom mask or bias (attention_decode16 reads neither).
bool DecodeVectorized(DType dtype, const AttnParams& p) {
  const bool half = dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16;
  return half && p.D == p.Dv && (p.D == 64 || p.D == 128 || p.D == 256) &&
         p.mask != v1::MASK_CUSTOM && p.mask != v1::MASK_BIAS;
}

}  // namespace

AttentionPath PlanAttentionPath(DType dtype, int64_t B, int64_t Hq, int64_t Sq, int64_t Sk,
                                int64_t D, int64_t Dv, const DeviceCaps& caps) {
  AttentionPath path;
  const int64_t rows = B * Hq * Sq;
  if (rows > 0 && Sq <= 8 && Sk >= 256) {
    // Enough warps to cover the device a few times over, each with at
    // least 32 keys.
    const int64_t target = int64_t{std::max(caps.sm_count, 1)} * 64;
    const int64_t most = std::min<int64_t>(256, (Sk + 31) / 32);
    path.kind = AttentionPath::kSplit;
    path.splits = std::clamp<int64_t>((target + rows - 1) / rows, 1, most);
    return path;
  }
  const bool half = dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16;
  const int64_t tiles = (Sq + kFlashTile - 1) / kFlashTile;
  if (half && D == Dv && (D == 64 || D == 128) && rows > 0 &&
      FlashSharedBytes(D) <= caps.max_shared_per_block_optin &&
      tiles <= caps.max_grid_x / std::max<int64_t>(B * Hq, 1)) {
    path.kind = AttentionPath::kFlash;
  }
  const int64_t row_tiles = (Sq + kTiledRows - 1) / kTiledRows;
  if (dtype == v1::DTYPE_F32 && D == Dv && (D == 64 || D == 128) && rows > 0 &&
      TiledSharedBytes(D) <= caps.max_shared_per_block_optin &&
      row_tiles <= caps.max_grid_x / std::max<int64_t>(B * Hq, 1)) {
    path.kind = AttentionPath::kTiled;
  }
  return path;
}

int DecodeRowsPerBlock(int64_t group_rows) {
  int r = 1;
  while (r < 8 && r < group_rows) r *= 2;
  return r;
}

int64_t DecodeKeysPerPass(int64_t head_dim, int rows_per_block, DecodeRing ring) {
  const int64_t keys_per_step = std::max<int64_t>(1, 256 / std::max<int64_t>(head_dim, 1));
  (void)rows_per_block;
  return kDecodeWarps * keys_per_step * ring.steps;
}

int64_t DecodeSplits(int64_t B, int64_t Hkv, int64_t tiles, int64_t keys, int64_t keys_per_pass,
                     int64_t resident_blocks) {
  const int64_t per_split = std::max<int64_t>(B * Hkv * tiles, 1);
  const int64_t most = std::max<int64_t>(1, (keys + keys_per_pass - 1) / std::max<int64_t>(keys_per_pass, 1));
  return std::clamp<int64_t>(resident_blocks / per_split, 1, most);
}

DecodeCost EstimateDecodeCost(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk,
                              int64_t D, int64_t Dv, int64_t element_bytes,
                              const DeviceCaps& caps) {
  // H100 SXM (3.35 TB/s DRAM), bf16, D 128, 2026-12-07: cuDNN 9.14 read K and V
  // at 997 GB/s over 32 query heads (B1 H32 Sk 32768) and 1,826 GB/s over 256
  // (B8 H32 KV8 Sk 8192): ~31 GB/s per (batch, head) CTA up to ~1.83 TB/s.
  // The 16-byte kernel read them at 2,422 GB/s (GQA, R = 4 rows per block) and
  // 2,732 GB/s (R = 1) in the same run (docs/benchmarks.md, "dec8"): the lower
  // share of DRAM bandwidth, 0.72, is kKilnDecodeFraction.
  constexpr double kH100Bytes = 3.35e12;
  constexpr double kCudnnPeakFraction = 1826e9 / kH100Bytes;
  constexpr double kCudnnPerCtaFraction = 997e9 / 32 / kH100Bytes;
  constexpr double kKilnDecodeFraction = 2422e9 / kH100Bytes;
  constexpr double kLaunchUs = 2.0;  // a kernel launch's share of a stream's time
  // Kiln's kernel is one launch since the combine moved into its last blocks,
  // but that combine is still a serial tail (after every split, a dependent
  // read of all the splits' records): counted as the second launch it was,
  // until a GPU times the fused kernel on a short cache.
  double dram = 2.0 * caps.memory_clock_khz * 1e3 * caps.bus_width_bits / 8;
  if (dram <= 0) dram = kH100Bytes;
  const double bytes = static_cast<double>(B * Hkv * Sk * (D + Dv) * element_bytes);
  const double ctas = static_cast<double>(B * Hq * ((Sq + 63) / 64));
  DecodeCost c;
  c.own_us = 2 * kLaunchUs + bytes / (kKilnDecodeFraction * dram) * 1e6;
  const double cudnn_bw =
      std::max(1.0, std::min(kCudnnPeakFraction, ctas * kCudnnPerCtaFraction) * dram);
  c.cudnn_us = kLaunchUs + bytes / cudnn_bw * 1e6;
  return c;
}

std::string DecodeAttentionSource(DType dtype, int64_t head_dim, int rows_per_block,
                                  DecodeRing ring) {
  const std::string dt = DTypeSuffix(dtype);
  std::string defines;
  if (ring.steps != kDefaultDecodeRing.steps || ring.passes != kDefaultDecodeRing.passes ||
      ring.min_blocks != kDefaultDecodeRing.min_blocks) {
    defines = absl::StrCat("#define KILN_DECODE_U ", ring.steps, "\n#define KILN_DECODE_P ",
                           ring.passes, "\n#define KILN_DECODE_MINB ", ring.min_blocks, "\n");
  }
  return absl::StrCat(defines, KernelSource("attention_decode.cu"), "\nKILN_ATTENTION_DECODE16(",
                      dt, ", ", dtype == v1::DTYPE_F16 ? "k_f16" : "k_bf16", ", ", head_dim, ", ",
                      rows_per_block, ")\n");
}

bool DecodeUsesMma(int64_t group_rows, DecodeMmaMode mode) {
  if (mode == DecodeMmaMode::kOff) return false;
  return group_rows >= (mode == DecodeMmaMode::kOn ? 1 : kDecodeMmaMinRows);
}

std::string DecodeMmaAttentionSource(DType dtype, int64_t head_dim, DecodeRing ring) {
  const std::string dt = DTypeSuffix(dtype);
  std::string defines;
  if (ring.steps != kDefaultDecodeMmaRing.steps || ring.passes != kDefaultDecodeMmaRing.passes ||
      ring.min_blocks != kDefaultDecodeMmaRing.min_blocks) {
    defines = absl::StrCat("#define KILN_DECODE_MMA_U ", ring.steps, "\n#define KILN_DECODE_MMA_P ",
                           ring.passes, "\n#define KILN_DECODE_MMA_MINB ", ring.min_blocks, "\n");
  }
  const bool f16 = dtype == v1::DTYPE_F16;
  return absl::StrCat(defines, KernelSource("attention_decode.cu"), "\nKILN_ATTENTION_DECODE_MMA(",
                      dt, ", ", f16 ? "k_f16" : "k_bf16", ", ", head_dim, ", ",
                      f16 ? "true" : "false", ")\n");
}

int64_t DecodeMmaSharedBytes(int64_t head_dim, DecodeRing ring) {
  // attention_decode_mma: per warp `passes` x (K and V: 16 x steps keys of
  // D + 8 halves); the merge: o [warps][rows][D], m and l [warps][rows] f32.
  const int64_t rings =
      int64_t{kDecodeWarps} * ring.passes * 2 * 16 * ring.steps * (head_dim + 8) * 2;
  const int64_t merge = (int64_t{kDecodeWarps} * kDecodeMmaRows * head_dim +
                         int64_t{2} * kDecodeWarps * kDecodeMmaRows) *
                        4;
  return std::max(rings, merge);
}

DecodeRing DefaultDecodeMmaRing(DType dtype, int64_t head_dim) {
  if (dtype == v1::DTYPE_BF16 && head_dim == 128) return DecodeRing{2, 2, 1};
  return kDefaultDecodeMmaRing;
}

int64_t DecodeMmaKeysPerPass(DecodeRing ring) { return int64_t{kDecodeWarps} * 16 * ring.steps; }

int64_t FlashSharedBytes(int64_t head_dim) {
  return int64_t{3} * kFlashTile * (head_dim + 8) * 2;
}

int64_t TiledSharedBytes(int64_t head_dim) {
  return (int64_t{kTiledRows} * (head_dim + 4) + int64_t{2} * kTiledKeys * (head_dim + 4) +
          int64_t{kTiledRows} * (kTiledKeys + 4)) *
         4;
}

namespace {

Claim SupportsAttention(const CudaDevice&, const KernelSpec& spec) {
  absl::StatusOr<AttnParams> p = PlanAttention(spec);
  if (!p.ok()) return Claim::No(absl::StrCat("cuda attention: ", p.status().message()));
  if (Claim c = FloatDType(spec.inputs[0].dtype, "attention"); !c.native) return c;
  if (p->D > kMaxHeadDim || p->Dv > kMaxHeadDim) {
    return Claim::No(absl::StrCat("cuda attention serves head dims up to ", kMaxHeadDim));
  }
  return Claim::Yes();
}

class AttentionKernel final : public CudaKernel {
 public:
  // Enqueue for the cuDNN kernel's fallback (resolved device addresses).
  absl::Status EnqueueOwn(CudaStream& s, std::span<const CUdeviceptr> in,
                          std::span<const CUdeviceptr> out) {
    return Enqueue(s, in, out);
  }

  // `vec`: the split path's 16-byte kernel (attention_decode16) or its
  // tensor-core kernel (attention_decode_mma), or none; launched when the
  // operands are 16-byte aligned, with `vec_splits` key splits, `vec_rows`
  // query rows per block and `vec_shared` bytes of dynamic shared memory;
  // `fast` otherwise. `zero`: its module's kiln_decode_counters_zero.
  AttentionKernel(CudaDevice& d, const KernelSpec& spec, AttentionPath path, LoadedFunction rows,
                  LoadedFunction fast, LoadedFunction combine, LoadedFunction vec,
                  LoadedFunction zero, int64_t vec_splits, int vec_rows, unsigned vec_shared,
                  AttnParams params, std::string impl)
      : CudaKernel(d, spec, std::move(impl)),
        path_(path),
        rows_(std::move(rows)),
        fast_(std::move(fast)),
        combine_(std::move(combine)),
        vec_(std::move(vec)),
        zero_(std::move(zero)),
        vec_splits_(vec_splits),
        vec_rows_(vec_rows),
        vec_shared_(vec_shared),
        params_(params) {}

  // Whether a 16-byte decode kernel (either) serves aligned operands.
  bool decode16() const { return vec_.fn != nullptr; }

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    CUdeviceptr q = in[0], k = in[1], v = in[2], extra = in.size() > 3 ? in[3] : 0, o = out[0];
    AttnParams p = params_;
    constexpr unsigned kWarps = 4;
    const int64_t rows = p.B * p.Hq * p.Sq;
    const bool aligned = ((q | k | v | o) & 15) == 0;
    if (path_.kind == AttentionPath::kFlash && aligned) {
      FlashParams f = ToFlash(p);
      void* args[] = {&q, &k, &v, &extra, &o, &f};
      const int64_t blocks = (p.Sq + kFlashTile - 1) / kFlashTile * p.B * p.Hq;
      return LaunchKernel(s, fast_.fn, static_cast<unsigned>(blocks), 1, 1, kFlashThreads,
                          static_cast<unsigned>(FlashSharedBytes(p.D)), args);
    }
    if (path_.kind == AttentionPath::kTiled) {
      TiledParams t = ToTiled(p);
      void* args[] = {&q, &k, &v, &extra, &o, &t};
      const int64_t blocks = (p.Sq + kTiledRows - 1) / kTiledRows * p.B * p.Hq;
      return LaunchKernel(s, fast_.fn, static_cast<unsigned>(blocks), 1, 1, kTiledThreads,
                          static_cast<unsigned>(TiledSharedBytes(p.D)), args);
    }
    if (path_.kind == AttentionPath::kSplit) {
      const bool vec = vec_.fn != nullptr && aligned;
      int64_t splits = vec ? vec_splits_ : path_.splits;
      if (partials_ == nullptr) {
        // Owned by the kernel (a run context's kernels run one launch at a
        // time), so the launch allocates nothing and a captured CUDA graph
        // replays it as is. Sized for either kernel's splits.
        const int64_t most = std::max(path_.splits, vec_splits_);
        KILN_ASSIGN_OR_RETURN(partials_, device_.Allocate(rows * most * (2 + p.Dv) * int64_t{4}));
      }
      CUdeviceptr part = static_cast<CudaBuffer*>(partials_.get())->ptr();
      if (vec) {
        // A block per (batch, kv head, split, row tile); blocks loop past the
        // grid's limit. The combine is the kernel's own (its last block per
        // (batch, kv head, row tile)), counted in `counters_`, zeroed once here
        // (stream-ordered before the first launch) and left at zero by every launch.
        const int64_t tiles = (p.Hq / p.Hkv * p.Sq + vec_rows_ - 1) / vec_rows_;
        if (counters_ == nullptr) {
          int64_t n = std::max<int64_t>(p.B * p.Hkv * tiles, 1);
          KILN_ASSIGN_OR_RETURN(counters_, device_.Allocate(n * int64_t{4}));
          CUdeviceptr c = static_cast<CudaBuffer*>(counters_.get())->ptr();
          void* zargs[] = {&c, &n};
          const int64_t zblocks = std::clamp<int64_t>((n + 255) / 256, 1, 1024);
          KILN_RETURN_IF_ERROR(
              LaunchKernel(s, zero_.fn, static_cast<unsigned>(zblocks), 1, 1, 256, 0, zargs));
        }
        CUdeviceptr counters = static_cast<CudaBuffer*>(counters_.get())->ptr();
        void* args[] = {&q, &k, &v, &extra, &part, &o, &counters, &p, &splits};
        const int64_t blocks =
            std::clamp<int64_t>(p.B * p.Hkv * splits * tiles, 1, device_.caps().max_grid_x);
        return LaunchKernel(s, vec_.fn, static_cast<unsigned>(blocks), 1, 1, 32 * kDecodeWarps,
                            vec_shared_, args);
      }
      void* args[] = {&q, &k, &v, &extra, &part, &p, &splits};
      const int64_t blocks =
          std::clamp<int64_t>((rows * splits + kWarps - 1) / kWarps, 1, device_.caps().max_grid_x);
      KILN_RETURN_IF_ERROR(
          LaunchKernel(s, fast_.fn, static_cast<unsigned>(blocks), 1, 1, 32 * kWarps, 0, args));
      void* cargs[] = {&part, &o, &p, &splits};
      const int64_t cblocks =
          std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, device_.caps().max_grid_x);
      return LaunchKernel(s, combine_.fn, static_cast<unsigned>(cblocks), 1, 1, 32 * kWarps, 0,
                          cargs);
    }
    void* args[] = {&q, &k, &v, &extra, &o, &p};
    const int64_t blocks =
        std::clamp<int64_t>((rows + kWarps - 1) / kWarps, 1, device_.caps().max_grid_x);
    return LaunchKernel(s, rows_.fn, static_cast<unsigned>(blocks), 1, 1, 32 * kWarps, 0, args);
  }

 private:
  const AttentionPath path_;
  LoadedFunction rows_, fast_, combine_, vec_, zero_;
  const int64_t vec_splits_;
  const int vec_rows_;
  const unsigned vec_shared_;
  AttnParams params_;
  std::unique_ptr<backend::Buffer> partials_;  // the split path's (m, l, o) records
  std::unique_ptr<backend::Buffer> counters_;  // the 16-byte kernel's splits done per row tile
};

// cudnn:sdpa_fwd_<dt>: cuDNN's fused attention (cudnn_sdpa.h) with a plan
// shared through the device's cache and a workspace of its own; operands
// that are not 16-byte aligned (the plan's promise) run Kiln's kernel.
class CudnnAttentionKernel final : public CudaKernel {
 public:
  CudnnAttentionKernel(CudaDevice& d, const KernelSpec& spec, CudnnContext& cudnn,
                       std::shared_ptr<const CudnnSdpaPlan> plan,
                       std::unique_ptr<backend::Buffer> workspace, float scale,
                       std::unique_ptr<AttentionKernel> own)
      : CudaKernel(d, spec, absl::StrCat("cudnn:sdpa_fwd_", DTypeSuffix(spec.inputs[0].dtype))),
        cudnn_(cudnn),
        plan_(std::move(plan)),
        workspace_(std::move(workspace)),
        scale_(scale),
        own_(std::move(own)) {}

 protected:
  absl::Status Enqueue(CudaStream& s, std::span<const CUdeviceptr> in,
                       std::span<const CUdeviceptr> out) override {
    if (((in[0] | in[1] | in[2] | out[0]) & 15) != 0) return own_->EnqueueOwn(s, in, out);
    const CUdeviceptr ws =
        workspace_ != nullptr ? static_cast<CudaBuffer*>(workspace_.get())->ptr() : 0;
    return cudnn_.ExecuteSdpa(*plan_, s.stream(), in[0], in[1], in[2], out[0], ws, scale_);
  }

 private:
  CudnnContext& cudnn_;
  const std::shared_ptr<const CudnnSdpaPlan> plan_;
  const std::unique_ptr<backend::Buffer> workspace_;
  const float scale_;
  const std::unique_ptr<AttentionKernel> own_;
};

// The cuDNN kernel for `spec` when the device has cuDNN, the shape is one it
// serves, and its plan finalizes; nullptr
// otherwise (the report names the kernel that runs). Errors only for device
// faults and failed allocations.
absl::StatusOr<std::unique_ptr<backend::Kernel>> MaybeCudnnAttention(
    CudaDevice& d, const KernelSpec& spec, const AttnParams& p,
    std::unique_ptr<AttentionKernel>& own, backend::PrepareContext& context) {
  if (d.cudnn_version() == 0) return nullptr;
  SdpaShape shape;
  shape.dtype = spec.inputs[0].dtype;
  shape.B = p.B, shape.Hq = p.Hq, shape.Hkv = p.Hkv, shape.Sq = p.Sq, shape.Sk = p.Sk;
  shape.D = p.D, shape.Dv = p.Dv;
  shape.mask = static_cast<int>(p.mask);
  shape.softcap = p.softcap;
  if (!CudnnSdpaServes(shape, d.caps().cc_major, d.caps().cc_minor, d.cudnn_version()).ok()) {
    return nullptr;
  }
  KILN_ASSIGN_OR_RETURN(CudnnContext * cudnn, d.cudnn_context());
  absl::StatusOr<std::shared_ptr<const CudnnSdpaPlan>> plan = cudnn->SdpaPlan(shape, &context);
  if (!plan.ok()) {
    if (backend::FaultedDevice(plan.status())) return plan.status();
    return nullptr;  // cuDNN refused the graph: Kiln's kernel serves it
  }
  std::unique_ptr<backend::Buffer> workspace;
  if ((*plan)->workspace_bytes() > 0) {
    KILN_ASSIGN_OR_RETURN(workspace, d.Allocate((*plan)->workspace_bytes()));
  }
  return std::unique_ptr<backend::Kernel>(std::make_unique<CudnnAttentionKernel>(
      d, spec, *cudnn, std::move(plan).value(), std::move(workspace), p.scale, std::move(own)));
}

absl::StatusOr<std::unique_ptr<AttentionKernel>> CreateOwnAttention(
    CudaDevice& d, const KernelSpec& spec, backend::PrepareContext& context);

absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateAttention(CudaDevice& d,
                                                                 const KernelSpec& spec,
                                                                 backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(AttnParams p, PlanAttention(spec));
  std::unique_ptr<AttentionKernel> own;
  {
    SlowStepLog slow(absl::StrCat(d.info().id, ": Kiln's attention kernels"), 2.0);
    slow.set_outcome("prepared");
    KILN_ASSIGN_OR_RETURN(own, CreateOwnAttention(d, spec, context));
  }
  if (own->decode16()) {
    // A decoding shape both paths may serve: the one the cost model expects
    // faster (attention_plan.h); KILN_DECODE_ATTENTION=own|cudnn overrides
    // it (benchmarks time both).
    const char* force = std::getenv("KILN_DECODE_ATTENTION");
    bool use_own;
    if (force != nullptr && std::string_view(force) == "own") {
      use_own = true;
    } else if (force != nullptr && std::string_view(force) == "cudnn") {
      use_own = false;
    } else {
      const DecodeCost cost = EstimateDecodeCost(p.B, p.Hq, p.Hkv, p.Sq, p.Sk, p.D, p.Dv,
                                                 ElementSize(spec.inputs[0].dtype), d.caps());
      use_own = cost.own_us <= cost.cudnn_us;
    }
    if (use_own) return std::unique_ptr<backend::Kernel>(std::move(own));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<backend::Kernel> cudnn,
                        MaybeCudnnAttention(d, spec, p, own, context));
  if (cudnn != nullptr) return cudnn;
  return std::unique_ptr<backend::Kernel>(std::move(own));
}

absl::StatusOr<std::unique_ptr<AttentionKernel>> CreateOwnAttention(
    CudaDevice& d, const KernelSpec& spec, backend::PrepareContext& context) {
  KILN_ASSIGN_OR_RETURN(AttnParams p, PlanAttention(spec));
  const DType dtype = spec.inputs[0].dtype;
  const std::string dt = DTypeSuffix(dtype);
  const AttentionPath path = PlanAttentionPath(dtype, p.B, p.Hq, p.Sq, p.Sk, p.D, p.Dv, d.caps());
  KILN_ASSIGN_OR_RETURN(LoadedFunction rows,
                        LoadFunction(d, "attention", KernelSource("attention.cu"),
                                     absl::StrCat("kiln_attention_", dt), context));
  LoadedFunction fast, combine, vec, zero;
  int64_t vec_splits = 0;
  int vec_rows = 1;
  unsigned vec_shared = 0;
  std::string impl = absl::StrCat("nvrtc:attention_rows_", dt);
  if (path.kind == AttentionPath::kFlash) {
    KILN_ASSIGN_OR_RETURN(fast, LoadFunction(d, "flash_attention",
                                             KernelSource("flash_attention.cu"),
                                             absl::StrCat("kiln_flash_attn_fwd_", dt, "_d", p.D),
                                             context));
    KILN_RETURN_IF_ERROR(d.Enter());
    KILN_RETURN_IF_ERROR(d.Check(
        Driver().cuFuncSetAttribute(fast.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    static_cast<int>(FlashSharedBytes(p.D))),
        "cuFuncSetAttribute"));
    impl = absl::StrCat("kiln:flash_attn_fwd_", dt);
  } else if (path.kind == AttentionPath::kTiled) {
    KILN_ASSIGN_OR_RETURN(fast, LoadFunction(d, "attention_tiled",
                                             KernelSource("attention_tiled.cu"),
                                             absl::StrCat("kiln_attention_tiled_", dt, "_d", p.D),
                                             context));
    KILN_RETURN_IF_ERROR(d.Enter());
    KILN_RETURN_IF_ERROR(d.Check(
        Driver().cuFuncSetAttribute(fast.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    static_cast<int>(TiledSharedBytes(p.D))),
        "cuFuncSetAttribute"));
    impl = absl::StrCat("nvrtc:flash_attn_simt_", dt);
  } else if (path.kind == AttentionPath::kSplit) {
    KILN_ASSIGN_OR_RETURN(fast, LoadFunction(d, "attention", KernelSource("attention.cu"),
                                             absl::StrCat("kiln_attention_split_", dt), context));
    KILN_ASSIGN_OR_RETURN(combine,
                          LoadFunction(d, "attention", KernelSource("attention.cu"),
                                       absl::StrCat("kiln_attention_combine_", dt), context));
    impl = absl::StrCat("nvrtc:attention_decode_split", path.splits, "_", dt);
    if (DecodeVectorized(dtype, p)) {
      // GQA groups (and several query rows per kv head) take the
      // tensor-core kernel where its shared memory fits; KILN_DECODE_MMA=0|1
      // overrides the rule (a benchmark's comparisons).
      const char* mma_env = std::getenv("KILN_DECODE_MMA");
      DecodeMmaMode mode = DecodeMmaMode::kAuto;
      if (mma_env != nullptr && std::string_view(mma_env) == "0") mode = DecodeMmaMode::kOff;
      if (mma_env != nullptr && std::string_view(mma_env) == "1") mode = DecodeMmaMode::kOn;
      bool mma = DecodeUsesMma(p.Hq / p.Hkv * p.Sq, mode) && d.caps().cc_major >= 8;
      // KILN_DECODE_RING=<steps>x<passes>[x<min_blocks>]: a benchmark's sweep of the load ring.
      const DecodeRing defaults = mma ? DefaultDecodeMmaRing(dtype, p.D) : kDefaultDecodeRing;
      DecodeRing ring = defaults;
      if (const char* env = std::getenv("KILN_DECODE_RING"); env != nullptr) {
        std::vector<absl::string_view> parts = absl::StrSplit(env, 'x');
        int steps = 0, passes = 0, min_blocks = 1;
        if ((parts.size() == 2 || parts.size() == 3) && absl::SimpleAtoi(parts[0], &steps) &&
            absl::SimpleAtoi(parts[1], &passes) && steps >= 1 && steps <= 8 && passes >= 2 &&
            passes <= 8 &&
            (parts.size() == 2 ||
             (absl::SimpleAtoi(parts[2], &min_blocks) && min_blocks >= 1 && min_blocks <= 16))) {
          ring = {steps, passes, min_blocks};
        }
      }
      const int64_t optin = d.caps().max_shared_per_block_optin;
      if (mma && DecodeMmaSharedBytes(p.D, ring) > optin) {
        // A swept ring too large for the device: the default, else (D 256
        // on a device of less than 198 KiB per block) the 16-byte kernel.
        ring = defaults;
        mma = DecodeMmaSharedBytes(p.D, ring) <= optin;
        if (!mma) ring = kDefaultDecodeRing;
      }
      vec_rows = mma ? kDecodeMmaRows : DecodeRowsPerBlock(p.Hq / p.Hkv * p.Sq);
      // Its own module per variant: a prepare compiles only the one it runs.
      const std::string kernel = mma ? "attention_decode_mma" : "attention_decode16";
      const std::string variant =
          mma ? absl::StrCat(dt, "_d", p.D) : absl::StrCat(dt, "_d", p.D, "_r", vec_rows);
      KILN_ASSIGN_OR_RETURN(
          vec, LoadFunction(d, absl::StrCat(kernel, "_", variant),
                            mma ? DecodeMmaAttentionSource(dtype, p.D, ring)
                                : DecodeAttentionSource(dtype, p.D, vec_rows, ring),
                            absl::StrCat("kiln_", kernel, "_", variant), context));
      zero.module = vec.module;
      KILN_ASSIGN_OR_RETURN(zero.fn, vec.module->Function("kiln_decode_counters_zero"));
      KILN_RETURN_IF_ERROR(d.Enter());
      if (mma) {
        vec_shared = static_cast<unsigned>(DecodeMmaSharedBytes(p.D, ring));
        KILN_RETURN_IF_ERROR(d.Check(
            Driver().cuFuncSetAttribute(vec.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        static_cast<int>(vec_shared)),
            "cuFuncSetAttribute"));
      }
      KILN_ASSIGN_OR_RETURN(unsigned resident,
                            ResidentBlocks(d, vec.fn, 32 * kDecodeWarps, vec_shared));
      // The keys a block's rows may see: a sliding window's, or all of them.
      const int64_t keys = p.mask == v1::MASK_SLIDING_WINDOW
                               ? std::min(p.Sk, p.window + p.Sq - 1)
                               : p.Sk;
      const int64_t tiles = (p.Hq / p.Hkv * p.Sq + vec_rows - 1) / vec_rows;
      const int64_t keys_per_pass =
          mma ? DecodeMmaKeysPerPass(ring) : DecodeKeysPerPass(p.D, vec_rows, ring);
      vec_splits = DecodeSplits(p.B, p.Hkv, tiles, keys, keys_per_pass, resident);
      // KILN_DECODE_SPLITS=n: a benchmark's sweep of the split count.
      if (const char* env = std::getenv("KILN_DECODE_SPLITS"); env != nullptr) {
        int64_t n = 0;
        if (absl::SimpleAtoi(env, &n) && n > 0) vec_splits = std::min<int64_t>(n, std::max<int64_t>(keys, 1));
      }
      impl = mma ? absl::StrCat("nvrtc:attention_decode_mma_split", vec_splits, "_", dt)
                 : absl::StrCat("nvrtc:attention_decode16_split", vec_splits, "_r", vec_rows, "_",
                                dt);
      const DecodeRing chosen = mma ? DefaultDecodeMmaRing(dtype, p.D) : kDefaultDecodeRing;
      if (ring.steps != chosen.steps || ring.passes != defaults.passes ||
          ring.min_blocks != chosen.min_blocks) {
        absl::StrAppend(&impl, "_ring", ring.steps, "x", ring.passes, "x", ring.min_blocks);
      }
    }
  }
  return std::make_unique<AttentionKernel>(d, spec, path, std::move(rows), std::move(fast),
                                           std::move(combine), std::move(vec), std::move(zero),
                                           vec_splits, vec_rows, vec_shared, p,
                                           std::move(impl));
}

const CudaOpRegistration kAttentionRegistration({
    {v1::OP_ATTENTION, &SupportsAttention, &CreateAttention},
});

}  // namespace
}  // namespace kiln::cuda
