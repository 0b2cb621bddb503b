#include "engine/runtime/worker_client.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "backends/capture.h"
#include "base/host_copy.h"
#include "base/status.h"
#include "engine/runtime/worker_protocol.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace kiln::runtime::worker {
namespace {

namespace wp = v1::worker;

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return absl::StrCat("was killed by signal ", sig, " (", name ? name : "?", ")");
  }
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  return "ended";
}

constexpr char kStopped[] = "was stopped";

absl::Mutex last_round_trip_mu;
std::optional<RoundTripTimes> last_round_trip ABSL_GUARDED_BY(last_round_trip_mu);

// One worker process: its socket, staging region, reader thread and the
// calls waiting for answers. Dead once the socket closes or it is killed;
// every call then fails as a fault of its device.
class Worker {
 public:
  static absl::StatusOr<std::shared_ptr<Worker>> Start(const WorkerOptions& options, int index,
                                                       const std::string& device);
  ~Worker();

  // One request and its answer within `timeout`; a worker that does not
  // answer in time is killed as hung. `read_ns`, when set, gets the
  // MonotonicNanos at which the reader thread had the answer. The caller
  // polls (yielding) for the answer for `spin` before it sleeps.
  absl::StatusOr<wp::Reply> Call(wp::Request request, absl::Duration timeout,
                                 int64_t* read_ns = nullptr,
                                 absl::Duration spin = absl::ZeroDuration());
  void Post(wp::Request request);
  WorkerTraffic traffic() const {
    return {round_trips_.load(std::memory_order_relaxed), one_way_.load(std::memory_order_relaxed)};
  }

  void Kill(const std::string& reason);
  // OK while the worker lives, else the device fault every call gets.
  absl::Status DeadStatus() const;
  bool alive() const { return DeadStatus().ok(); }
  ShmRegion& shm() { return *shm_; }
  HostArena* arena() const { return arena_; }
  // Host-arena blocks this worker's device may still read or write (copies it
  // was sent whose synchronization never answered): unheld once the process
  // is gone (reaped), at once if it already is.
  void UnholdWhenGone(std::vector<int64_t> blocks);
  uint64_t NextEventId() { return next_event_.fetch_add(1) + 1; }
  int64_t pid() const { return pid_; }
  const std::string& device() const { return device_; }
  void set_device(const std::string& id) { device_ = id; }
  const wp::HelloReply& hello() const { return hello_; }

 private:
  Worker(pid_t pid, std::unique_ptr<Channel> channel, std::unique_ptr<ShmRegion> shm,
         HostArena* arena, std::string device, absl::Duration reply_spin)
      : reply_spin_(reply_spin),
        pid_(pid),
        channel_(std::move(channel)),
        shm_(std::move(shm)),
        arena_(arena),
        device_(std::move(device)) {}
  void ReadLoop();
  void Reap();

  struct Pending {
    bool done = false;
    std::atomic<bool> ready = false;  // `done`, for a caller polling without mu_
    int64_t read_ns = 0;
    wp::Reply reply;
  };

  const absl::Duration reply_spin_;
  const pid_t pid_;
  std::unique_ptr<Channel> channel_;
  std::unique_ptr<ShmRegion> shm_;
  HostArena* const arena_;
  std::string device_;
  wp::HelloReply hello_;
  std::atomic<uint64_t> next_id_ = 0;
  std::atomic<uint64_t> next_event_ = 0;
  std::atomic<int64_t> round_trips_ = 0;
  std::atomic<int64_t> one_way_ = 0;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Pending*> pending_ ABSL_GUARDED_BY(mu_);
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;  // the process was waited for
  std::vector<int64_t> held_ ABSL_GUARDED_BY(mu_);  // UnholdWhenGone's, until gone_
  std::string reason_ ABSL_GUARDED_BY(mu_);  // why it died, for DeviceFault
  std::thread reader_;
};

