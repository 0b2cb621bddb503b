#include "engine/compile/executable_cache.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/compile/lower.h"
#include "engine/compile/stage_clock.h"
#include "spdlog/spdlog.h"

namespace kiln::compile {

ExecutableCache::ExecutableCache(ExecutableCacheOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<runtime::Program>> ExecutableCache::GetOrCompile(
    const std::string& key, std::span<const v1::KeyComponent> components, v1::CompileReport& report,
    CompileFn compile, bool allow_int8_activations) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<runtime::Program> program,
                        Get(key, components, report, compile, allow_int8_activations));
  absl::MutexLock lock(&stats_mu_);
  stats_.kernel_hits += report.kernel_cache_hits();
  stats_.kernel_misses += report.kernel_cache_misses();
  return program;
}

absl::StatusOr<std::shared_ptr<runtime::Program>> ExecutableCache::Get(
    const std::string& hex, std::span<const v1::KeyComponent> components, v1::CompileReport& report,
    CompileFn compile, bool allow_int8_activations) {
  if (auto program = FindLoaded(hex)) {
    report.set_executable_cache(v1::CACHE_HIT_MEMORY);
    absl::MutexLock lock(&stats_mu_);
    ++stats_.memory_hits;
    return program;
  }
  auto lock_for_key = CompileLock(hex);
  absl::MutexLock compile_lock(lock_for_key.get());
  if (auto program = FindLoaded(hex)) {  // another request compiled it meanwhile
    report.set_executable_cache(v1::CACHE_HIT_MEMORY);
    return program;
  }
  const auto t_load = Clock::now();
  if (auto program = LoadFromDisk(hex, report, allow_int8_activations)) {
    report.set_executable_cache(v1::CACHE_HIT_DISK);
    v1::StageTiming* st = report.add_stages();
    st->set_stage("cache_load");
    st->set_micros(MicrosSince(t_load));
    // Its parts: loading the program onto its devices (Program::load_stages).
    for (const v1::StageTiming& phase : program->load_stages()) *report.add_stages() = phase;
    const v1::CompileReport& stored = program->lir().compile();
    for (const auto& m : stored.memory()) *report.add_memory() = m;
    for (const auto& p : stored.paths()) *report.add_paths() = p;
    report.set_kernels(stored.kernels());
    report.set_copies(stored.copies());
    {
      absl::MutexLock lock(&stats_mu_);
      ++stats_.disk_hits;
    }
    Remember(hex, components, program);
    return program;
  }
  if (report.executable_cache() != v1::CACHE_CORRUPT) {
    report.set_executable_cache(options_.disk ? v1::CACHE_MISS : v1::CACHE_DISABLED);
    report.set_miss_reason(ExplainMiss(hex, components));
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<runtime::Program> program, compile(report));
  Store(hex, *program, report);
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.misses;
  }
  Remember(hex, components, program);
  return program;
}

std::string ExecutableCache::ExplainMiss(const std::string& key,
                                         std::span<const v1::KeyComponent> components) const {
  absl::MutexLock lock(&entries_mu_);
  if (known_by_hex_.contains(key)) {
    return "this executable was cached before and has been evicted";
  }
  const Known* nearest = nullptr;
  int most_alike = -1;
  for (const Known& k : known_) {  // most recent first: it wins a tie
    const int alike = ComponentsAlike(k.components, components);
    if (alike > most_alike) {
      most_alike = alike;
      nearest = &k;
    }
  }
  if (nearest == nullptr) return "no executable cached yet to compare with";
  return absl::StrCat("against cached executable ", nearest->hex.substr(0, 12),
                      "..: ", ExplainComponents(nearest->components, components));
}

