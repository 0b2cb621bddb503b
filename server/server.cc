#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <algorithm>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/custom_ops.h"
#include "server/config.h"
#include "server/tls.h"
#include "server/unix_listener.h"

namespace kiln::server {
namespace {

using Samples = std::vector<std::pair<Metrics::Labels, double>>;

// State read at scrape time.
// The model repository's versions, weights and loads.
void ScrapeModels(const ModelRepository& models, std::vector<prometheus::MetricFamily>& out) {
  using prometheus::MetricType;
  Samples state, bytes, sessions, loads;
  for (const v1::ModelVersionInfo& m : models.List()) {
    std::string st = v1::ModelState_Name(m.state()).substr(sizeof("MODEL_STATE_") - 1);
    absl::AsciiStrToLower(&st);
    const Metrics::Labels labels{{"model", m.name()}, {"version", std::to_string(m.version())}};
    Metrics::Labels with_state = labels;
    with_state.emplace_back("state", st);
    state.push_back({with_state, 1});
    bytes.push_back({labels, static_cast<double>(m.param_bytes())});
    sessions.push_back({labels, static_cast<double>(m.sessions())});
  }
  for (const auto& [key, n] : models.LoadCounts()) {
    loads.push_back({{{"model", key.first}, {"outcome", key.second}}, static_cast<double>(n)});
  }
  out.push_back(Metrics::Family("kiln_model_versions", "Model versions of the repository, by state",
                                MetricType::Gauge, state));
  out.push_back(Metrics::Family("kiln_model_param_bytes", "Bytes of each loaded model version's shared weights",
                                MetricType::Gauge, bytes));
  out.push_back(Metrics::Family("kiln_model_sessions", "Sessions open on each model version",
                                MetricType::Gauge, sessions));
  out.push_back(Metrics::Family("kiln_model_loads_total", "Model version loads, by outcome",
                                MetricType::Counter, loads));
  Samples held, imports;
  for (const ModelRepository::SpecializedInfo& m : models.Specialized()) {
    const Metrics::Labels labels{{"model", m.name},
                                 {"version", std::to_string(m.version)},
                                 {"value_inputs", absl::StrJoin(m.value_inputs, ",")}};
    held.push_back({labels, static_cast<double>(m.held)});
    imports.push_back({labels, static_cast<double>(m.imports)});
  }
  out.push_back(Metrics::Family("kiln_model_value_specializations",
                                "Imports a value-specialised model version holds now (one per distinct value of "
                                "its value inputs, the most recent kept)",
                                MetricType::Gauge, held));
  out.push_back(Metrics::Family("kiln_model_value_imports_total",
                                "Imports of a value-specialised model version (per new value, and at load)",
                                MetricType::Counter, imports));
}

std::vector<prometheus::MetricFamily> Scrape(const Engine& engine, const TenantRegistry& tenants,
                                             const SessionStore& sessions, const ModelRepository* models,
                                             const ShmRegistry* shm, absl::Time started) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  auto one = [](double v) { return Samples{{{}, v}}; };
  if (models != nullptr) ScrapeModels(*models, out);
  const CacheStats c = engine.cache_stats();
  out.push_back(Metrics::Family("kiln_compile_cache_hits_total",
                                "Executables found in the compile cache, by level",
                                MetricType::Counter,
                                {{{{"level", "memory"}}, static_cast<double>(c.memory_hits)},
                                 {{{"level", "disk"}}, static_cast<double>(c.disk_hits)}}));
  out.push_back(Metrics::Family("kiln_compile_cache_misses_total", "Executables compiled",
                                MetricType::Counter, one(c.misses)));
  out.push_back(Metrics::Family("kiln_compile_cache_corrupt_total",
                                "Cache entries found corrupt and discarded", MetricType::Counter,
                                one(c.corrupt)));
  out.push_back(Metrics::Family("kiln_compile_cache_evictions_total",
                                "Disk cache entries evicted to stay in budget", MetricType::Counter,
                                one(c.evictions)));
  out.push_back(Metrics::Family("kiln_kernel_cache_hits_total", "Kernel binaries from the cache",
                                MetricType::Counter, one(c.kernel_hits)));
  out.push_back(Metrics::Family("kiln_kernel_cache_misses_total", "Kernel binaries built",
                                MetricType::Counter, one(c.kernel_misses)));
  out.push_back(Metrics::Family("kiln_compile_cache_disk_bytes", "Bytes in the disk cache",
                                MetricType::Gauge, one(c.disk_bytes)));
  out.push_back(Metrics::Family("kiln_compile_cache_disk_entries", "Entries in the disk cache",
                                MetricType::Gauge, one(c.disk_entries)));