absl::StatusOr<std::shared_ptr<Worker>> Worker::Start(const WorkerOptions& options, int index,
                                                      const std::string& device) {
  if (options.binary.empty() || ::access(options.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no device worker executable at \"", options.binary,
                                            "\" (set KILN_DEVICE_WORKER or install kiln-device-worker beside kilnd)"));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ShmRegion> shm, ShmRegion::Create(options.staging_bytes));
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const int parent_fd = fds[0], child_fd = fds[1];
  std::vector<std::string> args = {
      options.binary,
      absl::StrCat("--backend=", options.backend),
      absl::StrCat("--device=", index),
      absl::StrCat("--cpu_threads=", options.backend_options.cpu_threads),
      absl::StrCat("--cache_max_bytes=", options.cache_max_bytes),
      absl::StrCat("--parent_pid=", ::getpid()),
      absl::StrCat("--queue_spin_us=", absl::ToInt64Microseconds(options.queue_spin)),
      "--socket_fd=3",
      "--shm_fd=4",
  };
  if (options.host_arena != nullptr) args.push_back("--arena_fd=5");
  if (!options.backend_options.cache_dir.empty()) {
    args.push_back(absl::StrCat("--cache_dir=", options.backend_options.cache_dir));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 onto 3 and 4 clears close-on-exec on the copies only. Through a
  // high descriptor first, in case one source already is 3 or 4.
  posix_spawn_file_actions_adddup2(&actions, child_fd, 100);
  posix_spawn_file_actions_adddup2(&actions, shm->fd(), 101);
  if (options.host_arena != nullptr) {
    posix_spawn_file_actions_adddup2(&actions, options.host_arena->fd(), 102);
  }
  posix_spawn_file_actions_adddup2(&actions, 100, 3);
  posix_spawn_file_actions_adddup2(&actions, 101, 4);
  posix_spawn_file_actions_addclose(&actions, 100);
  posix_spawn_file_actions_addclose(&actions, 101);
  if (options.host_arena != nullptr) {
    posix_spawn_file_actions_adddup2(&actions, 102, 5);
    posix_spawn_file_actions_addclose(&actions, 102);
  }
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, options.binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(child_fd);
  if (rc != 0) {
    ::close(parent_fd);
    return absl::UnavailableError(
        absl::StrCat("could not start ", options.binary, ": ", std::strerror(rc)));
  }
  std::shared_ptr<Worker> w(new Worker(pid, std::make_unique<Channel>(parent_fd), std::move(shm),
                                       options.host_arena, device, options.reply_spin));
  w->reader_ = std::thread([p = w.get()] { p->ReadLoop(); });
  wp::Request hello;
  hello.mutable_hello()->set_protocol(kProtocol);
  absl::StatusOr<wp::Reply> reply = w->Call(std::move(hello), options.start_timeout);
  if (!reply.ok()) {
    return absl::UnavailableError(absl::StrCat("the ", options.backend, " device worker did not start: ",
                                               reply.status().message()));
  }
  if (reply->code() != 0) {
    // The backend itself failed (no driver, no such device): its message.
    return absl::Status(static_cast<absl::StatusCode>(reply->code()), reply->message());
  }
  if (reply->hello().protocol() != kProtocol ||
      reply->hello().serving() >= reply->hello().devices_size()) {
    w->Kill("speaks another protocol");
    return absl::FailedPreconditionError(absl::StrCat(options.binary, " speaks protocol ",
                                                      reply->hello().protocol(), ", kilnd ", kProtocol));
  }
  w->hello_ = reply->hello();
  w->device_ = reply->hello().devices(reply->hello().serving()).id();
  return w;
}

Worker::~Worker() {
  {
    absl::MutexLock lock(&mu_);
    if (!dead_) {
      dead_ = true;
      reason_ = kStopped;
    }
  }
  channel_->Shutdown();  // the worker reads end of stream and exits
  if (reader_.joinable()) reader_.join();
  Reap();
}

void Worker::Reap() {
  {
    absl::MutexLock lock(&mu_);
    if (reaped_) return;
    reaped_ = true;
  }
  int status = 0;
  pid_t r = 0;
  // A worker told to go (or whose socket closed) exits at once, after
  // closing its backend down (it saves caches: up to its own limit of 8 s);
  // one that has not gone within 10 s is killed.
  for (int i = 0; i < 1000 && (r = ::waitpid(pid_, &status, WNOHANG)) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (r == 0) {
    ::kill(pid_, SIGKILL);
    r = ::waitpid(pid_, &status, 0);
  }
  std::vector<int64_t> held;
  {
    absl::MutexLock lock(&mu_);
    if (r == pid_ && reason_.empty()) reason_ = DescribeExit(status);
    // Its device's copies ended with it (the driver tore its context down
    // before the process could be waited for).
    gone_ = true;
    held.swap(held_);
  }
  for (int64_t b : held) arena_->Unhold(b);
}

void Worker::UnholdWhenGone(std::vector<int64_t> blocks) {
  if (blocks.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    if (!gone_) {
      held_.insert(held_.end(), blocks.begin(), blocks.end());
      return;
    }
  }
  for (int64_t b : blocks) arena_->Unhold(b);
}

void Worker::ReadLoop() {
  for (;;) {
    wp::Reply reply;
    // After an answer the next one (the next run's) often follows within
    // reply_spin: polled for, it costs no wake-up.
    absl::Status s = channel_->Receive(&reply, reply_spin_);
    if (!s.ok()) break;
    const int64_t read_ns = MonotonicNanos();
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(reply.id());
    if (it == pending_.end()) continue;  // its caller gave up
    it->second->read_ns = read_ns;
    it->second->reply = std::move(reply);
    it->second->done = true;
    it->second->ready.store(true, std::memory_order_release);
    pending_.erase(it);
  }
  Reap();  // fills in how it ended unless it was killed on purpose
  absl::MutexLock lock(&mu_);
  const bool stopped = dead_ && reason_ == kStopped;
  dead_ = true;  // after the reason is known: callers woken now report it
  if (reason_.empty()) reason_ = "closed its socket";
  if (stopped) {
    spdlog::debug("{}: device worker (pid {}) stopped", device_, pid_);
  } else {
    spdlog::error("{}: device worker (pid {}) {}", device_, pid_, reason_);
  }
}

absl::Status Worker::DeadStatus() const {
  absl::MutexLock lock(&mu_);
  if (!dead_) return absl::OkStatus();
  return backend::DeviceFault(device_, absl::StrCat("its worker process (pid ", pid_, ") ",
                                                    reason_.empty() ? "ended" : reason_));
}

absl::StatusOr<wp::Reply> Worker::Call(wp::Request request, absl::Duration timeout,
                                       int64_t* read_ns, absl::Duration spin) {
  round_trips_.fetch_add(1, std::memory_order_relaxed);
  Pending p;
  const uint64_t id = next_id_.fetch_add(1) + 1;
  request.set_id(id);
  bool registered = false;
  {
    absl::MutexLock lock(&mu_);
    if (!dead_) {
      pending_[id] = &p;
      registered = true;
    }
  }
  if (!registered) return DeadStatus();
  if (absl::Status s = channel_->Send(request); !s.ok()) {
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
    dead_ = true;
    if (reason_.empty()) reason_ = absl::StrCat("could not be written to: ", s.message());
  }
  if (spin > absl::ZeroDuration()) {
    // Bounded: a worker that died is noticed after it, under mu_ below.
    const absl::Time until = absl::Now() + std::min(spin, timeout);
    while (!p.ready.load(std::memory_order_acquire) && absl::Now() < until) {
      std::this_thread::yield();
    }
  }
  bool done, dead;
  {
    absl::MutexLock lock(&mu_);
    auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return p.done || dead_; };
    mu_.AwaitWithTimeout(absl::Condition(&answered), timeout);
    pending_.erase(id);
    done = p.done;
    dead = dead_;
  }
  if (done) {
    if (read_ns != nullptr) *read_ns = p.read_ns;
    return std::move(p.reply);
  }
  if (!dead) {
    Kill(absl::StrCat("did not answer within ", absl::FormatDuration(timeout),
                      ": it or its device hung, and it was killed"));
  }
  return DeadStatus();
}

