#include "backends/cuda/prepare_cache.h"

#include "absl/strings/str_cat.h"
#include "base/sha256.h"

namespace kiln::cuda {
namespace {

std::string Header(std::string_view kind, std::string_view key) {
  std::string out = "kiln-";
  out.append(kind);
  absl::StrAppend(&out, " ", kPrepareEntryVersion, "\n");
  out.append(key);
  out += '\n';
  return out;
}

}  // namespace

std::string PrepareCacheKey(std::string_view kind,
                            const std::vector<std::pair<std::string, std::string>>& components) {
  // Ordered, named, length-prefixed: no two lists hash alike.
  Sha256 sha;
  auto add = [&](std::string_view name, std::string_view value) {
    std::string prefix(name);
    absl::StrAppend(&prefix, ":", value.size(), ":");
    sha.Update(prefix);
    sha.Update(value);
  };
  add("kind", kind);
  add("entry_version", absl::StrCat(kPrepareEntryVersion));
  for (const auto& [name, value] : components) add(name, value);
  std::string key(kind);
  absl::StrAppend(&key, "-", sha.FinalHex());
  return key;
}

std::string EncodePrepareEntry(std::string_view kind, std::string_view key,
                               std::string_view payload) {
  std::string entry = Header(kind, key);
  entry.append(payload);
  return entry;
}

std::optional<std::string> DecodePrepareEntry(std::string_view kind, std::string_view key,
                                              std::string_view entry) {
  const std::string header = Header(kind, key);
  if (entry.size() <= header.size() || entry.substr(0, header.size()) != header) {
    return std::nullopt;
  }
  return std::string(entry.substr(header.size()));
}

}  // namespace kiln::cuda
