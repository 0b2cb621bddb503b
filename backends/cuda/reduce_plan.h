// How a column reduction [outer, r, inner] -> [outer, inner] (inner > 1) is
// spread over the GPU (kernels_reduce.cc, kernels/reduce.cu).
//
// The plain column kernel gives each output one thread that walks r: right
// when there are many outputs, but a bias gradient ([64] from [16384, 64])
// is then 64 threads of 16384 serial loads each, milliseconds on an H100
// (the char GPT's training step ran 22 of them). The split kernel gives
// each block 32 adjacent columns and one of `splits` slices of r (8 rows of
// threads striding over it); with more than one split, a second kernel folds
// the f32 partials, which live in the stream's workspace.
//
// Pure function; thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::cuda {

struct ColumnReducePlan {
  bool split = false;         // the split kernel (else the one-thread-per-output one)
  int64_t tiles = 0;          // blocks along x: outer * ceil(inner / 32)
  int64_t splits = 1;         // blocks along y: slices of r
  int64_t partial_bytes = 0;  // f32 partials (splits > 1), else 0
};

// Outputs from which the plain kernel has threads enough to fill a GPU of
// `sm_count` SMs by itself (its 256-thread blocks, 8 per SM), and the least
// rows a slice of r gets (8 rows of threads, 4 loads each, 2 rounds).
inline constexpr int64_t kColumnThreadsPerSm = 2048;
inline constexpr int64_t kMinRowsPerSplit = 64;

inline ColumnReducePlan PlanColumnReduce(int64_t outer, int64_t r, int64_t inner, int sm_count) {
  ColumnReducePlan p;
  const int64_t sms = std::max(sm_count, 1);
  const int64_t outputs = outer * inner;
  if (r < 2 * 8 || outputs >= sms * kColumnThreadsPerSm) return p;
  // Fewer than 8 columns leave most of a block's 32 lanes idle: only worth it
  // when the plain kernel would have under 32 threads per SM ([16384, 4] ->
  // [4] splits; [50000, 32, 2] -> [50000, 2] keeps its 100,000 threads).
  if (inner < 8 && outputs >= sms * 32) return p;
  p.split = true;
  p.tiles = outer * ((inner + 31) / 32);
  // Aim at ~4 blocks per SM; no slice shorter than kMinRowsPerSplit rows;
  // at most 65535 (the grid's y limit).
  const int64_t want = (4 * sms + p.tiles - 1) / p.tiles;
  const int64_t most = std::max<int64_t>(1, r / kMinRowsPerSplit);
  p.splits = std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 65535));
  p.partial_bytes = p.splits > 1 ? outputs * p.splits * 4 : 0;
  return p;
}

}  // namespace kiln::cuda