  Samples in_use, capacity;
  const std::vector<const backend::DeviceInfo*> devices = engine.Devices();
  const std::vector<int64_t> used = engine.DeviceMemoryInUse();
  for (size_t i = 0; i < devices.size(); ++i) {
    const Metrics::Labels labels{{"device", devices[i]->id}, {"backend", devices[i]->backend}};
    in_use.push_back({labels, static_cast<double>(i < used.size() ? used[i] : 0)});
    capacity.push_back({labels, static_cast<double>(devices[i]->memory_bytes)});
  }
  out.push_back(Metrics::Family("kiln_device_memory_in_use_bytes",
                                "Bytes allocated on each device", MetricType::Gauge, in_use));
  out.push_back(Metrics::Family("kiln_device_memory_bytes", "Memory of each device",
                                MetricType::Gauge, capacity));
  // The devices' workers: busy time (its rate over a window is the busy
  // ratio), runs, queue length, and whether the profile was calibrated.
  Samples busy, busy_ratio, device_runs, device_queued, calibrated, healthy, faults, restarts,
      caller_runs;
  std::map<std::string, int64_t> tenant_queued, tenant_running;
  for (const DeviceStats& d : engine.DeviceStatistics()) {
    const Metrics::Labels labels{{"device", d.device}};
    for (const auto& [t, n] : d.tenant_queued) tenant_queued[t] += n;
    for (const auto& [t, n] : d.tenant_running) tenant_running[t] += n;
    healthy.push_back({labels, d.healthy ? 1.0 : 0.0});
    faults.push_back({labels, static_cast<double>(d.faults)});
    restarts.push_back({labels, static_cast<double>(d.restarts)});
    busy.push_back({labels, d.busy_micros / 1e6});
    busy_ratio.push_back({labels, d.uptime_micros > 0 ? d.busy_micros / d.uptime_micros : 0.0});
    device_runs.push_back({labels, static_cast<double>(d.runs)});
    caller_runs.push_back({labels, static_cast<double>(d.inline_runs)});
    device_queued.push_back({labels, static_cast<double>(d.queued)});
    calibrated.push_back({labels, d.calibrated ? (d.calibration_from_cache ? 2.0 : 1.0) : 0.0});
  }
  out.push_back(Metrics::Family("kiln_device_busy_seconds_total",
                                "Time each device's worker spent running work (rate() = busy ratio)",
                                MetricType::Counter, busy));
  out.push_back(Metrics::Family("kiln_device_busy_ratio",
                                "Busy time over uptime of each device's worker", MetricType::Gauge,
                                busy_ratio));
  out.push_back(Metrics::Family("kiln_device_runs_total", "Runs executed on each device",
                                MetricType::Counter, device_runs));
  out.push_back(Metrics::Family(
      "kiln_device_caller_runs_total",
      "Of kiln_device_runs_total, runs executed on the thread that asked for them (short runs, "
      "GPU runs of a blocking caller, training steps over the shared-memory socket), not handed "
      "to the device's own thread",
      MetricType::Counter, caller_runs));
  out.push_back(Metrics::Family("kiln_device_queued_runs", "Runs waiting for each device",
                                MetricType::Gauge, device_queued));
  out.push_back(Metrics::Family("kiln_device_healthy",
                                "1 serving, 0 faulted (hung, lost or crashed) and being restarted",
                                MetricType::Gauge, healthy));
  out.push_back(Metrics::Family("kiln_device_faults_total",
                                "Device faults (a wait timed out, the device was lost)",
                                MetricType::Counter, faults));
  out.push_back(Metrics::Family("kiln_device_restarts_total",
                                "Times a faulted device came back", MetricType::Counter, restarts));
  out.push_back(Metrics::Family("kiln_device_calibrated",
                                "0 nominal profile, 1 calibrated at this start, 2 from the "
                                "calibration cache",
                                MetricType::Gauge, calibrated));

