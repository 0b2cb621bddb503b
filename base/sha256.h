// SHA-256 through OpenSSL's libcrypto: the one helper for cache keys, API-key
// hashes and kernel-binary keys (STYLE.md: one place per concept).
//
// Thread safety: a Sha256 is used by one thread at a time; Sha256Hex is
// thread-safe. libcrypto failing to hash means a broken installation or no
// memory, never bad input: an invariant, so it aborts.
#pragma once

#include <openssl/evp.h>

#include <memory>
#include <string>
#include <string_view>

namespace kiln {

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::string_view bytes);
  // An 8-byte little-endian length, then the bytes: no two lists of values
  // concatenate to the same input.
  void UpdateLengthPrefixed(std::string_view bytes);
  // The digest as 64 lowercase hex digits. Call once.
  std::string FinalHex();

 private:
  struct Deleter {
    void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
  };
  std::unique_ptr<EVP_MD_CTX, Deleter> ctx_;
};

// The SHA-256 of `bytes`, 64 lowercase hex digits.
std::string Sha256Hex(std::string_view bytes);

}  // namespace kiln