void Worker::Post(wp::Request request) {
  if (!alive()) return;
  one_way_.fetch_add(1, std::memory_order_relaxed);
  if (!channel_->Send(request).ok()) {
    absl::MutexLock lock(&mu_);
    dead_ = true;
  }
}

void Worker::Kill(const std::string& reason) {
  bool reaped;
  {
    absl::MutexLock lock(&mu_);
    if (dead_ && !reason_.empty()) return;
    dead_ = true;
    if (reason_.empty()) reason_ = reason;
    reaped = reaped_;
  }
  if (!reaped) ::kill(pid_, SIGKILL);
  channel_->Shutdown();
}

class IsolatedDevice;

// Device memory in the worker: a handle.
class RemoteBuffer final : public backend::Buffer, public backend::CaptureBinding {
 public:
  RemoteBuffer(std::shared_ptr<Worker> w, uint64_t handle, int64_t size,
               std::shared_ptr<std::atomic<int64_t>> in_use)
      : w_(std::move(w)), handle_(handle), size_(size), in_use_(std::move(in_use)) {
    *in_use_ += size_;
  }
  ~RemoteBuffer() override {
    *in_use_ -= size_;
    wp::Request r;
    r.set_free(handle_);
    w_->Post(std::move(r));
  }
  int64_t size() const override { return size_; }
  uint64_t binding_id() const override { return handle_; }  // handles are never reused
  const Worker* worker() const { return w_.get(); }
  uint64_t handle() const { return handle_; }

 private:
  std::shared_ptr<Worker> w_;
  const uint64_t handle_;
  const int64_t size_;
  std::shared_ptr<std::atomic<int64_t>> in_use_;
};

struct EventState {
  EventState(std::shared_ptr<Worker> w, uint64_t id, const void* stream)
      : w(std::move(w)), id(id), stream(stream) {}
  const std::shared_ptr<Worker> w;
  const uint64_t id;
  const void* const stream;
  absl::Mutex mu;
  bool flushed ABSL_GUARDED_BY(mu) = false;
  bool released ABSL_GUARDED_BY(mu) = false;
  std::optional<double> micros ABSL_GUARDED_BY(mu);
};

class RemoteEvent final : public backend::Event {
 public:
  explicit RemoteEvent(std::shared_ptr<EventState> s) : s_(std::move(s)) {}
  ~RemoteEvent() override {
    absl::MutexLock lock(&s_->mu);
    s_->released = true;
    // Not yet sent: its stream releases it right after sending its record.
    if (!s_->flushed) return;
    wp::Request r;
    r.set_destroy_event(s_->id);
    s_->w->Post(std::move(r));
  }
  absl::StatusOr<double> MicrosSince(const backend::Event& earlier) const override {
    const auto* e = dynamic_cast<const RemoteEvent*>(&earlier);
    if (e == nullptr || e->s_->stream != s_->stream) {
      return absl::InvalidArgumentError("events of different streams");
    }
    std::optional<double> a, b;
    {
      absl::MutexLock lock(&s_->mu);
      a = s_->micros;
    }
    {
      absl::MutexLock lock(&e->s_->mu);
      b = e->s_->micros;
    }
    if (!a || !b) return absl::FailedPreconditionError("the stream was not synchronized past the event");
    return *a - *b;
  }
  const std::shared_ptr<EventState>& state() const { return s_; }

 private:
  std::shared_ptr<EventState> s_;
};

class RemoteStream final : public backend::Stream, public backend::CapturingStream {
 public:
  RemoteStream(std::shared_ptr<Worker> w, uint64_t handle, const WorkerOptions& options)
      : w_(std::move(w)), handle_(handle), options_(options) {}
  ~RemoteStream() override;

  absl::Status SynchronizeFor(absl::Duration timeout) override;
  absl::Status Wait(const backend::Event& event) override;
  absl::Status FlushWork() override { return Flush(); }
  absl::StatusOr<std::unique_ptr<backend::Event>> Record() override;
  // The worker's stream captures; EndCapture waits for the worker to end
  // the capture (a capture that failed fails here, once per capture, and
  // the stream is usable again).
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<backend::CapturedWork>> EndCapture() override;
  // Queues a replay of graph `id`; `events` (recorded inside it) get this
  // replay's times at the next synchronization.
  absl::Status Replay(uint64_t id, const std::vector<std::shared_ptr<EventState>>& events);

