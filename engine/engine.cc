#include "engine/engine.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/status.h"
#include "engine/compile/cache_key.h"
#include "engine/compile/disk_cache.h"
#include "engine/compile/lower.h"
#include "engine/ir/text.h"
#include "engine/passes/pass.h"
#include "engine/runtime/calibration.h"
#include "engine/runtime/cost_model.h"
#include "engine/runtime/device_registry.h"
#include "engine/runtime/device_health.h"
#include "engine/runtime/fair_scheduler.h"
#include "engine/runtime/program.h"
#include "engine/runtime/params.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

std::string Deterministic(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

std::string DeviceSignature(const backend::DeviceInfo& d) {
  return absl::StrCat(d.id, "|", d.backend, "|", d.arch, "|", d.driver_version, "|", d.identity,
                      "\n");
}

// Writes the graph's text form after a stage when dumping is on.
void Dump(const std::string& dir, const ir::Graph& g, int index, const std::string& stage) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string name = g.name().empty() ? "graph" : g.name();
  const std::string path = absl::StrCat(dir, "/", name, ".", index, "_", stage, ".kiln");
  std::ofstream out(path);
  ir::PrintOptions opts;
  opts.annotations = true;
  out << ir::PrintGraph(g, opts);
  if (!out) spdlog::warn("KILN_DUMP: cannot write {}", path);
}

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  // Shared with every executable and parameter set, which may outlive the Engine.
  std::shared_ptr<runtime::DeviceRegistry> registry;
  std::shared_ptr<compile::DiskCache> disk;
  // Shared with every program, which prepares kernels for new run contexts.
  std::shared_ptr<compile::KernelBinaryCacheAdapter> kernel_binaries;
  runtime::ProgramOptions program_options;
  runtime::CostModel cost_model;
  std::string devices_signature;
  // Device infos as reported (calibrated profiles merged), in registry order.
  std::vector<backend::DeviceInfo> infos;
  std::vector<bool> calibration_from_cache;
  std::vector<bool> calibration_contended;
  // One scheduler per device (every run placed there goes through it).
  std::map<std::string, std::unique_ptr<runtime::FairScheduler>> schedulers;

  // A device fault marks its device unhealthy until a probe succeeds.
  std::unique_ptr<runtime::DeviceHealth> health;

  ~Impl() {
    // Runs still draining may note a fault: the schedulers go before the
    // health tracker, and both before the devices.
    schedulers.clear();
    health.reset();
  }

  absl::Mutex cache_mu;
  std::list<std::string> lru ABSL_GUARDED_BY(cache_mu);  // front = most recent
  std::map<std::string, std::pair<std::shared_ptr<runtime::Program>,
                                  std::list<std::string>::iterator>>
      loaded ABSL_GUARDED_BY(cache_mu);
  // One compile per key at a time; concurrent requests for it wait.
  std::map<std::string, std::shared_ptr<absl::Mutex>> compiling ABSL_GUARDED_BY(cache_mu);

  absl::Mutex stats_mu;
  CacheStats stats ABSL_GUARDED_BY(stats_mu);

  std::shared_ptr<runtime::Program> FindLoaded(const std::string& key) {
    absl::MutexLock lock(&cache_mu);
    auto it = loaded.find(key);
    if (it == loaded.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second.second);
    return it->second.first;
  }

  void Remember(const std::string& key, std::shared_ptr<runtime::Program> exe) {
    absl::MutexLock lock(&cache_mu);
    if (loaded.contains(key)) return;
    lru.push_front(key);
    loaded[key] = {std::move(exe), lru.begin()};
    while (static_cast<int64_t>(loaded.size()) > std::max<int64_t>(1, options.max_memory_executables)) {
      loaded.erase(lru.back());
      lru.pop_back();
    }
  }

  std::shared_ptr<absl::Mutex> CompileLock(const std::string& key) {
    absl::MutexLock lock(&cache_mu);
    auto& m = compiling[key];
    if (!m) m = std::make_shared<absl::Mutex>();
    return m;
  }

  // One small compile on the CPU, not cached: pays the process's one-time
  // costs (lazy protobuf and table set-up in the importer and the passes,
  // the CPU kernels' first JIT) at start-up instead of in the first request.
  void WarmUp() {
    const auto t0 = Clock::now();
    static constexpr char kGraph[] =
        "graph \"kiln_warmup\"\n"
        "input x: f32[2, 8]\n"
        "param w: f32[8, 8]\n"
        "param b: f32[8]\n"
        "let y = gelu(x @ w + b)\n"
        "out y\n";
    absl::Status s = [&]() -> absl::Status {
      KILN_ASSIGN_OR_RETURN(v1::Graph proto, ir::ParseGraphProto(kGraph));
      KILN_ASSIGN_OR_RETURN(auto g, ir::ImportGraph(proto, options.verify));
      KILN_RETURN_IF_ERROR(ir::Specialize(*g, {}, options.verify));
      CompileOptions co;
      co.device = registry->cpu()->info().id;
      v1::CompileReport report;
      return CompileFresh(std::move(g), co, "warmup", report).status();
    }();
    if (!s.ok()) spdlog::warn("engine warm-up compile failed: {}", std::string(s.message()));
    spdlog::debug("engine warm-up took {:.2f} ms", MicrosSince(t0) / 1000);
  }

  double options_inline_run_micros() const { return options.inline_run_micros; }
  // Queues (or runs inline) one run on its device's scheduler; `done` gets
  // the outcome, then `keep_alive_until_done` runs (it may free `program`).
  absl::StatusOr<RunTicket> SubmitRun(runtime::Program& program,
                                      std::span<const TensorRef> inputs,
                                      const runtime::ParamSetImpl* params,
                                      const RunOptions& options,
                                      std::function<void(absl::StatusOr<RunResult>)> done,
                                      std::function<void()> keep_alive_until_done);

  absl::StatusOr<std::shared_ptr<runtime::Program>> LoadFromDisk(
      const std::string& key, v1::CompileReport& report);
  absl::StatusOr<std::shared_ptr<runtime::Program>> CompileFresh(
      std::unique_ptr<ir::Graph> graph, const CompileOptions& options, const std::string& key,
      v1::CompileReport& report);
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->program_options.max_contexts = std::max(1, options.max_run_contexts_per_program);
  impl->program_options.device_wait_floor = options.device_wait_floor;
  impl->program_options.device_wait_slack = options.device_wait_slack;
  impl->program_options.ledger = std::make_shared<runtime::RunMemoryLedger>();
  runtime::RegistryOptions ro;
  ro.backend.cpu_threads = options.cpu_threads;
  ro.backend.cache_dir = options.cache_dir;
  ro.disabled = options.disabled_backends;
  switch (options.device_isolation) {
    case EngineOptions::DeviceIsolation::kAuto: ro.isolation = runtime::DeviceIsolation::kAuto; break;
    case EngineOptions::DeviceIsolation::kThread: ro.isolation = runtime::DeviceIsolation::kThread; break;
    case EngineOptions::DeviceIsolation::kProcess: ro.isolation = runtime::DeviceIsolation::kProcess; break;
  }
  ro.worker_binary = options.device_worker;
  ro.cache_max_bytes = options.cache_max_bytes;
  ro.worker_grace = options.device_worker_grace;
  KILN_ASSIGN_OR_RETURN(impl->registry, runtime::DeviceRegistry::Create(ro));
  for (backend::Device* d : impl->registry->devices()) {
    impl->devices_signature += DeviceSignature(d->info());
    backend::DeviceInfo info = d->info();
    bool from_cache = false, contended = false;
    const bool calibrate =
        options.calibration == EngineOptions::Calibration::kAlways ||
        (options.calibration == EngineOptions::Calibration::kIfCacheDir && !options.cache_dir.empty());
    if (calibrate) {
      auto measured = runtime::CalibrateCached(*d, options.cache_dir,
                                               options.calibration_max_load_per_core);
      if (measured.ok()) {
        info.profile = measured->profile;
        from_cache = measured->from_cache;
        contended = measured->contended;
        impl->cost_model.SetProfile(info.id, info.profile);
        spdlog::info("{}: {} ({:.1f} GFLOP/s f32, {:.1f} GB/s, launch {:.1f} us, sync {:.1f} us){}",
                     info.id, info.name, info.profile.peak_gflops_f32, info.profile.bandwidth_gbps,
                     info.profile.launch_overhead_us, info.profile.sync_overhead_us,
                     from_cache ? " from the calibration cache"
                                : absl::StrCat(" calibrated in ", measured->seconds, " s"));
      } else {
        spdlog::warn("{}: calibration failed ({}); using nominal figures", info.id,
                     std::string(measured.status().message()));
      }
    }
    impl->infos.push_back(std::move(info));
    impl->calibration_from_cache.push_back(from_cache);
    impl->calibration_contended.push_back(contended);
    runtime::FairScheduler::Options so;
    so.name = d->info().id;
    so.slots = std::max(1, d->info().max_concurrent_runs);
    if (auto it = options.device_slots.find(so.name); it != options.device_slots.end()) {
      so.slots = std::max(1, it->second);
    }
    if (options.max_device_slots > 0) so.slots = std::min(so.slots, options.max_device_slots);
    so.max_queued = options.max_queued_runs_per_device;
    KILN_ASSIGN_OR_RETURN(impl->schedulers[so.name], runtime::FairScheduler::Create(so));
  }
  impl->devices_signature += impl->registry->BackendVersions();
  impl->WarmUp();  // before the disk cache exists: nothing of it is stored
  if (!options.cache_dir.empty()) {
    compile::DiskCacheOptions co;
    co.dir = options.cache_dir;
    co.max_bytes = options.cache_max_bytes;
    auto disk = compile::DiskCache::Create(co);
    if (!disk.ok()) {
      return StatusBuilder(disk.status()) << "while opening the compile cache in "
                                          << options.cache_dir;
    }
    impl->disk = std::move(disk).value();
    impl->kernel_binaries = std::make_shared<compile::KernelBinaryCacheAdapter>(impl->disk);
  }
  // The probe has a generous bound of its own: it must not inherit a run's.
  impl->health = std::make_unique<runtime::DeviceHealth>(
      *impl->registry, absl::Milliseconds(200),
      std::max(options.device_wait_floor, absl::Seconds(10)));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::vector<const backend::DeviceInfo*> Engine::Devices() const {
  std::vector<const backend::DeviceInfo*> out;
  for (const backend::DeviceInfo& info : impl_->infos) out.push_back(&info);
  return out;
}

