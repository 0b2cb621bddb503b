// Disk cache tests on real files: one fresh directory under /tmp per test, no
// mocks. Cross-process tests re-run this binary as a child (see ChildMain).
#include "engine/compile/disk_cache.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/compile/cache_key.h"
#include "gtest/gtest.h"

extern char** environ;

namespace kiln::compile {
namespace {

namespace fs = std::filesystem;

constexpr char kChildEnv[] = "KILN_DISK_CACHE_CHILD";
constexpr int64_t kHeader = kEntryHeaderBytes;

std::string KeyOf(int i) { return Sha256Hex(absl::StrCat("key ", i)); }

// A payload that identifies its key and writer, so a reader can tell a valid
// payload from a mixed or misplaced one. Sizes vary with the key.
std::string PayloadOf(int key, int writer = 0) {
  std::string payload = absl::StrCat("key=", key, " writer=", writer, " ");
  const size_t size = 200 + static_cast<size_t>(key * 37 % 1800);
  while (payload.size() < size) {
    payload.push_back(static_cast<char>('a' + (key + payload.size()) % 26));
  }
  return payload;
}

bool IsValidPayload(const std::string& payload, int key, int writers) {
  for (int w = 0; w < writers; ++w) {
    if (payload == PayloadOf(key, w)) return true;
  }
  return false;
}

std::string EntryPath(const std::string& dir, CacheLevel level, const std::string& key) {
  return absl::StrCat(dir, "/", CacheLevelDirName(level), "/", key.substr(0, 2), "/", key);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Flips one bit in place, as bit rot on disk would (the size is unchanged).
void FlipBit(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(offset);
  char c = 0;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x10));
}

void WriteFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t GetU64(const std::string& s, size_t offset) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(s[offset + i])} << (8 * i);
  return v;
}

void PutU64(std::string& s, size_t offset, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Rewrites the header checksum (bytes 96..103 over 0..95) after an edit, so
// the entry fails on the field that was edited, not on the checksum.
void ResealHeader(std::string& entry) { PutU64(entry, 96, XXH3_64bits(entry.data(), 96)); }

// Every file under `dir` that is neither a valid-looking entry nor the lock.
std::vector<std::string> StrayFiles(const std::string& dir) {
  std::vector<std::string> stray;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (name == "lock" || DiskCache::IsValidKey(name)) continue;
    stray.push_back(e.path().string());
  }
  return stray;
}

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln_disk_cache_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    root_ = tmpl;
    dir_ = root_ + "/cache";  // Create makes it
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::unique_ptr<DiskCache> Open(int64_t max_bytes = int64_t{1} << 30) {
    absl::StatusOr<std::unique_ptr<DiskCache>> cache = DiskCache::Create({dir_, max_bytes});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  std::string root_;
  std::string dir_;
};

// --- Cross-process helpers -------------------------------------------------

struct ChildProcess {
  pid_t pid = -1;
  std::string log_path;
};

// Re-runs this test binary as a child that performs `action` (ChildMain below)
// with its output captured in a log file beside the cache.
ChildProcess SpawnChild(const std::string& action, const std::string& log_path) {
  ChildProcess child;
  child.log_path = log_path;
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--gtest_filter=DiskCacheChildProcess.DISABLED_Run",
                                   "--gtest_also_run_disabled_tests"};
  std::vector<std::string> env = {absl::StrCat(kChildEnv, "=", action)};
  // GTEST_* variables (output files, sharding) are the parent's business.
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    if (var.substr(0, std::strlen(kChildEnv)) == kChildEnv || var.substr(0, 6) == "GTEST_") {
      continue;
    }
    env.emplace_back(var);
  }
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int rc = ::posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(rc, 0) << std::strerror(rc);
  if (rc != 0) child.pid = -1;
  return child;
}

// Waits for the child; an empty string means it exited 0, else its log.
std::string WaitChild(const ChildProcess& child) {
  if (child.pid < 0) return "child did not start";
  int status = 0;
  if (::waitpid(child.pid, &status, 0) != child.pid) return "waitpid failed";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return absl::StrCat("child failed (status ", status, "):\n", ReadFile(child.log_path));
}

