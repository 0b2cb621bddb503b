// CUDA C++ generation for elementwise regions: FusedElementwise, and the
// single ops Unary, Binary, Compare, Where, Cast and Clamp as one-instruction
// regions (decoded by backends/common/elementwise_region.h). Mirrors
// backends/vulkan/codegen_elementwise: the kernel reads each region input
// through its broadcast (shape constants baked in: dims collapsed, strides
// and divisors literals), evaluates the instruction list in registers
// (floats in f32, integers in 32 or 64 bits with wrapping arithmetic, bools
// as 0/1), rounds every instruction's result to its dtype exactly as the
// unfused ops would store it, and writes each region result.
//
// Pure functions of their arguments; thread-safe.
#pragma once

#include <string>

#include "backends/backend.h"
#include "backends/common/elementwise_region.h"

namespace kiln::cuda {

// The generated kernel's entry point.
inline constexpr char kElementwiseEntry[] = "kiln_elementwise";

// Empty when the backend can run `region` for `spec`; otherwise what is missing.
std::string ElementwiseUnsupported(const backend::KernelSpec& spec,
                                   const backend::ElementwiseRegion& region);

// The complete kernel source (common.cuh included): kiln_elementwise(in0 ..
// in(n-1), out0 ..), one pointer per operand, a grid-stride loop over the
// output elements; outputs may alias inputs element for element.
// REQUIRES: ElementwiseUnsupported(spec, region) is empty.
std::string GenerateElementwise(const backend::KernelSpec& spec,
                                const backend::ElementwiseRegion& region);

}  // namespace kiln::cuda
