#include "engine/engine.h"

#include <chrono>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status.h"
#include "engine/compile/disk_cache.h"
#include "engine/compile/executable_cache.h"
#include "engine/compile/pipeline.h"
#include "engine/passes/vmap.h"
#include "engine/runtime/calibration.h"
#include "engine/runtime/cost_model.h"
#include "engine/runtime/device_health.h"
#include "engine/runtime/device_registry.h"
#include "engine/runtime/fair_scheduler.h"
#include "engine/runtime/params.h"
#include "engine/runtime/program.h"
#include "engine/runtime/worker_client.h"
#include "engine/train/train_step.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// The params a caller gives for an updating executable (a training step or a
// stateful program), by name; INVALID_ARGUMENT for a name given twice.
absl::StatusOr<std::map<std::string, const TensorRef*>> GivenByName(
    std::span<const TensorRef> values) {
  std::map<std::string, const TensorRef*> given;
  for (const TensorRef& v : values) {
    if (!given.emplace(v.name, &v).second) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", v.name, "\" given twice"));
    }
  }
  return given;
}

// The static dims of the executable's param `i`.
Dims ParamDims(const v1::Executable& lir, int i) {
  Dims dims;
  for (const auto& d : lir.slots(lir.params(i).slot()).type().dims()) dims.push_back(d.size());
  return dims;
}

}  // namespace

// The facade's state: compiles go through compile/ (the pipeline and the
// executable cache in front of it), runs through runtime/ (one scheduler per
// device, device health).
struct Engine::Impl {
  EngineOptions options;
  // Shared with every executable and parameter set, which may outlive the Engine.
  std::shared_ptr<runtime::DeviceRegistry> registry;
  std::shared_ptr<compile::DiskCache> disk;
  // Shared with every program, which prepares kernels for new run contexts.
  std::shared_ptr<compile::KernelBinaryCacheAdapter> kernel_binaries;
  runtime::ProgramOptions program_options;
  runtime::CostModel cost_model;
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

  std::unique_ptr<compile::Pipeline> pipeline;  // reads cost_model
  std::unique_ptr<compile::ExecutableCache> executables;

