// The persistent, content-addressed compile cache (DESIGN.md section 4).
//
// Two levels under one directory, one budget:
//   <dir>/executables/<k0k1>/<key>   compiled executables (serialized LIR)
//   <dir>/kernels/<k0k1>/<key>       kernel binaries (SPIR-V, cubins, ...)
//   <dir>/lock                       flock()ed around scans, eviction and Clear
// where <key> is a 64-character lowercase hex SHA-256 (CacheKey::Hex) and
// <k0k1> its first two characters.
//
// Entry file: a fixed 104-byte header, then the payload. Header fields are
// little-endian:
//   0  magic "KILNCACH"         8 bytes
//   8  format version           u32 (kEntryFormatVersion)
//   12 level                    u32 (CacheLevel value)
//   16 key                      64 bytes, lowercase hex
//   80 payload length           u64
//   88 payload checksum         u64, XXH3_64bits of the payload
//   96 header checksum          u64, XXH3_64bits of bytes 0..95
//
// Invariants and guarantees:
// - An entry is never modified in place. A store writes a unique temp file in
//   the entry's directory, fsyncs it, rename()s it over the entry's path and
//   fsyncs the directory, so a reader sees the old entry, the new one, or none,
//   never a partial one.
// - Nothing read is trusted: an entry whose magic, version, level, key, length
//   or either checksum does not match is counted corrupt, deleted and reported
//   as kCorrupt, whatever its bytes. The caller recompiles and stores again.
// - Several processes may share one directory. Readers hold an open fd, which
//   stays readable when another process replaces or evicts the entry; races on
//   deleted files (ENOENT) are ignored; eviction runs under an flock() on
//   <dir>/lock so two processes do not both evict for the same overflow.
// - LRU: a store stamps the entry's mtime, every hit touches it, and eviction
//   removes the oldest mtimes first (across both levels) until the total is
//   under kEvictToFraction of max_bytes. Sizes are file sizes (header included).
// - Accounting is cheap: an in-memory running total, set by a directory scan at
//   Create, adjusted by this process's stores and deletions, and rescanned when
//   it passes the budget, or after kRescanStores stores or kRescanInterval
//   since the last scan, whichever comes first (other processes' stores make
//   it drift). Stats' bytes and entries are that estimate; the other counters
//   count this process's operations.
//
// Thread safety: every method is thread-safe. File operations run without
// holding a lock; only counters, the running total and the scan are serialized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"

namespace kiln::compile {

// Stored in entry headers: append-only, never renumbered.
enum class CacheLevel : uint32_t {
  kExecutable = 1,
  kKernel = 2,
};

// "executables" / "kernels": the level's directory name.
const char* CacheLevelDirName(CacheLevel level);

// Bumped on any change to the entry layout; entries of other versions are
// discarded as corrupt (and recompiled).
inline constexpr uint32_t kEntryFormatVersion = 1;
inline constexpr int64_t kEntryHeaderBytes = 104;

struct DiskCacheOptions {
  std::string dir;                       // created (with parents) when missing
  int64_t max_bytes = int64_t{4} << 30;  // budget over both levels; > 0
};

enum class LookupOutcome {
  kHit,
  kMiss,
  kCorrupt,  // an entry was there but failed validation; it has been deleted
};

struct LookupResult {
  LookupOutcome outcome = LookupOutcome::kMiss;
  std::string payload;  // the stored bytes when kHit, else empty
  std::string reason;   // why kCorrupt (or why an existing file could not be read)
};

struct CacheLevelStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t stores = 0;
  int64_t store_failures = 0;
  int64_t evictions = 0;
  int64_t corrupt = 0;
  int64_t bytes = 0;    // estimated bytes on disk (see the file comment)
  int64_t entries = 0;  // estimated entries on disk
};

class DiskCache {
 public:
  // Eviction brings the total under this fraction of max_bytes, so a full cache
  // does not scan and evict on every store.
  static constexpr double kEvictToFraction = 0.9;
  // Temp files older than this are leftovers of a crashed writer, removed at Create.
  static constexpr absl::Duration kStaleTempAge = absl::Minutes(10);
  // The running total is refreshed by a scan after this many stores or this
  // much time since the last scan, whichever comes first (checked on a store).
  static constexpr int64_t kRescanStores = 64;
  static constexpr absl::Duration kRescanInterval = absl::Minutes(1);