std::string RunChild(const std::string& action, const std::string& log_path) {
  return WaitChild(SpawnChild(action, log_path));
}

// Stores `rounds` payloads over keys [0, keys) as writer `writer`, looking up a
// pseudo-random key after each store. A corrupt entry or a wrong payload fails.
void StoreAndCheckMany(DiskCache& cache, int writer, int writers, int keys, int rounds,
                       uint32_t seed) {
  std::mt19937 rng(seed);
  for (int r = 0; r < rounds; ++r) {
    const int key = (r * 7 + writer) % keys;
    CacheLevel level = key % 3 == 0 ? CacheLevel::kExecutable : CacheLevel::kKernel;
    absl::Status stored = cache.Store(level, KeyOf(key), PayloadOf(key, writer));
    ASSERT_TRUE(stored.ok()) << stored;
    const int probe = static_cast<int>(rng() % keys);
    level = probe % 3 == 0 ? CacheLevel::kExecutable : CacheLevel::kKernel;
    LookupResult result = cache.Lookup(level, KeyOf(probe));
    ASSERT_NE(result.outcome, LookupOutcome::kCorrupt) << result.reason;
    if (result.outcome == LookupOutcome::kHit) {
      ASSERT_TRUE(IsValidPayload(result.payload, probe, writers)) << "key " << probe;
    }
  }
}

// What a child does, from KILN_DISK_CACHE_CHILD = "<verb> <dir> <args...>":
//   store <dir> <key> <writer>          stores PayloadOf(key, writer)
//   expect_hit <dir> <key> <writer>     fails unless the lookup hits with it
//   store_many <dir> <max_bytes> <writer> <writers> <keys> <rounds>
TEST(DiskCacheChildProcess, DISABLED_Run) {
  const char* action = std::getenv(kChildEnv);
  if (action == nullptr) GTEST_SKIP() << "runs only as a child of the cross-process tests";
  std::vector<std::string> words = absl::StrSplit(action, ' ');
  ASSERT_GE(words.size(), 2u) << action;
  std::vector<int64_t> args;
  for (size_t i = 2; i < words.size(); ++i) {
    ASSERT_TRUE(absl::SimpleAtoi(words[i], &args.emplace_back())) << action;
  }
  const std::string& verb = words[0];
  const std::string& dir = words[1];
  const int64_t max_bytes = verb == "store_many" ? args.at(0) : int64_t{1} << 30;
  absl::StatusOr<std::unique_ptr<DiskCache>> cache = DiskCache::Create({dir, max_bytes});
  ASSERT_TRUE(cache.ok()) << cache.status();
  if (verb == "store") {
    ASSERT_EQ(args.size(), 2u);
    absl::Status s =
        (*cache)->Store(CacheLevel::kExecutable, KeyOf(static_cast<int>(args[0])),
                        PayloadOf(static_cast<int>(args[0]), static_cast<int>(args[1])));
    ASSERT_TRUE(s.ok()) << s;
  } else if (verb == "expect_hit") {
    ASSERT_EQ(args.size(), 2u);
    LookupResult r = (*cache)->Lookup(CacheLevel::kExecutable, KeyOf(static_cast<int>(args[0])));
    ASSERT_EQ(r.outcome, LookupOutcome::kHit) << r.reason;
    ASSERT_EQ(r.payload, PayloadOf(static_cast<int>(args[0]), static_cast<int>(args[1])));
  } else if (verb == "store_many") {
    ASSERT_EQ(args.size(), 5u);
    StoreAndCheckMany(**cache, static_cast<int>(args[1]), static_cast<int>(args[2]),
                      static_cast<int>(args[3]), static_cast<int>(args[4]),
                      static_cast<uint32_t>(args[1] + 1));
  } else {
    FAIL() << "unknown child action: " << action;
  }
}

// --- Creation and layout -----------------------------------------------------

