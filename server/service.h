// The gRPC service kiln.v1.Kiln (callback API) over the engine: DESIGN.md
// section 7. Handlers are grouped one file per RPC group:
//   rpc_graphs.cc  Compile, CreateSession, CloseSession
//   rpc_params.cc  SetParams (client stream), GetParams (server stream)
//   rpc_run.cc     Run (through its device's scheduler in the engine)
//   rpc_info.cc    ListDevices, GetReport, ServerInfo
//   rpc_models.cc  ListModels, LoadModel, UnloadModel (the model repository)
//   rpc_train.cc   TrainStep, TrainSteps (bidi stream): training sessions
//   rpc_shm.cc     ConnectSharedMemory (server/shm_regions.h)
// and service.cc holds what every call shares: authentication, request ids,
// the request-bytes quota, draining, logging and request metrics.
//
// Blocking work never runs on gRPC's callback threads: runs go to their
// device's scheduler (Engine::RunAsync; only runs the cost model rates short
// run inline), compiles and param transfers to the fair WorkPool.
//
// Thread safety: thread-safe. Borrows everything in ServiceDeps, which must
// outlive the service and every call it started (KilnServer orders this).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "kiln/v1/config.pb.h"
#include "kiln/v1/service.grpc.pb.h"
#include "server/batcher.h"
#include "server/metrics.h"
#include "server/models.h"
#include "server/reports.h"
#include "server/sessions.h"
#include "server/shm_regions.h"
#include "server/tenants.h"
#include "server/work_pool.h"

namespace kiln::server {

struct ServiceDeps {
  const v1::ServerConfig* config = nullptr;  // defaults applied
  Engine* engine = nullptr;
  TenantRegistry* tenants = nullptr;
  SessionStore* sessions = nullptr;
  ReportStore* reports = nullptr;
  Metrics* metrics = nullptr;
  WorkPool* pool = nullptr;
  ModelRepository* models = nullptr;  // null without --model_repository
  Batcher* batcher = nullptr;         // null: sessions' runs never batch
  ShmRegistry* shm = nullptr;         // null: shm_socket "off"
  absl::Time started = absl::Now();
};

// kilnd's version, reported by ServerInfo.
inline constexpr char kKilndVersion[] = "0.1.0";

// Every method is registered raw (bytes in, bytes out) and parsed by the
// handlers: gRPC 1.51 answers a request that fails to parse with an empty
// UNIMPLEMENTED, and ends a client stream silently at a chunk that fails to
// parse, where kilnd must say INVALID_ARGUMENT and apply nothing.
using RawKilnService = v1::Kiln::WithRawCallbackMethod_Compile<
    v1::Kiln::WithRawCallbackMethod_CreateSession<v1::Kiln::WithRawCallbackMethod_SetParams<
        v1::Kiln::WithRawCallbackMethod_GetParams<v1::Kiln::WithRawCallbackMethod_Run<
            v1::Kiln::WithRawCallbackMethod_CloseSession<v1::Kiln::WithRawCallbackMethod_ListDevices<
                v1::Kiln::WithRawCallbackMethod_GetReport<v1::Kiln::WithRawCallbackMethod_ServerInfo<
                    v1::Kiln::WithRawCallbackMethod_ListModels<v1::Kiln::WithRawCallbackMethod_LoadModel<
                        v1::Kiln::WithRawCallbackMethod_UnloadModel<v1::Kiln::WithRawCallbackMethod_TrainStep<
                            v1::Kiln::WithRawCallbackMethod_TrainSteps<
                                v1::Kiln::WithRawCallbackMethod_ConnectSharedMemory<
                                    v1::Kiln::Service>>>>>>>>>>>>>>>;

class KilnService final : public RawKilnService {
 public:
  explicit KilnService(const ServiceDeps& deps) : deps_(deps) {}
  KilnService(const KilnService&) = delete;
  KilnService& operator=(const KilnService&) = delete;

  // From now on every new call is refused with UNAVAILABLE.
  void StartDraining();
  // Waits until no admitted call is active, or `deadline`; true when idle.
  bool WaitForCalls(absl::Time deadline);
  // Calls begun so far, and whether none is active now (for idle-time work).
  uint64_t calls_begun() const { return calls_begun_.load(std::memory_order_relaxed); }
  bool idle() const;

  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* SetParams(grpc::CallbackServerContext* ctx,
                                                       grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetParams(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetReport(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  // rpc_models.cc
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LoadModel(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnloadModel(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  // rpc_train.cc
  grpc::ServerUnaryReactor* TrainStep(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TrainSteps(
      grpc::CallbackServerContext* ctx) override;
  // rpc_shm.cc
  grpc::ServerUnaryReactor* ConnectSharedMemory(grpc::CallbackServerContext* ctx,
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) override;

  // --- Shared by the handler files (not part of the RPC surface). ---

  // One call's identity, from Begin to End.
  struct Call {
    std::string method;
    std::string request_id;
    Tenant* tenant = nullptr;  // null when authentication failed
    absl::Time start;
    bool admitted = false;     // counted in active calls
    std::string detail;        // appended to the log line (session id, cache outcome, ...)
  };

  // Names the call, authenticates it, checks the request-bytes quota and
  // the drain state. On error the call must still be ended with End().
  absl::Status Begin(grpc::CallbackServerContext* ctx, const char* method, int64_t request_bytes,
                     Call& call);
  // Begin for a call that came on kilnd's shared-memory socket: its tenant
  // is the connection's ticket's; `request_id` the client's (kept when short
  // and plain, as x-request-id is).
  absl::Status BeginLocal(Tenant* tenant, const char* method, int64_t request_bytes,
                          std::string_view request_id, Call& call);
  // Logs one line, counts the request and releases the call.
  void End(Call& call, const absl::Status& status);

  // A run message of the shared-memory socket (ShmRegistry's runner): the
  // same run as Kiln.Run's, answered through request.answer. (rpc_run.cc)
  std::shared_ptr<ShmRunCall> RunOnSocket(ShmRunRequest request);
  // A train_step message of the shared-memory socket: the same step as
  // Kiln.TrainStep's, answered through request.answer. (rpc_train.cc)
  std::shared_ptr<ShmRunCall> TrainStepOnSocket(ShmRunRequest request);

  const ServiceDeps& deps() const { return deps_; }

 private:
  // Begin's checks once the call is named and authenticated.
  absl::Status Admit(const char* method, int64_t request_bytes, Call& call);

  const ServiceDeps deps_;
  std::atomic<uint64_t> next_request_ = 1;
  std::atomic<uint64_t> calls_begun_ = 0;
  const uint64_t boot_tag_ = absl::ToUnixMicros(absl::Now()) & 0xffffff;

  mutable absl::Mutex calls_mu_;
  bool draining_ ABSL_GUARDED_BY(calls_mu_) = false;
  int64_t active_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

// absl::Status -> grpc::Status (the codes are the same numbers); a message
// past kMaxStatusMessageBytes (server/limits.h) is cut.
grpc::Status ToGrpc(const absl::Status& status);

// Rewrites a compile report as `tenant` may see it and counts it in the
// tenant's cache counters: an executable the tenant never used before is
// CACHE_MISS (and its kernels misses) even when another tenant's compile left
// it in the shared cache, so no tenant can confirm a guess of another's graph.
// With one open tenant (no tenants configured) the report is left as is.
void ScopeCacheReport(const TenantRegistry& tenants, Tenant& tenant, v1::CompileReport& report);

}  // namespace kiln::server
