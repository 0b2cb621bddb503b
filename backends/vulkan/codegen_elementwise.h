// GLSL generation for elementwise regions: FusedElementwise, and the single
// ops Unary, Binary, Compare, Where, Cast and Clamp as one-instruction
// regions. The generated kernel reads each region input through its
// broadcast (shape constants are baked in: dims collapsed, strides and
// divisors are literals), evaluates the instruction list in registers
// (floats in f32 via kmath.glsl, integers in 32 or 64 bits, bools as 0/1),
// rounds every instruction's result to its dtype exactly as the unfused ops
// would store it, and writes each region result.
//
// Pure functions of their arguments; thread-safe.
#pragma once

#include <string>

#include "backends/backend.h"
#include "backends/common/elementwise_region.h"
#include "backends/vulkan/vk_device.h"

namespace kiln::vulkan {

// Regions are decoded and checked by backends/common/elementwise_region.h
// (backend::DecodeSpec); what follows takes the decoded region of `spec`.

// Empty when `caps` can run `region` for `spec`; otherwise what is missing.
std::string ElementwiseUnsupported(const DeviceCaps& caps, const backend::KernelSpec& spec,
                                   const backend::ElementwiseRegion& region);

// The kernel's GLSL: bindings 0..n-1 are the inputs, n.. the outputs; no push
// constants; `workgroup` invocations per group, grid-stride over the output.
// REQUIRES: ElementwiseUnsupported(caps, spec, region) is empty.
std::string GenerateElementwise(const DeviceCaps& caps, const backend::KernelSpec& spec,
                                const backend::ElementwiseRegion& region, uint32_t workgroup);

}  // namespace kiln::vulkan