  const Worker* worker() const { return w_.get(); }
  // Queues a command; fails with the stream's fault once it has one.
  absl::Status Append(wp::Command command);
  absl::Status CopyIn(const void* src, const wp::View& dst, int64_t bytes);
  absl::Status CopyOut(const wp::View& src, void* dst, int64_t bytes);

 private:
  absl::Status Flush();
  // After the answer that passed every copy sent: the staging blocks are
  // free and the host-arena blocks unheld.
  void FreeStaging();
  // When no answer came (the worker died or hung) or it reported a device
  // fault: the arena blocks stay held until the worker is gone; the staging
  // blocks die with its region.
  void AbandonHolds();
  // Holds the host-arena block that [p, p + bytes) lies in, for a copy by
  // reference: its offset in the arena, or nullopt (copy through staging).
  std::optional<int64_t> HoldInArena(const void* p, int64_t bytes);

  static constexpr int64_t kInArena = -2;  // Out::shm: the worker wrote dst itself
  struct Out {
    void* dst;
    int64_t bytes;
    int64_t shm;  // -1 = inline, kInArena = by reference
  };

  std::shared_ptr<Worker> w_;
  const uint64_t handle_;
  const WorkerOptions& options_;
  wp::Submit pending_;
  int64_t pending_inline_bytes_ = 0;
  std::vector<int64_t> staging_;  // shared-region blocks in use until the next answer
  std::vector<int64_t> holds_;    // host-arena blocks held until the next answer
  std::vector<Out> outs_;
  std::vector<std::shared_ptr<EventState>> unflushed_, awaiting_;
  absl::Status sticky_;
  bool capturing_ = false;
  std::vector<std::shared_ptr<EventState>> captured_;  // recorded while capturing
};

// A graph captured by a worker's stream, by id.
class RemoteGraph final : public backend::CapturedWork {
 public:
  RemoteGraph(std::shared_ptr<Worker> w, uint64_t id, RemoteStream* stream,
              std::vector<std::shared_ptr<EventState>> events)
      : w_(std::move(w)), id_(id), stream_(stream), events_(std::move(events)) {}
  ~RemoteGraph() override {
    wp::Request r;
    r.set_destroy_graph(id_);
    w_->Post(std::move(r));
  }
  absl::Status Replay(backend::Stream& stream) override {
    if (&stream != stream_) {
      return absl::InvalidArgumentError(
          absl::StrCat(w_->device(), ": a graph replays on the stream it was captured on"));
    }
    return stream_->Replay(id_, events_);
  }

 private:
  std::shared_ptr<Worker> w_;
  const uint64_t id_;
  RemoteStream* const stream_;
  const std::vector<std::shared_ptr<EventState>> events_;
};

RemoteStream::~RemoteStream() {
  if (!sticky_.ok() || !w_->alive()) {  // what the worker may still use stays put
    AbandonHolds();
    return;
  }
  (void)Flush();
  wp::Request r;
  r.set_destroy_stream(handle_);
  if (w_->Call(std::move(r), options_.call_timeout).ok()) {
    FreeStaging();
  } else {
    AbandonHolds();
  }
}

void RemoteStream::FreeStaging() {
  for (int64_t off : staging_) w_->shm().Free(off);
  for (const Out& o : outs_) {
    if (o.shm >= 0) w_->shm().Free(o.shm);
  }
  for (int64_t b : holds_) w_->arena()->Unhold(b);
  staging_.clear();
  outs_.clear();
  holds_.clear();
}

void RemoteStream::AbandonHolds() {
  w_->UnholdWhenGone(std::move(holds_));
  holds_.clear();
}

std::optional<int64_t> RemoteStream::HoldInArena(const void* p, int64_t bytes) {
  HostArena* arena = w_->arena();
  if (arena == nullptr || bytes <= 0) return std::nullopt;
  std::optional<HostArena::Span> span = arena->Hold(p, bytes);
  if (!span) return std::nullopt;
  holds_.push_back(span->block);
  arena->CountDirect(bytes);
  return span->offset;
}

absl::Status RemoteStream::Append(wp::Command command) {
  if (!sticky_.ok()) return sticky_;
  if (absl::Status dead = w_->DeadStatus(); !dead.ok()) return sticky_ = dead;
  *pending_.add_commands() = std::move(command);
  if (pending_.commands_size() >= 512 || pending_inline_bytes_ >= (int64_t{64} << 20)) return Flush();
  return absl::OkStatus();
}

