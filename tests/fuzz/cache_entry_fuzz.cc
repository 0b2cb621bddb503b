// The compile-cache entry decoder (engine/compile/disk_cache.h) on arbitrary
// file contents, through the public path kilnd takes: the bytes are written as
// an entry file of a real DiskCache and looked up. Every lookup is a hit, a miss
// or kCorrupt (and a corrupt file is gone afterwards), never a crash; a hit
// returns exactly the bytes after the header.
//
// Input: one control byte, then the entry file. Control bits let the fuzzer get
// past the checksums and reach the checks behind them:
//   bit 0  rewrite the header checksum (bytes 96..103) to match bytes 0..95
//   bit 1  rewrite the payload checksum (bytes 88..95) to match the payload
//   bit 2  look up under the key the header names (when it is a valid key)
//   bit 3  the kernel level instead of the executable level
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "engine/compile/disk_cache.h"
#include "xxhash.h"

namespace {

using kiln::compile::CacheLevel;
using kiln::compile::DiskCache;
using kiln::compile::kEntryHeaderBytes;

constexpr char kFixedKey[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

void PutU64(std::string& s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

struct Fixture {
  std::string dir;
  std::unique_ptr<DiskCache> cache;
};

Fixture& GetFixture() {
  static Fixture* fixture = [] {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string dir = std::string(base) + "/kiln_fuzz_cache_XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) std::abort();
    auto cache = DiskCache::Create({.dir = dir, .max_bytes = int64_t{1} << 30});
    if (!cache.ok()) {
      std::fprintf(stderr, "DiskCache::Create: %s\n", cache.status().ToString().c_str());
      std::abort();
    }
    auto* f = new Fixture{dir, *std::move(cache)};
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(GetFixture().dir, ec);
    });
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Fixture& fixture = GetFixture();
  const uint8_t control = data[0];
  std::string entry(reinterpret_cast<const char*>(data + 1), size - 1);
  const CacheLevel level = (control & 8) ? CacheLevel::kKernel : CacheLevel::kExecutable;
  const auto header_bytes = static_cast<size_t>(kEntryHeaderBytes);
  if (entry.size() >= header_bytes) {
    if (control & 2) {
      PutU64(entry, 88, XXH3_64bits(entry.data() + header_bytes, entry.size() - header_bytes));
    }
    if (control & 1) PutU64(entry, 96, XXH3_64bits(entry.data(), 96));
  }
  std::string key = kFixedKey;
  if ((control & 4) && entry.size() >= 80 && DiskCache::IsValidKey(entry.substr(16, 64))) {
    key = entry.substr(16, 64);
  }
  const std::string entry_dir = fixture.dir + "/" + kiln::compile::CacheLevelDirName(level) +
                                "/" + key.substr(0, 2);
  const std::string path = entry_dir + "/" + key;
  std::filesystem::create_directories(entry_dir);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(entry.data(), static_cast<std::streamsize>(entry.size()));
    if (!out) std::abort();
  }
  kiln::compile::LookupResult result = fixture.cache->Lookup(level, key);
  switch (result.outcome) {
    case kiln::compile::LookupOutcome::kHit:
      if (entry.size() < header_bytes || result.payload != entry.substr(header_bytes)) {
        std::fprintf(stderr, "a hit returned other bytes than the entry's payload\n");
        std::abort();
      }
      break;
    case kiln::compile::LookupOutcome::kCorrupt:
      if (std::filesystem::exists(path)) {
        std::fprintf(stderr, "a corrupt entry was left on disk: %s\n", result.reason.c_str());
        std::abort();
      }
      break;
    case kiln::compile::LookupOutcome::kMiss:
      std::fprintf(stderr, "an entry file on disk was a miss: %s\n", result.reason.c_str());
      std::abort();
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return 0;
}
