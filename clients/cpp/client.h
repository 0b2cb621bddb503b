// kiln::Client: the C++ client of kilnd (proto/kiln/v1/service.proto).
//
// One method per RPC. Every call returns an absl::Status carrying the
// server's gRPC code and message unchanged (codes map one to one), or a
// client-side error (INVALID_ARGUMENT for a request the client refuses to
// send, DATA_LOSS for an inconsistent GetParams stream).
//
// Tensors travel as kiln::HostTensor. Inputs and params are borrowed for the
// duration of a call; outputs are owned by the result.
//
// Thread safety: a Client is immutable after Create and every method may be
// called from many threads at once (the gRPC channel multiplexes calls).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/host_tensor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln {

class ShmConnection;  // clients/cpp/shm.h
class ShmRegion;

// Tensors by name (inputs, params). Names are unique by construction.
using TensorMap = std::map<std::string, HostTensor>;
// Tensors in a defined order (run outputs, in the graph's output order).
using NamedTensors = std::vector<std::pair<std::string, HostTensor>>;

struct ClientOptions {
  // Sent as `authorization: Bearer <api_key>` on every call; empty = none.
  std::string api_key;
  // Deadline of each call, from its start; infinite = none.
  absl::Duration timeout = absl::InfiniteDuration();
  // Payload bytes per SetParams chunk. kilnd's default message limit is far
  // above this; smaller chunks give a smoother progress bar.
  int64_t chunk_bytes = int64_t{1} << 20;

  // TLS (docs/server.md, "TLS and mTLS"). The channel speaks TLS when `tls`
  // is set or any of the files below is given; otherwise plaintext.
  bool tls = false;
  // PEM CA certificates the server's certificate must chain to; empty = the
  // system's roots.
  std::string ca_file;
  // PEM client certificate and its private key, presented to the server
  // (mTLS: the certificate may identify the tenant instead of an API key).
  // Both or neither.
  std::string cert_file;
  std::string key_file;
  // The name checked against the server's certificate when it differs from
  // the address's host (e.g. connecting by IP to a certificate for a DNS name).
  std::string tls_server_name;

  // Tensors of Run go through shared memory when kilnd is on this host (the
  // address is loopback or a Unix socket, and kilnd's shared-memory socket
  // is reachable: kiln/v1/shm.proto, docs/clients.md "Shared memory"), and
  // as bytes in the messages otherwise or when this is false. The
  // environment variable KILN_SHM=0 turns it off for every client.
  bool shared_memory = true;
  // With shared memory in use, Run is sent over kilnd's shared-memory socket
  // instead of gRPC (one round trip on a Unix socket: docs/clients.md "Runs
  // over the socket"); gRPC when this is false, when kilnd takes no runs on
  // its socket (an older kilnd), or for a call made while another thread's
  // run is on the socket. KILN_SHM_RUN=0 turns it off for every client.
  bool shm_runs = true;
  // The same for TrainStep (docs/training.md "Steps over the socket"): its
  // batch in shared memory, the step sent over kilnd's shared-memory socket;
  // gRPC when this is false or kilnd takes no steps there (its ticket's
  // train_steps). KILN_SHM_TRAIN_STEP=0 turns it off for every client.
  bool shm_train_steps = true;

  // Options from the environment: KILN_API_KEY, KILN_TLS (1/true/yes),
  // KILN_CA, KILN_CERT, KILN_KEY, KILN_TLS_SERVER_NAME. Unset variables leave
  // the defaults.
  static ClientOptions FromEnvironment();
};

// Called after each chunk of a long transfer: bytes done of `total`.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// A graph to send: the wire proto, or `.kiln` text that the server parses.
v1::GraphSource GraphFromProto(v1::Graph graph);
v1::GraphSource GraphFromText(std::string text);

using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

// Spelled Client::RunOptions and Client::RunResult (kiln::RunOptions and
// kiln::RunResult are the in-process Engine's).
struct ClientRunOptions {
  bool report = false;         // ask for the dispatch report
  int32_t priority = 0;        // higher first within the tenant
  v1::CompileOptions compile;  // one-shot runs only (a session was compiled at creation)
};

