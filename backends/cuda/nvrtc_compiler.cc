#include "backends/cuda/nvrtc_compiler.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/loaded_libraries.h"
#include "base/sha256.h"
#include "base/status.h"

namespace kiln::cuda {
namespace {

bool LooksLikeCubin(const std::string& bytes) {
  return bytes.size() > 64 && bytes.compare(0, 4,
                                            "\x7f"
                                            "ELF") == 0;
}

// "13.0"; "none" without NVRTC (cached cubins still load; a miss then fails
// in CompileCubin with the reason).
std::string NvrtcVersion() {
  if (!LoadNvrtc().ok()) return "none";
  int major = 0, minor = 0;
  Nvrtc().nvrtcVersion(&major, &minor);
  return absl::StrCat(major, ".", minor);
}

}  // namespace

std::string CubinCacheKey(const std::string& source, const std::string& arch) {
  // Ordered, named, length-prefixed components: no two lists hash alike.
  const std::pair<std::string, std::string> components[] = {
      {"kind", "cuda-cubin"},    {"codegen_version", absl::StrCat(kCodegenVersion)},
      {"nvrtc", NvrtcVersion()}, {"arch", arch},
      {"flags", kNvrtcFlags},    {"source", source},
  };
  Sha256 sha;
  for (const auto& [name, value] : components) {
    sha.Update(absl::StrCat(name, ":", value.size(), ":"));
    sha.Update(value);
  }
  return absl::StrCat("cuda-cubin-", sha.FinalHex());
}

absl::StatusOr<std::string> CompileCubin(const std::string& name, const std::string& source,
                                         const std::string& arch) {
  KILN_RETURN_IF_ERROR(LoadNvrtc());
  const NvrtcApi& api = Nvrtc();
  nvrtcProgram prog = nullptr;
  KILN_RETURN_IF_ERROR(NvrtcCheck(
      api.nvrtcCreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
      "nvrtcCreateProgram"));
  std::vector<std::string> opts = absl::StrSplit(kNvrtcFlags, ';');
  opts.push_back(absl::StrCat("--gpu-architecture=", arch));
  std::vector<const char*> argv;
  argv.reserve(opts.size());
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult compiled =
      api.nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    std::string log;
    if (api.nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      api.nvrtcGetProgramLog(prog, log.data());
      log.resize(log_size - 1);
    }
    api.nvrtcDestroyProgram(&prog);
    return absl::InternalError(absl::StrCat("cuda: kernel ", name, " failed to compile for ", arch,
                                            ": ", api.nvrtcGetErrorString(compiled), "\n", log));
  }
  size_t size = 0;
  absl::Status s = NvrtcCheck(api.nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  std::string cubin(size, '\0');
  if (s.ok()) s = NvrtcCheck(api.nvrtcGetCUBIN(prog, cubin.data()), "nvrtcGetCUBIN");
  api.nvrtcDestroyProgram(&prog);
  if (!s.ok()) return s;
  return cubin;
}

Module::~Module() {
  if (device_.Enter().ok()) Driver().cuModuleUnload(module_);
}

absl::StatusOr<CUfunction> Module::Function(const std::string& name) const {
  CUfunction fn = nullptr;
  KILN_RETURN_IF_ERROR(device_.Check(Driver().cuModuleGetFunction(&fn, module_, name.c_str()),
                                     "cuModuleGetFunction"))
      << "(kernel " << name << ")";
  return fn;
}

absl::StatusOr<std::shared_ptr<const Module>> ModuleCache::Get(const std::string& name,
                                                               const std::string& source,
                                                               backend::PrepareContext& context) {
  const std::string& arch = device_.caps().arch;
  const std::string key = CubinCacheKey(source, arch);
  {
    absl::MutexLock lock(&memo_mu_);
    if (auto it = memo_.find(key); it != memo_.end()) {
      ++context.kernel_cache_hits;
      return it->second;
    }
  }
  KILN_RETURN_IF_ERROR(device_.Enter());
  auto load = [&](const std::string& cubin) -> absl::StatusOr<std::shared_ptr<const Module>> {
    SlowStepLog slow(absl::StrCat(device_.info().id, ": module ", name), 2.0);
    slow.set_outcome(absl::StrCat("loaded (", cubin.size() >> 10, " KiB cubin)"));
    CUmodule m = nullptr;
    KILN_RETURN_IF_ERROR(
        device_.Check(Driver().cuModuleLoadData(&m, cubin.data()), "cuModuleLoadData"))
        << "(kernel " << name << ")";
    return std::make_shared<const Module>(device_, m);
  };
  std::shared_ptr<const Module> module;
  if (context.binaries != nullptr) {
    if (std::optional<std::string> bytes = context.binaries->Lookup(key);
        bytes && LooksLikeCubin(*bytes)) {
      absl::StatusOr<std::shared_ptr<const Module>> m = load(*bytes);
      if (m.ok()) {
        module = *std::move(m);
        ++context.kernel_cache_hits;
      } else if (backend::FaultedDevice(m.status())) {
        return m.status();
      }
    }
  }
  if (module == nullptr) {
    KILN_ASSIGN_OR_RETURN(std::string cubin, CompileCubin(name, source, arch));
    ++context.kernel_cache_misses;
    KILN_ASSIGN_OR_RETURN(module, load(cubin));
    if (context.binaries != nullptr) context.binaries->Store(key, cubin);
  }
  absl::MutexLock lock(&memo_mu_);
  auto [it, inserted] = memo_.emplace(key, module);
  return it->second;
}

}  // namespace kiln::cuda