std::vector<DeviceStats> Engine::DeviceStatistics() const {
  std::vector<DeviceStats> out;
  const auto& devices = impl_->registry->devices();
  for (size_t i = 0; i < devices.size(); ++i) {
    const runtime::FairSchedulerStats w = impl_->schedulers.at(devices[i]->info().id)->stats();
    DeviceStats s;
    s.device = w.name;
    s.runs = w.runs;
    s.inline_runs = w.inline_runs;
    s.busy_micros = w.busy_micros;
    s.uptime_micros = w.uptime_micros;
    s.queued = w.queued;
    s.running = w.running;
    s.slots = w.slots;
    s.dropped = w.dropped;
    s.rejected = w.rejected;
    s.tenant_device_micros = w.tenant_device_micros;
    s.tenant_queued = w.tenant_queued;
    s.tenant_running = w.tenant_running;
    s.tenant_run_memory_bytes = impl_->program_options.ledger->On(w.name);
    const runtime::DeviceHealth::State h = impl_->health->Get(w.name);
    s.healthy = h.healthy;
    s.fault = h.fault;
    s.faults = h.faults;
    s.restarts = h.restarts;
    s.worker_pid = impl_->registry->worker_pid(w.name);
    s.isolated = s.worker_pid != 0;
    s.memory_in_use = devices[i]->memory_in_use();
    s.calibrated = impl_->infos[i].profile.calibrated;
    s.calibration_from_cache = impl_->calibration_from_cache[i];
    s.calibration_contended = impl_->calibration_contended[i];
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<int64_t> Engine::DeviceMemoryInUse() const {
  std::vector<int64_t> out;
  for (backend::Device* d : impl_->registry->devices()) out.push_back(d->memory_in_use());
  return out;
}

std::vector<std::string> Engine::UnavailableBackends() const {
  return impl_->registry->unavailable();
}

absl::StatusOr<GraphSignature> Engine::Inspect(const v1::Graph& graph) const {
  KILN_ASSIGN_OR_RETURN(auto g, ir::ImportGraph(graph, impl_->options.verify));
  v1::Graph exported;
  ir::ExportGraph(*g, &exported, {.strip_names = false, .with_constants = false});
  GraphSignature sig;
  for (const v1::Node& n : exported.nodes()) {
    if (n.op() == v1::OP_INPUT) sig.inputs.push_back({n.name(), n.outputs(0)});
    if (n.op() == v1::OP_PARAM) sig.params.push_back({n.name(), n.outputs(0)});
  }
  for (const ir::GraphOutput& o : g->outputs()) {
    for (const v1::Node& n : exported.nodes()) {
      if (n.id() == o.value.node) sig.outputs.push_back({o.name, n.outputs(o.value.output)});
    }
  }
  return sig;
}

absl::StatusOr<std::shared_ptr<runtime::Program>> Engine::Impl::LoadFromDisk(
    const std::string& key, v1::CompileReport& report) {
  if (!disk) return std::shared_ptr<runtime::Program>();
  compile::LookupResult found = disk->Lookup(compile::CacheLevel::kExecutable, key);
  if (found.outcome == compile::LookupOutcome::kMiss) return std::shared_ptr<runtime::Program>();
  auto corrupt = [&](const std::string& why) {
    spdlog::warn("compile cache: discarding entry {}: {}", key.substr(0, 16), why);
    report.set_executable_cache(v1::CACHE_CORRUPT);
    report.add_notes(absl::StrCat("cache entry discarded: ", why));
    absl::MutexLock lock(&stats_mu);
    ++stats.corrupt;
  };
  if (found.outcome == compile::LookupOutcome::kCorrupt) {
    corrupt(found.reason);
    return std::shared_ptr<runtime::Program>();
  }
  v1::Executable lir;
  if (!lir.ParseFromString(found.payload)) {
    corrupt("payload is not an executable");
    return std::shared_ptr<runtime::Program>();
  }
  if (lir.format_version() != compile::kLirFormatVersion || lir.key() != key) {
    corrupt(absl::StrCat("LIR format ", lir.format_version(), " / key mismatch"));
    return std::shared_ptr<runtime::Program>();
  }
  backend::PrepareContext prep;
  auto exe = runtime::Program::Load(std::move(lir), registry, kernel_binaries, &prep, program_options);
  if (!exe.ok()) {
    corrupt(std::string(exe.status().message()));
    return std::shared_ptr<runtime::Program>();
  }
  report.set_kernel_cache_hits(prep.kernel_cache_hits);
  report.set_kernel_cache_misses(prep.kernel_cache_misses);
  return std::shared_ptr<runtime::Program>(std::move(exe).value());
}

absl::StatusOr<std::shared_ptr<runtime::Program>> Engine::Impl::CompileFresh(
    std::unique_ptr<ir::Graph> g, const CompileOptions& options, const std::string& key,
    v1::CompileReport& report) {
  const char* env_dump = std::getenv("KILN_DUMP");
  const std::string dump = !options.dump_dir.empty() ? options.dump_dir : (env_dump ? env_dump : "");
  Dump(dump, *g, 0, "hir");
  absl::flat_hash_map<int32_t, compile::OriginInfo> origins;
  for (const auto& n : g->nodes()) origins[n->id] = {n->name, n->op};

  passes::PassContext ctx;
  ctx.devices = registry->devices();
  ctx.placement = options.device;
  ctx.prefer_common_ir = options.prefer_common_ir;
  ctx.enable_fusion = options.enable_fusion;
  ctx.cost_model = &cost_model;
  int index = 1;
  for (const std::string& stage : passes::PipelineStages()) {
    const auto t = Clock::now();
    KILN_ASSIGN_OR_RETURN(auto pass, passes::CreatePass(stage));
    KILN_RETURN_IF_ERROR(pass->Run(*g, ctx)) << "in stage " << stage;
    v1::StageTiming* st = report.add_stages();
    st->set_stage(stage == "canonicalize" ? "mir" : stage);
    st->set_micros(MicrosSince(t));
    st->set_nodes_after(static_cast<int32_t>(g->nodes().size()));
    Dump(dump, *g, index++, stage);
  }
  const auto t_lir = Clock::now();
  KILN_ASSIGN_OR_RETURN(v1::Executable lir, compile::Lower(*g, ctx, origins));
  lir.set_key(key);
  for (const v1::MemoryPlanSummary& m : ctx.memory) *report.add_memory() = m;
  for (const std::string& note : ctx.notes) report.add_notes(note);
  std::map<v1::Path, int> paths;
  int kernels = 0, copies = 0;
  for (const v1::LirStep& s : lir.steps()) {
    if (s.kind() == v1::STEP_COPY) {
      ++copies;
      continue;
    }
    ++kernels;
    ++paths[s.kernel().path()];
  }
  for (const auto& [path, count] : paths) {
    v1::PathCount* pc = report.add_paths();
    pc->set_path(path);
    pc->set_nodes(count);
  }
  report.set_kernels(kernels);
  report.set_copies(copies);
  backend::PrepareContext prep;
  KILN_ASSIGN_OR_RETURN(auto exe, runtime::Program::Load(std::move(lir), registry,
                                                         kernel_binaries, &prep, program_options));
  report.set_kernel_cache_hits(prep.kernel_cache_hits);
  report.set_kernel_cache_misses(prep.kernel_cache_misses);
  v1::StageTiming* st = report.add_stages();
  st->set_stage("lir");
  st->set_micros(MicrosSince(t_lir));
  st->set_nodes_after(kernels + copies);
  // The stored LIR carries the compile report as compiled (cache fields are
  // rewritten on every load).
  v1::Executable stored = exe->lir();
  *stored.mutable_compile() = report;
  if (disk) {
    if (auto s = disk->Store(compile::CacheLevel::kExecutable, key, stored.SerializeAsString()); !s.ok()) {
      spdlog::warn("compile cache: cannot store {}: {}", key.substr(0, 16), std::string(s.message()));
    }
  }
  return std::shared_ptr<runtime::Program>(std::move(exe));
}

absl::StatusOr<CompileResult> Engine::Compile(
    const v1::Graph& graph, const CompileOptions& options,
    const std::vector<std::pair<std::string, Dims>>& shapes) {
  const auto t0 = Clock::now();
  CompileResult result;
  v1::CompileReport& report = result.report;
  report.set_compiler_version(compile::kCompilerVersion);
  KILN_ASSIGN_OR_RETURN(auto g, ir::ImportGraph(graph, impl_->options.verify));
  KILN_RETURN_IF_ERROR(ir::Specialize(*g, shapes, impl_->options.verify));
  if (options.device != "auto" && !options.device.empty() &&
      impl_->registry->Find(options.device) == nullptr) {
    std::string ids;
    for (backend::Device* d : impl_->registry->devices()) absl::StrAppend(&ids, ids.empty() ? "" : ", ", d->info().id);
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", options.device, "\" does not exist; devices: ", ids));
  }

  // The executable key: every input that can change the compiled result.
  compile::CacheKey key;
  key.Add(compile::kKeyKilnVersion, compile::kCompilerVersion);
  key.Add(compile::kKeyLirFormat, absl::StrCat(compile::kLirFormatVersion));
  v1::Graph canonical;
  ir::ExportGraph(*g, &canonical, {.strip_names = true, .with_constants = true});
  key.Add("graph", Deterministic(canonical));
  key.Add("options", absl::StrCat("device=", options.device, ";common_ir=", options.prefer_common_ir,
                                  ";fusion=", options.enable_fusion));
  key.Add("devices", impl_->devices_signature);
  std::string shape_sig;
  for (const ir::Node* in : g->Inputs()) {
    absl::StrAppend(&shape_sig, in->name, ":", ir::TypeToString(in->type()), ";");
  }
  key.Add("input_shapes", shape_sig);
  const std::string hex = key.Hex();
  report.set_executable_key(hex);
  for (const v1::KeyComponent& c : key.Components()) *report.add_key_components() = c;
  v1::StageTiming* hir = report.add_stages();
  hir->set_stage("hir");
  hir->set_micros(MicrosSince(t0));
  hir->set_nodes_after(static_cast<int32_t>(g->nodes().size()));

  if (auto exe = impl_->FindLoaded(hex)) {
    report.set_executable_cache(v1::CACHE_HIT_MEMORY);
    absl::MutexLock lock(&impl_->stats_mu);
    ++impl_->stats.memory_hits;
    result.executable = exe;
  } else {
    auto lock_for_key = impl_->CompileLock(hex);
    absl::MutexLock compile_lock(lock_for_key.get());
    if (auto again = impl_->FindLoaded(hex)) {  // another request compiled it meanwhile
      report.set_executable_cache(v1::CACHE_HIT_MEMORY);
      result.executable = again;
    } else {
      const auto t_load = Clock::now();
      KILN_ASSIGN_OR_RETURN(auto loaded, impl_->LoadFromDisk(hex, report));
      if (loaded) {
        report.set_executable_cache(v1::CACHE_HIT_DISK);
        v1::StageTiming* st = report.add_stages();
        st->set_stage("cache_load");
        st->set_micros(MicrosSince(t_load));
        for (const auto& m : loaded->lir().compile().memory()) *report.add_memory() = m;
        for (const auto& p : loaded->lir().compile().paths()) *report.add_paths() = p;
        report.set_kernels(loaded->lir().compile().kernels());
        report.set_copies(loaded->lir().compile().copies());
        absl::MutexLock lock(&impl_->stats_mu);
        ++impl_->stats.disk_hits;
      } else {
        if (report.executable_cache() != v1::CACHE_CORRUPT) {
          report.set_executable_cache(impl_->disk ? v1::CACHE_MISS : v1::CACHE_DISABLED);
        }
        KILN_ASSIGN_OR_RETURN(loaded, impl_->CompileFresh(std::move(g), options, hex, report));
        absl::MutexLock lock(&impl_->stats_mu);
        ++impl_->stats.misses;
      }
      impl_->Remember(hex, loaded);
      result.executable = loaded;
    }
  }
  {
    absl::MutexLock lock(&impl_->stats_mu);
    impl_->stats.kernel_hits += report.kernel_cache_hits();
    impl_->stats.kernel_misses += report.kernel_cache_misses();
  }
  report.set_total_micros(MicrosSince(t0));
  return result;
}

