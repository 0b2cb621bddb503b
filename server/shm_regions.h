// Shared-memory regions of clients on kilnd's host (kiln/v1/shm.proto,
// docs/server.md "Shared memory").
//
// kilnd listens on a SOCK_SEQPACKET Unix socket (by default the abstract
// "@kilnd-<pid>-<n>.shm"). A client gets a ticket over gRPC
// (ConnectSharedMemory, so the ticket is its tenant's), connects, sends the
// ticket, then registers memfds (SCM_RIGHTS) by a region id of its choosing.
// kilnd maps each region once, shared and read-write; runs name tensor bytes
// in it as (region id, offset, bytes), and find it here by the caller's
// tenant: another tenant's region id is NOT_FOUND.
//
// What is checked, and why:
// - the fd is a regular, non-empty, non-hugetlb file sealed with
//   F_SEAL_SHRINK: a client that truncated its file under a mapping would
//   kill kilnd with SIGBUS on the next access;
// - a region id, and a file, registered once per tenant (ALREADY_EXISTS);
// - the tenant's quota (TenantQuota.max_shm_regions / max_shm_bytes) before
//   anything is mapped;
// - every use: offset and bytes non-negative and inside the region, with
//   overflow-checked sums (ShmRegion::Slice).
// A connection's regions are unregistered when it closes (the client went
// away, or exited).
//
// Runs over the socket (ShmClientMessage.run; docs/server.md "Runs over the
// socket"): once a connection's ticket is accepted it gets a thread of its
// own, which reads its messages and starts its runs through the runner the
// server set (SetRunner: the same code as Kiln.Run). One run per connection
// at a time: its next message is not read until the run's answer went out,
// so a client cannot queue work or memory past its tenant's limits through
// the socket. The run's answer is sent by whichever thread ends the run (the
// connection's, when the engine runs it inline). The connection's thread
// cancels the run when the client closes the socket or the run's deadline
// passes. A datagram is checked against kMaxRunMessageBytes before any
// buffer for it is allocated. A run holds the regions it uses (shared_ptr): a region
// unregistered mid-run stays mapped until that run ends, and counts against
// the quota until it is unmapped.
//
// Thread safety: ShmRegistry is thread-safe; its listening socket and the
// connections without a ticket yet are served by one thread of its own, each
// connection with a ticket by a thread of its own. ShmRegion is immutable (its bytes belong to the client).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kiln/v1/config.pb.h"
#include "kiln/v1/shm.pb.h"
#include "kiln/v1/tensor.pb.h"
#include "server/tenants.h"

namespace kiln::server {

// Regions and bytes mapped per tenant; shared by the registry and every
// region, so a region outliving the registry (held by a run) still releases.
class ShmUsage {
 public:
  struct Counts {
    int64_t regions = 0;
    int64_t bytes = 0;
  };
  // Reserves one region of `bytes` for `tenant`, or RESOURCE_EXHAUSTED
  // naming the quota, its limit and what is in use.
  absl::Status Reserve(const Tenant& tenant, int64_t bytes);
  void Release(const std::string& tenant, int64_t bytes);
  Counts Of(const std::string& tenant) const;
  std::map<std::string, Counts> All() const;

 private:
  mutable absl::Mutex usage_mu_;
  std::map<std::string, Counts> usage_ ABSL_GUARDED_BY(usage_mu_);
};

// One mapped region. Unmapped, and its quota released, when the last holder
// lets go.
class ShmRegion {
 public:
  ShmRegion(std::string id, std::string tenant, char* base, int64_t bytes, dev_t dev, ino_t ino,
            std::shared_ptr<ShmUsage> usage)
      : id_(std::move(id)), tenant_(std::move(tenant)), base_(base), bytes_(bytes), dev_(dev),
        ino_(ino), usage_(std::move(usage)) {}
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  const std::string& id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  int64_t bytes() const { return bytes_; }
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }

  // The region's bytes [offset, offset + bytes): OUT_OF_RANGE naming `what`,
  // the range and the region's size when it is not inside the region.
  absl::StatusOr<char*> Slice(int64_t offset, int64_t bytes, const std::string& what) const;

