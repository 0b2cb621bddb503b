// How a MatMul / FusedMatMul spec maps onto cuBLASLt calls (kernels_matmul.cc).
// Row-major [..., M, K] @ [..., K, N] with NumPy-broadcast batch dims: the
// batch dims are collapsed into runs; the innermost run becomes one
// strided-batched call (count, a_stride, b_stride) unless an operand
// broadcasts along it, and every combination of the outer runs is a call of
// its own, with the element offsets of A, B and the result. x @ W with an
// unbatched W and a plain A is one [batch * M, K] @ [K, N] product.
//
// Pure function; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace kiln::cuda {

struct MatMulPlan {
  int64_t M = 0, N = 0, K = 0;
  bool ta = false, tb = false, has_bias = false, has_residual = false;
  v1::UnaryKind act = v1::UNARY_KIND_UNSPECIFIED;  // none
  bool tf32 = false;  // an f32 product whose attrs allow TF32 (CompileOptions.allow_tf32)
  bool exact_f32 = false;  // an f32 product without TF32: results must match the f32 reference
  // One strided-batched call per entry: element offsets of A, B and C; each
  // call multiplies `count` batches, A and B advancing by their strides and C
  // by M * N.
  int64_t count = 1, a_stride = 0, b_stride = 0;
  std::vector<std::array<int64_t, 3>> calls;
};

// INVALID_ARGUMENT naming what does not fit (operand count, contracting
// dims, batch dims that do not broadcast, more than 4096 calls).
absl::StatusOr<MatMulPlan> PlanMatMul(const backend::KernelSpec& spec);

}  // namespace kiln::cuda
