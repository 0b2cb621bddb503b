#include "backends/cuda/loaded_libraries.h"

#include <dlfcn.h>
#include <link.h>

#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace kiln::cuda {
namespace {

// Every mapped object's path.
std::vector<std::string> MappedPaths() {
  std::vector<std::string> paths;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(out)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &paths);
  return paths;
}

bool IsCudaLibrary(std::string_view name) {
  return name.starts_with("libcudnn") || name.starts_with("libcublas");
}

}  // namespace

std::set<std::string> LoadedCudaLibraries() {
  std::set<std::string> names;
  for (const std::string& path : MappedPaths()) {
    std::string name = std::filesystem::path(path).filename().string();
    if (IsCudaLibrary(name)) names.insert(std::move(name));
  }
  return names;
}

std::string LibrariesOpenedSince(const std::set<std::string>& before) {
  std::vector<std::string> opened;
  for (const std::string& name : LoadedCudaLibraries()) {
    if (!before.contains(name)) opened.push_back(name);
  }
  return opened.empty() ? "none" : absl::StrJoin(opened, ", ");
}

std::set<std::string> OpenCudnnEngineLibraries() {
  std::set<std::string> opened;
  std::filesystem::path dir;
  for (const std::string& path : MappedPaths()) {
    const std::filesystem::path p(path);
    if (p.filename().string().starts_with("libcudnn")) dir = p.parent_path();
  }
  if (dir.empty()) return opened;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // libcudnn_engines_precompiled.so.9, libcudnn_engines_runtime_compiled.so.9
    // (the versioned names cuDNN opens, not the unversioned links).
    const size_t so = name.find(".so.");
    if (!name.starts_with("libcudnn_engines_") || so == std::string::npos ||
        name.find('.', so + 4) != std::string::npos) {
      continue;
    }
    if (dlopen(entry.path().c_str(), RTLD_LAZY | RTLD_LOCAL) != nullptr) opened.insert(name);
  }
  return opened;
}

SlowStepLog::SlowStepLog(std::string what, double threshold_ms)
    : what_(std::move(what)),
      threshold_ms_(threshold_ms),
      before_(LoadedCudaLibraries()),
      start_(std::chrono::steady_clock::now()) {}

SlowStepLog::~SlowStepLog() {
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  if (ms < threshold_ms_) return;
  spdlog::info("{} {} in {:.1f} ms (libraries opened meanwhile: {})", what_, outcome_, ms,
               LibrariesOpenedSince(before_));
}

}  // namespace kiln::cuda
