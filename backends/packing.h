// Operand packing: an optional part of the backend contract (backend.h).
//
// A kernel whose inner loop wants an operand in its own layout (a matmul's
// weights in column panels) implements PackingKernel besides Kernel. The
// engine packs an operand whose value cannot change while the program lives
// once, and hands the packed copy to every launch:
//   - a constant of the program: packed when the program is loaded;
//   - a param of an inference ParamSet: packed on the first run with that set
//     and kept with the set (a new set, as SetParams makes, is packed anew);
//   - anything else (graph inputs, intermediates, the params of a training
//     set, which every step rewrites): never packed; the kernel reads the
//     input as given.
// A packed copy lives in host memory the backend allocates itself: it is not
// a Device::Allocate buffer, so it is not in Device::memory_in_use() nor in
// any tenant's quota (ParamSet::total_bytes() counts the values only).
//
// Thread safety: Pack is const and thread-safe (it touches no launch state,
// so the engine may pack with any run context's kernel while another runs).
// UsePacked is called by the thread that launches, between launches, as
// Launch is (never concurrently with it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace kiln::backend {

// An operand in a kernel's own layout. Immutable once made.
class PackedOperand {
 public:
  virtual ~PackedOperand() = default;
  virtual int64_t bytes() const = 0;
};

class PackingKernel {
 public:
  virtual ~PackingKernel() = default;
  // Indices (KernelSpec input order) of the inputs this kernel can take packed.
  virtual std::vector<int> packable_inputs() const = 0;
  // The layout `input` is packed into: kernels with equal keys for an input
  // accept each other's packings of the same value (the engine shares one
  // packed copy between them and between run contexts).
  virtual std::string packing_key(int input) const = 0;
  // Packs `value`, input `input`'s bytes on this kernel's device. REQUIRES:
  // writes to `value` have completed; `input` is one of packable_inputs().
  virtual absl::StatusOr<std::shared_ptr<const PackedOperand>> Pack(
      int input, const BufferView& value) const = 0;
  // The following launches read input `input` from `packed` (made by Pack of
  // a kernel with the same packing_key, from the value those launches get)
  // instead of the view; nullptr: from the view. The caller keeps `packed`
  // alive for those launches; the engine binds every packable input (packed
  // or nullptr) before each run's first launch.
  virtual void UsePacked(int input, const PackedOperand* packed) = 0;
};

}  // namespace kiln::backend
