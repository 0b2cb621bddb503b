#include "engine/compile/cache_key.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"

namespace kiln::compile {
namespace {

// Names the encoding hashed by CacheKey::Hex; change it with the encoding.
constexpr std::string_view kKeyEncodingTag = "kiln.cache_key.v1";

bool IsShortPrintable(std::string_view value) {
  if (value.empty() || value.size() > CacheKey::kMaxInlineValueBytes) return false;
  for (char c : value) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

std::string Digest(std::string_view value) {
  return IsShortPrintable(value) ? std::string(value) : Sha256Hex(value);
}

// A digest short enough for one log line: printable values whole, hashes cut.
std::string ShortDigest(std::string_view value) {
  if (IsShortPrintable(value)) return absl::StrCat("\"", std::string(value), "\"");
  return Sha256Hex(value).substr(0, 12) + "..";
}

// Index of the `occurrence`-th component named `name`, or -1.
int Find(const std::vector<CacheKey::Component>& components, const std::string& name,
         int occurrence) {
  for (size_t i = 0; i < components.size(); ++i) {
    if (components[i].name != name) continue;
    if (occurrence-- == 0) return static_cast<int>(i);
  }
  return -1;
}

// Occurrence number of components[i]'s name among components[0..i].
int OccurrenceOf(const std::vector<CacheKey::Component>& components, size_t i) {
  int n = 0;
  for (size_t j = 0; j < i; ++j) n += components[j].name == components[i].name;
  return n;
}

std::vector<std::string> Names(const std::vector<CacheKey::Component>& components) {
  std::vector<std::string> names;
  names.reserve(components.size());
  for (const auto& c : components) names.push_back(c.name);
  return names;
}

}  // namespace

CacheKey& CacheKey::Add(std::string name, std::string_view value) {
  components_.push_back({std::move(name), std::string(value)});
  return *this;
}

std::string CacheKey::Hex() const {
  Sha256 sha;
  sha.UpdateLengthPrefixed(kKeyEncodingTag);
  for (const Component& c : components_) {
    sha.UpdateLengthPrefixed(c.name);
    sha.UpdateLengthPrefixed(c.value);
  }
  return sha.FinalHex();
}

std::vector<v1::KeyComponent> CacheKey::Components() const {
  std::vector<v1::KeyComponent> out;
  out.reserve(components_.size());
  for (const Component& c : components_) {
    v1::KeyComponent& kc = out.emplace_back();
    kc.set_name(c.name);
    kc.set_digest(Digest(c.value));
  }
  return out;
}

std::string CacheKey::Explain(const CacheKey& other) const {
  if (Hex() == other.Hex()) return "";
  std::vector<std::string> changed, only_here, only_there;
  for (size_t i = 0; i < components_.size(); ++i) {
    const Component& mine = components_[i];
    int j = Find(other.components_, mine.name, OccurrenceOf(components_, i));
    if (j < 0) {
      only_here.push_back(mine.name);
      continue;
    }
    const Component& theirs = other.components_[j];
    if (mine.value != theirs.value) {
      changed.push_back(absl::StrCat(mine.name, ": ", ShortDigest(mine.value), " -> ",
                                     ShortDigest(theirs.value)));
    }
  }
  for (size_t i = 0; i < other.components_.size(); ++i) {
    const Component& theirs = other.components_[i];
    if (Find(components_, theirs.name, OccurrenceOf(other.components_, i)) < 0) {
      only_there.push_back(theirs.name);
    }
  }
  std::vector<std::string> parts = std::move(changed);
  if (!only_here.empty()) parts.push_back("only in this: " + absl::StrJoin(only_here, ", "));
  if (!only_there.empty()) parts.push_back("only in other: " + absl::StrJoin(only_there, ", "));
  if (parts.empty()) {
    // Same names and values, so only their order can differ.
    parts.push_back(absl::StrCat("component order differs: [",
                                 absl::StrJoin(Names(components_), ", "), "] -> [",
                                 absl::StrJoin(Names(other.components_), ", "), "]"));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace kiln::compile