absl::StatusOr<std::shared_ptr<ParamSet>> Engine::CreateParams(std::span<const TensorRef> values) {
  KILN_ASSIGN_OR_RETURN(auto set, runtime::ParamSetImpl::Create(impl_->registry, *impl_->registry->cpu(), values));
  return std::shared_ptr<ParamSet>(std::move(set));
}

absl::StatusOr<Engine::RunTicket> Engine::Impl::SubmitRun(
    runtime::Program& program, std::span<const TensorRef> inputs,
    const runtime::ParamSetImpl* params, const RunOptions& options,
    std::function<void(absl::StatusOr<RunResult>)> done,
    std::function<void()> keep_alive_until_done) {
  std::string device = program.device();
  auto it = schedulers.find(device);
  if (it == schedulers.end()) {
    device = registry->cpu()->info().id;
    it = schedulers.find(device);
  }
  KILN_RETURN_IF_ERROR(health->Check(device));
  const double estimate = program.estimated_run_micros();
  // The outcome travels from `run` (or `drop`) to `finish`, which answers the
  // caller once the slot is free and the statistics count the job.
  auto outcome = std::make_shared<absl::StatusOr<RunResult>>(
      absl::UnknownError("the run neither ran nor was dropped"));
  runtime::FairJob job;
  job.tenant = {options.tenant, options.tenant_weight, options.tenant_max_queue, 0};
  job.priority = options.priority;
  job.deadline = options.deadline;
  job.cost_micros = estimate;
  job.run = [this, &program, inputs, params, options, outcome](absl::Duration queued) -> double {
    if (options.cancelled != nullptr && options.cancelled->load()) {
      *outcome = absl::CancelledError("the client went away before the run started");
      return 0;
    }
    const auto t0 = Clock::now();
    *outcome = program.Run(inputs, params, options);
    const double used = MicrosSince(t0);
    if (outcome->ok() && options.report) {
      (*outcome)->report.set_queue_micros(absl::ToDoubleMicroseconds(queued));
    }
    if (auto faulted = backend::FaultedDevice(outcome->status())) {
      health->NoteFault(*faulted, outcome->status());
    }
    return used;
  };
  job.drop = [outcome](absl::Status why) { *outcome = std::move(why); };
  job.finish = [outcome, done = std::move(done), keep = std::move(keep_alive_until_done)] {
    done(std::move(*outcome));
    if (keep) keep();
  };
  const bool may_run_inline = estimate > 0 && estimate <= options_inline_run_micros();
  if (may_run_inline && it->second->TryRunInline(job)) return RunTicket{device, 0};
  KILN_ASSIGN_OR_RETURN(const uint64_t id, it->second->Submit(std::move(job)));
  return RunTicket{device, id};
}