struct ClientRunResult {
  NamedTensors outputs;       // the graph's output order
  v1::DispatchReport report;  // filled when RunOptions::report
  std::string request_id;
  bool shared_memory = false;  // the tensors went through shared memory
  bool shm_run = false;        // the run went over the shared-memory socket, not gRPC

  // The output called `name`, or nullptr.
  const HostTensor* output(const std::string& name) const;
};

// Keeps glibc's malloc from serving tensor-sized buffers with fresh mmaps and
// from returning freed heap to the system after every call: either makes each
// call that moves a large tensor page-fault its buffers anew (~15 us a page on
// a VM: a session Run with a 384 KiB input took 2.9 ms instead of 0.3-0.5 ms).
// Process-wide (mallopt: mmap threshold 32 MiB, trim threshold 128 MiB, so up
// to 128 MiB of freed heap stays with the process): kilnctl and kiln_load call
// it at start; an application embedding the client decides for itself (or sets
// GLIBC_TUNABLES). Returns false when glibc refused a setting.
bool TuneMallocForLargeTensors();

class Client {
 public:
  using RunOptions = ClientRunOptions;
  using RunResult = ClientRunResult;

  // `addr` is a gRPC target ("127.0.0.1:7450", "unix:/run/kilnd.sock"). The
  // channel connects lazily: an unreachable server (or a TLS handshake that
  // fails: wrong CA, certificate refused) shows up as UNAVAILABLE on the first
  // call, not here. The TLS files are read here: a missing or unreadable one
  // is an error naming it.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& addr,
                                                        const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& addr() const { return addr_; }

  // Verifies `graph`; compiles it too when `input_shapes` fixes every
  // symbolic input dim (or the graph has none and shapes are given).
  absl::StatusOr<v1::CompileResponse> Compile(
      const v1::GraphSource& graph, const v1::CompileOptions& options = {},
      const std::vector<std::pair<std::string, Dims>>& input_shapes = {}) const;

  // A session owned by the caller's tenant. `params` go inline (small ones);
  // use SetParams for anything large. `state`: (output, param) bindings of a
  // stateful session (CreateSessionRequest.state): after each successful run
  // the output's value becomes the param's, in kilnd, and is not returned.
  absl::StatusOr<v1::CreateSessionResponse> CreateSession(
      const v1::GraphSource& graph, const v1::CompileOptions& options = {},
      const TensorMap& params = {},
      const std::vector<std::pair<std::string, std::string>>& state = {}) const;

  // Streams `params` in chunks of ClientOptions::chunk_bytes; the server
  // applies them atomically when the stream ends. `progress` (may be empty)
  // is called on the calling thread after each chunk.
  absl::StatusOr<v1::SetParamsResponse> SetParams(const std::string& session_id,
                                                  const TensorMap& params,
                                                  const ProgressFn& progress = {}) const;

  // The session's params (`names` empty = all), reassembled from chunks.
  absl::StatusOr<TensorMap> GetParams(const std::string& session_id,
                                      const std::vector<std::string>& names = {}) const;

  // Runs a session.
  absl::StatusOr<RunResult> Run(const std::string& session_id, const TensorMap& inputs,
                                const RunOptions& options = {}) const;
  // One-shot: compiles `graph` (cached by content on the server) and runs it.
  absl::StatusOr<RunResult> Run(const v1::GraphSource& graph, const TensorMap& inputs,
                                const TensorMap& params = {}, const RunOptions& options = {}) const;

  // One training step of a training session (one made with
  // options.transforms.training): `batch` holds every input of the graph.
  // Answers the loss (before the step's update), the step count and the
  // learning rate; the trained params stay on the server (GetParams).
  // The batch goes through shared memory when Run's inputs would (a local
  // kilnd, ClientOptions::shared_memory), else as bytes; `shared_memory`
  // (may be null) is set to whether it did. Against a kilnd that refuses a
  // batch in shared memory the step is sent again as bytes (nothing ran),
  // and every later step goes as bytes. With the batch in shared memory the
  // step goes over kilnd's shared-memory socket (ClientOptions::
  // shm_train_steps); `over_socket` (may be null) is set to whether it did.
  absl::StatusOr<v1::TrainStepResponse> TrainStep(const std::string& session_id,
                                                  const TensorMap& batch,
                                                  bool* shared_memory = nullptr,
                                                  bool* over_socket = nullptr) const;
  // Many steps in one call (TrainSteps, a bidirectional stream): batches are
  // sent one ahead of the answers (kilnd checks the next batch while a step
  // runs and starts it when the step ends), steps run in order, and
  // `on_step` (may be empty) sees each answer. Returns the answers; the first
  // failed step ends the call with its status (earlier steps stay applied).
  absl::StatusOr<std::vector<v1::TrainStepResponse>> TrainSteps(
      const std::string& session_id, std::span<const TensorMap> batches,
      const std::function<void(const v1::TrainStepResponse&)>& on_step = {}) const;

