// A 2-D Conv whose kernel is spatially larger than its result — the shape of
// a conv's weight gradient, which the autodiff pass writes as a forward conv
// of the transposed input with the transposed cotangent as the kernel
// (passes/autodiff_rules.cc, ConvGroupVjp) — run as oneDNN's
// convolution_backward_weights instead of convolution_forward.
//
// Any conv  y[a, o, p, q] = sum_b,i,j x[a, b, p*s + i*d - lo, ...] * w[o, b, i, j]
// is the weight gradient of the conv with source x viewed as [b, a, H, W],
// cotangent w viewed as [b, o, K1, K2], stride d and dilation s: oneDNN reads
// all three through strided (permuted) memory descriptors, so no data moves
// but its own reorders. oneDNN's forward conv runs such a shape with the
// whole cotangent as a kernel it reorders each launch (brgconv, the largest
// kernels of the CNN's training step); its backward-weights kernels are built
// for it (a large "output" reduced into a small "kernel").
//
// f32 as is; f16 / bf16 through f32 copies. Thread safety: as every Kernel.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "kiln/plugin.h"

namespace kiln::cpu {

// Whether `spec` (a valid OP_CONV) takes the backward-weights form: 2-D, no
// bias, one group, f32 storage, at least 4 rows of x (oneDNN's input
// channels), kernel area over result area, and geometry
// oneDNN's size rule accepts (no negative padding on the far side).
bool IsWeightGradientShaped(const backend::KernelSpec& spec);

// The kernel for such a spec. REQUIRES: IsWeightGradientShaped(spec).
absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateConvAsWeightGradient(
    const backend::KernelSpec& spec);

// kiln.conv2d_backward_weights (base/custom_ops.h): the built-in op's shape
// function (the plugin ABI's signature: checks x, g, w and the payload's
// ConvAttrs; dw has w's type) and the CPU kernel the custom-op path creates
// for it (kernels_custom.cc): oneDNN's backward-weights on x and g as they
// lie (plain NCHW), no transposes.
int ConvBackwardWeightsShape(const void* payload, size_t payload_size, const KilnTensorType* inputs,
                             int32_t num_inputs, KilnTensorType* outputs, int32_t* num_outputs,
                             char* error, size_t error_size);
absl::StatusOr<std::unique_ptr<backend::Kernel>> CreateConvBackwardWeights(
    const backend::KernelSpec& spec);

}  // namespace kiln::cpu
