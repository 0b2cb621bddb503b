#include "engine/compile/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/compile/cache_key.h"

namespace kiln::compile {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};
constexpr size_t kKeyChars = 64;
// Header field offsets (see the layout in disk_cache.h).
constexpr size_t kOffVersion = 8;
constexpr size_t kOffLevel = 12;
constexpr size_t kOffKey = 16;
constexpr size_t kOffLength = 80;
constexpr size_t kOffPayloadSum = 88;
constexpr size_t kOffHeaderSum = 96;
static_assert(kOffHeaderSum + 8 == kEntryHeaderBytes);

// Temp files live beside the entries: "<k0k1>/.tmp-<key>-XXXXXX".
constexpr char kTempPrefix[] = ".tmp-";
constexpr char kLockFileName[] = "lock";

constexpr CacheLevel kLevels[] = {CacheLevel::kExecutable, CacheLevel::kKernel};

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

uint64_t Checksum(const char* data, size_t size) { return XXH3_64bits(data, size); }

std::string EncodeHeader(CacheLevel level, const std::string& key_hex, std::string_view payload) {
  std::string header(kEntryHeaderBytes, '\0');
  char* p = header.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  PutU32(p + kOffVersion, kEntryFormatVersion);
  PutU32(p + kOffLevel, static_cast<uint32_t>(level));
  std::memcpy(p + kOffKey, key_hex.data(), kKeyChars);
  PutU64(p + kOffLength, payload.size());
  PutU64(p + kOffPayloadSum, Checksum(payload.data(), payload.size()));
  PutU64(p + kOffHeaderSum, Checksum(p, kOffHeaderSum));
  return header;
}

// The status for the errno left by `op` on `path`. Reads errno before
// anything else can change it, so call it right after the failing call.
absl::Status ErrnoError(const char* op, std::string_view path) {
  const int error = errno;
  return absl::ErrnoToStatus(error, absl::StrCat(op, " ", std::string(path)));
}