TEST_F(DiskCacheTest, CreateRejectsBadOptions) {
  EXPECT_EQ(DiskCache::Create({"", 100}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiskCache::Create({dir_, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  WriteFile(root_ + "/a_file", "x");
  EXPECT_FALSE(DiskCache::Create({root_ + "/a_file/cache", 1000}).ok());
}

TEST_F(DiskCacheTest, StoreLookupRoundTrip) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_TRUE(fs::is_directory(dir_ + "/executables"));
  EXPECT_TRUE(fs::is_directory(dir_ + "/kernels"));

  const std::string key = KeyOf(1);
  EXPECT_EQ(cache->Lookup(CacheLevel::kExecutable, key).outcome, LookupOutcome::kMiss);
  ASSERT_TRUE(cache->Store(CacheLevel::kExecutable, key, PayloadOf(1)).ok());
  const std::string path = EntryPath(dir_, CacheLevel::kExecutable, key);
  EXPECT_EQ(fs::file_size(path), kHeader + PayloadOf(1).size());

  LookupResult hit = cache->Lookup(CacheLevel::kExecutable, key);
  EXPECT_EQ(hit.outcome, LookupOutcome::kHit) << hit.reason;
  EXPECT_EQ(hit.payload, PayloadOf(1));
  // Levels are separate namespaces.
  EXPECT_EQ(cache->Lookup(CacheLevel::kKernel, key).outcome, LookupOutcome::kMiss);

  // Binary payloads (every byte value) and the empty payload survive.
  std::string binary;
  for (int i = 0; i < 512; ++i) binary.push_back(static_cast<char>(i));
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(2), binary).ok());
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(3), "").ok());
  EXPECT_EQ(cache->Lookup(CacheLevel::kKernel, KeyOf(2)).payload, binary);
  LookupResult empty = cache->Lookup(CacheLevel::kKernel, KeyOf(3));
  EXPECT_EQ(empty.outcome, LookupOutcome::kHit);
  EXPECT_EQ(empty.payload, "");

  // A second instance (a restarted kilnd) finds the entries and counts them.
  auto reopened = Open();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->Lookup(CacheLevel::kExecutable, key).payload, PayloadOf(1));
  DiskCache::Stats stats = reopened->stats();
  EXPECT_EQ(stats.executable.entries, 1);
  EXPECT_EQ(stats.kernel.entries, 2);
  EXPECT_EQ(stats.total.bytes, 3 * kHeader + static_cast<int64_t>(PayloadOf(1).size() + 512));
}

TEST_F(DiskCacheTest, StoreReplacesAnEntryOfTheSameKey) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(1), "first").ok());
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(1), "second, longer").ok());
  EXPECT_EQ(cache->Lookup(CacheLevel::kKernel, KeyOf(1)).payload, "second, longer");
  EXPECT_EQ(cache->stats().kernel.entries, 1);
  EXPECT_EQ(cache->stats().kernel.bytes, kHeader + 14);
  EXPECT_TRUE(StrayFiles(dir_).empty());
}

