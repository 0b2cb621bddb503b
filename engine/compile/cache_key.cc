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

// A digest (CacheKey::Components) short enough for one log line: a hash cut,
// a value shown whole.
std::string ShortDigestOf(const std::string& digest) {
  const bool hashed =
      digest.size() == 64 && digest.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (hashed) return digest.substr(0, 12) + "..";
  return absl::StrCat("\"", digest, "\"");
}

// One component as compared: its name and the bytes compared (value or digest).
struct Compared {
  const std::string* name;
  const std::string* value;
};

// Index of the `occurrence`-th component named `name`, or -1.
int Find(const std::vector<Compared>& components, const std::string& name, int occurrence) {
  for (size_t i = 0; i < components.size(); ++i) {
    if (*components[i].name != name) continue;
    if (occurrence-- == 0) return static_cast<int>(i);
  }
  return -1;
}

// Occurrence number of components[i]'s name among components[0..i].
int OccurrenceOf(const std::vector<Compared>& components, size_t i) {
  int n = 0;
  for (size_t j = 0; j < i; ++j) n += *components[j].name == *components[i].name;
  return n;
}

std::vector<std::string> Names(const std::vector<Compared>& components) {
  std::vector<std::string> names;
  names.reserve(components.size());
  for (const auto& c : components) names.push_back(*c.name);
  return names;
}

std::vector<Compared> Compare(const std::vector<CacheKey::Component>& components) {
  std::vector<Compared> out;
  out.reserve(components.size());
  for (const auto& c : components) out.push_back({&c.name, &c.value});
  return out;
}

std::vector<Compared> Compare(std::span<const v1::KeyComponent> components) {
  std::vector<Compared> out;
  out.reserve(components.size());
  for (const auto& c : components) out.push_back({&c.name(), &c.digest()});
  return out;
}

// The one comparison behind CacheKey::Explain and ExplainComponents; `show`
// renders a compared value. Empty when the lists are alike.
std::string ExplainCompared(const std::vector<Compared>& from, const std::vector<Compared>& to,
                            std::string (*show)(const std::string&)) {
  std::vector<std::string> changed, only_here, only_there;
  bool reordered = false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int j = Find(to, *from[i].name, OccurrenceOf(from, i));
    if (j < 0) {
      only_here.push_back(*from[i].name);
      continue;
    }
    reordered |= static_cast<size_t>(j) != i;
    if (*from[i].value != *to[j].value) {
      changed.push_back(
          absl::StrCat(*from[i].name, ": ", show(*from[i].value), " -> ", show(*to[j].value)));
    }
  }
  for (size_t i = 0; i < to.size(); ++i) {
    if (Find(from, *to[i].name, OccurrenceOf(to, i)) < 0) only_there.push_back(*to[i].name);
  }
  std::vector<std::string> parts = std::move(changed);
  if (!only_here.empty()) parts.push_back("only in this: " + absl::StrJoin(only_here, ", "));
  if (!only_there.empty()) parts.push_back("only in other: " + absl::StrJoin(only_there, ", "));
  if (parts.empty() && reordered) {
    // Same names and values, so only their order differs.
    parts.push_back(absl::StrCat("component order differs: [", absl::StrJoin(Names(from), ", "),
                                 "] -> [", absl::StrJoin(Names(to), ", "), "]"));
  }
  return absl::StrJoin(parts, "; ");
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
  return ExplainCompared(Compare(components_), Compare(other.components_),
                         [](const std::string& value) { return ShortDigest(value); });
}

int ComponentsAlike(std::span<const v1::KeyComponent> from, std::span<const v1::KeyComponent> to) {
  const std::vector<Compared> a = Compare(from), b = Compare(to);
  int alike = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int j = Find(b, *a[i].name, OccurrenceOf(a, i));
    alike += j >= 0 && *a[i].value == *b[j].value;
  }
  return alike;
}

std::string ExplainComponents(std::span<const v1::KeyComponent> from,
                              std::span<const v1::KeyComponent> to) {
  return ExplainCompared(Compare(from), Compare(to), ShortDigestOf);
}

}  // namespace kiln::compile