// Owns a file descriptor.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error close() may carry (deferred write errors).
  absl::Status Close(const std::string& path) {
    int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return ErrnoError("close", path);
    return absl::OkStatus();
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes at `offset`; fails on a short file or an error.
absl::Status PreadAll(int fd, char* out, size_t size, off_t offset) {
  while (size > 0) {
    ssize_t n = ::pread(fd, out, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read", "entry");
    }
    if (n == 0) return absl::DataLossError("file ended early");
    out += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open", dir);
  if (::fsync(fd.get()) != 0) return ErrnoError("fsync", dir);
  return absl::OkStatus();
}

// Stamps mtime (and atime) with the current time at full resolution, so LRU
// order is exact even for entries used within one kernel clock tick. Setting an
// explicit time needs ownership; for another user's entry fall back to "now".
void TouchNow(int fd) {
  timespec now = absl::ToTimespec(absl::Now());
  timespec times[2] = {now, now};
  if (::futimens(fd, times) != 0 && errno == EPERM) ::futimens(fd, nullptr);
}

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

bool SameTime(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// Publishes an entry atomically: writes `header` + `payload` to a unique temp
// file in `dir` (created if missing), stamps its mtime, fsyncs it, renames it
// to `dir`/`key` and fsyncs `dir`. Returns the size of the file it replaced,
// or -1 when there was none. On failure the temp file is removed.
absl::StatusOr<int64_t> PublishEntry(const std::string& level_dir, const std::string& dir,
                                     const std::string& key, std::string_view header,
                                     std::string_view payload) {
  const std::string temp_template = absl::StrCat(dir, "/", kTempPrefix, key, "-XXXXXX");
  std::string temp_path = temp_template;
  int raw_fd = ::mkostemp(temp_path.data(), O_CLOEXEC);
  if (raw_fd < 0 && errno == ENOENT) {
    // First entry of this fan-out directory (or the tree was removed under us).
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk cache: create ", dir, ": ", ec.message()));
    }
    KILN_RETURN_IF_ERROR(FsyncDir(level_dir));
    temp_path = temp_template;
    raw_fd = ::mkostemp(temp_path.data(), O_CLOEXEC);
  }
  if (raw_fd < 0) return ErrnoError("disk cache: create temp file in", dir);
  UniqueFd fd(raw_fd);
  absl::Cleanup remove_temp = [&temp_path] { ::unlink(temp_path.c_str()); };

  KILN_RETURN_IF_ERROR(WriteAll(fd.get(), header, temp_path));
  KILN_RETURN_IF_ERROR(WriteAll(fd.get(), payload, temp_path));
  TouchNow(fd.get());
  if (::fsync(fd.get()) != 0) return ErrnoError("disk cache: fsync", temp_path);
  KILN_RETURN_IF_ERROR(fd.Close(temp_path));

  const std::string final_path = absl::StrCat(dir, "/", key);
  struct stat old;
  const bool replaces = ::lstat(final_path.c_str(), &old) == 0 && S_ISREG(old.st_mode);
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    return ErrnoError("disk cache: rename to", final_path);
  }
  std::move(remove_temp).Cancel();
  KILN_RETURN_IF_ERROR(FsyncDir(dir));
  return replaces ? static_cast<int64_t>(old.st_size) : -1;
}

// Validates the entry open as `fd` (`size` bytes) for `level` and `key_hex`
// and reads its payload. Returns why it is invalid, or "" when it is valid.
std::string ReadEntry(int fd, int64_t size, CacheLevel level, const std::string& key_hex,
                      int64_t max_payload, std::string& payload) {
  if (size < kEntryHeaderBytes) {
    return absl::StrCat("truncated: ", size, " bytes, less than the ", kEntryHeaderBytes,
                        "-byte header");
  }
  char header[kEntryHeaderBytes];
  if (absl::Status s = PreadAll(fd, header, sizeof(header), 0); !s.ok()) {
    return absl::StrCat("header unreadable: ", s.message());
  }
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) return "bad magic";
  if (uint32_t version = GetU32(header + kOffVersion); version != kEntryFormatVersion) {
    return absl::StrCat("format version ", version, ", expected ", kEntryFormatVersion);
  }
  if (GetU64(header + kOffHeaderSum) != Checksum(header, kOffHeaderSum)) {
    return "header checksum mismatch";
  }
  if (uint32_t stored = GetU32(header + kOffLevel); stored != static_cast<uint32_t>(level)) {
    return absl::StrCat("entry is for level ", stored, ", expected ", static_cast<uint32_t>(level));
  }
  if (std::string_view stored(header + kOffKey, kKeyChars); stored != key_hex) {
    return absl::StrCat("entry is for key ", std::string(stored));
  }
  const uint64_t length = GetU64(header + kOffLength);
  const uint64_t present = static_cast<uint64_t>(size - kEntryHeaderBytes);
  if (length != present) {
    return absl::StrCat("header claims ", length, " payload bytes, file holds ", present);
  }
  // A file this large was never written by a cache with this budget; do not
  // allocate for it.
  if (length > static_cast<uint64_t>(max_payload)) {
    return absl::StrCat("payload of ", length, " bytes exceeds the cache budget");
  }
  payload.resize(length);
  if (absl::Status s = PreadAll(fd, payload.data(), length, kEntryHeaderBytes); !s.ok()) {
    return absl::StrCat("payload unreadable: ", s.message());
  }
  if (GetU64(header + kOffPayloadSum) != Checksum(payload.data(), payload.size())) {
    return "payload checksum mismatch";
  }
  return "";
}

struct ScannedEntry {
  std::string path;
  CacheLevel level;
  int64_t size;
  timespec mtime;
};

bool OlderThan(const ScannedEntry& a, const ScannedEntry& b) {
  if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec < b.mtime.tv_sec;
  if (a.mtime.tv_nsec != b.mtime.tv_nsec) return a.mtime.tv_nsec < b.mtime.tv_nsec;
  return a.path < b.path;
}

using DirPtr = std::unique_ptr<DIR, int (*)(DIR*)>;

// Lists the file names in `dir`; an absent directory lists nothing.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DirPtr d(::opendir(dir.c_str()), &::closedir);
  if (d == nullptr) {
    if (errno == ENOENT) return names;
    return ErrnoError("opendir", dir);
  }
  errno = 0;
  while (const dirent* e = ::readdir(d.get())) {
    std::string_view name(e->d_name);
    if (name != "." && name != "..") names.emplace_back(name);
    errno = 0;
  }
  if (errno != 0) return ErrnoError("readdir", dir);
  return names;
}