TEST_F(DiskCacheTest, RejectsInvalidKeysAndOversizedEntries) {
  auto cache = Open(/*max_bytes=*/10000);
  ASSERT_NE(cache, nullptr);
  const std::vector<std::string> bad_keys = {"",
                                             "abc",
                                             "../../../../etc/passwd",
                                             std::string(64, 'A'),
                                             std::string(63, 'a') + "/",
                                             std::string(65, 'a')};
  for (const std::string& bad : bad_keys) {
    EXPECT_EQ(cache->Store(CacheLevel::kKernel, bad, "x").code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
    LookupResult r = cache->Lookup(CacheLevel::kKernel, bad);
    EXPECT_EQ(r.outcome, LookupOutcome::kMiss) << bad;
    EXPECT_NE(r.reason, "") << bad;
  }
  EXPECT_EQ(cache->Store(CacheLevel::kKernel, KeyOf(1), std::string(9000, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->stats().kernel.store_failures, 7);
  EXPECT_EQ(cache->stats().kernel.stores, 0);
  EXPECT_TRUE(StrayFiles(dir_).empty());
}

// --- Corruption ----------------------------------------------------------------

// Stores a valid entry for `key` (unless the last call left one), lets
// `damage` edit the file's bytes, and expects the lookup to report kCorrupt,
// delete the file, and a fresh store to work afterwards.
void ExpectRecoveredAsCorrupt(DiskCache& cache, const std::string& dir, const std::string& key,
                              const std::function<void(std::string&)>& damage,
                              const std::string& what) {
  SCOPED_TRACE(what);
  const std::string path = EntryPath(dir, CacheLevel::kExecutable, key);
  if (!fs::exists(path)) {
    ASSERT_TRUE(cache.Store(CacheLevel::kExecutable, key, PayloadOf(5)).ok());
  }
  std::string bytes = ReadFile(path);
  damage(bytes);
  WriteFile(path, bytes);
  const int64_t corrupt_before = cache.stats().executable.corrupt;
  LookupResult r = cache.Lookup(CacheLevel::kExecutable, key);
  ASSERT_EQ(r.outcome, LookupOutcome::kCorrupt);
  EXPECT_EQ(r.payload, "");
  EXPECT_NE(r.reason, "");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(cache.stats().executable.corrupt, corrupt_before + 1);
  EXPECT_EQ(cache.Lookup(CacheLevel::kExecutable, key).outcome, LookupOutcome::kMiss);
  ASSERT_TRUE(cache.Store(CacheLevel::kExecutable, key, PayloadOf(5)).ok());
  LookupResult again = cache.Lookup(CacheLevel::kExecutable, key);
  EXPECT_EQ(again.outcome, LookupOutcome::kHit) << again.reason;
  EXPECT_EQ(again.payload, PayloadOf(5));
}

TEST_F(DiskCacheTest, TruncatedEntriesAreCorrupt) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const size_t full = kHeader + PayloadOf(5).size();
  for (size_t length : {size_t{0}, size_t{1}, size_t{7}, size_t{50}, size_t{kHeader - 1},
                        size_t{kHeader}, size_t{kHeader + 1}, full / 2, full - 1}) {
    ExpectRecoveredAsCorrupt(
        *cache, dir_, KeyOf(5), [length](std::string& b) { b.resize(length); },
        absl::StrCat("truncated to ", length));
  }
  // Extra bytes after the payload are as wrong as missing ones.
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5), [](std::string& b) { b += "tail"; }, "appended");
}

TEST_F(DiskCacheTest, EveryFlippedHeaderByteAndPayloadBitIsCaught) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  for (size_t offset = 0; offset < static_cast<size_t>(kHeader); ++offset) {
    ExpectRecoveredAsCorrupt(
        *cache, dir_, KeyOf(5), [offset](std::string& b) { b[offset] ^= 0x01; },
        absl::StrCat("header byte ", offset));
  }
  const size_t payload = PayloadOf(5).size();
  for (size_t offset : {size_t{0}, size_t{1}, payload / 2, payload - 1}) {
    for (int bit : {0, 7}) {
      ExpectRecoveredAsCorrupt(
          *cache, dir_, KeyOf(5),
          [offset, bit](std::string& b) { b[kHeader + offset] ^= static_cast<char>(1 << bit); },
          absl::StrCat("payload byte ", offset, " bit ", bit));
    }
  }
}

TEST_F(DiskCacheTest, ResealedHeadersWithWrongFieldsAreCorrupt) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  // Fields changed with a matching header checksum: each check stands alone.
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5),
      [](std::string& b) {
        b[8] = 2;  // format version 2
        ResealHeader(b);
      },
      "future format version");
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5),
      [](std::string& b) {
        b[12] = static_cast<char>(CacheLevel::kKernel);
        ResealHeader(b);
      },
      "other level");
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5),
      [](std::string& b) {
        PutU64(b, 80, uint64_t{1} << 60);  // claims an exabyte payload
        ResealHeader(b);
      },
      "huge claimed length");
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5),
      [](std::string& b) {
        PutU64(b, 80, GetU64(b, 80) - 1);
        ResealHeader(b);
      },
      "short claimed length");
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5),
      [](std::string& b) {
        PutU64(b, 88, GetU64(b, 88) + 1);
        ResealHeader(b);
      },
      "payload checksum");
}