  const std::map<std::string, int64_t> open = sessions.CountByTenant();
  Samples session_samples, in_flight, running, queued, param_bytes, device_bytes;
  for (const auto& t : tenants.tenants()) {
    const Metrics::Labels labels{{"tenant", t->name()}};
    auto count = open.find(t->name());
    session_samples.push_back({labels, count == open.end() ? 0.0 : static_cast<double>(count->second)});
    const Tenant::Usage u = t->usage();
    in_flight.push_back({labels, static_cast<double>(u.runs_in_flight)});
    running.push_back({labels, static_cast<double>(tenant_running[t->name()])});
    queued.push_back({labels, static_cast<double>(tenant_queued[t->name()])});
    param_bytes.push_back({labels, static_cast<double>(u.param_bytes)});
    device_bytes.push_back({labels, static_cast<double>(u.device_bytes)});
  }
  out.push_back(Metrics::Family("kiln_sessions", "Open sessions by tenant", MetricType::Gauge,
                                session_samples));
  out.push_back(Metrics::Family("kiln_runs_in_flight",
                                "Run calls admitted and not yet answered (compiling, queued or "
                                "running), by tenant",
                                MetricType::Gauge, in_flight));
  out.push_back(Metrics::Family("kiln_runs_running", "Runs executing on a device now, by tenant",
                                MetricType::Gauge, running));
  out.push_back(Metrics::Family("kiln_runs_queued", "Runs waiting in a device's queue, by tenant",
                                MetricType::Gauge, queued));
  out.push_back(Metrics::Family("kiln_param_bytes", "Param bytes charged to each tenant",
                                MetricType::Gauge, param_bytes));
  out.push_back(Metrics::Family("kiln_tenant_device_bytes",
                                "Device bytes charged to each tenant (params + session arenas)",
                                MetricType::Gauge, device_bytes));
  if (shm != nullptr) {
    const std::map<std::string, ShmUsage::Counts> usage = shm->UsageByTenant();
    Samples regions, bytes;
    for (const auto& t : tenants.tenants()) {
      const Metrics::Labels labels{{"tenant", t->name()}};
      auto it = usage.find(t->name());
      const ShmUsage::Counts c = it == usage.end() ? ShmUsage::Counts{} : it->second;
      regions.push_back({labels, static_cast<double>(c.regions)});
      bytes.push_back({labels, static_cast<double>(c.bytes)});
    }
    out.push_back(Metrics::Family("kiln_shm_regions",
                                  "Shared-memory regions mapped for each tenant", MetricType::Gauge,
                                  regions));
    out.push_back(Metrics::Family("kiln_shm_bytes",
                                  "Bytes of the shared-memory regions mapped for each tenant",
                                  MetricType::Gauge, bytes));
  }
  out.push_back(Metrics::Family("kiln_uptime_seconds", "Seconds since kilnd started",
                                MetricType::Gauge,
                                one(absl::ToDoubleSeconds(absl::Now() - started))));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KilnServer>> KilnServer::Create(const v1::ServerConfig& config) {
  std::unique_ptr<KilnServer> s(new KilnServer());
  s->config_ = config;
  const absl::Time started = absl::Now();
  // The TLS files are read and checked before anything slow starts.
  auto credentials = ServerCredentialsFrom(config.tls());
  if (!credentials.ok()) return credentials.status();

  auto metrics = Metrics::Create(config.metrics_listen());
  if (!metrics.ok()) return metrics.status();
  s->metrics_ = std::move(metrics).value();

  // Plugins load before the engine exists, so no compile ever sees a half-loaded set.
  if (!config.plugin_dir().empty()) {
    auto plugins = CustomOpRegistry::Global().LoadDirectory(config.plugin_dir());
    if (!plugins.ok()) return plugins.status();
    for (const std::string& line : plugins->loaded) spdlog::info("plugin loaded: {}", line);
    for (const absl::Status& refused : plugins->refused) {
      spdlog::error("plugin refused: {}", std::string(refused.message()));
    }
  }

  EngineOptions eo;
  eo.cache_dir = config.cache_dir();
  eo.cache_max_bytes = config.cache_max_bytes();
  eo.cpu_threads = config.cpu_threads();
  eo.calibration = config.calibration() == "never"    ? EngineOptions::Calibration::kNever
                   : config.calibration() == "always" ? EngineOptions::Calibration::kAlways
                                                      : EngineOptions::Calibration::kIfCacheDir;
  eo.verify = VerifyOptionsFrom(config.limits());
  eo.max_while_iterations = config.limits().max_while_iterations();
  eo.disabled_backends.assign(config.disabled_backends().begin(), config.disabled_backends().end());
  eo.max_device_slots = config.max_concurrent_runs();
  if (config.device_wait_floor_seconds() > 0) {
    eo.device_wait_floor = absl::Seconds(config.device_wait_floor_seconds());
  }
  if (config.device_wait_slack() > 0) eo.device_wait_slack = config.device_wait_slack();
  eo.device_isolation = config.device_isolation() == "process" ? EngineOptions::DeviceIsolation::kProcess
                        : config.device_isolation() == "thread" ? EngineOptions::DeviceIsolation::kThread
                                                                : EngineOptions::DeviceIsolation::kAuto;
  eo.device_worker = config.device_worker();
  if (config.device_worker_grace_seconds() > 0) {
    eo.device_worker_grace = absl::Seconds(config.device_worker_grace_seconds());
  }
  auto engine = Engine::Create(eo);
  if (!engine.ok()) return engine.status();
  s->engine_ = std::move(engine).value();

  auto tenants = TenantRegistry::Create(config);
  if (!tenants.ok()) return tenants.status();
  s->tenants_ = std::move(tenants).value();
  if (config.shm_socket() != "off") {
    auto shm = ShmRegistry::Create(config);
    if (!shm.ok()) return shm.status();
    s->shm_ = std::move(shm).value();
  }
  s->sessions_ = std::make_unique<SessionStore>();
  s->reports_ = std::make_unique<ReportStore>(config.reports_per_tenant(),
                                             config.report_bytes_per_tenant());
  s->pool_ = std::make_unique<WorkPool>(
      std::max(2, static_cast<int>(std::thread::hardware_concurrency())));

  ServiceDeps deps;
  deps.config = &s->config_;
  deps.engine = s->engine_.get();
  deps.tenants = s->tenants_.get();
  deps.sessions = s->sessions_.get();
  deps.reports = s->reports_.get();
  deps.metrics = s->metrics_.get();
  deps.pool = s->pool_.get();
  s->batcher_ = Batcher::Create(*s->engine_, *s->pool_);
  deps.batcher = s->batcher_.get();
  deps.shm = s->shm_.get();
  deps.started = started;
  if (!config.model_repository().root().empty()) {
    s->models_ = std::make_unique<ModelRepository>(config.model_repository(), config.limits(), *s->engine_);
    if (absl::Status st = s->models_->Start(); !st.ok()) return st;
    deps.models = s->models_.get();
  }
  s->service_ = std::make_unique<KilnService>(deps);
  if (s->shm_) {
    // Runs on the shared-memory socket: the service's Run code (StopRuns in
    // the teardown, before the service goes).
    s->shm_->SetRunner(
        [service = s->service_.get()](ShmRunRequest r) {
          return r.train_step ? service->TrainStepOnSocket(std::move(r))
                              : service->RunOnSocket(std::move(r));
        },
        /*train_steps=*/true);
  }

  s->metrics_->SetCollector([engine = s->engine_.get(), tenants = s->tenants_.get(),
                             sessions = s->sessions_.get(), models = s->models_.get(),
                             shm = s->shm_.get(), started] {
    return Scrape(*engine, *tenants, *sessions, models, shm, started);
  });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  auto listen = SplitListen(config.listen());
  if (!listen.ok()) return listen.status();
  // The first gRPC address's port is port(); more are served alike.
  std::vector<int> more_ports(listen->grpc.size(), 0);
  for (size_t i = 0; i < listen->grpc.size(); ++i) {
    builder.AddListeningPort(listen->grpc[i], *credentials, i == 0 ? &s->port_ : &more_ports[i]);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.limits().max_message_bytes()));
  // Two kilnds on one port would split the traffic silently: the second fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  bool bound = s->server_ != nullptr;
  for (size_t i = 0; i < listen->grpc.size(); ++i) {
    bound = bound && (i == 0 ? s->port_ : more_ports[i]) != 0;
  }
  if (!bound) {
    s->metrics_->SetCollector(nullptr);
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", config.listen(),
        ": the address is invalid or in use (--listen=host:port; port 0 picks a free port)"));
  }
  for (const std::string& path : listen->unix_paths) {
    auto l = UnixListener::Create(path, s->server_.get());
    if (!l.ok()) {
      s->metrics_->SetCollector(nullptr);
      return l.status();
    }
    s->unix_listeners_.push_back(std::move(l).value());
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  s->server_->GetHealthCheckService()->SetServingStatus(v1::Kiln::service_full_name(), true);
  // Each device is a health service of its own ("kiln.device/<id>"), NOT_SERVING
  // from a fault until its restart probe succeeds.
  s->UpdateDeviceHealth();
  s->health_watcher_ = std::thread([raw = s.get()] {
    uint64_t calls_seen = 0;
    bool trimmed = true;
    for (int tick = 1; !raw->stop_health_.WaitForNotificationWithTimeout(absl::Milliseconds(200));
         ++tick) {
      raw->UpdateDeviceHealth();
      if (tick % 25 != 0) continue;
      // Every 5 s: once kilnd has been idle a whole period after some work,
      // give freed heap back to the system. glibc returns only the top of a
      // heap by itself; a small live block (a kept report, a session's
      // bookkeeping) above freed tensor buffers pinned them (~200 MiB per
      // tenant). Only when idle: trimmed pages fault back in on reuse.
      const uint64_t calls = raw->service_->calls_begun();
      if (calls != calls_seen) {
        calls_seen = calls;
        trimmed = false;
      } else if (!trimmed && raw->service_->idle()) {
        malloc_trim(0);
        trimmed = true;
      }
    }
  });
  const v1::TlsConfig& tls = config.tls();
  spdlog::info("kilnd {} listening on {} (port {}, {}), metrics {}, cache {}, {} tenant(s){}, "
               "at most {} concurrent run(s) per device",
               kKilndVersion, config.listen(), s->port_,
               !TlsEnabled(tls)               ? "plaintext"
               : tls.client_ca_file().empty() ? "TLS"
               : tls.require_client_cert()    ? "mTLS, client certificate required"
                                              : "TLS, client certificates verified when sent",
               config.metrics_listen() == "off"
                   ? std::string("off")
                   : absl::StrCat(config.metrics_listen(), " (port ", s->metrics_->port(), ")"),
               config.cache_dir(), s->tenants_->tenants().size(),
               s->tenants_->open() ? " (open, no auth)" : "", config.max_concurrent_runs());
  spdlog::info("shared memory: {}", s->shm_ ? s->shm_->socket_name() : std::string("off"));
  for (const backend::DeviceInfo* d : s->engine_->Devices()) {
    spdlog::info("device {}: {} ({}), {} threads", d->id, d->name, d->arch, d->threads);
  }
  for (const std::string& u : s->engine_->UnavailableBackends()) {
    spdlog::info("backend unavailable: {}", u);
  }
  return s;
}

