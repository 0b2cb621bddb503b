// KilnServer: kilnd assembled — engine (with its device schedulers), tenants, sessions, work
// pool, metrics exposer and the gRPC server (kiln.v1.Kiln, grpc.health.v1
// and server reflection) — with graceful shutdown.
//
// Thread safety: Shutdown may be called from any one thread; the accessors
// are immutable after Create.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "engine/engine.h"
#include "kiln/v1/config.pb.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "server/models.h"
#include "server/reports.h"
#include "server/service.h"
#include "server/sessions.h"
#include "server/shm_regions.h"
#include "server/tenants.h"
#include "server/unix_listener.h"
#include "server/work_pool.h"

namespace kiln::server {

class KilnServer {
 public:
  // Creates the engine and starts serving. REQUIRES: `config` has defaults
  // applied and is valid (LoadConfig does both).
  static absl::StatusOr<std::unique_ptr<KilnServer>> Create(const v1::ServerConfig& config);
  // Shuts down (without draining) if Shutdown was not called.
  ~KilnServer();
  KilnServer(const KilnServer&) = delete;
  KilnServer& operator=(const KilnServer&) = delete;

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }
  // The shared-memory registry (null when shm_socket is "off").
  const ShmRegistry* shm() const { return shm_.get(); }

  // Health turns NOT_SERVING, new calls get UNAVAILABLE, calls in flight get
  // up to config.drain_timeout_seconds to finish; then the gRPC server stops.
  // Returns false when calls were still running at the drain deadline (their
  // runs cannot be interrupted mid-graph; the caller may exit anyway).
  bool Shutdown();

  // For a process about to _Exit after Shutdown: the metrics exposer is not
  // stopped (its stop takes up to 2 s and the exit closes its port).
  void LeakMetricsExposerForExit();

  // The health service name of a device: "kiln.device/<id>".
  static std::string DeviceHealthService(const std::string& device) {
    return "kiln.device/" + device;
  }

 private:
  KilnServer() = default;
  // Sets each device's health service from the engine's device health.
  void UpdateDeviceHealth();
  void StopHealthWatcher();

  v1::ServerConfig config_;
  int port_ = 0;
  bool shut_down_ = false;
  // Declaration order is teardown order reversed: the gRPC server stops
  // first, then the pool (whose tasks hand runs to the engine), then the
  // engine (its device schedulers finish or drop the runs they hold, whose
  // callbacks answer through the service), then the service and what it
  // borrows.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<TenantRegistry> tenants_;
  std::unique_ptr<ShmRegistry> shm_;  // null when shm_socket is "off"
  std::unique_ptr<SessionStore> sessions_;
  std::unique_ptr<ReportStore> reports_;
  std::unique_ptr<KilnService> service_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ModelRepository> models_;  // its poll thread stops before the engine goes
  std::unique_ptr<WorkPool> pool_;
  std::unique_ptr<Batcher> batcher_;  // goes before the pool its batches compile on
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<UnixListener>> unix_listeners_;  // hand connections to server_
  absl::Notification stop_health_;
  std::thread health_watcher_;  // UpdateDeviceHealth every 200 ms; joined first
};

}  // namespace kiln::server