  double options_inline_run_micros() const { return options.inline_run_micros; }
  // Queues (or runs inline) one run on its device's scheduler; `done` gets
  // the outcome, then `keep_alive_until_done` runs (it may free `program`).
  // `caller_waits`: the submitting thread blocks until `done` (Engine::Run).
  absl::StatusOr<RunTicket> SubmitRun(runtime::Program& program,
                                      std::span<const TensorRef> inputs,
                                      const runtime::ParamSetImpl* params,
                                      const RunOptions& options,
                                      std::function<void(absl::StatusOr<RunResult>)> done,
                                      std::function<void()> keep_alive_until_done,
                                      bool caller_waits = false);
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->program_options.max_contexts = std::max(1, options.max_run_contexts_per_program);
  impl->program_options.device_wait_floor = options.device_wait_floor;
  impl->program_options.device_wait_slack = options.device_wait_slack;
  impl->program_options.max_while_iterations = std::max<int64_t>(1, options.max_while_iterations);
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
    backend::DeviceInfo info = d->info();
    bool from_cache = false, contended = false;
    const bool calibrate =
        options.calibration == EngineOptions::Calibration::kAlways ||
        (options.calibration == EngineOptions::Calibration::kIfCacheDir && !options.cache_dir.empty());
    if (calibrate) {
      // kAlways (kilnd --calibration=always) measures at every start even
      // where the cache holds a profile, and rewrites it: the way to force a
      // recalibration; kIfCacheDir reads a cached profile when there is one.
      auto measured = runtime::CalibrateCached(
          *d, options.cache_dir, options.calibration_max_load_per_core,
          /*refresh=*/options.calibration == EngineOptions::Calibration::kAlways);
      if (measured.ok()) {
        info.profile = measured->profile;
        from_cache = measured->from_cache;
        contended = measured->contended;
        impl->cost_model.SetProfile(info.id, info.profile);
        impl->cost_model.SetHostProfile(info.id, measured->host);
        const runtime::HostProfile& h = measured->host;
        spdlog::info(
            "{}: {} ({:.1f} GFLOP/s f32, {:.1f} GB/s, launch {:.1f} us, sync {:.1f} us{}){}",
            info.id, info.name, info.profile.peak_gflops_f32, info.profile.bandwidth_gbps,
            info.profile.launch_overhead_us, info.profile.sync_overhead_us,
            h.parallel_launch_us > 0 || h.mixed_launch_us > 0 || h.cache_bytes > 0 ||
                    h.transcendental_gelems > 0
                ? absl::StrCat(", team launch ", absl::SixDigits(h.parallel_launch_us),
                               " us (mixed sizes ", absl::SixDigits(h.mixed_launch_us),
                               " us), tanh ", absl::SixDigits(h.transcendental_gelems), " G/s, ",
                               absl::SixDigits(h.cache_bandwidth_gbps), " GB/s within ",
                               h.cache_bytes >> 20, " MiB of cache")
                : "",
            from_cache ? " from the calibration cache"
                       : absl::StrCat(" calibrated in ", measured->seconds, " s"));
      } else {
        spdlog::warn("{}: calibration failed ({}); using nominal figures", info.id,
                     std::string(measured.status().message()));
      }
    }
    impl->program_options.launch_overhead_us[info.id] = info.profile.launch_overhead_us;
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
  compile::PipelineOptions po;
  po.registry = impl->registry;
  po.cost_model = &impl->cost_model;
  po.program_options = impl->program_options;
  po.verify = options.verify;
  {
    // Before the disk cache exists: nothing of the warm-up is stored.
    const auto t0 = Clock::now();
    if (absl::Status s = compile::Pipeline(po).WarmUp(); !s.ok()) {
      spdlog::warn("engine warm-up compile failed: {}", std::string(s.message()));
    }
    spdlog::debug("engine warm-up took {:.2f} ms", MicrosSince(t0) / 1000);
  }
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
  po.kernel_binaries = impl->kernel_binaries;
  impl->pipeline = std::make_unique<compile::Pipeline>(po);
  compile::ExecutableCacheOptions eo;
  eo.max_entries = options.max_memory_executables;
  eo.disk = impl->disk;
  eo.registry = impl->registry;
  eo.kernel_binaries = impl->kernel_binaries;
  eo.program_options = impl->program_options;
  impl->executables = std::make_unique<compile::ExecutableCache>(std::move(eo));
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
    const runtime::worker::WorkerTraffic traffic = runtime::worker::WorkerMessages(*devices[i]);
    s.worker_round_trips = traffic.round_trips;
    s.worker_one_way_messages = traffic.one_way;
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

absl::StatusOr<CompileResult> Engine::Compile(
    const v1::Graph& graph, const CompileOptions& given_options,
    const std::vector<std::pair<std::string, Dims>>& given_shapes) {
  const auto t0 = Clock::now();
  CompileResult result;
  v1::CompileReport& report = result.report;
  // A vmapped graph's run shapes carry the batch; the graph specializes per
  // example (and the batch fixes VmapSpec.size when it is 0).
  CompileOptions options = given_options;
  std::vector<std::pair<std::string, Dims>> shapes = given_shapes;
  if (options.transforms.has_vmap() && !shapes.empty()) {
    KILN_RETURN_IF_ERROR(passes::UnbatchShapes(*options.transforms.mutable_vmap(), shapes));
  }
  KILN_ASSIGN_OR_RETURN(compile::HirGraph hir,
                        impl_->pipeline->Hir(graph, options, shapes, report));
  // A pinned device that is being restarted fails fast, as its runs do.
  std::map<std::string, uint64_t> generations;  // of every device, as the compile begins
  for (backend::Device* d : impl_->registry->devices()) generations[d->info().id] = d->generation();
  if (options.device != "auto" && !options.device.empty()) {
    KILN_RETURN_IF_ERROR(impl_->health->Check(options.device));
  }
  auto executable = impl_->executables->GetOrCompile(
      hir.key, hir.key_components, report,
      [&](v1::CompileReport& r) {
        return impl_->pipeline->Compile(std::move(hir.graph), options, hir.key, r);
      },
      options.allow_int8_activations);
  if (auto faulted = backend::FaultedDevice(executable.status())) {
    // A device that faulted while the compile asked it (claims, kernels):
    // marked unhealthy and restarted like one that faults in a run.
    auto g = generations.find(*faulted);
    impl_->health->NoteFault(*faulted, executable.status(),
                             g == generations.end() ? std::nullopt : std::optional<uint64_t>(g->second));
  }
  KILN_ASSIGN_OR_RETURN(result.executable, std::move(executable));
  report.set_total_micros(MicrosSince(t0));
  return result;
}

absl::StatusOr<std::shared_ptr<ParamSet>> Engine::CreateParams(std::span<const TensorRef> values) {
  KILN_ASSIGN_OR_RETURN(auto set, runtime::ParamSetImpl::Create(impl_->registry, *impl_->registry->cpu(), values));
  return std::shared_ptr<ParamSet>(std::move(set));
}

absl::StatusOr<std::shared_ptr<ParamSet>> Engine::CreateTrainingParams(
    const Executable& step, std::span<const TensorRef> values) {
  const v1::Executable& lir = step.lir();
  if (lir.param_updates_size() == 0) {
    return absl::InvalidArgumentError(
        "the executable is not a training step (compile it with a training spec)");
  }
  backend::Device* device = impl_->registry->Find(lir.placement().chosen());
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the training step's device \"", lir.placement().chosen(), "\" is gone"));
  }
  KILN_ASSIGN_OR_RETURN(auto given, GivenByName(values));
  const bool resumed = given.contains(train::kStepParam);
  std::vector<TensorRef> all;
  std::vector<HostTensor> zeros;
  zeros.reserve(lir.params_size());
  for (int i = 0; i < lir.params_size(); ++i) {
    const std::string& name = lir.params(i).name();
    const v1::TensorType& want = lir.slots(lir.params(i).slot()).type();
    const Dims dims = ParamDims(lir, i);
    auto it = given.find(name);
    if (it == given.end()) {
      if (!train::IsOptimizerState(name) && !passes::IsLsqScaleParam(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param \"", name, "\" (", DTypeName(want.dtype()), DimsToString(dims),
            ") of the training step is not given"));
      }
      // Given steps taken means a continued run (a restored checkpoint): state
      // that silently started at zero would not continue it.
      if (resumed) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state \"", name, "\" (", DTypeName(want.dtype()),
                         DimsToString(dims), ") is not given, but \"", train::kStepParam,
                         "\" is: a continued run needs all of its optimizer state"));
      }
      KILN_ASSIGN_OR_RETURN(HostTensor z, HostTensor::Create(want.dtype(), dims));
      zeros.push_back(std::move(z));
      all.push_back(TensorRef::Of(name, zeros.back()));
      continue;
    }
    const TensorRef& v = *it->second;
    if (v.dtype != want.dtype() || v.dims != dims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", name, "\" must be ", DTypeName(want.dtype()), DimsToString(dims), ", is ",
          DTypeName(v.dtype), DimsToString(v.dims)));
    }
    all.push_back(v);
    given.erase(it);
  }
  if (!given.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training step has no param named \"", given.begin()->first, "\""));
  }
  KILN_ASSIGN_OR_RETURN(auto set,
                        runtime::ParamSetImpl::Create(impl_->registry, *device, all, true));
  return std::shared_ptr<ParamSet>(std::move(set));
}