void KilnServer::UpdateDeviceHealth() {
  for (const DeviceStats& d : engine_->DeviceStatistics()) {
    server_->GetHealthCheckService()->SetServingStatus(DeviceHealthService(d.device),
                                                       d.healthy && !shut_down_);
  }
}

void KilnServer::StopHealthWatcher() {
  if (!health_watcher_.joinable()) return;
  stop_health_.Notify();
  health_watcher_.join();
}

bool KilnServer::Shutdown() {
  if (shut_down_) return true;
  StopHealthWatcher();  // before shut_down_ changes: the watcher reads it
  shut_down_ = true;
  const absl::Duration drain = absl::Seconds(config_.drain_timeout_seconds());
  spdlog::info("shutting down: health NOT_SERVING, refusing new work, draining up to {}",
               absl::FormatDuration(drain));
  server_->GetHealthCheckService()->SetServingStatus(false);
  UpdateDeviceHealth();  // NOT_SERVING: shut_down_
  service_->StartDraining();
  unix_listeners_.clear();  // no new connections
  const bool drained = service_->WaitForCalls(absl::Now() + drain);
  if (!drained) spdlog::warn("drain timeout: calls are still running; stopping anyway");
  server_->GetHealthCheckService()->Shutdown();
  // What is left after a drain is streams that never end by themselves: health
  // Watch streams (a load balancer's, a probe's; they saw NOT_SERVING above;
  // gRPC 1.51's health service does not end them) and reflection streams.
  // gRPC cancels them at this deadline, which used to be 5 s: an idle kilnd
  // with a health watcher took 5-6 s to exit. 1 s is left for our answers
  // (given before the drain ended) to finish sending.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (drained) {
    batcher_.reset();
    pool_.reset();
  }
  metrics_->SetCollector(nullptr);
  spdlog::info("kilnd stopped{}", drained ? "" : " (drain timed out)");
  return drained;
}

KilnServer::~KilnServer() {
  StopHealthWatcher();
  if (shm_) shm_->StopRuns();  // no run starts on the socket from here
  if (server_ && !shut_down_) {
    service_->StartDraining();
    server_->Shutdown(std::chrono::system_clock::now());
  }
  if (metrics_) metrics_->SetCollector(nullptr);
  // The members' order (server.h), each timed: an exit that takes long says where.
  auto teardown = [](const char* what, auto& member) {
    const absl::Time t0 = absl::Now();
    member.reset();
    spdlog::debug("teardown: {} in {}", what, absl::FormatDuration(absl::Now() - t0));
  };
  unix_listeners_.clear();  // they hand connections to server_
  teardown("grpc server", server_);
  teardown("batcher", batcher_);
  teardown("work pool", pool_);
  teardown("engine", engine_);
  teardown("service", service_);
  teardown("metrics exposer", metrics_);
}

void KilnServer::LeakMetricsExposerForExit() {
  // civetweb's mg_stop waits for its master thread, which polls in 2 s
  // quanta: 0.3-2 s of an idle kilnd's exit. The process ends next, which
  // closes the port.
  (void)metrics_.release();
}

}  // namespace kiln::server