TEST_F(DiskCacheTest, RandomGarbageIsCorrupt) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  std::mt19937 rng(42);
  for (size_t size : {size_t{1}, size_t{104}, size_t{105}, size_t{4096}, size_t{100000}}) {
    ExpectRecoveredAsCorrupt(
        *cache, dir_, KeyOf(5),
        [&rng, size](std::string& b) {
          b.resize(size);
          for (char& c : b) c = static_cast<char>(rng());
        },
        absl::StrCat(size, " random bytes"));
  }
  // Garbage that keeps a valid magic.
  ExpectRecoveredAsCorrupt(
      *cache, dir_, KeyOf(5),
      [&rng](std::string& b) {
        for (size_t i = 8; i < b.size(); ++i) b[i] = static_cast<char>(rng());
      },
      "random after magic");
}

TEST_F(DiskCacheTest, ForeignEntriesAreRejected) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string a = KeyOf(1), b = KeyOf(2);
  ASSERT_TRUE(cache->Store(CacheLevel::kExecutable, a, PayloadOf(1)).ok());

  // A valid entry for key A renamed to key B's path.
  const std::string b_path = EntryPath(dir_, CacheLevel::kExecutable, b);
  fs::create_directories(fs::path(b_path).parent_path());
  fs::rename(EntryPath(dir_, CacheLevel::kExecutable, a), b_path);
  LookupResult r = cache->Lookup(CacheLevel::kExecutable, b);
  EXPECT_EQ(r.outcome, LookupOutcome::kCorrupt);
  EXPECT_NE(r.reason.find("entry is for key " + a), std::string::npos) << r.reason;
  EXPECT_FALSE(fs::exists(b_path));
  EXPECT_EQ(cache->Lookup(CacheLevel::kExecutable, a).outcome, LookupOutcome::kMiss);

  // A valid executable entry copied into the kernel level under the same key.
  ASSERT_TRUE(cache->Store(CacheLevel::kExecutable, a, PayloadOf(1)).ok());
  const std::string kernel_path = EntryPath(dir_, CacheLevel::kKernel, a);
  fs::create_directories(fs::path(kernel_path).parent_path());
  fs::copy_file(EntryPath(dir_, CacheLevel::kExecutable, a), kernel_path);
  r = cache->Lookup(CacheLevel::kKernel, a);
  EXPECT_EQ(r.outcome, LookupOutcome::kCorrupt);
  EXPECT_NE(r.reason.find("level"), std::string::npos) << r.reason;
  // The original is untouched.
  EXPECT_EQ(cache->Lookup(CacheLevel::kExecutable, a).payload, PayloadOf(1));
  EXPECT_EQ(cache->stats().total.corrupt, 2);
}

TEST_F(DiskCacheTest, NonRegularFileAtEntryPathIsNotTrusted) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string key = KeyOf(1);
  const std::string path = EntryPath(dir_, CacheLevel::kKernel, key);
  fs::create_directories(fs::path(path).parent_path());
  fs::create_symlink("/etc/hostname", path);  // symlinks are never followed
  EXPECT_NE(cache->Lookup(CacheLevel::kKernel, key).outcome, LookupOutcome::kHit);
  fs::remove(path);
  fs::create_directories(path);
  EXPECT_EQ(cache->Lookup(CacheLevel::kKernel, key).outcome, LookupOutcome::kCorrupt);
}

// --- Budget and LRU ---------------------------------------------------------------