 private:
  const std::string id_;
  const std::string tenant_;
  char* const base_;
  const int64_t bytes_;
  const dev_t dev_;
  const ino_t ino_;
  const std::shared_ptr<ShmUsage> usage_;
};

// A run (or a training step) that came over the socket, as the server's
// run code takes it.
struct ShmRunRequest {
  Tenant* tenant = nullptr;  // the ticket's
  // ShmClientMessage.run: a serialized kiln.v1.RunRequest; with train_step,
  // ShmClientMessage.train_step: a serialized kiln.v1.TrainStepRequest,
  // answered with train_step_response.
  std::string run;
  bool train_step = false;
  absl::Time deadline = absl::InfiniteFuture();  // from run_timeout_ms
  std::string request_id;    // the client's, or empty
  // Called exactly once with the run's answer (request_id and run_response
  // or a status), on any thread, possibly before the runner returns.
  std::function<void(v1::ShmServerMessage)> answer;
};

// A started run, for the connection's thread.
class ShmRunCall {
 public:
  virtual ~ShmRunCall() = default;
  // The client closed its socket or the deadline passed: stop the run as a
  // cancelled gRPC call stops (its answer is still given).
  virtual void Cancel() = 0;
};

// Starts a run: null when it was answered already (an error before it
// started, or it ran inline).
using ShmRunner = std::function<std::shared_ptr<ShmRunCall>(ShmRunRequest)>;

class ShmRegistry {
 public:
  // Binds the socket named by config.shm_socket() ("" = the default abstract
  // name; REQUIRES: not "off") and starts serving it. The tenants whose
  // tickets it hands out must outlive it.
  static absl::StatusOr<std::unique_ptr<ShmRegistry>> Create(const v1::ServerConfig& config);
  // Stops the socket's thread and closes every connection (their regions
  // are unregistered; runs holding one keep it until they end).
  ~ShmRegistry();
  ShmRegistry(const ShmRegistry&) = delete;
  ShmRegistry& operator=(const ShmRegistry&) = delete;

  // "@kilnd-123-0.shm" (abstract) or a path.
  const std::string& socket_name() const { return socket_name_; }

  // A ticket for one connection of `tenant`, good for kTicketTtl.
  v1::ConnectSharedMemoryResponse NewTicket(Tenant& tenant);

  // Takes runs on the socket from now on (until StopRuns); before, a run
  // message is answered UNIMPLEMENTED and tickets say max_run_message_bytes 0.
  // With `train_steps`, the runner takes training steps too
  // (ShmRunRequest::train_step; tickets say train_steps); without, a
  // train_step message is answered UNIMPLEMENTED.
  void SetRunner(ShmRunner runner, bool train_steps = false);
  // No run starts after this returns (the runner is not called again; a run
  // message is answered UNAVAILABLE), and every run started on the socket
  // was cancelled, answered and let go. For the server's teardown, before
  // the engine and the service go.
  void StopRuns();

  // The tenant's region `id`; NOT_FOUND when it has none of that id (another
  // tenant's region included).
  absl::StatusOr<std::shared_ptr<const ShmRegion>> Find(const Tenant& tenant,
                                                        std::string_view id) const;

  // The tenant's regions and bytes mapped now (registered, or unregistered
  // and still held by a run).
  ShmUsage::Counts Usage(const std::string& tenant) const { return usage_->Of(tenant); }
  std::map<std::string, ShmUsage::Counts> UsageByTenant() const { return usage_->All(); }

  static constexpr absl::Duration kTicketTtl = absl::Seconds(30);
  // A connection that sends no valid ticket within this is closed.
  static constexpr absl::Duration kHelloTimeout = absl::Seconds(10);
  static constexpr int kMaxConnections = 1024;
  static constexpr int kMaxTicketsPerTenant = 64;
  // The largest datagram a run (or its answer) may be on the socket: within
  // Linux's default socket buffers (net.core.wmem_default, 208 KiB), so a
  // message this size is sent without raising SO_SNDBUF.
  static constexpr int64_t kMaxRunMessageBytes = int64_t{128} << 10;