  absl::Status CloseSession(const std::string& session_id) const;
  absl::StatusOr<v1::ListDevicesResponse> ListDevices() const;
  // The caller's last `last` dispatch reports (0 = all the server keeps), oldest first.
  absl::StatusOr<std::vector<v1::DispatchReport>> GetReports(int32_t last = 0) const;
  // One request's report, by the request id a RunResult carries.
  absl::StatusOr<v1::DispatchReport> GetReport(const std::string& request_id) const;
  absl::StatusOr<v1::ServerInfoResponse> ServerInfo() const;
  // The model repository: every version (`name` "" = every model); load and
  // unload (admin tenants; `version` 0 = newest on disk / every loaded one).
  absl::StatusOr<v1::ListModelsResponse> ListModels(const std::string& name = "") const;
  absl::StatusOr<v1::ModelVersionInfo> LoadModel(const std::string& name, int64_t version = 0) const;
  absl::StatusOr<v1::UnloadModelResponse> UnloadModel(const std::string& name, int64_t version = 0) const;
  // grpc.health.v1 Check; `service` empty = the server as a whole.
  absl::StatusOr<ServingStatus> Health(const std::string& service = "") const;

  // The raw stubs, for callers that build requests themselves.
  v1::Kiln::Stub& stub() const { return *stub_; }
  // A context with the API key and deadline applied, for raw stub calls.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  Client(std::string addr, ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  // Runs `request` (no inputs or params of its own) with `inputs` and
  // `params`: the inputs through shared memory when it is on and works, else
  // everything as bytes serialized straight from the buffers
  // (base/tensor_wire.h).
  absl::StatusOr<RunResult> DoRun(v1::RunRequest& request, const TensorMap& inputs,
                                  const TensorMap& params) const;
  absl::StatusOr<RunResult> RunWithBytes(const v1::RunRequest& request, const TensorMap& inputs,
                                         const TensorMap& params) const;
  // Nullopt when shared memory is not used for this call.
  std::optional<absl::StatusOr<RunResult>> RunWithShm(v1::RunRequest& request,
                                                      const TensorMap& inputs) const;
  // A region of the pool (or a new one) with room for `input_bytes` of
  // tensors, plus room for outputs when `outputs`; nullopt when shared
  // memory does not work now (no kilnd socket, the tenant's quota full).
  struct ShmLease {
    std::unique_ptr<ShmRegion> region;
    std::shared_ptr<ShmConnection> connection;
  };
  std::optional<ShmLease> AcquireShm(int64_t input_bytes, bool outputs) const;
  // Copies `inputs` to the start of `region`, 64-byte aligned, naming each in
  // `named`; returns the bytes used.
  static int64_t PlaceInShm(const TensorMap& inputs, ShmRegion& region,
                            google::protobuf::RepeatedPtrField<v1::NamedTensor>& named);
  // True when `s` says kilnd lost the lease's region (nothing ran): the
  // connection is dropped, the region must not go back to the pool.
  bool ShmLost(const absl::Status& s, const ShmLease& lease) const;
  // Returns the region to the pool (unless its connection was replaced).
  void ReleaseShm(ShmLease lease) const;

  const std::string addr_;
  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Kiln::Stub> stub_;
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  // Shared memory with a local kilnd (client.cc); null when off.
  struct Shm;
  const std::unique_ptr<Shm> shm_;
  // kilnd answered that TrainStep's batch may not name shared memory.
  mutable std::atomic<bool> train_step_shm_refused_ = false;
};

// gRPC status -> absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kiln