  struct Stats {
    CacheLevelStats executable;
    CacheLevelStats kernel;
    CacheLevelStats total;  // the sum of both levels

    const CacheLevelStats& level(CacheLevel level) const {
      return level == CacheLevel::kExecutable ? executable : kernel;
    }
  };

  // Creates the directory tree if missing, removes stale temp files, scans the
  // entries for the running total, and evicts if the directory is over budget.
  // Fails when `dir` is empty or cannot be created, or max_bytes <= 0.
  static absl::StatusOr<std::unique_ptr<DiskCache>> Create(const DiskCacheOptions& options);

  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  // Reads the entry for `key_hex`. kHit returns the payload and marks the entry
  // recently used; kCorrupt means an invalid entry was found and deleted. An
  // invalid key_hex (not 64 lowercase hex characters) is a kMiss with a reason.
  LookupResult Lookup(CacheLevel level, const std::string& key_hex);

  // Stores `payload` under `key_hex`, replacing any entry of that key, then
  // evicts if the cache is over budget. Fails with INVALID_ARGUMENT for a bad
  // key, RESOURCE_EXHAUSTED for an entry larger than the eviction target, or
  // the I/O error; a failed store leaves no file behind and existing entries
  // intact. An error from the eviction that follows a successful store is
  // returned too, with context saying the entry was stored.
  absl::Status Store(CacheLevel level, const std::string& key_hex, std::string_view payload);

  // Deletes every entry of both levels (temp files of in-flight stores are left
  // alone). Counters other than bytes and entries are kept.
  absl::Status Clear();

  Stats stats() const;

  const DiskCacheOptions& options() const { return options_; }

  // Whether `key` is 64 lowercase hex characters (a valid entry key).
  static bool IsValidKey(std::string_view key);

 private:
  struct Counters {
    CacheLevelStats executable;
    CacheLevelStats kernel;
    CacheLevelStats& level(CacheLevel level) {
      return level == CacheLevel::kExecutable ? executable : kernel;
    }
  };

  DiskCache(DiskCacheOptions options, int lock_fd);

  std::string LevelDir(CacheLevel level) const;
  std::string EntryDir(CacheLevel level, const std::string& key_hex) const;

  // Deletes the file at `path` if it is still the one open as `fd` (another
  // process may have replaced it meanwhile), and counts it corrupt.
  void DiscardCorrupt(CacheLevel level, const std::string& path, int fd, int64_t size);

  // Whether the running total is over budget or due for a rescan.
  bool ScanDueLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(counters_mu_);

  // Takes the lock file, rescans both levels (removing stale temp files when
  // asked), evicts least-recently-used entries while the total exceeds
  // max_bytes, and resets the running totals. Unless `force`, returns at once
  // when another thread's scan made it unnecessary.
  absl::Status ScanAndEvict(bool force, bool remove_stale_temps);

  const DiskCacheOptions options_;
  const int64_t evict_to_bytes_;

  // Serializes scans, eviction and Clear within this process; lock_fd_ (an fd
  // of <dir>/lock, owned) serializes them across processes through flock().
  absl::Mutex lock_file_mu_;
  const int lock_fd_;

  mutable absl::Mutex counters_mu_;
  Counters counters_ ABSL_GUARDED_BY(counters_mu_);
  absl::Time last_scan_ ABSL_GUARDED_BY(counters_mu_) = absl::InfinitePast();
  int64_t stores_since_scan_ ABSL_GUARDED_BY(counters_mu_) = 0;
};

// kiln::backend::KernelBinaryCache over the kernel level of a DiskCache. A key
// that is not already a 64-character hex digest is hashed (SHA-256) into one.
// Lookup returns nullopt on a miss or a corrupt entry; Store drops failures
// (they are counted in the cache's store_failures), since a backend can always
// rebuild. Thread-safe; `cache` is not owned and must outlive the adapter.
class KernelBinaryCacheAdapter final : public backend::KernelBinaryCache {
 public:
  // Keeps `cache` alive: programs hold the adapter past the Engine's life.
  explicit KernelBinaryCacheAdapter(std::shared_ptr<DiskCache> cache) : cache_(std::move(cache)) {}

  std::optional<std::string> Lookup(const std::string& key) override;
  void Store(const std::string& key, std::string_view binary) override;

 private:
  std::shared_ptr<DiskCache> cache_;
};

}  // namespace kiln::compile