TEST_F(DiskCacheTest, EvictionKeepsMostRecentlyUsedEntries) {
  constexpr int64_t kPayload = 1000;
  constexpr int64_t kEntry = kHeader + kPayload;
  auto cache = Open(/*max_bytes=*/10 * kEntry);
  ASSERT_NE(cache, nullptr);
  const std::string payload(kPayload, 'p');
  for (int i = 0; i < 10; ++i) {
    // Alternate levels: one budget and one LRU order covers both.
    const CacheLevel level = i % 2 ? CacheLevel::kKernel : CacheLevel::kExecutable;
    ASSERT_TRUE(cache->Store(level, KeyOf(i), payload).ok());
  }
  EXPECT_EQ(cache->stats().total.evictions, 0);
  EXPECT_EQ(cache->stats().total.bytes, 10 * kEntry);
  // Use the two oldest entries, then overflow the budget.
  ASSERT_EQ(cache->Lookup(CacheLevel::kExecutable, KeyOf(0)).outcome, LookupOutcome::kHit);
  ASSERT_EQ(cache->Lookup(CacheLevel::kKernel, KeyOf(1)).outcome, LookupOutcome::kHit);
  ASSERT_TRUE(cache->Store(CacheLevel::kExecutable, KeyOf(10), payload).ok());

  DiskCache::Stats stats = cache->stats();
  EXPECT_GT(stats.total.evictions, 0);
  EXPECT_LE(stats.total.bytes, static_cast<int64_t>(10 * kEntry * DiskCache::kEvictToFraction));
  auto present = [&](int i) {
    const CacheLevel level = i % 2 ? CacheLevel::kKernel : CacheLevel::kExecutable;
    return fs::exists(EntryPath(dir_, level, KeyOf(i)));
  };
  EXPECT_TRUE(present(0));
  EXPECT_TRUE(present(1));
  EXPECT_TRUE(present(10));
  EXPECT_FALSE(present(2));
  // Exactly the oldest unused entries went: a prefix of 2, 3, ..., 9.
  int evicted = 0;
  while (evicted + 2 < 10 && !present(evicted + 2)) ++evicted;
  EXPECT_EQ(evicted, stats.total.evictions);
  for (int i = evicted + 2; i <= 10; ++i) EXPECT_TRUE(present(i)) << i;
  EXPECT_EQ(stats.total.entries, 11 - evicted);
}

TEST_F(DiskCacheTest, CreateEvictsADirectoryOverItsBudget) {
  {
    auto big = Open();
    ASSERT_NE(big, nullptr);
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(big->Store(CacheLevel::kKernel, KeyOf(i), std::string(1000, 'x')).ok());
    }
  }
  auto small = Open(/*max_bytes=*/5 * (kHeader + 1000));
  ASSERT_NE(small, nullptr);
  DiskCache::Stats stats = small->stats();
  EXPECT_LE(stats.total.bytes, 5 * (kHeader + 1000));
  EXPECT_EQ(stats.kernel.evictions, 20 - stats.kernel.entries);
  // The newest survive.
  EXPECT_EQ(small->Lookup(CacheLevel::kKernel, KeyOf(19)).outcome, LookupOutcome::kHit);
  EXPECT_EQ(small->Lookup(CacheLevel::kKernel, KeyOf(0)).outcome, LookupOutcome::kMiss);
}

TEST_F(DiskCacheTest, CreateRemovesStaleTempFilesOnly) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(1), "kept").ok());
  const std::string fan = fs::path(EntryPath(dir_, CacheLevel::kKernel, KeyOf(1))).parent_path();
  const std::string stale = fan + "/.tmp-" + KeyOf(1) + "-AbCdEf";
  const std::string fresh = fan + "/.tmp-" + KeyOf(1) + "-GhIjKl";
  const std::string unrelated = fan + "/README";
  WriteFile(stale, "half written");
  WriteFile(fresh, "being written");
  WriteFile(unrelated, "not ours");
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(1));

  auto reopened = Open();
  ASSERT_NE(reopened, nullptr);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_TRUE(fs::exists(unrelated));
  EXPECT_EQ(reopened->stats().kernel.entries, 1);
  EXPECT_EQ(reopened->Lookup(CacheLevel::kKernel, KeyOf(1)).payload, "kept");
}

TEST_F(DiskCacheTest, ClearRemovesEveryEntry) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(
        cache->Store(i % 2 ? CacheLevel::kKernel : CacheLevel::kExecutable, KeyOf(i), PayloadOf(i))
            .ok());
  }
  ASSERT_TRUE(cache->Clear().ok());
  DiskCache::Stats stats = cache->stats();
  EXPECT_EQ(stats.total.bytes, 0);
  EXPECT_EQ(stats.total.entries, 0);
  EXPECT_EQ(stats.total.stores, 6);  // counters are kept
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(
        cache->Lookup(i % 2 ? CacheLevel::kKernel : CacheLevel::kExecutable, KeyOf(i)).outcome,
        LookupOutcome::kMiss);
  }
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(1), "after clear").ok());
  EXPECT_EQ(cache->Lookup(CacheLevel::kKernel, KeyOf(1)).payload, "after clear");
}

