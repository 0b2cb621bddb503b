// Content-addressed cache keys (DESIGN.md section 4).
//
// A CacheKey is an ordered list of named components (name + bytes). Its hex
// SHA-256 addresses an entry in the disk cache; its components are loggable,
// so a miss can be explained ("device_signature changed") rather than guessed.
//
// The class is generic: it knows nothing about graphs or devices. Callers add
// the components that determine what they cache, versions first, e.g.
//
//   CacheKey key;
//   key.Add(kKeyKilnVersion, kCompilerVersion);
//   key.Add(kKeyLirFormat, absl::StrCat(lir_format_version));
//   key.Add("graph", canonical_graph_bytes);
//   key.Add("device", device_signature);
//   cache.Lookup(CacheLevel::kExecutable, key.Hex());
//
// Encoding: the hash covers a tag naming the encoding, then for each component
// in order its name and its value, each prefixed by its length as 8 little-endian
// bytes. Component boundaries therefore cannot be shifted to forge a collision
// ("ab"+"c" and "a"+"bc" hash differently), and order matters.
//
// Thread safety: a const CacheKey may be read from any number of threads; Add
// needs exclusive access.
#pragma once

#include "base/sha256.h"

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/v1/report.pb.h"

namespace kiln::compile {

// Versions that key every cached artifact. Bump the one whose output changed:
// old entries then stop matching and are recompiled (and evicted as they age).
// kCompilerVersion: anything that changes a compiled executable (passes,
// lowering, the executable's meaning). kCodegenVersion: anything that changes
// a kernel binary built from the same source and flags.
inline constexpr char kCompilerVersion[] = "kiln-0.1.0+c2";  // c2: Adam bias corrections
inline constexpr int kCodegenVersion = 1;

// Canonical component names, so every caller spells them the same way.
inline constexpr char kKeyKilnVersion[] = "kiln_version";
inline constexpr char kKeyLirFormat[] = "lir_format";
inline constexpr char kKeyCodegenVersion[] = "codegen_version";

// SHA-256 lives in base/ (one helper for the whole tree).
using ::kiln::Sha256Hex;

class CacheKey {
 public:
  // A component's value is shown as-is in Components() when it is printable
  // ASCII of at most this many bytes (version strings, arch names, flags).
  static constexpr size_t kMaxInlineValueBytes = 64;

  struct Component {
    std::string name;
    std::string value;
  };

  CacheKey() = default;

  // Appends a component. Names should be unique within a key (Explain matches
  // repeated names by occurrence). Returns *this for chaining.
  CacheKey& Add(std::string name, std::string_view value);

  // Lowercase hex SHA-256 over the ordered components (64 characters).
  std::string Hex() const;

  // Each component's name and digest: the value itself when it is short
  // printable text, else the hex SHA-256 of its bytes. For logs and reports.
  std::vector<v1::KeyComponent> Components() const;

  // Says why this key and `other` differ, naming the components that differ,
  // exist only on one side, or appear in another order, e.g.
  //   "graph: 3f2a9c01.. -> 9b1c44e0..; only in other: shapes".
  // Empty when the keys hash alike.
  std::string Explain(const CacheKey& other) const;

  const std::vector<Component>& components() const { return components_; }

 private:
  std::vector<Component> components_;
};

// What a cache keeps of the keys of its entries is their Components(): names
// and digests, small whatever the values were. These compare such lists.
//
// The components of `from` and `to` alike (same name and occurrence, same
// digest): how near a cached key is to a wanted one.
int ComponentsAlike(std::span<const v1::KeyComponent> from, std::span<const v1::KeyComponent> to);

// CacheKey::Explain over digests: says which components differ between
// `from` and `to` (`input_shapes: "x:f32[2];" -> "x:f32[3];"`), exist on one
// side only, or appear in another order. Hashed values are shown cut to 12
// hex characters. Empty when the lists are alike.
std::string ExplainComponents(std::span<const v1::KeyComponent> from,
                              std::span<const v1::KeyComponent> to);

}  // namespace kiln::compile