absl::StatusOr<std::shared_ptr<ParamSet>> Engine::CreateStateParams(
    const Executable& executable, std::span<const TensorRef> values) {
  const v1::Executable& lir = executable.lir();
  if (lir.param_updates_size() == 0) {
    return absl::InvalidArgumentError(
        "the executable updates no params (compile it with state bindings)");
  }
  backend::Device* device = impl_->registry->Find(lir.placement().chosen());
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the executable's device \"", lir.placement().chosen(), "\" is gone"));
  }
  KILN_ASSIGN_OR_RETURN(auto given, GivenByName(values));
  std::vector<TensorRef> all;
  for (int i = 0; i < lir.params_size(); ++i) {
    const std::string& name = lir.params(i).name();
    const v1::TensorType& want = lir.slots(lir.params(i).slot()).type();
    const Dims dims = ParamDims(lir, i);
    auto it = given.find(name);
    if (it == given.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", name, "\" (", DTypeName(want.dtype()), DimsToString(dims), ") is not given"));
    }
    const TensorRef& v = *it->second;
    if (v.dtype != want.dtype() || v.dims != dims) {
      return absl::InvalidArgumentError(
          absl::StrCat("param \"", name, "\" must be ", DTypeName(want.dtype()), DimsToString(dims),
                       ", is ", DTypeName(v.dtype), DimsToString(v.dims)));
    }
    all.push_back(v);
    given.erase(it);
  }
  // A param the graph does not read (DCE'd) is still the session's: keep it.
  for (const auto& [name, v] : given) all.push_back(*v);
  std::set<std::string> written;
  for (const v1::LirNamedSlot& u : lir.param_updates()) written.insert(u.name());
  KILN_ASSIGN_OR_RETURN(auto set, runtime::ParamSetImpl::Create(impl_->registry, *device, all, true,
                                                                std::move(written)));
  return std::shared_ptr<ParamSet>(std::move(set));
}