absl::Status RemoteStream::CopyIn(const void* src, const wp::View& dst, int64_t bytes) {
  if (!sticky_.ok()) return sticky_;
  // The caller's buffer is in the host arena: the worker reads it there (its
  // device DMAs from it when registered) until the answer that passes the copy.
  if (std::optional<int64_t> at = HoldInArena(src, bytes)) {
    wp::Command c;
    wp::CopyIn* in = c.mutable_copy_in();
    *in->mutable_dst() = dst;
    in->set_shm_offset(*at);
    in->set_arena(true);
    KILN_RETURN_IF_ERROR(Append(std::move(c)));
    // A large one is sent now: its DMA starts while the launches are queued.
    if (options_.upload_piece_bytes > 0 && bytes > options_.upload_piece_bytes) return Flush();
    return absl::OkStatus();
  }
  std::optional<int64_t> off = bytes > 0 ? w_->shm().Allocate(bytes) : std::nullopt;
  if (!off) {
    wp::Command c;
    wp::CopyIn* in = c.mutable_copy_in();
    *in->mutable_dst() = dst;
    in->set_inline_data(true);
    in->mutable_data()->assign(static_cast<const char*>(src), static_cast<size_t>(bytes));
    pending_inline_bytes_ += bytes;
    return Append(std::move(c));
  }
  // The block stays ours until the answer to the synchronization that passes
  // the copy (the worker's device may DMA from it until then).
  staging_.push_back(*off);
  const std::vector<UploadPiece> pieces = UploadPieces(bytes, options_.upload_piece_bytes);
  for (const UploadPiece& p : pieces) {
    HostCopy(w_->shm().at(*off + p.offset), static_cast<const char*>(src) + p.offset, p.bytes);
    wp::Command c;
    wp::CopyIn* in = c.mutable_copy_in();
    *in->mutable_dst() = dst;
    in->mutable_dst()->set_offset(dst.offset() + p.offset);
    in->mutable_dst()->set_bytes(p.bytes);
    in->set_shm_offset(*off + p.offset);
    KILN_RETURN_IF_ERROR(Append(std::move(c)));
    // Sent now: the worker starts this piece's DMA while the next is copied.
    if (pieces.size() > 1) KILN_RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::Status RemoteStream::CopyOut(const wp::View& src, void* dst, int64_t bytes) {
  if (!sticky_.ok()) return sticky_;
  wp::Command c;
  wp::CopyOut* out = c.mutable_copy_out();
  *out->mutable_src() = src;
  // The destination is in the host arena: the worker writes it there.
  if (std::optional<int64_t> at = HoldInArena(dst, bytes)) {
    out->set_shm_offset(*at);
    out->set_arena(true);
    outs_.push_back({dst, bytes, kInArena});
    return Append(std::move(c));
  }
  std::optional<int64_t> off = bytes > 0 ? w_->shm().Allocate(bytes) : std::nullopt;
  if (off) {
    out->set_shm_offset(*off);
  } else {
    out->set_inline_data(true);
  }
  outs_.push_back({dst, bytes, off ? *off : -1});
  return Append(std::move(c));
}

absl::Status RemoteStream::Flush() {
  if (!sticky_.ok()) return sticky_;
  if (pending_.commands_size() == 0) return absl::OkStatus();
  wp::Request r;
  pending_.set_stream(handle_);
  *r.mutable_submit() = std::move(pending_);
  pending_.Clear();
  pending_inline_bytes_ = 0;
  w_->Post(std::move(r));
  for (auto& e : unflushed_) {
    absl::MutexLock lock(&e->mu);
    e->flushed = true;
    if (e->released) {
      wp::Request d;
      d.set_destroy_event(e->id);
      w_->Post(std::move(d));
    }
    awaiting_.push_back(e);
  }
  unflushed_.clear();
  if (absl::Status dead = w_->DeadStatus(); !dead.ok()) return sticky_ = dead;
  return absl::OkStatus();
}

absl::Status RemoteStream::SynchronizeFor(absl::Duration timeout) {
  if (!sticky_.ok()) return sticky_;
  wp::Request r;
  pending_.set_stream(handle_);
  pending_.set_sync(true);
  pending_.set_timeout_micros(absl::ToInt64Microseconds(timeout));
  *r.mutable_submit() = std::move(pending_);
  pending_.Clear();
  pending_inline_bytes_ = 0;
  for (auto& e : unflushed_) {
    absl::MutexLock lock(&e->mu);
    e->flushed = true;
    awaiting_.push_back(e);
  }
  std::vector<std::shared_ptr<EventState>> released;
  for (auto& e : unflushed_) {
    absl::MutexLock lock(&e->mu);
    if (e->released) released.push_back(e);
  }
  unflushed_.clear();
  const int64_t sent_ns = MonotonicNanos();
  int64_t read_ns = 0;
  absl::StatusOr<wp::Reply> reply =
      w_->Call(std::move(r), timeout + options_.grace, &read_ns, options_.reply_spin);
  if (reply.ok() && reply->has_sync_times()) {
    const wp::SyncTimes& t = reply->sync_times();
    const RoundTripTimes trip{sent_ns, t.received(), t.started(), t.launched(), t.done(),
                              t.replied(), read_ns, MonotonicNanos()};
    absl::MutexLock lock(&last_round_trip_mu);
    last_round_trip = trip;
  }
  for (auto& e : released) {
    wp::Request d;
    d.set_destroy_event(e->id);
    w_->Post(std::move(d));
  }
  if (!reply.ok()) {
    AbandonHolds();
    return sticky_ = reply.status();
  }
  absl::Status s = StatusOf(*reply, w_->device());
  std::unordered_map<uint64_t, double> times;
  for (const auto& t : reply->events()) times[t.event()] = t.micros();
  for (auto& e : awaiting_) {
    absl::MutexLock lock(&e->mu);
    if (auto it = times.find(e->id); it != times.end()) e->micros = it->second;
  }
  awaiting_.clear();
  if (s.ok()) {
    int next_inline = 0;
    for (const Out& o : outs_) {
      if (o.shm == kInArena) continue;  // written where it belongs by the worker
      if (o.shm >= 0) {
        HostCopy(o.dst, w_->shm().at(o.shm), o.bytes);
        continue;
      }
      if (next_inline >= reply->copy_out_size() ||
          static_cast<int64_t>(reply->copy_out(next_inline).size()) != o.bytes) {
        s = absl::DataLossError("the device worker returned a copy of the wrong size");
        break;
      }
      std::memcpy(o.dst, reply->copy_out(next_inline).data(), static_cast<size_t>(o.bytes));
      ++next_inline;
    }
  }
  // A device fault: the worker's device may be past saving, and the worker
  // past answering again; its arena blocks wait for it to be gone.
  if (backend::FaultedDevice(s)) AbandonHolds();
  FreeStaging();
  if (backend::FaultedDevice(s)) sticky_ = s;
  return s;
}

absl::Status RemoteStream::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError(absl::StrCat(w_->device(), ": already capturing"));
  wp::Command c;
  c.set_begin_capture(true);
  KILN_RETURN_IF_ERROR(Append(std::move(c)));
  capturing_ = true;
  captured_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<backend::CapturedWork>> RemoteStream::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError(absl::StrCat(w_->device(), ": not capturing"));
  capturing_ = false;
  std::vector<std::shared_ptr<EventState>> events = std::move(captured_);
  captured_.clear();
  const uint64_t id = w_->NextEventId();  // one counter: ids unique in the worker
  wp::Command c;
  c.set_end_capture(id);
  KILN_RETURN_IF_ERROR(Append(std::move(c)));
  // The worker ends the capture even when a command in it failed; whether
  // the graph exists is known once it answered.
  KILN_RETURN_IF_ERROR(SynchronizeFor(kDefaultWaitTimeout)) << "while capturing a graph";
  return std::unique_ptr<backend::CapturedWork>(
      std::make_unique<RemoteGraph>(w_, id, this, std::move(events)));
}

absl::Status RemoteStream::Replay(uint64_t id,
                                  const std::vector<std::shared_ptr<EventState>>& events) {
  wp::Command c;
  c.set_replay(id);
  KILN_RETURN_IF_ERROR(Append(std::move(c)));
  awaiting_.insert(awaiting_.end(), events.begin(), events.end());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<backend::Event>> RemoteStream::Record() {
  auto state = std::make_shared<EventState>(w_, w_->NextEventId(), this);
  wp::Command c;
  c.set_record(state->id);
  KILN_RETURN_IF_ERROR(Append(std::move(c)));
  unflushed_.push_back(state);
  if (capturing_) captured_.push_back(state);
  return std::unique_ptr<backend::Event>(new RemoteEvent(std::move(state)));
}

absl::Status RemoteStream::Wait(const backend::Event& event) {
  const auto* e = dynamic_cast<const RemoteEvent*>(&event);
  if (e == nullptr || e->state()->w != w_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Stream::Wait: the event is not from a stream of ", w_->device()));
  }
  {
    absl::MutexLock lock(&e->state()->mu);
    if (!e->state()->flushed && e->state()->stream != this) {
      return absl::FailedPreconditionError(
          "Stream::Wait: the event's stream has not handed its work to the device (FlushWork)");
    }
  }
  if (e->state()->stream == this) return absl::OkStatus();  // in order already
  wp::Command c;
  c.set_wait(e->state()->id);
  return Append(std::move(c));
}

class RemoteKernel final : public backend::Kernel, public backend::CapturableKernel {
 public:
  RemoteKernel(std::shared_ptr<Worker> w, uint64_t handle, std::string implementation,
               bool capturable)
      : w_(std::move(w)),
        handle_(handle),
        implementation_(std::move(implementation)),
        capturable_(capturable) {}
  ~RemoteKernel() override {
    wp::Request r;
    r.set_destroy_kernel(handle_);
    w_->Post(std::move(r));
  }
  std::string implementation() const override { return implementation_; }
  bool capturable() const override { return capturable_; }
  absl::Status Launch(backend::Stream& stream, std::span<const backend::BufferView> inputs,
                      std::span<const backend::BufferView> outputs) override;

 private:
  std::shared_ptr<Worker> w_;
  const uint64_t handle_;
  const std::string implementation_;
  const bool capturable_;
};

// A BufferView as a message; the buffer must be of `w`.
absl::StatusOr<wp::View> ViewOf(const Worker* w, const backend::BufferView& v) {
  wp::View out;
  out.set_offset(v.offset);
  out.set_bytes(v.bytes);
  if (v.buffer == nullptr) {
    if (v.bytes != 0) return absl::InvalidArgumentError("a view of no buffer");
    return out;
  }
  const auto* b = dynamic_cast<const RemoteBuffer*>(v.buffer);
  if (b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("a buffer not of ", w->device()));
  }
  if (b->worker() != w) {
    return backend::DeviceFault(w->device(), "a buffer from before the device restarted");
  }
  out.set_buffer(b->handle());
  return out;
}

absl::Status RemoteKernel::Launch(backend::Stream& stream,
                                  std::span<const backend::BufferView> inputs,
                                  std::span<const backend::BufferView> outputs) {
  auto* s = dynamic_cast<RemoteStream*>(&stream);
  if (s == nullptr) return absl::InvalidArgumentError(absl::StrCat("a stream not of ", w_->device()));
  if (s->worker() != w_.get()) {
    return backend::DeviceFault(w_->device(), "a kernel from before the device restarted");
  }
  wp::Command c;
  wp::Launch* l = c.mutable_launch();
  l->set_kernel(handle_);
  for (const auto& v : inputs) {
    KILN_ASSIGN_OR_RETURN(*l->add_inputs(), ViewOf(w_.get(), v));
  }
  for (const auto& v : outputs) {
    KILN_ASSIGN_OR_RETURN(*l->add_outputs(), ViewOf(w_.get(), v));
  }
  return s->Append(std::move(c));
}

class IsolatedDevice final : public backend::Device {
 public:
  IsolatedDevice(WorkerOptions options, int index, std::shared_ptr<Worker> worker)
      : options_(std::move(options)), index_(index), worker_(std::move(worker)) {
    info_ = FromProto(worker_->hello().devices(index_));
    // The memory is the worker's: never addressable from kilnd.
    info_.host_memory = false;
  }

  const backend::DeviceInfo& info() const override { return info_; }
  absl::StatusOr<std::unique_ptr<backend::Buffer>> Allocate(int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<backend::Stream>> CreateStream() override;
  absl::Status CopyToDevice(backend::Stream& stream, const void* src, backend::BufferView dst) override;
  absl::Status CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) override;
  absl::Status CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                            backend::BufferView dst) override;
  backend::Claim Supports(const backend::KernelSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<backend::Kernel>> PrepareKernel(
      const backend::KernelSpec& spec, backend::PrepareContext& context) override;
  int64_t memory_in_use() const override { return in_use_->load(); }
  uint64_t generation() const override {
    absl::MutexLock lock(&mu_);
    return generation_;
  }
  absl::Status Restart() override;
  int64_t pid() const { return Current()->pid(); }
  WorkerTraffic traffic() const { return Current()->traffic(); }

 private:
  std::shared_ptr<Worker> Current() const {
    absl::MutexLock lock(&mu_);
    return worker_;
  }
  // The stream as one of this device's current worker's.
  absl::StatusOr<RemoteStream*> StreamOf(backend::Stream& stream, const Worker* w) const {
    auto* s = dynamic_cast<RemoteStream*>(&stream);
    if (s == nullptr) return absl::InvalidArgumentError(absl::StrCat("a stream not of ", info_.id));
    if (s->worker() != w) return backend::DeviceFault(info_.id, "a stream from before the device restarted");
    return s;
  }

  const WorkerOptions options_;
  const int index_;
  backend::DeviceInfo info_;
  std::shared_ptr<std::atomic<int64_t>> in_use_ = std::make_shared<std::atomic<int64_t>>(0);
  absl::Mutex restart_mu_;
  mutable absl::Mutex mu_;
  std::shared_ptr<Worker> worker_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex claims_mu_;
  mutable std::unordered_map<std::string, backend::Claim> claims_ ABSL_GUARDED_BY(claims_mu_);
};

absl::StatusOr<std::unique_ptr<backend::Buffer>> IsolatedDevice::Allocate(int64_t bytes) {
  std::shared_ptr<Worker> w = Current();
  wp::Request r;
  r.set_allocate(bytes);
  KILN_ASSIGN_OR_RETURN(wp::Reply reply, w->Call(std::move(r), options_.call_timeout));
  KILN_RETURN_IF_ERROR(StatusOf(reply, info_.id));
  return std::unique_ptr<backend::Buffer>(new RemoteBuffer(w, reply.handle(), bytes, in_use_));
}

absl::StatusOr<std::unique_ptr<backend::Stream>> IsolatedDevice::CreateStream() {
  std::shared_ptr<Worker> w = Current();
  wp::Request r;
  r.set_create_stream(true);
  KILN_ASSIGN_OR_RETURN(wp::Reply reply, w->Call(std::move(r), options_.call_timeout));
  KILN_RETURN_IF_ERROR(StatusOf(reply, info_.id));
  return std::unique_ptr<backend::Stream>(new RemoteStream(w, reply.handle(), options_));
}

absl::Status IsolatedDevice::CopyToDevice(backend::Stream& stream, const void* src,
                                          backend::BufferView dst) {
  std::shared_ptr<Worker> w = Current();
  KILN_ASSIGN_OR_RETURN(RemoteStream * s, StreamOf(stream, w.get()));
  KILN_ASSIGN_OR_RETURN(wp::View v, ViewOf(w.get(), dst));
  return s->CopyIn(src, v, dst.bytes);
}

absl::Status IsolatedDevice::CopyToHost(backend::Stream& stream, backend::BufferView src, void* dst) {
  std::shared_ptr<Worker> w = Current();
  KILN_ASSIGN_OR_RETURN(RemoteStream * s, StreamOf(stream, w.get()));
  KILN_ASSIGN_OR_RETURN(wp::View v, ViewOf(w.get(), src));
  return s->CopyOut(v, dst, src.bytes);
}

absl::Status IsolatedDevice::CopyOnDevice(backend::Stream& stream, backend::BufferView src,
                                          backend::BufferView dst) {
  std::shared_ptr<Worker> w = Current();
  KILN_ASSIGN_OR_RETURN(RemoteStream * s, StreamOf(stream, w.get()));
  wp::Command c;
  KILN_ASSIGN_OR_RETURN(*c.mutable_copy_on_device()->mutable_src(), ViewOf(w.get(), src));
  KILN_ASSIGN_OR_RETURN(*c.mutable_copy_on_device()->mutable_dst(), ViewOf(w.get(), dst));
  return s->Append(std::move(c));
}

backend::Claim IsolatedDevice::Supports(const backend::KernelSpec& spec) const {
  wp::Request r;
  ToProto(spec, r.mutable_supports());
  // Claims depend on the spec alone: asked once per distinct spec (a compile
  // asks for every node on every device).
  wp::Spec key_spec = r.supports();
  key_spec.clear_label();
  std::string key = key_spec.SerializeAsString();
  {
    absl::MutexLock lock(&claims_mu_);
    if (auto it = claims_.find(key); it != claims_.end()) return it->second;
  }
  absl::StatusOr<wp::Reply> reply = Current()->Call(std::move(r), options_.call_timeout);
  if (!reply.ok()) return backend::Claim::Fault(reply.status());
  if (reply->code() != 0) return backend::Claim::No(reply->message());
  backend::Claim claim{reply->native(), reply->reason()};
  absl::MutexLock lock(&claims_mu_);
  if (claims_.size() >= 65536) claims_.clear();
  claims_.emplace(std::move(key), claim);
  return claim;
}

absl::StatusOr<std::unique_ptr<backend::Kernel>> IsolatedDevice::PrepareKernel(
    const backend::KernelSpec& spec, backend::PrepareContext& context) {
  std::shared_ptr<Worker> w = Current();
  wp::Request r;
  ToProto(spec, r.mutable_prepare());
  KILN_ASSIGN_OR_RETURN(wp::Reply reply, w->Call(std::move(r), options_.prepare_timeout));
  context.kernel_cache_hits += reply.cache_hits();
  context.kernel_cache_misses += reply.cache_misses();
  KILN_RETURN_IF_ERROR(StatusOf(reply, info_.id));
  return std::unique_ptr<backend::Kernel>(new RemoteKernel(w, reply.handle(), reply.implementation(), reply.capturable()));
}

absl::Status IsolatedDevice::Restart() {
  absl::MutexLock restart(&restart_mu_);
  Current()->Kill("was restarted after a fault");
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Worker> fresh, Worker::Start(options_, index_, info_.id));
  const wp::Info& again = fresh->hello().devices(index_);
  if (again.identity() != info_.identity) {
    return backend::DeviceFault(info_.id, absl::StrCat("came back as another device (", again.name(),
                                                       ", identity ", again.identity(), ")"));
  }
  absl::MutexLock lock(&mu_);
  worker_ = std::move(fresh);
  ++generation_;
  spdlog::info("{}: device worker restarted (pid {}, generation {})", info_.id, worker_->pid(),
               generation_);
  return absl::OkStatus();
}

}  // namespace

