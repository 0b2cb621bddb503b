#include "base/custom_ops.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"

namespace kiln {
namespace {

// The reason a plugin function wrote, NUL-terminated within the buffer even
// when the plugin forgot to terminate it.
std::string ReasonFrom(const char* buffer, size_t size) {
  const size_t n = strnlen(buffer, size);
  if (n == 0) return "(no reason given)";
  return QuotePluginString(std::string_view(buffer, n), 200);
}

// A NUL-terminated string from a plugin's struct, at most KILN_PLUGIN_MAX_NAME
// bytes, or an error naming `what`.
absl::StatusOr<std::string> PluginName(const char* s, const char* what) {
  if (s == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  const size_t n = strnlen(s, KILN_PLUGIN_MAX_NAME + 1);
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (n > KILN_PLUGIN_MAX_NAME) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is longer than ", KILN_PLUGIN_MAX_NAME, " bytes"));
  }
  std::string out(s, n);
  for (char c : out) {
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", QuotePluginString(out),
                                                     " has a byte outside printable ASCII"));
    }
  }
  return out;
}

absl::StatusOr<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError("cannot read the file");
  Sha256 sha;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof(buf));
    sha.Update(std::string_view(buf, static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) return absl::FailedPreconditionError("read error");
  return sha.FinalHex();
}

}  // namespace

std::string CustomOp::Identity() const {
  return absl::StrCat(name, "|", plugin, "|", plugin_version, "|", file_sha256);
}

std::string QuotePluginString(std::string_view s, size_t max_bytes) {
  const std::string_view kept = s.substr(0, std::min(s.size(), max_bytes));
  std::string out = absl::StrCat("\"", absl::CHexEscape(absl::string_view(kept.data(), kept.size())));
  if (kept.size() < s.size()) return absl::StrCat(out, "...\"(+", s.size() - kept.size(), " bytes)");
  return out + "\"";
}

CustomOpRegistry& CustomOpRegistry::Global() {
  static auto* registry = new CustomOpRegistry();
  return *registry;
}

absl::Status CustomOpRegistry::Register(const KilnPlugin& plugin, const std::string& path,
                                        const std::string& file_sha256) {
  if (plugin.abi_version != KILN_PLUGIN_ABI_VERSION) {
    return absl::FailedPreconditionError(absl::StrCat("plugin ABI version ", plugin.abi_version,
                                                      ", but kilnd loads version ",
                                                      KILN_PLUGIN_ABI_VERSION));
  }
  if (plugin.struct_size != sizeof(KilnPlugin)) {
    return absl::FailedPreconditionError(absl::StrCat("KilnPlugin struct_size ", plugin.struct_size,
                                                      ", want ", sizeof(KilnPlugin)));
  }
  auto name = PluginName(plugin.name, "plugin name");
  if (!name.ok()) return name.status();
  auto version = PluginName(plugin.version, "plugin version");
  if (!version.ok()) return version.status();
  if (plugin.num_ops <= 0 || plugin.num_ops > 1024 || plugin.ops == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("plugin ", *name, " lists ", plugin.num_ops, " ops (want 1 .. 1024)"));
  }
  std::vector<std::unique_ptr<CustomOp>> ops;
  for (int32_t i = 0; i < plugin.num_ops; ++i) {
    const KilnCustomOp& o = plugin.ops[i];
    auto op_name = PluginName(o.name, absl::StrCat("op ", i, " name").c_str());
    if (!op_name.ok()) return op_name.status();
    if (o.shape == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("op ", *op_name, " has no shape function"));
    }
    if (o.cpu_kernel == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("op ", *op_name, " has no CPU kernel"));
    }
    for (void* r : o.reserved) {
      if (r != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "op ", *op_name, " sets reserved fields (GPU kernels are not in ABI version 1)"));
      }
    }
    for (const auto& earlier : ops) {
      if (earlier->name == *op_name) {
        return absl::AlreadyExistsError(absl::StrCat("op ", *op_name, " is listed twice"));
      }
    }
    auto op = std::make_unique<CustomOp>();
    op->name = *op_name;
    op->plugin = *name;
    op->plugin_version = *version;
    op->path = path;
    op->file_sha256 = file_sha256;
    op->shape = o.shape;
    op->cpu_kernel = o.cpu_kernel;
    ops.push_back(std::move(op));
  }
  absl::MutexLock lock(&ops_mu_);
  for (const auto& op : ops) {
    if (auto it = ops_.find(op->name); it != ops_.end()) {
      const CustomOp& other = *it->second;
      return absl::AlreadyExistsError(absl::StrCat(
          "op ", op->name, " is already provided by plugin ", other.plugin, " ",
          other.plugin_version,
          other.path.empty() ? "" : absl::StrCat(" (", QuotePluginString(other.path, 256), ")")));
    }
  }
  for (auto& op : ops) {
    std::string key = op->name;
    ops_.emplace(std::move(key), std::move(op));
  }
  return absl::OkStatus();
}

