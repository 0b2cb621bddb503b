// ListDevices, GetReport, ServerInfo: answered inline (no blocking work).
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/compile/cache_key.h"
#include "engine/ir/verifier.h"
#include "server/limits.h"
#include "server/rpc_common.h"

namespace kiln::server {

grpc::ServerUnaryReactor* KilnService::ListDevices(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request_bytes,
                                                   grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::ListDevicesRequest, v1::ListDevicesResponse>(
      *this, ctx, "ListDevices", request_bytes, response_bytes, /*offload=*/false,
      [this](Call&, const v1::ListDevicesRequest&,
             v1::ListDevicesResponse& response) -> absl::Status {
    const Engine& engine = *deps().engine;
    const std::vector<const backend::DeviceInfo*> devices = engine.Devices();
    const std::vector<int64_t> in_use = engine.DeviceMemoryInUse();
    const std::vector<DeviceStats> stats = engine.DeviceStatistics();
    for (size_t i = 0; i < devices.size(); ++i) {
      const backend::DeviceInfo& d = *devices[i];
      v1::DeviceInfo* out = response.add_devices();
      out->set_id(d.id);
      out->set_backend(d.backend);
      out->set_name(d.name);
      out->set_arch(d.arch);
      out->set_driver_version(d.driver_version);
      out->set_memory_bytes(d.memory_bytes);
      out->set_memory_in_use(i < in_use.size() ? in_use[i] : 0);
      for (const std::string& f : d.features) out->add_features(f);
      out->set_threads(d.threads);
      v1::DeviceProfileInfo* p = out->mutable_profile();
      p->set_peak_gflops_f32(d.profile.peak_gflops_f32);
      p->set_peak_gflops_f16(d.profile.peak_gflops_f16);
      p->set_bandwidth_gbps(d.profile.bandwidth_gbps);
      p->set_launch_overhead_us(d.profile.launch_overhead_us);
      p->set_host_to_device_gbps(d.profile.host_to_device_gbps);
      p->set_device_to_host_gbps(d.profile.device_to_host_gbps);
      p->set_sync_overhead_us(d.profile.sync_overhead_us);
      p->set_calibrated(d.profile.calibrated);
      for (const DeviceStats& s : stats) {
        if (s.device != d.id) continue;
        out->set_healthy(s.healthy);
        out->set_fault(s.fault);
        out->set_faults(s.faults);
        out->set_restarts(s.restarts);
        out->set_concurrent_runs(s.slots);
        out->set_queued_runs(s.queued);
        out->set_isolated(s.isolated);
        out->set_worker_pid(s.worker_pid);
      }
    }
    for (const std::string& u : engine.UnavailableBackends()) response.add_unavailable(u);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::GetReport(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request_bytes,
                                                 grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::GetReportRequest, v1::GetReportResponse>(
      *this, ctx, "GetReport", request_bytes, response_bytes, /*offload=*/false,
      [this](Call& call, const v1::GetReportRequest& request,
             v1::GetReportResponse& response) -> absl::Status {
    const ReportStore& reports = *deps().reports;
    if (!request.request_id().empty()) {
      std::optional<v1::DispatchReport> r = reports.Find(call.tenant->name(), request.request_id());
      if (!r) {
        return absl::NotFoundError(absl::StrCat(
            "no report for request ", QuoteClientString(request.request_id()), ": kilnd keeps the last ",
            deps().config->reports_per_tenant(), " reports of each tenant, and only its own"));
      }
      *response.add_reports() = std::move(*r);
      return absl::OkStatus();
    }
    if (request.last() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("last is ", request.last(), "; must be >= 0 (0 = every report kept)"));
    }
    for (v1::DispatchReport& r : reports.Last(call.tenant->name(), request.last())) {
      *response.add_reports() = std::move(r);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KilnService::ServerInfo(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request_bytes,
                                                  grpc::ByteBuffer* response_bytes) {
  return UnaryCall<v1::ServerInfoRequest, v1::ServerInfoResponse>(
      *this, ctx, "ServerInfo", request_bytes, response_bytes, /*offload=*/false,
      [this](Call& call, const v1::ServerInfoRequest&,
             v1::ServerInfoResponse& response) -> absl::Status {
    const ServiceDeps& d = deps();
    response.set_version(kKilndVersion);
    response.set_compiler_version(compile::kCompilerVersion);
    response.set_ir_version(ir::kIrVersion);
    response.set_tenant(call.tenant->name());
    std::set<std::string> backends;
    for (const backend::DeviceInfo* dev : d.engine->Devices()) backends.insert(dev->backend);
    for (const std::string& b : backends) response.add_backends(b);
    v1::CacheInfo* c = response.mutable_cache();
    response.set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - d.started));
    if (!d.tenants->IsAdmin(*call.tenant)) {
      // The cache is shared: its path and its whole counters are the
      // operator's; a tenant sees how the cache served its own compiles.
      const Tenant::CacheCounts own = call.tenant->cache_counts();
      c->set_memory_hits(own.memory_hits);
      c->set_disk_hits(own.disk_hits);
      c->set_misses(own.misses);
      return absl::OkStatus();
    }
    c->set_server_wide(true);
    const CacheStats s = d.engine->cache_stats();
    c->set_dir(d.config->cache_dir());
    c->set_memory_hits(s.memory_hits);
    c->set_disk_hits(s.disk_hits);
    c->set_misses(s.misses);
    c->set_corrupt(s.corrupt);
    c->set_evictions(s.evictions);
    c->set_disk_bytes(s.disk_bytes);
    c->set_disk_entries(s.disk_entries);
    c->set_kernel_hits(s.kernel_hits);
    c->set_kernel_misses(s.kernel_misses);
    return absl::OkStatus();
  });
}

}  // namespace kiln::server