// Appends the entries of one level to `out`. Temp files older than
// `stale_before` are deleted (pass absl::InfinitePast() to keep them all).
absl::Status ScanLevel(const std::string& level_dir, CacheLevel level, absl::Time stale_before,
                       std::vector<ScannedEntry>& out) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> fans, ListDir(level_dir));
  for (const std::string& fan : fans) {
    if (fan.size() != 2 || !IsLowerHex(fan[0]) || !IsLowerHex(fan[1])) continue;
    const std::string fan_dir = absl::StrCat(level_dir, "/", fan);
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(fan_dir));
    for (const std::string& name : names) {
      const bool entry = DiskCache::IsValidKey(name) && absl::StartsWith(name, fan);
      const bool temp = absl::StartsWith(name, kTempPrefix);
      if (!entry && !temp) continue;
      std::string path = absl::StrCat(fan_dir, "/", name);
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // raced away
      if (entry) {
        out.push_back({std::move(path), level, static_cast<int64_t>(st.st_size), st.st_mtim});
      } else if (absl::TimeFromTimespec(st.st_mtim) < stale_before) {
        ::unlink(path.c_str());  // ENOENT: its writer or another process got there first
      }
    }
  }
  return absl::OkStatus();
}

// Holds flock(LOCK_EX) on a file descriptor for its lifetime.
class FileLock {
 public:
  static absl::StatusOr<FileLock> Acquire(int fd) {
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) return ErrnoError("flock", "the cache lock file");
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& other) : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::flock(fd_, LOCK_UN);
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace

const char* CacheLevelDirName(CacheLevel level) {
  return level == CacheLevel::kExecutable ? "executables" : "kernels";
}

bool DiskCache::IsValidKey(std::string_view key) {
  return key.size() == kKeyChars && std::all_of(key.begin(), key.end(), IsLowerHex);
}

absl::StatusOr<std::unique_ptr<DiskCache>> DiskCache::Create(const DiskCacheOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("disk cache: empty directory");
  if (options.max_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk cache: max_bytes must be positive, got ", options.max_bytes));
  }
  for (CacheLevel level : kLevels) {
    const std::string path = absl::StrCat(options.dir, "/", CacheLevelDirName(level));
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk cache: cannot create ", path, ": ", ec.message()));
    }
  }
  const std::string lock_path = absl::StrCat(options.dir, "/", kLockFileName);
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return ErrnoError("disk cache: open", lock_path);
  auto cache = std::unique_ptr<DiskCache>(new DiskCache(options, lock_fd));
  KILN_RETURN_IF_ERROR(cache->ScanAndEvict(/*force=*/true, /*remove_stale_temps=*/true))
      << "while opening the disk cache in " << options.dir;
  return cache;
}

DiskCache::DiskCache(DiskCacheOptions options, int lock_fd)
    : options_(std::move(options)),
      evict_to_bytes_(
          static_cast<int64_t>(static_cast<double>(options_.max_bytes) * kEvictToFraction)),
      lock_fd_(lock_fd) {}

DiskCache::~DiskCache() { ::close(lock_fd_); }

std::string DiskCache::LevelDir(CacheLevel level) const {
  return absl::StrCat(options_.dir, "/", CacheLevelDirName(level));
}

std::string DiskCache::EntryDir(CacheLevel level, const std::string& key_hex) const {
  return absl::StrCat(LevelDir(level), "/", key_hex.substr(0, 2));
}