absl::Status CustomOpRegistry::LoadFile(const std::string& path) {
  const std::string where = QuotePluginString(path, 256);
  auto sha = FileSha256(path);
  if (!sha.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("plugin ", where, ": ", sha.status().message()));
  }
  // RTLD_LOCAL: a plugin's symbols never satisfy another plugin's.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "plugin ", where, ": cannot load: ", QuotePluginString(err != nullptr ? err : "", 300)));
  }
  dlerror();
  void* entry = dlsym(handle, KILN_PLUGIN_ENTRY_SYMBOL);
  if (entry == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat("plugin ", where, ": no symbol ",
                                                      KILN_PLUGIN_ENTRY_SYMBOL,
                                                      " (include/kiln/plugin.h)"));
  }
  const KilnPlugin* plugin = reinterpret_cast<KilnPluginEntryFn>(entry)();
  if (plugin == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat("plugin ", where, ": ", KILN_PLUGIN_ENTRY_SYMBOL, " returned null"));
  }
  if (absl::Status s = Register(*plugin, path, *sha); !s.ok()) {
    dlclose(handle);
    return absl::Status(s.code(), absl::StrCat("plugin ", where, ": ", s.message()));
  }
  return absl::OkStatus();  // the handle stays open for the life of the process
}

absl::StatusOr<PluginLoadReport> CustomOpRegistry::LoadDirectory(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plugin_dir ", QuotePluginString(dir, 256), " cannot be read: ", ec.message()));
  }
  for (const auto& entry : it) {
    const std::string file = entry.path().string();
    if (entry.path().extension() != ".so" || !entry.is_regular_file(ec)) continue;
    files.push_back(file);
  }
  std::sort(files.begin(), files.end());
  PluginLoadReport report;
  for (const std::string& file : files) {
    const std::vector<std::string> before = Names();
    if (absl::Status s = LoadFile(file); !s.ok()) {
      report.refused.push_back(std::move(s));
      continue;
    }
    std::vector<std::string> added;
    for (const std::string& n : Names()) {
      if (!std::binary_search(before.begin(), before.end(), n)) added.push_back(n);
    }
    const CustomOp* first = added.empty() ? nullptr : Find(added[0]);
    report.loaded.push_back(absl::StrCat(QuotePluginString(file, 256), ": ",
                                         first != nullptr ? first->plugin : "", " ",
                                         first != nullptr ? first->plugin_version : "", " (",
                                         absl::StrJoin(added, ", "), ")"));
  }
  return report;
}

const CustomOp* CustomOpRegistry::Find(std::string_view name) const {
  absl::MutexLock lock(&ops_mu_);
  auto it = ops_.find(absl::string_view(name.data(), name.size()));
  return it == ops_.end() ? nullptr : it->second.get();
}

std::vector<std::string> CustomOpRegistry::Names() const {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&ops_mu_);
    for (const auto& [name, op] : ops_) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<KilnTensorType>> CallShapeFunction(
    const CustomOp& op, std::string_view payload, const std::vector<KilnTensorType>& inputs) {
  KilnTensorType outputs[KILN_PLUGIN_MAX_OUTPUTS] = {};
  int32_t num_outputs = 0;
  char error[512] = {};
  const int rc = op.shape(payload.data(), payload.size(), inputs.data(),
                          static_cast<int32_t>(inputs.size()), outputs, &num_outputs, error,
                          sizeof(error));
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("custom op ", QuotePluginString(op.name),
                                                   ": shape function failed: ",
                                                   ReasonFrom(error, sizeof(error))));
  }
  if (num_outputs < 1 || num_outputs > KILN_PLUGIN_MAX_OUTPUTS) {
    return absl::InvalidArgumentError(absl::StrCat("custom op ", QuotePluginString(op.name),
                                                   ": shape function returned ", num_outputs,
                                                   " results (want 1 .. ", KILN_PLUGIN_MAX_OUTPUTS,
                                                   ")"));
  }
  return std::vector<KilnTensorType>(outputs, outputs + num_outputs);
}

absl::Status CallCpuKernel(const CustomOp& op, std::string_view payload,
                           const std::vector<KilnTensor>& inputs, std::vector<KilnTensor>& outputs) {
  char error[512] = {};
  const int rc = op.cpu_kernel(payload.data(), payload.size(), inputs.data(),
                               static_cast<int32_t>(inputs.size()), outputs.data(),
                               static_cast<int32_t>(outputs.size()), error, sizeof(error));
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("custom op ", QuotePluginString(op.name),
                                                   ": kernel failed: ", ReasonFrom(error, sizeof(error))));
  }
  return absl::OkStatus();
}

}  // namespace kiln
