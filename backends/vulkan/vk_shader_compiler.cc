#include "backends/vulkan/vk_shader_compiler.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"

namespace kiln::vulkan {
namespace {

constexpr uint32_t kSpirvMagic = 0x07230203;
constexpr char kFlags[] = "target=vulkan1.2;opt=performance;glsl450";

bool LooksLikeSpirv(const std::string& bytes) {
  if (bytes.size() < 20 || bytes.size() % 4 != 0) return false;
  uint32_t magic;
  std::memcpy(&magic, bytes.data(), 4);
  return magic == kSpirvMagic;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShaderCompiler>> ShaderCompiler::Create(std::string identity) {
  auto c = std::unique_ptr<ShaderCompiler>(new ShaderCompiler(std::move(identity)));
  c->compiler_ = shaderc_compiler_initialize();
  if (c->compiler_ == nullptr) return absl::InternalError("vulkan: shaderc failed to initialize");
  return c;
}

ShaderCompiler::~ShaderCompiler() {
  if (compiler_ != nullptr) shaderc_compiler_release(compiler_);
}

std::string ShaderCompiler::CacheKey(const std::string& source) const {
  // Ordered, named, length-prefixed components: no two lists hash alike.
  const std::pair<std::string, std::string> components[] = {
      {"kind", "vulkan-spirv"}, {"codegen_version", absl::StrCat(kCodegenVersion)},
      {"device", identity_},    {"flags", kFlags},
      {"source", source},
  };
  Sha256 sha;
  for (const auto& [name, value] : components) {
    sha.Update(absl::StrCat(name, ":", value.size(), ":"));
    sha.Update(value);
  }
  return absl::StrCat("vk-spirv-", sha.FinalHex());
}

absl::StatusOr<Spirv> ShaderCompiler::Compile(const std::string& name,
                                              const std::string& source) const {
  shaderc_compile_options_t options = shaderc_compile_options_initialize();
  shaderc_compile_options_set_target_env(options, shaderc_target_env_vulkan,
                                         shaderc_env_version_vulkan_1_2);
  shaderc_compile_options_set_optimization_level(options, shaderc_optimization_level_performance);
  shaderc_compilation_result_t result =
      shaderc_compile_into_spv(compiler_, source.data(), source.size(), shaderc_compute_shader,
                               name.c_str(), "main", options);
  shaderc_compile_options_release(options);
  if (shaderc_result_get_compilation_status(result) != shaderc_compilation_status_success) {
    std::string message = shaderc_result_get_error_message(result);
    shaderc_result_release(result);
    return absl::InternalError(
        absl::StrCat("vulkan: generated shader ", name, " failed to compile: ", message));
  }
  const size_t bytes = shaderc_result_get_length(result);
  Spirv spirv(bytes / 4);
  std::memcpy(spirv.data(), shaderc_result_get_bytes(result), spirv.size() * 4);
  shaderc_result_release(result);
  return spirv;
}

absl::StatusOr<std::shared_ptr<const Spirv>> ShaderCompiler::Get(const std::string& name,
                                                                 const std::string& source,
                                                                 backend::PrepareContext& context) {
  const std::string key = CacheKey(source);
  {
    absl::MutexLock lock(&memo_mu_);
    if (auto it = memo_.find(key); it != memo_.end()) {
      ++context.kernel_cache_hits;
      return it->second;
    }
  }
  std::shared_ptr<const Spirv> spirv;
  if (context.binaries != nullptr) {
    if (std::optional<std::string> bytes = context.binaries->Lookup(key);
        bytes && LooksLikeSpirv(*bytes)) {
      auto words = std::make_shared<Spirv>(bytes->size() / 4);
      std::memcpy(words->data(), bytes->data(), bytes->size());
      spirv = std::move(words);
      ++context.kernel_cache_hits;
    }
  }
  if (spirv == nullptr) {
    absl::StatusOr<Spirv> compiled = Compile(name, source);
    if (!compiled.ok()) return compiled.status();
    ++context.kernel_cache_misses;
    if (context.binaries != nullptr) {
      context.binaries->Store(key, std::string_view(reinterpret_cast<const char*>(compiled->data()),
                                                    compiled->size() * 4));
    }
    spirv = std::make_shared<const Spirv>(std::move(compiled).value());
  }
  absl::MutexLock lock(&memo_mu_);
  auto [it, inserted] = memo_.emplace(key, spirv);
  return it->second;
}

}  // namespace kiln::vulkan