LookupResult DiskCache::Lookup(CacheLevel level, const std::string& key_hex) {
  LookupResult result;
  auto count_miss = [&] {
    absl::MutexLock lock(&counters_mu_);
    ++counters_.level(level).misses;
  };
  if (!IsValidKey(key_hex)) {
    result.reason = "invalid cache key \"" + key_hex + "\"";
    count_miss();
    return result;
  }
  const std::string path = absl::StrCat(EntryDir(level, key_hex), "/", key_hex);
  // O_NONBLOCK: a FIFO (or device) planted in place of an entry must not
  // block open() until a writer comes; fstat then refuses it as not regular.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno != ENOENT) result.reason = ErrnoError("open", path).ToString();
    count_miss();
    return result;
  }
  struct stat st = {};
  std::string invalid;
  if (::fstat(fd.get(), &st) != 0) {
    invalid = ErrnoError("fstat", path).ToString();
  } else if (!S_ISREG(st.st_mode)) {
    invalid = "not a regular file";
  } else {
    invalid = ReadEntry(fd.get(), st.st_size, level, key_hex,
                        options_.max_bytes - kEntryHeaderBytes, result.payload);
  }
  if (!invalid.empty()) {
    DiscardCorrupt(level, path, fd.get(), st.st_size);
    result.outcome = LookupOutcome::kCorrupt;
    result.reason = absl::StrCat(path, ": ", invalid);
    result.payload.clear();
    return result;
  }
  TouchNow(fd.get());
  result.outcome = LookupOutcome::kHit;
  absl::MutexLock lock(&counters_mu_);
  ++counters_.level(level).hits;
  return result;
}

void DiskCache::DiscardCorrupt(CacheLevel level, const std::string& path, int fd, int64_t size) {
  // Delete by path only if the path still names the file we read: a writer
  // may have renamed a fresh, valid entry over it meanwhile.
  struct stat opened, current;
  const bool removed = ::fstat(fd, &opened) == 0 && ::lstat(path.c_str(), &current) == 0 &&
                       SameFile(opened, current) && ::unlink(path.c_str()) == 0;
  absl::MutexLock lock(&counters_mu_);
  CacheLevelStats& c = counters_.level(level);
  ++c.corrupt;
  if (removed) {
    c.bytes = std::max<int64_t>(0, c.bytes - size);
    c.entries = std::max<int64_t>(0, c.entries - 1);
  }
}

absl::Status DiskCache::Store(CacheLevel level, const std::string& key_hex,
                              std::string_view payload) {
  auto fail = [&](absl::Status status) {
    absl::MutexLock lock(&counters_mu_);
    ++counters_.level(level).store_failures;
    return status;
  };
  if (!IsValidKey(key_hex)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("disk cache: invalid key \"", key_hex, "\" (want 64 lowercase hex digits)")));
  }
  const int64_t entry_bytes = kEntryHeaderBytes + static_cast<int64_t>(payload.size());
  if (static_cast<int64_t>(payload.size()) > evict_to_bytes_ - kEntryHeaderBytes) {
    return fail(absl::ResourceExhaustedError(absl::StrCat("disk cache: a ", entry_bytes,
                                                          "-byte entry does not fit the budget of ",
                                                          options_.max_bytes, " bytes")));
  }

  absl::StatusOr<int64_t> replaced =
      PublishEntry(LevelDir(level), EntryDir(level, key_hex), key_hex,
                   EncodeHeader(level, key_hex, payload), payload);
  if (!replaced.ok()) return fail(replaced.status());

  bool scan = false;
  {
    absl::MutexLock lock(&counters_mu_);
    CacheLevelStats& c = counters_.level(level);
    ++c.stores;
    c.bytes += entry_bytes - std::max<int64_t>(*replaced, 0);
    c.entries += *replaced < 0 ? 1 : 0;
    ++stores_since_scan_;
    scan = ScanDueLocked(absl::Now());
  }
  if (scan) {
    KILN_RETURN_IF_ERROR(ScanAndEvict(/*force=*/false, /*remove_stale_temps=*/false))
        << "the entry was stored, but eviction failed";
  }
  return absl::OkStatus();
}

bool DiskCache::ScanDueLocked(absl::Time now) const {
  return counters_.executable.bytes + counters_.kernel.bytes > options_.max_bytes ||
         stores_since_scan_ >= kRescanStores || now - last_scan_ >= kRescanInterval;
}

