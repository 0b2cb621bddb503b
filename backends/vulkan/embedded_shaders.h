// SPIR-V modules compiled from backends/vulkan/shaders/*.comp by glslc at build
// time and embedded by embed_spirv.cmake. Immutable; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kiln::vulkan {

struct EmbeddedShader {
  const char* name;  // variant name from shaders/shaders.cmake, e.g. "softmax_f16_sg"
  const uint32_t* words;
  size_t word_count;
};

std::span<const EmbeddedShader> EmbeddedShaders();

// A GLSL include file from shaders/ (e.g. "kmath.glsl") for generated
// kernels; empty when there is none of that name.
std::string EmbeddedText(std::string_view name);

// The variant named `name`, or nullptr.
inline const EmbeddedShader* FindEmbeddedShader(std::string_view name) {
  for (const EmbeddedShader& s : EmbeddedShaders()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

}  // namespace kiln::vulkan
