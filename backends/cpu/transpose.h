// Dense permutation of a row-major tensor, shared by the Transpose kernel
// and kernels that need a layout change first (reductions over scattered
// axes).
#pragma once

#include <cstdint>
#include <span>

#include "base/host_tensor.h"

namespace kiln::cpu {

// out = in.transpose(perm): out.dims[i] = in_dims[perm[i]]. Elements are
// `esize` bytes (1, 2, 4 or 8). Parallel over rows or tiles when large.
// REQUIRES: perm is a permutation of [0, rank); in and out do not overlap.
void TransposeBytes(const void* in, void* out, const Dims& in_dims, std::span<const int64_t> perm,
                    int64_t esize);

}  // namespace kiln::cpu
