// Compiles generated GLSL compute shaders to SPIR-V (shaderc) and caches the
// binaries: first in a per-device memo, then in the engine's KernelBinaryCache
// (PrepareContext::binaries) under a SHA-256 key over the ordered components
// {codegen version, device identity, compile flags, source}.
//
// Thread-safe. The device outlives the compiler.
#pragma once

#include <shaderc/shaderc.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace kiln::vulkan {

// Bumped whenever generated code changes meaning, so old binaries miss.
inline constexpr int kCodegenVersion = 1;

using Spirv = std::vector<uint32_t>;

class ShaderCompiler {
 public:
  static absl::StatusOr<std::unique_ptr<ShaderCompiler>> Create(std::string device_identity);
  ~ShaderCompiler();
  ShaderCompiler(const ShaderCompiler&) = delete;
  ShaderCompiler& operator=(const ShaderCompiler&) = delete;

  // The kernel-cache key of `source`: "vk-spirv-" + hex SHA-256.
  std::string CacheKey(const std::string& source) const;

  // SPIR-V for `source`. A memo or binary-cache hit counts in
  // context.kernel_cache_hits; a compile counts in kernel_cache_misses and is
  // stored in context.binaries. A cached entry that is not valid SPIR-V is
  // recompiled and overwritten. `name` labels compile errors.
  absl::StatusOr<std::shared_ptr<const Spirv>> Get(const std::string& name,
                                                   const std::string& source,
                                                   backend::PrepareContext& context);

  // Compiles without any caching (used by Get and by tests).
  absl::StatusOr<Spirv> Compile(const std::string& name, const std::string& source) const;

 private:
  explicit ShaderCompiler(std::string identity) : identity_(std::move(identity)) {}

  std::string identity_;
  shaderc_compiler_t compiler_ = nullptr;  // thread-safe per shaderc.h
  absl::Mutex memo_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Spirv>> memo_ ABSL_GUARDED_BY(memo_mu_);
};

}  // namespace kiln::vulkan