TEST_F(DiskCacheTest, StatsCountEachOutcome) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  const std::string payload = "0123456789";
  ASSERT_TRUE(cache->Store(CacheLevel::kExecutable, KeyOf(1), payload).ok());
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(2), payload).ok());
  ASSERT_TRUE(cache->Store(CacheLevel::kKernel, KeyOf(3), payload).ok());
  cache->Lookup(CacheLevel::kExecutable, KeyOf(1));  // hit
  cache->Lookup(CacheLevel::kExecutable, KeyOf(1));  // hit
  cache->Lookup(CacheLevel::kExecutable, KeyOf(9));  // miss
  cache->Lookup(CacheLevel::kKernel, KeyOf(2));      // hit
  FlipBit(EntryPath(dir_, CacheLevel::kKernel, KeyOf(3)), kHeader + 3);
  cache->Lookup(CacheLevel::kKernel, KeyOf(3));  // corrupt
  cache->Lookup(CacheLevel::kKernel, KeyOf(3));  // miss

  DiskCache::Stats s = cache->stats();
  EXPECT_EQ(s.executable.stores, 1);
  EXPECT_EQ(s.executable.hits, 2);
  EXPECT_EQ(s.executable.misses, 1);
  EXPECT_EQ(s.executable.corrupt, 0);
  EXPECT_EQ(s.executable.entries, 1);
  EXPECT_EQ(s.executable.bytes, kHeader + 10);
  EXPECT_EQ(s.kernel.stores, 2);
  EXPECT_EQ(s.kernel.hits, 1);
  EXPECT_EQ(s.kernel.misses, 1);
  EXPECT_EQ(s.kernel.corrupt, 1);
  EXPECT_EQ(s.kernel.entries, 1);
  EXPECT_EQ(s.kernel.bytes, kHeader + 10);
  EXPECT_EQ(s.total.hits, 3);
  EXPECT_EQ(s.total.misses, 2);
  EXPECT_EQ(s.total.stores, 3);
  EXPECT_EQ(s.total.corrupt, 1);
  EXPECT_EQ(s.total.evictions, 0);
  EXPECT_EQ(s.total.entries, 2);
  EXPECT_EQ(s.total.bytes, 2 * (kHeader + 10));
}

// --- Sharing ------------------------------------------------------------------------

TEST_F(DiskCacheTest, HitAcrossProcesses) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  // A child stores, the parent reads.
  EXPECT_EQ(RunChild(absl::StrCat("store ", dir_, " 7 3"), root_ + "/child1.log"), "");
  LookupResult r = cache->Lookup(CacheLevel::kExecutable, KeyOf(7));
  EXPECT_EQ(r.outcome, LookupOutcome::kHit) << r.reason;
  EXPECT_EQ(r.payload, PayloadOf(7, 3));
  // The parent stores, a child reads.
  ASSERT_TRUE(cache->Store(CacheLevel::kExecutable, KeyOf(8), PayloadOf(8, 1)).ok());
  EXPECT_EQ(RunChild(absl::StrCat("expect_hit ", dir_, " 8 1"), root_ + "/child2.log"), "");
  // And the child really checks: a wrong expectation fails it.
  EXPECT_NE(RunChild(absl::StrCat("expect_hit ", dir_, " 8 2"), root_ + "/child3.log"), "");
}

// After concurrent writers, every file is a valid entry and every lookup is a
// hit with a valid payload or a clean miss.
void ExpectOnlyValidEntries(const std::string& dir, int keys, int writers) {
  EXPECT_EQ(StrayFiles(dir), std::vector<std::string>{});
  absl::StatusOr<std::unique_ptr<DiskCache>> cache = DiskCache::Create({dir, int64_t{1} << 30});
  ASSERT_TRUE(cache.ok()) << cache.status();
  int hits = 0;
  for (int key = 0; key < keys; ++key) {
    for (CacheLevel level : {CacheLevel::kExecutable, CacheLevel::kKernel}) {
      LookupResult r = (*cache)->Lookup(level, KeyOf(key));
      ASSERT_NE(r.outcome, LookupOutcome::kCorrupt) << r.reason;
      if (r.outcome != LookupOutcome::kHit) continue;
      ++hits;
      EXPECT_TRUE(IsValidPayload(r.payload, key, writers)) << key;
    }
  }
  EXPECT_GT(hits, 0);
  EXPECT_EQ((*cache)->stats().total.corrupt, 0);
}

