// Runs one kernel on a device over host tensors, synchronously: constant
// folding and small host-side evaluations use the real backend kernels, so
// folded values are bit-identical to what the device would compute.
#pragma once

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "base/host_tensor.h"

namespace kiln::runtime {

absl::StatusOr<std::vector<HostTensor>> EvaluateKernel(backend::Device& device,
                                                       const backend::KernelSpec& spec,
                                                       std::span<const HostTensor* const> inputs);

}  // namespace kiln::runtime
