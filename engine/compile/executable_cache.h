// The executable cache (DESIGN.md section 4): two levels in front of the
// compile pipeline.
//   memory  loaded programs by executable key, least recently used dropped
//           past `max_entries`
//   disk    the executable level of a DiskCache (serialized LIR with its
//           compile report), shared across processes; optional
// GetOrCompile serves a key from memory, then disk, then compiles it once
// however many callers ask at the same time, stores it on both levels, and
// says in the compile report which level answered. On a miss the report's
// miss_reason names the key components that differ from the nearest
// executable this cache has seen (the last `max_known_keys` keys it held,
// evicted ones included).
//
// Thread safety: every method is thread-safe. Compiles of different keys run
// at once; callers of one key wait for its compile.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/compile/cache_key.h"
#include "engine/compile/disk_cache.h"
#include "engine/engine.h"
#include "engine/runtime/device_registry.h"
#include "engine/runtime/program.h"
#include "kiln/v1/report.pb.h"

namespace kiln::compile {

struct ExecutableCacheOptions {
  int64_t max_entries = 256;  // programs kept loaded; at least 1 is kept
  // Keys remembered to explain misses against (more than max_entries: an
  // evicted key still explains why it recompiled).
  int64_t max_known_keys = 1024;
  std::shared_ptr<DiskCache> disk;  // may be null: no disk level
  // What loading a disk entry takes (as Pipeline compiles with it).
  std::shared_ptr<const runtime::DeviceRegistry> registry;      // required
  std::shared_ptr<backend::KernelBinaryCache> kernel_binaries;  // may be null
  runtime::ProgramOptions program_options;
};

class ExecutableCache {
 public:
  explicit ExecutableCache(ExecutableCacheOptions options);
  ExecutableCache(const ExecutableCache&) = delete;
  ExecutableCache& operator=(const ExecutableCache&) = delete;

  // Compiles a missing executable into a program whose key is the one given;
  // fills the report's compile fields (Pipeline::Compile).
  using CompileFn =
      absl::FunctionRef<absl::StatusOr<std::unique_ptr<runtime::Program>>(v1::CompileReport&)>;

  // The program of `key`: from memory (CACHE_HIT_MEMORY), else from disk
  // (CACHE_HIT_DISK, with a "cache_load" stage and the stored memory plans,
  // paths and counts), else from `compile` (CACHE_MISS, CACHE_DISABLED without
  // a disk level, CACHE_CORRUPT when a disk entry was discarded), then stored
  // on disk with the report as compiled. Sets report.executable_cache, and
  // report.miss_reason when it compiled. A failed compile is returned as is
  // and caches nothing.
  //
  // `key` is the executable key's Hex() and `components` its Components().
  // `allow_int8_activations` is the compile's CompileOptions field of that name
  // (part of the key), which a disk entry is loaded with
  // (runtime::ProgramOptions; the LIR does not record it).
  absl::StatusOr<std::shared_ptr<runtime::Program>> GetOrCompile(
      const std::string& key, std::span<const v1::KeyComponent> components,
      v1::CompileReport& report, CompileFn compile, bool allow_int8_activations = false);

  // Why `key` (with `components`) is not cached: the components that differ
  // from the nearest key seen (most components alike, the most recent on a
  // tie), or that it was cached and evicted, or that no key was seen yet.
  std::string ExplainMiss(const std::string& key,
                          std::span<const v1::KeyComponent> components) const;

  // This cache's counters, with the disk level's bytes, entries and evictions.
  CacheStats stats() const;

 private:
  struct Loaded {
    std::shared_ptr<runtime::Program> program;
    std::list<std::string>::iterator lru;
  };
  struct Known {
    std::string hex;
    std::vector<v1::KeyComponent> components;
  };

  absl::StatusOr<std::shared_ptr<runtime::Program>> Get(
      const std::string& hex, std::span<const v1::KeyComponent> components,
      v1::CompileReport& report, CompileFn compile, bool allow_int8_activations);
  std::shared_ptr<runtime::Program> FindLoaded(const std::string& hex);
  void Remember(const std::string& hex, std::span<const v1::KeyComponent> components,
                std::shared_ptr<runtime::Program> program);
  std::shared_ptr<absl::Mutex> CompileLock(const std::string& hex);
  // Null on a miss, or after discarding a bad entry (then CACHE_CORRUPT and a
  // note are in the report).
  std::shared_ptr<runtime::Program> LoadFromDisk(const std::string& hex, v1::CompileReport& report,
                                                 bool allow_int8_activations);
  void Store(const std::string& hex, const runtime::Program& program,
             const v1::CompileReport& report);

  const ExecutableCacheOptions options_;

  mutable absl::Mutex entries_mu_;
  std::list<std::string> lru_ ABSL_GUARDED_BY(entries_mu_);  // front = most recent
  std::map<std::string, Loaded> loaded_ ABSL_GUARDED_BY(entries_mu_);
  // One compile per key at a time; concurrent requests for it wait.
  std::map<std::string, std::shared_ptr<absl::Mutex>> compiling_ ABSL_GUARDED_BY(entries_mu_);
  // Keys held, most recent first, at most max_known_keys.
  std::list<Known> known_ ABSL_GUARDED_BY(entries_mu_);
  absl::flat_hash_map<std::string, std::list<Known>::iterator> known_by_hex_
      ABSL_GUARDED_BY(entries_mu_);

  mutable absl::Mutex stats_mu_;
  CacheStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace kiln::compile
