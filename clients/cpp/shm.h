// The client side of kilnd's shared-memory transport (kiln/v1/shm.proto,
// docs/clients.md "Shared memory"): a connection to kilnd's shared-memory
// socket and the memfd regions registered on it.
//
// kiln::Client uses it by itself for a kilnd on the same host
// (ClientOptions::shared_memory); it is public for callers that lay out
// tensors in shared memory themselves and build RunRequests by hand.
//
// Thread safety: ShmConnection is thread-safe (one message on the socket at
// a time). A ShmRegion's bytes are the caller's to synchronize.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kiln/v1/service.grpc.pb.h"

namespace kiln {

// A memfd (sealed against shrinking) mapped here and registered with kilnd.
// Unregistered when destroyed while its connection lives; kilnd drops it
// anyway when the connection closes.
class ShmConnection;
class ShmRegion {
 public:
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  const std::string& id() const { return id_; }
  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int fd() const { return fd_; }  // the memfd (owned), for callers that map it again

 private:
  friend class ShmConnection;
  ShmRegion(std::shared_ptr<ShmConnection> connection, std::string id, int fd, char* data,
            int64_t bytes)
      : connection_(std::move(connection)), id_(std::move(id)), fd_(fd), data_(data),
        bytes_(bytes) {}
  const std::shared_ptr<ShmConnection> connection_;
  const std::string id_;
  const int fd_;
  char* const data_;
  const int64_t bytes_;
};

class ShmConnection : public std::enable_shared_from_this<ShmConnection> {
 public:
  // Asks kilnd for a ticket (ConnectSharedMemory on `stub` with `context`,
  // which carries the caller's credentials) and connects to the socket the
  // answer names. UNAVAILABLE when kilnd has no shared memory or its socket
  // cannot be reached from here (another host, another network namespace).
  static absl::StatusOr<std::shared_ptr<ShmConnection>> Connect(v1::Kiln::Stub& stub,
                                                                grpc::ClientContext& context);
  // Closes the socket: kilnd unregisters every region of the connection.
  ~ShmConnection();
  ShmConnection(const ShmConnection&) = delete;
  ShmConnection& operator=(const ShmConnection&) = delete;

  // Creates a memfd of `bytes`, seals it against shrinking, maps it and
  // registers it as `id`. kilnd's answer is returned as a status
  // (ALREADY_EXISTS, RESOURCE_EXHAUSTED naming the quota, ...).
  absl::StatusOr<std::unique_ptr<ShmRegion>> CreateRegion(const std::string& id, int64_t bytes);
  // Registers an fd the caller made (it stays the caller's); for tests and
  // for callers with memory of their own.
  absl::Status RegisterFd(const std::string& id, int fd, int64_t* bytes = nullptr);
  absl::Status Unregister(const std::string& id);

  // A Run over the socket instead of gRPC (ShmClientMessage.run; docs/
  // clients.md "Runs over the socket"): kilnd runs it exactly as Kiln.Run,
  // as the ticket's tenant, with `deadline` (InfiniteFuture: none). Its
  // outcome is the run's status and response. nullopt when the run was not
  // sent and should go over gRPC: kilnd takes no runs on its socket (it
  // predates them), the request does not fit max_run_message_bytes, or
  // another thread's message is on the socket now (no waiting behind it).
  std::optional<absl::StatusOr<v1::RunResponse>> TryRun(const v1::RunRequest& request,
                                                        absl::Time deadline);
  // Whether kilnd takes runs on this socket (its ticket said so, and no run
  // was refused as an unknown message since).
  bool takes_runs() const { return max_run_message_bytes_ > 0 && !runs_refused_.load(); }
  int64_t max_run_message_bytes() const { return max_run_message_bytes_; }
  // A TrainStep over the socket (ShmClientMessage.train_step; docs/
  // training.md "Steps over the socket"), as TryRun is for Run: kilnd runs
  // it exactly as Kiln.TrainStep. nullopt when it was not sent and should go
  // over gRPC: kilnd takes none on its socket (its ticket says train_steps
  // false), or as for TryRun.
  std::optional<absl::StatusOr<v1::TrainStepResponse>> TryTrainStep(
      const v1::TrainStepRequest& request, absl::Time deadline);
  bool takes_train_steps() const {
    return takes_runs() && train_steps_ && !train_steps_refused_.load();
  }

  const std::string& socket_name() const { return socket_name_; }
  int64_t max_regions() const { return max_regions_; }
  int64_t max_bytes() const { return max_bytes_; }

 private:
  ShmConnection(int fd, std::string socket_name) : fd_(fd), socket_name_(std::move(socket_name)) {}
  // Sends `message` (with `fd` attached when >= 0) and reads kilnd's answer.
  absl::StatusOr<v1::ShmServerMessage> Call(const v1::ShmClientMessage& message, int fd);
  // Sends a run or train_step message `m` (its deadline set from
  // `deadline`) and reads its answer: nullopt when not sent (too large, or
  // the socket is busy with another thread's message).
  std::optional<absl::StatusOr<v1::ShmServerMessage>> TrySend(v1::ShmClientMessage& m,
                                                              absl::Time deadline,
                                                              const char* what);

  absl::Mutex socket_mu_;
  const int fd_;  // guarded by socket_mu_ for sends and receives
  const std::string socket_name_;
  int64_t max_regions_ = 0;
  int64_t max_bytes_ = 0;
  int64_t max_run_message_bytes_ = 0;
  std::atomic<bool> runs_refused_ = false;
  bool train_steps_ = false;  // the ticket's train_steps
  std::atomic<bool> train_steps_refused_ = false;
  std::string run_answer_ ABSL_GUARDED_BY(socket_mu_);  // a run's answer, received here
};

// Whether a gRPC target names this host: "unix:...", "localhost", 127.0.0.0/8
// or ::1 (with or without a "dns:///", "ipv4:" or "ipv6:" scheme).
bool IsLocalTarget(const std::string& target);

}  // namespace kiln