 private:
  struct Connection {
    int fd = -1;
    Tenant* tenant = nullptr;  // null until its ticket came
    absl::Time accepted;
    std::vector<std::string> regions;  // ids it registered, still registered
  };
  struct Ticket {
    Tenant* tenant = nullptr;
    absl::Time expires;
  };
  // A run in flight on a connection: set by its answer. The eventfd the
  // connection's thread sleeps on is made only when the answer has not come
  // by the time the run was started (a step run on that thread, or any
  // error, answers first: no eventfd made and closed per message).
  struct RunWait {
    ~RunWait();
    absl::Mutex mu;
    std::atomic<bool> done = false;  // set under mu
    int event_fd ABSL_GUARDED_BY(mu) = -1;  // written once `done` is set; closed by the last holder
  };

  ShmRegistry(int listen_fd, int wake_fd, std::string socket_name, std::string unlink_path);
  void Serve();
  // Handles one datagram of `c`; false when the connection is to be closed.
  // `own_thread`: c is served by a thread of its own (it may run).
  bool HandleMessage(Connection& c, bool own_thread);
  // A connection's own thread, from its ticket to its end.
  void ServeConnection(Connection c);
  // How many of `fds` (connections' own ends) have a client still connected.
  static int LiveConnections(const std::set<int>& fds);
  // Runs one run message of `c` and waits for its answer to be sent; false
  // when the connection is to be closed (the client went away meanwhile).
  bool RunMessage(Connection& c, v1::ShmClientMessage& m);
  v1::ShmServerMessage Register(Connection& c, const v1::ShmRegisterRegion& r, int fd);
  v1::ShmServerMessage Unregister(Connection& c, const std::string& id);
  // Unregisters every region of `c` and closes it.
  void Close(Connection& c);

  const int listen_fd_;
  const int wake_fd_;  // eventfd: the destructor wakes Serve
  const std::string socket_name_;
  const std::string unlink_path_;  // a socket file to remove at the end
  const std::shared_ptr<ShmUsage> usage_ = std::make_shared<ShmUsage>();

  mutable absl::Mutex regions_mu_;
  // tenant name -> region id -> region.
  std::map<std::string, std::map<std::string, std::shared_ptr<const ShmRegion>, std::less<>>,
           std::less<>>
      regions_ ABSL_GUARDED_BY(regions_mu_);

  absl::Mutex tickets_mu_;
  absl::flat_hash_map<std::string, Ticket> tickets_ ABSL_GUARDED_BY(tickets_mu_);

  absl::Mutex connections_mu_;
  // Each tenant's connections with a ticket, by fd (kilnd's end, open until
  // the connection's Close): at most max_shm_regions of them whose client is
  // still there (a connection the client closed counts until its thread
  // notices, except when it would refuse a new one).
  std::map<const Tenant*, std::set<int>> tenant_connections_ ABSL_GUARDED_BY(connections_mu_);
  // Connections with a thread of their own, and those threads (each joined
  // by Serve once it ended, or by the destructor).
  std::map<uint64_t, std::thread> connection_threads_ ABSL_GUARDED_BY(connections_mu_);
  std::vector<uint64_t> ended_threads_ ABSL_GUARDED_BY(connections_mu_);
  uint64_t next_thread_ ABSL_GUARDED_BY(connections_mu_) = 0;

  absl::Mutex runner_mu_;  // held (shared) while a run starts
  ShmRunner runner_ ABSL_GUARDED_BY(runner_mu_);
  bool runs_stopped_ ABSL_GUARDED_BY(runner_mu_) = false;
  // Runs started and not yet let go by their connection's thread.
  absl::Mutex runs_mu_;
  std::map<uint64_t, std::shared_ptr<ShmRunCall>> runs_ ABSL_GUARDED_BY(runs_mu_);
  uint64_t next_run_ ABSL_GUARDED_BY(runs_mu_) = 0;
  std::atomic<bool> takes_runs_ = false;
  std::atomic<bool> takes_train_steps_ = false;

  std::atomic<bool> stopping_ = false;  // set by the destructor before it wakes Serve
  std::thread thread_;                  // runs Serve; joined by the destructor
};

}  // namespace kiln::server
