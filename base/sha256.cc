#include "base/sha256.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace kiln {
namespace {

void CheckEvp(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "kiln: libcrypto %s failed\n", what);
  std::abort();
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  CheckEvp(ctx_ != nullptr, "EVP_MD_CTX_new");
  CheckEvp(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1, "EVP_DigestInit_ex");
}

void Sha256::Update(std::string_view bytes) {
  CheckEvp(EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size()) == 1, "EVP_DigestUpdate");
}

void Sha256::UpdateLengthPrefixed(std::string_view bytes) {
  const uint64_t n = bytes.size();
  char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  Update(std::string_view(le, sizeof(le)));
  Update(bytes);
}

std::string Sha256::FinalHex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  CheckEvp(EVP_DigestFinal_ex(ctx_.get(), digest, &size) == 1, "EVP_DigestFinal_ex");
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes);
  return sha.FinalHex();
}

}  // namespace kiln
