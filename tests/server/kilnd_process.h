// Test helpers: a real kilnd child process (the built binary, KILND_PATH)
// on 127.0.0.1 with ephemeral ports, clients over the generated stubs, a
// plain-socket /metrics scrape, and tensor conversions.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "base/host_tensor.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln::testing {

// A directory removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct KilndOptions {
  std::string cache_dir;                 // required
  std::string config_text;               // written to a file for --config when non-empty
  std::vector<std::string> extra_flags;  // e.g. "--max_concurrent_runs=1"
};

class KilndProcess {
 public:
  // Starts kilnd and waits until it serves (its port files are written).
  // Returns null and sets `error` (with kilnd's log) when it does not start.
  static std::unique_ptr<KilndProcess> Start(const KilndOptions& options, std::string* error);
  // Kills the process if it still runs.
  ~KilndProcess();
  KilndProcess(const KilndProcess&) = delete;
  KilndProcess& operator=(const KilndProcess&) = delete;

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }
  std::string address() const;
  std::unique_ptr<v1::Kiln::Stub> Stub() const;
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

  void Signal(int sig) const;
  // Waits for the process to exit; its exit code, or nullopt on timeout or
  // death by a signal.
  std::optional<int> WaitExit(absl::Duration timeout);
  // What kilnd wrote to stdout and stderr so far.
  std::string Log() const;

 private:
  KilndProcess() = default;
  std::unique_ptr<TempDir> dir_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

// Runs kilnd with `args` until it exits (for start-up failures); returns the
// exit code (-1 on timeout) and fills `output`.
int RunKilndToExit(const std::vector<std::string>& args, std::string* output,
                   absl::Duration timeout = absl::Seconds(30));

// A client context with `authorization: Bearer <key>` (none when empty) and
// a deadline.
std::unique_ptr<grpc::ClientContext> Context(const std::string& api_key = "",
                                             absl::Duration deadline = absl::Seconds(120));

v1::Tensor ToProto(const HostTensor& t);
HostTensor FromProto(const v1::Tensor& t);

// HTTP GET http://127.0.0.1:<port><path>; the body ("" on failure).
std::string HttpGet(int port, const std::string& path);

// The value of the sample `name` whose labels include every pair of
// `labels` (0 when there is none; summed when several match).
double MetricValue(const std::string& exposition, const std::string& name,
                   const std::map<std::string, std::string>& labels = {});

// A unary call with raw request bytes through the generic stub.
grpc::Status RawUnaryCall(grpc::Channel& channel, const std::string& method,
                          const std::string& request_bytes, std::string* response_bytes,
                          const std::string& api_key = "");

// A client-streaming call with raw message bytes through the generic stub.
grpc::Status RawClientStream(grpc::Channel& channel, const std::string& method,
                             const std::vector<std::string>& messages);

// Uploads `params` to `session` through one SetParams stream, `chunk_bytes`
// of data per chunk.
grpc::Status UploadParams(v1::Kiln::Stub& stub, const std::string& session,
                          const std::map<std::string, HostTensor>& params, int64_t chunk_bytes,
                          const std::string& api_key = "",
                          v1::SetParamsResponse* response = nullptr);

// Service names listed by server reflection (grpc.reflection.v1alpha);
// empty when the call failed.
std::vector<std::string> ReflectionServices(grpc::Channel& channel);

// grpc.health.v1.Health/Check for `service` ("" = the server): 1 SERVING,
// 2 NOT_SERVING, -1 when the call failed.
int HealthStatus(grpc::Channel& channel, const std::string& service = "");

}  // namespace kiln::testing