TEST_F(DiskCacheTest, ConcurrentWritersInTwoProcesses) {
  constexpr int kKeys = 60, kRounds = 200, kWriters = 2;
  // A budget of about 25 entries, so eviction races stores and lookups too.
  const int64_t budget = 25 * (kHeader + 1100);
  ASSERT_NE(Open(budget), nullptr);
  std::vector<ChildProcess> children;
  for (int w = 0; w < kWriters; ++w) {
    children.push_back(SpawnChild(absl::StrCat("store_many ", dir_, " ", budget, " ", w, " ",
                                               kWriters, " ", kKeys, " ", kRounds),
                                  absl::StrCat(root_, "/writer", w, ".log")));
  }
  for (const ChildProcess& child : children) EXPECT_EQ(WaitChild(child), "");
  ExpectOnlyValidEntries(dir_, kKeys, kWriters);
}

TEST_F(DiskCacheTest, ConcurrentWritersInThreads) {
  constexpr int kKeys = 40, kRounds = 100, kThreads = 4;
  const int64_t budget = 20 * (kHeader + 1100);
  // Two instances over one directory in one process: the threads of each
  // share a cache object, and the two objects contend through the lock file.
  auto first = Open(budget);
  auto second = Open(budget);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    DiskCache& cache = t % 2 ? *second : *first;
    threads.emplace_back([&cache, t] {
      StoreAndCheckMany(cache, t, kThreads, kKeys, kRounds, static_cast<uint32_t>(100 + t));
    });
  }
  for (std::thread& t : threads) t.join();

  DiskCache::Stats a = first->stats(), b = second->stats();
  EXPECT_EQ(a.total.stores + b.total.stores, kThreads * kRounds);
  EXPECT_EQ(a.total.hits + a.total.misses + b.total.hits + b.total.misses, kThreads * kRounds);
  EXPECT_EQ(a.total.corrupt + b.total.corrupt, 0);
  EXPECT_GT(a.total.evictions + b.total.evictions, 0)
      << a.total.bytes << " " << b.total.bytes << " " << a.total.entries;
  ExpectOnlyValidEntries(dir_, kKeys, kThreads);
}

// --- Backend adapter -------------------------------------------------------------

TEST_F(DiskCacheTest, KernelBinaryCacheAdapter) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  std::shared_ptr<DiskCache> shared(std::move(cache));
  KernelBinaryCacheAdapter adapter(shared);
  backend::KernelBinaryCache& binaries = adapter;

  // Backends may use any key text; it is hashed into an entry key.
  const std::string key = "vulkan|spirv|softmax_f32|-O";
  EXPECT_EQ(binaries.Lookup(key), std::nullopt);
  binaries.Store(key, std::string("\x03\x02\x23\x07spirv", 9));
  EXPECT_EQ(binaries.Lookup(key), std::string("\x03\x02\x23\x07spirv", 9));
  EXPECT_TRUE(fs::exists(EntryPath(dir_, CacheLevel::kKernel, Sha256Hex(key))));

  // A hex digest key is used as is.
  const std::string hex = KeyOf(4);
  binaries.Store(hex, "cubin");
  EXPECT_TRUE(fs::exists(EntryPath(dir_, CacheLevel::kKernel, hex)));

  WriteFile(EntryPath(dir_, CacheLevel::kKernel, hex), "damaged");
  EXPECT_EQ(binaries.Lookup(hex), std::nullopt);
  DiskCache::Stats s = shared->stats();
  EXPECT_EQ(s.kernel.hits, 1);
  EXPECT_EQ(s.kernel.misses, 1);
  EXPECT_EQ(s.kernel.corrupt, 1);
  EXPECT_EQ(s.kernel.stores, 2);
  EXPECT_EQ(s.executable.stores, 0);
}

}  // namespace
}  // namespace kiln::compile