absl::StatusOr<Engine::RunTicket> Engine::Impl::SubmitRun(
    runtime::Program& program, std::span<const TensorRef> inputs,
    const runtime::ParamSetImpl* params, const RunOptions& options,
    std::function<void(absl::StatusOr<RunResult>)> done,
    std::function<void()> keep_alive_until_done, bool caller_waits) {
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
  backend::Device* placed = registry->Find(device);
  job.run = [this, &program, inputs, params, options, outcome, placed](absl::Duration queued) -> double {
    if (options.cancelled != nullptr && options.cancelled->load()) {
      *outcome = absl::CancelledError("the client went away before the run started");
      return 0;
    }
    const auto t0 = Clock::now();
    const uint64_t generation = placed != nullptr ? placed->generation() : 0;
    *outcome = program.Run(inputs, params, options);
    const double used = MicrosSince(t0);
    if (outcome->ok() && options.report) {
      (*outcome)->report.set_queue_micros(absl::ToDoubleMicroseconds(queued));
    }
    if (auto faulted = backend::FaultedDevice(outcome->status())) {
      health->NoteFault(*faulted, outcome->status(),
                        placed != nullptr && *faulted == placed->info().id
                            ? std::optional<uint64_t>(generation)
                            : std::nullopt);
    }
    return used;
  };
  job.drop = [outcome](absl::Status why) { *outcome = std::move(why); };
  job.finish = [outcome, done = std::move(done), keep = std::move(keep_alive_until_done)] {
    done(std::move(*outcome));
    if (keep) keep();
  };
  // A caller that blocks for the run anyway runs it itself when the device's
  // memory is not host memory (a GPU, a device worker): its thread only
  // enqueues and waits, and the hand-off to the device's thread and back cost
  // two wake-ups per run (issue 8, bert8). CPU runs stay on the device's own
  // thread (its warm OpenMP team) unless they are short, or the caller runs
  // many and waits for each (RunOptions::on_caller_when_idle: its own team
  // stays warm).
  const bool waits_on_device =
      caller_waits && placed != nullptr && !placed->info().host_memory;
  const bool may_run_inline =
      options_inline_run_micros() > 0 &&
      ((estimate > 0 && estimate <= options_inline_run_micros()) || waits_on_device ||
       options.on_caller_when_idle);
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
      nullptr, /*caller_waits=*/true).status());
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

CacheStats Engine::cache_stats() const { return impl_->executables->stats(); }

}  // namespace kiln