std::shared_ptr<runtime::Program> ExecutableCache::FindLoaded(const std::string& hex) {
  absl::MutexLock lock(&entries_mu_);
  auto it = loaded_.find(hex);
  if (it == loaded_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.program;
}

void ExecutableCache::Remember(const std::string& hex, std::span<const v1::KeyComponent> components,
                               std::shared_ptr<runtime::Program> program) {
  absl::MutexLock lock(&entries_mu_);
  if (auto it = known_by_hex_.find(hex); it != known_by_hex_.end()) {
    known_.splice(known_.begin(), known_, it->second);
  } else {
    known_.push_front({hex, {components.begin(), components.end()}});
    known_by_hex_[hex] = known_.begin();
    while (static_cast<int64_t>(known_.size()) > std::max<int64_t>(1, options_.max_known_keys)) {
      known_by_hex_.erase(known_.back().hex);
      known_.pop_back();
    }
  }
  if (loaded_.contains(hex)) return;
  lru_.push_front(hex);
  loaded_[hex] = {std::move(program), lru_.begin()};
  while (static_cast<int64_t>(loaded_.size()) > std::max<int64_t>(1, options_.max_entries)) {
    loaded_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::shared_ptr<absl::Mutex> ExecutableCache::CompileLock(const std::string& hex) {
  absl::MutexLock lock(&entries_mu_);
  auto& m = compiling_[hex];
  if (!m) m = std::make_shared<absl::Mutex>();
  return m;
}

std::shared_ptr<runtime::Program> ExecutableCache::LoadFromDisk(const std::string& hex,
                                                                v1::CompileReport& report,
                                                                bool allow_int8_activations) {
  if (!options_.disk) return nullptr;
  LookupResult found = options_.disk->Lookup(CacheLevel::kExecutable, hex);
  if (found.outcome == LookupOutcome::kMiss) return nullptr;
  auto corrupt = [&](const std::string& why) {
    spdlog::warn("compile cache: discarding entry {}: {}", hex.substr(0, 16), why);
    report.set_executable_cache(v1::CACHE_CORRUPT);
    report.add_notes(absl::StrCat("cache entry discarded: ", why));
    report.set_miss_reason(absl::StrCat("the disk entry was discarded: ", why));
    absl::MutexLock lock(&stats_mu_);
    ++stats_.corrupt;
  };
  if (found.outcome == LookupOutcome::kCorrupt) {
    corrupt(found.reason);
    return nullptr;
  }
  v1::Executable lir;
  if (!lir.ParseFromString(found.payload)) {
    corrupt("payload is not an executable");
    return nullptr;
  }
  if (lir.format_version() != kLirFormatVersion || lir.key() != hex) {
    corrupt(absl::StrCat("LIR format ", lir.format_version(), " / key mismatch"));
    return nullptr;
  }
  backend::PrepareContext prep;
  runtime::ProgramOptions program_options = options_.program_options;
  program_options.allow_int8_activations = allow_int8_activations;
  auto program = runtime::Program::Load(std::move(lir), options_.registry, options_.kernel_binaries,
                                        &prep, program_options);
  if (!program.ok()) {
    corrupt(std::string(program.status().message()));
    return nullptr;
  }
  report.set_kernel_cache_hits(prep.kernel_cache_hits);
  report.set_kernel_cache_misses(prep.kernel_cache_misses);
  return std::move(program).value();
}

void ExecutableCache::Store(const std::string& hex, const runtime::Program& program,
                            const v1::CompileReport& report) {
  if (!options_.disk) return;
  // The stored LIR carries the compile report as compiled (cache fields are
  // rewritten on every load).
  v1::Executable stored = program.lir();
  *stored.mutable_compile() = report;
  if (auto s = options_.disk->Store(CacheLevel::kExecutable, hex, stored.SerializeAsString());
      !s.ok()) {
    spdlog::warn("compile cache: cannot store {}: {}", hex.substr(0, 16), std::string(s.message()));
  }
}

CacheStats ExecutableCache::stats() const {
  CacheStats s;
  {
    absl::MutexLock lock(&stats_mu_);
    s = stats_;
  }
  if (options_.disk) {
    const auto d = options_.disk->stats();
    s.evictions = d.total.evictions;
    s.disk_bytes = d.total.bytes;
    s.disk_entries = d.total.entries;
    s.corrupt = std::max(s.corrupt, d.executable.corrupt);
  }
  return s;
}

}  // namespace kiln::compile