absl::StatusOr<RunResult> Engine::Run(Executable& executable, std::span<const TensorRef> inputs,
                                      const ParamSet* params, const RunOptions& options) {
  absl::StatusOr<RunResult> result;
  absl::Notification done;
  KILN_RETURN_IF_ERROR(impl_->SubmitRun(
      static_cast<runtime::Program&>(executable), inputs,
      static_cast<const runtime::ParamSetImpl*>(params), options,
      [&](absl::StatusOr<RunResult> r) {
        result = std::move(r);
        done.Notify();
      },
      nullptr).status());
  done.WaitForNotification();
  return result;
}

bool Engine::CancelQueued(const RunTicket& ticket) {
  if (ticket.id == 0) return false;
  auto it = impl_->schedulers.find(ticket.device);
  return it != impl_->schedulers.end() && it->second->Cancel(ticket.id);
}

absl::StatusOr<Engine::RunTicket> Engine::RunAsync(std::shared_ptr<Executable> executable,
                                                   std::vector<TensorRef> inputs,
                                                   std::shared_ptr<const ParamSet> params,
                                                   RunOptions options, RunDone done) {
  if (executable == nullptr) return absl::InvalidArgumentError("RunAsync: no executable");
  // The views and the objects they name live in a holder until `done` ran.
  struct Held {
    std::shared_ptr<Executable> executable;
    std::vector<TensorRef> inputs;
    std::shared_ptr<const ParamSet> params;
  };
  auto held = std::make_shared<Held>(Held{std::move(executable), std::move(inputs), std::move(params)});
  return impl_->SubmitRun(static_cast<runtime::Program&>(*held->executable), held->inputs,
                          static_cast<const runtime::ParamSetImpl*>(held->params.get()), options,
                          std::move(done), [held]() mutable { held.reset(); });
}

absl::StatusOr<RunResult> Engine::RunGraph(const v1::Graph& graph, std::span<const TensorRef> inputs,
                                           const ParamSet* params, const CompileOptions& compile,
                                           const RunOptions& run) {
  std::vector<std::pair<std::string, Dims>> shapes;
  for (const TensorRef& t : inputs) shapes.emplace_back(t.name, t.dims);
  KILN_ASSIGN_OR_RETURN(CompileResult compiled, Compile(graph, compile, shapes));
  KILN_ASSIGN_OR_RETURN(RunResult result, Run(*compiled.executable, inputs, params, run));
  if (run.report) *result.report.mutable_compile() = compiled.report;
  return result;
}

CacheStats Engine::cache_stats() const {
  CacheStats s;
  {
    absl::MutexLock lock(&impl_->stats_mu);
    s = impl_->stats;
  }
  if (impl_->disk) {
    const auto d = impl_->disk->stats();
    s.evictions = d.total.evictions;
    s.disk_bytes = d.total.bytes;
    s.disk_entries = d.total.entries;
    s.corrupt = std::max(s.corrupt, d.executable.corrupt);
  }
  return s;
}

}  // namespace kiln