absl::Status DiskCache::ScanAndEvict(bool force, bool remove_stale_temps) {
  absl::MutexLock file_lock(&lock_file_mu_);
  const absl::Time now = absl::Now();
  if (!force) {
    // Another thread may have scanned while this one waited.
    absl::MutexLock lock(&counters_mu_);
    if (!ScanDueLocked(now)) return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(FileLock flock_held, FileLock::Acquire(lock_fd_));

  const absl::Time stale_before = remove_stale_temps ? now - kStaleTempAge : absl::InfinitePast();
  std::vector<ScannedEntry> entries;
  for (CacheLevel level : kLevels) {
    KILN_RETURN_IF_ERROR(ScanLevel(LevelDir(level), level, stale_before, entries));
  }
  Counters found;
  for (const ScannedEntry& e : entries) {
    found.level(e.level).bytes += e.size;
    found.level(e.level).entries += 1;
  }

  int64_t total = found.executable.bytes + found.kernel.bytes;
  Counters evicted;
  absl::Status first_error;
  if (total > options_.max_bytes) {
    std::sort(entries.begin(), entries.end(), OlderThan);
    for (const ScannedEntry& e : entries) {
      if (total <= evict_to_bytes_) break;
      struct stat st;
      if (::lstat(e.path.c_str(), &st) != 0) {
        if (errno == ENOENT) {  // evicted or discarded by another process
          total -= e.size;
          found.level(e.level).bytes -= e.size;
          found.level(e.level).entries -= 1;
        }
        continue;
      }
      // Used or replaced since the scan: no longer least recently used.
      if (!SameTime(st.st_mtim, e.mtime)) continue;
      if (::unlink(e.path.c_str()) != 0 && errno != ENOENT) {
        if (first_error.ok()) first_error = ErrnoError("disk cache: evict", e.path);
        continue;
      }
      total -= e.size;
      found.level(e.level).bytes -= e.size;
      found.level(e.level).entries -= 1;
      evicted.level(e.level).evictions += 1;
    }
  }

  absl::MutexLock lock(&counters_mu_);
  for (CacheLevel level : kLevels) {
    CacheLevelStats& c = counters_.level(level);
    c.bytes = found.level(level).bytes;
    c.entries = found.level(level).entries;
    c.evictions += evicted.level(level).evictions;
  }
  last_scan_ = now;
  stores_since_scan_ = 0;
  return first_error;
}

absl::Status DiskCache::Clear() {
  absl::MutexLock file_lock(&lock_file_mu_);
  KILN_ASSIGN_OR_RETURN(FileLock flock_held, FileLock::Acquire(lock_fd_));
  std::vector<ScannedEntry> entries;
  for (CacheLevel level : kLevels) {
    KILN_RETURN_IF_ERROR(ScanLevel(LevelDir(level), level, absl::InfinitePast(), entries));
  }
  absl::Status first_error;
  Counters left;
  for (const ScannedEntry& e : entries) {
    if (::unlink(e.path.c_str()) == 0 || errno == ENOENT) continue;
    if (first_error.ok()) first_error = ErrnoError("disk cache: remove", e.path);
    left.level(e.level).bytes += e.size;
    left.level(e.level).entries += 1;
  }
  absl::MutexLock lock(&counters_mu_);
  for (CacheLevel level : kLevels) {
    counters_.level(level).bytes = left.level(level).bytes;
    counters_.level(level).entries = left.level(level).entries;
  }
  last_scan_ = absl::Now();
  stores_since_scan_ = 0;
  return first_error;
}

DiskCache::Stats DiskCache::stats() const {
  Stats stats;
  {
    absl::MutexLock lock(&counters_mu_);
    stats.executable = counters_.executable;
    stats.kernel = counters_.kernel;
  }
  for (const CacheLevelStats* c : {&stats.executable, &stats.kernel}) {
    stats.total.hits += c->hits;
    stats.total.misses += c->misses;
    stats.total.stores += c->stores;
    stats.total.store_failures += c->store_failures;
    stats.total.evictions += c->evictions;
    stats.total.corrupt += c->corrupt;
    stats.total.bytes += c->bytes;
    stats.total.entries += c->entries;
  }
  return stats;
}

std::optional<std::string> KernelBinaryCacheAdapter::Lookup(const std::string& key) {
  LookupResult result =
      cache_->Lookup(CacheLevel::kKernel, DiskCache::IsValidKey(key) ? key : Sha256Hex(key));
  if (result.outcome != LookupOutcome::kHit) return std::nullopt;
  return std::move(result.payload);
}

void KernelBinaryCacheAdapter::Store(const std::string& key, std::string_view binary) {
  // A failed store only costs a rebuild later; DiskCache counts it.
  cache_->Store(CacheLevel::kKernel, DiskCache::IsValidKey(key) ? key : Sha256Hex(key), binary)
      .IgnoreError();
}

}  // namespace kiln::compile