std::string DefaultWorkerBinary() {
  if (const char* env = std::getenv("KILN_DEVICE_WORKER"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / "kiln-device-worker";
    if (::access(beside.c_str(), X_OK) == 0) return beside.string();
  }
#ifdef KILN_DEVICE_WORKER_BUILD_PATH
  if (::access(KILN_DEVICE_WORKER_BUILD_PATH, X_OK) == 0) return KILN_DEVICE_WORKER_BUILD_PATH;
#endif
  return "";
}

std::vector<UploadPiece> UploadPieces(int64_t bytes, int64_t piece_bytes) {
  std::vector<UploadPiece> out;
  if (bytes <= 0) return out;
  if (piece_bytes <= 0 || bytes <= piece_bytes) {
    out.push_back({0, bytes});
    return out;
  }
  for (int64_t at = 0; at < bytes; at += piece_bytes) {
    out.push_back({at, std::min(piece_bytes, bytes - at)});
  }
  return out;
}

absl::StatusOr<IsolatedBackend> StartIsolatedBackend(const WorkerOptions& given) {
  WorkerOptions options = given;
  const bool process_arena = options.host_arena == nullptr;
  if (process_arena) options.host_arena = HostArena::Process(options.host_arena_bytes);
  if (const char* env = std::getenv("KILN_WORKER_UPLOAD_PIECE_BYTES");
      env != nullptr && *env != '\0') {
    options.upload_piece_bytes = std::strtoll(env, nullptr, 10);
  }
  if (const char* env = std::getenv("KILN_WORKER_REPLY_SPIN_US"); env != nullptr && *env != '\0') {
    options.reply_spin = absl::Microseconds(std::max<int64_t>(0, std::strtoll(env, nullptr, 10)));
  }
  if (const char* env = std::getenv("KILN_WORKER_QUEUE_SPIN_US"); env != nullptr && *env != '\0') {
    options.queue_spin = absl::Microseconds(std::max<int64_t>(0, std::strtoll(env, nullptr, 10)));
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Worker> first,
                        Worker::Start(options, 0, absl::StrCat(options.backend, " device 0")));
  IsolatedBackend out;
  out.name = first->hello().backend();
  out.version = first->hello().version();
  const int n = first->hello().devices_size();
  out.devices.push_back(std::make_unique<IsolatedDevice>(options, 0, std::move(first)));
  for (int i = 1; i < n; ++i) {
    auto w = Worker::Start(options, i, absl::StrCat(options.backend, " device ", i));
    if (!w.ok()) {
      spdlog::warn("{} device {}: no worker: {}", options.backend, i, std::string(w.status().message()));
      continue;
    }
    out.devices.push_back(std::make_unique<IsolatedDevice>(options, i, std::move(w).value()));
  }
  // CUDA workers register the arena with their device (the one backend with
  // HostMemoryRegistrar, backends/host_memory.h), so copies through it are DMA
  // with no host copy: large HostTensors made from now on are allocated in it.
  // Other workers map it too and copy from it (a host copy fewer in kilnd) but
  // do not make HostTensor use it.
  if (process_arena && options.host_arena != nullptr && out.name == "cuda") {
    options.host_arena->Activate();
  }
  return out;
}

int64_t WorkerPid(const backend::Device& device) {
  const auto* d = dynamic_cast<const IsolatedDevice*>(&device);
  return d == nullptr ? 0 : d->pid();
}

WorkerTraffic WorkerMessages(const backend::Device& device) {
  const auto* d = dynamic_cast<const IsolatedDevice*>(&device);
  return d == nullptr ? WorkerTraffic{} : d->traffic();
}

std::optional<RoundTripTimes> LastRoundTrip() {
  absl::MutexLock lock(&last_round_trip_mu);
  return last_round_trip;
}

}  // namespace kiln::runtime::worker
