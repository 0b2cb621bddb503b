// The CUDA C++ sources under backends/cuda/kernels/, embedded at build time
// (embed_sources.cmake) and compiled by NVRTC at prepare time.
#pragma once

#include <span>
#include <string_view>

namespace kiln::cuda {

struct EmbeddedCudaSource {
  const char* name;  // file name: "common.cuh", "norm.cu"
  std::string_view text;
};

extern const std::span<const EmbeddedCudaSource> kEmbeddedCudaSources;

}  // namespace kiln::cuda
