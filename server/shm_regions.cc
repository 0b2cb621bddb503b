#include "server/shm_regions.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/client_string.h"

namespace kiln::server {
namespace {

// An fd closed when it goes out of scope.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  ~OwnedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

bool IsValidRegionId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

v1::ShmServerMessage Answer(const absl::Status& s) {
  v1::ShmServerMessage m;
  m.set_code(static_cast<int>(s.code()));
  m.set_message(std::string(s.message()));
  return m;
}

// Fills `addr` for `name` ("@abstract" or a path); returns its length.
socklen_t SocketAddress(const std::string& name, sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (!name.empty() && name[0] == '@') {
    // Abstract: a leading NUL, then the name without the '@' (not NUL-terminated).
    std::memcpy(addr.sun_path + 1, name.data() + 1, name.size() - 1);
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  }
  std::memcpy(addr.sun_path, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
}

std::string DefaultSocketName() {
  static std::atomic<int> next{0};
  return absl::StrCat("@kilnd-", ::getpid(), "-", next.fetch_add(1), ".shm");
}

}  // namespace

absl::Status ShmUsage::Reserve(const Tenant& tenant, int64_t bytes) {
  absl::MutexLock lock(&usage_mu_);
  Counts& c = usage_[tenant.name()];
  const v1::TenantQuota& q = tenant.quota();
  if (c.regions >= q.max_shm_regions()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant \"", tenant.name(), "\" has ", c.regions,
        " shared-memory regions mapped; its quota max_shm_regions is ", q.max_shm_regions(),
        " (unregister one, or close a connection, first)"));
  }
  if (bytes > q.max_shm_bytes() - c.bytes) {  // c.bytes <= max: no overflow
    return absl::ResourceExhaustedError(absl::StrCat(
        "a region of ", bytes, " bytes would put tenant \"", tenant.name(), "\" over its quota "
        "max_shm_bytes of ", q.max_shm_bytes(), " (", c.bytes, " bytes mapped now)"));
  }
  ++c.regions;
  c.bytes += bytes;
  return absl::OkStatus();
}

void ShmUsage::Release(const std::string& tenant, int64_t bytes) {
  absl::MutexLock lock(&usage_mu_);
  Counts& c = usage_[tenant];
  --c.regions;
  c.bytes -= bytes;
}

ShmUsage::Counts ShmUsage::Of(const std::string& tenant) const {
  absl::MutexLock lock(&usage_mu_);
  auto it = usage_.find(tenant);
  return it == usage_.end() ? Counts{} : it->second;
}

std::map<std::string, ShmUsage::Counts> ShmUsage::All() const {
  absl::MutexLock lock(&usage_mu_);
  return usage_;
}

ShmRegion::~ShmRegion() {
  ::munmap(base_, static_cast<size_t>(bytes_));
  usage_->Release(tenant_, bytes_);
}

absl::StatusOr<char*> ShmRegion::Slice(int64_t offset, int64_t bytes,
                                       const std::string& what) const {
  // offset + bytes <= size, written so that nothing overflows.
  if (offset < 0 || bytes < 0 || offset > bytes_ || bytes > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        what, ": bytes [", offset, ", ", offset, " + ", bytes, ") are not inside shared-memory region ",
        QuoteClientString(id_), " of ", bytes_, " bytes"));
  }
  return base_ + offset;
}

absl::StatusOr<std::unique_ptr<ShmRegistry>> ShmRegistry::Create(const v1::ServerConfig& config) {
  const std::string name = config.shm_socket().empty() ? DefaultSocketName() : config.shm_socket();
  OwnedFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::InternalError(Errno("shared-memory socket"));
  sockaddr_un addr;
  const socklen_t len = SocketAddress(name, addr);
  std::string unlink_path;
  if (name[0] != '@') {
    // A socket file left by a kilnd that is gone is replaced; one that
    // answers belongs to a running kilnd.
    struct stat st;
    if (::lstat(name.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      OwnedFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
      if (probe.get() >= 0 && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
        return absl::AlreadyExistsError(
            absl::StrCat("shm_socket ", name, " is in use by another process"));
      }
      ::unlink(name.c_str());
    }
    unlink_path = name;
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind the shared-memory socket ", name, ": ", std::strerror(errno),
                     " (shm_socket / --shm_socket; \"off\" disables shared memory)"));
  }
  // Anyone on the host may connect: nothing happens without a ticket, which
  // only an authenticated gRPC call gets.
  if (!unlink_path.empty()) ::chmod(unlink_path.c_str(), 0666);
  if (::listen(fd.get(), 64) != 0) return absl::InternalError(Errno("listen (shared-memory socket)"));
  OwnedFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) return absl::InternalError(Errno("eventfd"));
  std::unique_ptr<ShmRegistry> r(
      new ShmRegistry(fd.release(), wake.release(), name, unlink_path));
  r->thread_ = std::thread([raw = r.get()] { raw->Serve(); });
  return r;
}

ShmRegistry::ShmRegistry(int listen_fd, int wake_fd, std::string socket_name,
                         std::string unlink_path)
    : listen_fd_(listen_fd), wake_fd_(wake_fd),
      socket_name_(std::move(socket_name)), unlink_path_(std::move(unlink_path)) {}

ShmRegistry::~ShmRegistry() {
  stopping_.store(true);
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // The eventfd cannot be full (one write); Serve also polls with a timeout.
  }
  if (thread_.joinable()) thread_.join();
  // Each connection's thread sees the eventfd too; a run of its own is
  // cancelled and waited for.
  std::map<uint64_t, std::thread> threads;
  {
    absl::MutexLock lock(&connections_mu_);
    threads.swap(connection_threads_);
  }
  for (auto& [id, t] : threads) t.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

void ShmRegistry::SetRunner(ShmRunner runner, bool train_steps) {
  absl::MutexLock lock(&runner_mu_);
  if (runs_stopped_) return;
  runner_ = std::move(runner);
  takes_runs_.store(runner_ != nullptr);
  takes_train_steps_.store(runner_ != nullptr && train_steps);
}

void ShmRegistry::StopRuns() {
  {
    absl::MutexLock lock(&runner_mu_);  // waits for runs being started
    runs_stopped_ = true;
    runner_ = nullptr;
    takes_runs_.store(false);
    takes_train_steps_.store(false);
  }
  std::vector<std::shared_ptr<ShmRunCall>> running;
  {
    absl::MutexLock lock(&runs_mu_);
    for (auto& [id, call] : runs_) running.push_back(call);
  }
  for (const std::shared_ptr<ShmRunCall>& call : running) call->Cancel();
  running.clear();
  absl::MutexLock lock(&runs_mu_);
  runs_mu_.Await(absl::Condition(
      +[](std::map<uint64_t, std::shared_ptr<ShmRunCall>>* runs) { return runs->empty(); },
      &runs_));
}

ShmRegistry::RunWait::~RunWait() {
  if (event_fd >= 0) ::close(event_fd);
}

v1::ConnectSharedMemoryResponse ShmRegistry::NewTicket(Tenant& tenant) {
  unsigned char raw[16];
  // getrandom of 16 bytes from an initialized pool does not fail or come short.
  ssize_t got = ::getrandom(raw, sizeof(raw), 0);
  if (got != static_cast<ssize_t>(sizeof(raw))) {
    // Never hand out a guessable ticket: fall back to /dev/urandom.
    OwnedFd u(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
    got = u.get() >= 0 ? ::read(u.get(), raw, sizeof(raw)) : -1;
    if (got != static_cast<ssize_t>(sizeof(raw))) {
      spdlog::critical("no randomness for a shared-memory ticket");
      std::abort();
    }
  }
  const std::string ticket =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(raw), sizeof(raw)));
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&tickets_mu_);
    // Expired tickets go; a tenant's unused tickets are capped (the oldest go).
    int mine = 0;
    auto oldest = tickets_.end();
    for (auto it = tickets_.begin(); it != tickets_.end();) {
      if (it->second.expires <= now) {
        tickets_.erase(it++);
        continue;
      }
      if (it->second.tenant == &tenant) {
        ++mine;
        if (oldest == tickets_.end() || it->second.expires < oldest->second.expires) oldest = it;
      }
      ++it;
    }
    if (mine >= kMaxTicketsPerTenant && oldest != tickets_.end()) tickets_.erase(oldest);
    tickets_[ticket] = Ticket{&tenant, now + kTicketTtl};
  }
  v1::ConnectSharedMemoryResponse r;
  r.set_ticket(ticket);
  r.set_socket(socket_name_);
  r.set_ticket_ttl_ms(absl::ToInt64Milliseconds(kTicketTtl));
  r.set_max_regions(tenant.quota().max_shm_regions());
  r.set_max_bytes(tenant.quota().max_shm_bytes());
  if (takes_runs_.load()) r.set_max_run_message_bytes(kMaxRunMessageBytes);
  r.set_train_steps(takes_train_steps_.load());
  return r;
}

absl::StatusOr<std::shared_ptr<const ShmRegion>> ShmRegistry::Find(const Tenant& tenant,
                                                                  std::string_view id) const {
  absl::MutexLock lock(&regions_mu_);
  auto t = regions_.find(tenant.name());
  if (t != regions_.end()) {
    auto r = t->second.find(id);
    if (r != t->second.end()) return r->second;
  }
  return absl::NotFoundError(absl::StrCat(
      "no shared-memory region ", QuoteClientString(id),
      " is registered for this tenant (regions are unregistered when their connection closes)"));
}

void ShmRegistry::Serve() {
  // Connections without a ticket yet; one with a ticket moves to a thread
  // of its own (ServeConnection).
  std::vector<Connection> connections;
  while (!stopping_.load()) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Connection& c : connections) fds.push_back({c.fd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), 1000);
    if (n < 0 && errno != EINTR) {
      spdlog::error("shared-memory socket: {}", Errno("poll"));
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (stopping_.load()) break;
    // Threads of connections that ended.
    std::vector<std::thread> ended;
    {
      absl::MutexLock lock(&connections_mu_);
      for (uint64_t id : ended_threads_) {
        auto it = connection_threads_.find(id);
        if (it == connection_threads_.end()) continue;
        ended.push_back(std::move(it->second));
        connection_threads_.erase(it);
      }
      ended_threads_.clear();
    }
    for (std::thread& t : ended) t.join();
    const absl::Time now = absl::Now();
    std::vector<bool> drop(connections.size(), false);
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short ev = fds[i + 2].revents;
      if (ev & POLLIN) {
        drop[i] = !HandleMessage(c, /*own_thread=*/false);
      } else if (ev & (POLLHUP | POLLERR | POLLNVAL)) {
        drop[i] = true;
      }
      if (c.tenant == nullptr && now - c.accepted > kHelloTimeout) drop[i] = true;
    }
    std::vector<Connection> kept;
    for (size_t i = 0; i < connections.size(); ++i) {
      if (drop[i]) {
        if (connections[i].tenant != nullptr) {
          absl::MutexLock lock(&connections_mu_);
          tenant_connections_[connections[i].tenant].erase(connections[i].fd);
        }
        Close(connections[i]);
      } else if (connections[i].tenant != nullptr) {
        absl::MutexLock lock(&connections_mu_);
        const uint64_t id = next_thread_++;
        connection_threads_.emplace(
            id, std::thread([this, id, c = std::move(connections[i])]() mutable {
              ServeConnection(std::move(c));
              absl::MutexLock lock(&connections_mu_);
              ended_threads_.push_back(id);
            }));
      } else {
        kept.push_back(std::move(connections[i]));
      }
    }
    connections = std::move(kept);
    if (fds[1].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        size_t open = connections.size();
        {
          absl::MutexLock lock(&connections_mu_);
          open += connection_threads_.size();
        }
        if (open >= static_cast<size_t>(kMaxConnections)) {
          ::close(fd);
          continue;
        }
        connections.push_back(Connection{fd, nullptr, now, {}});
      }
    }
  }
  for (Connection& c : connections) Close(c);
}

// How long a connection's thread polls (yielding) for the client's next
// message after answering one before it sleeps: a client in a loop of runs
// or training steps sends the next within its own per-call work, and finds
// the thread awake (one thread wake fewer per call; the spin-then-block of
// bert8's device workers). KILN_SHM_NEXT_MESSAGE_SPIN_US, default 1000; 0
// sleeps at once.
namespace {
absl::Duration NextMessageSpin() {
  static const absl::Duration spin = [] {
    int64_t us = 1000;
    if (const char* env = std::getenv("KILN_SHM_NEXT_MESSAGE_SPIN_US");
        env != nullptr && *env != '\0') {
      us = std::max<int64_t>(0, std::strtoll(env, nullptr, 10));
    }
    return absl::Microseconds(us);
  }();
  return spin;
}
}  // namespace

// A tenant's connections whose client has not hung up: a client that closed
// one and opened the next is not refused while the old one's thread (on a
// loaded host, not yet scheduled) has still to notice. The fds stay kilnd's
// until their Close, so none is another connection's.
int ShmRegistry::LiveConnections(const std::set<int>& fds) {
  std::vector<pollfd> p;
  p.reserve(fds.size());
  for (int fd : fds) p.push_back({fd, POLLRDHUP, 0});
  if (::poll(p.data(), p.size(), 0) < 0) return static_cast<int>(fds.size());
  int live = 0;
  for (const pollfd& q : p) live += (q.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
  return live;
}

void ShmRegistry::ServeConnection(Connection c) {
  const absl::Duration spin = NextMessageSpin();
  absl::Time spin_until = absl::InfinitePast();
  while (!stopping_.load()) {
    pollfd fds[2] = {{c.fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const bool spinning = spin_until > absl::InfinitePast() && absl::Now() < spin_until;
    const int n = ::poll(fds, 2, spinning ? 0 : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("shared-memory connection: {}", Errno("poll"));
      break;
    }
    if (n == 0) {  // spinning: nothing yet
      std::this_thread::yield();
      continue;
    }
    if (stopping_.load()) break;
    if (fds[0].revents & POLLIN) {
      if (!HandleMessage(c, /*own_thread=*/true)) break;
      spin_until = spin > absl::ZeroDuration() ? absl::Now() + spin : absl::InfinitePast();
    } else if (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
      break;
    }
  }
  {
    absl::MutexLock lock(&connections_mu_);
    tenant_connections_[c.tenant].erase(c.fd);
  }
  Close(c);
}

bool ShmRegistry::RunMessage(Connection& c, v1::ShmClientMessage& m) {
  auto wait = std::make_shared<RunWait>();
  const absl::Time now = absl::Now();
  ShmRunRequest r;
  r.tenant = c.tenant;
  r.request_id = std::move(*m.mutable_run_request_id());
  auto answer_now = [&c, &r](const absl::Status& s) {
    v1::ShmServerMessage a = Answer(s);
    a.set_request_id(r.request_id.empty() ? std::string("-") : r.request_id);
    const std::string bytes = a.SerializeAsString();
    return ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
           static_cast<ssize_t>(bytes.size());
  };
  if (m.run_timeout_ms() < 0) {
    return answer_now(absl::InvalidArgumentError(absl::StrCat(
        "run_timeout_ms is ", m.run_timeout_ms(), ": give a deadline in ms >= 0 (0 = none)")));
  }
  if (m.run_timeout_ms() > 0) r.deadline = now + absl::Milliseconds(m.run_timeout_ms());
  r.train_step = m.kind_case() == v1::ShmClientMessage::kTrainStep;
  if (r.train_step && !takes_train_steps_.load()) {
    return answer_now(absl::UnimplementedError(
        "this kilnd takes no training steps on its shared-memory socket (its ticket says "
        "train_steps false): send TrainStep over gRPC"));
  }
  r.run = r.train_step ? std::move(*m.mutable_train_step()) : std::move(*m.mutable_run());
  const absl::Time deadline = r.deadline;
  const int fd = c.fd;
  r.answer = [fd, wait](v1::ShmServerMessage a) {
    std::string bytes = a.SerializeAsString();
    if (static_cast<int64_t>(bytes.size()) > kMaxRunMessageBytes) {
      v1::ShmServerMessage too_big = Answer(absl::ResourceExhaustedError(absl::StrCat(
          "the run's answer is ", bytes.size(), " bytes, over max_run_message_bytes (",
          kMaxRunMessageBytes, ") of kilnd's shared-memory socket: give shm_output_area or "
          "shm_outputs for its outputs, or run it over gRPC")));
      too_big.set_request_id(a.request_id());
      bytes = too_big.SerializeAsString();
    }
    // A client that went away is cancelled by the connection's thread; the
    // connection's fd stays open until that thread saw `done`.
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    absl::MutexLock lock(&wait->mu);
    wait->done.store(true);
    const uint64_t one = 1;
    if (wait->event_fd >= 0 && ::write(wait->event_fd, &one, sizeof(one)) < 0) {
      // Cannot fail: one write per eventfd.
    }
  };
  std::shared_ptr<ShmRunCall> call;
  uint64_t run_id = 0;
  {
    absl::ReaderMutexLock lock(&runner_mu_);
    if (runner_ == nullptr) {
      return answer_now(runs_stopped_
                            ? absl::UnavailableError("kilnd is shutting down and takes no new runs")
                            : absl::UnimplementedError(
                                  "this kilnd takes no runs on its shared-memory socket: run "
                                  "over gRPC"));
    }
    call = runner_(std::move(r));
    if (call != nullptr) {
      // Registered before StopRuns can look (it waits for runner_mu_).
      absl::MutexLock runs_lock(&runs_mu_);
      run_id = ++next_run_;
      runs_.emplace(run_id, call);
    }
  }
  // The answer may have gone already (an error, or a run inline here: a
  // training step runs on this thread when its device is idle). Else an
  // eventfd to sleep on, which the answer writes.
  int event_fd = -1;
  {
    absl::MutexLock lock(&wait->mu);
    if (!wait->done.load()) {
      wait->event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (wait->event_fd < 0) {
        spdlog::error("shared-memory run: {}; polling for its answer every millisecond",
                      Errno("eventfd"));
      }
      event_fd = wait->event_fd;
    }
  }
  // Until it goes: the client hanging up, the registry ending or the
  // deadline passing cancels the run (and then only the answer is awaited).
  bool hung_up = false;
  bool cancelled = false;
  while (!wait->done.load()) {
    pollfd fds[3] = {{event_fd, POLLIN, 0}, {fd, 0, 0}, {wake_fd_, POLLIN, 0}};
    int timeout_ms = -1;
    if (!cancelled && deadline != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1))), 0,
          1 << 30));
    }
    if (event_fd < 0) timeout_ms = timeout_ms < 0 ? 1 : std::min(timeout_ms, 1);
    // The connection's hang-up only (its next message waits).
    const int n = ::poll(fds, cancelled ? 1 : 3, timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("shared-memory run: {}", Errno("poll"));
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    if (wait->done.load() || cancelled) continue;
    const bool gone = (fds[1].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
    hung_up = hung_up || gone;
    const bool expired =
        n == 0 && deadline != absl::InfiniteFuture() && absl::Now() >= deadline;
    if (gone || expired || stopping_.load() || (fds[2].revents & POLLIN)) {
      if (call) call->Cancel();
      cancelled = true;
    }
  }
  if (call != nullptr) {
    call.reset();
    absl::MutexLock runs_lock(&runs_mu_);
    runs_.erase(run_id);
  }
  return !hung_up;
}

bool ShmRegistry::HandleMessage(Connection& c, bool own_thread) {
  // A connection with a ticket may send a run of up to kMaxRunMessageBytes:
  // its size is read first, and a larger one refused unread.
  std::string big;
  char small[4096];
  char* buffer = small;
  size_t buffer_bytes = sizeof(small);
  ssize_t peeked = -1;  // the datagram's whole size, when read first
  if (own_thread) {
    peeked = ::recv(c.fd, nullptr, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    if (peeked > static_cast<ssize_t>(sizeof(small)) && peeked <= kMaxRunMessageBytes) {
      big.resize(static_cast<size_t>(peeked));
      buffer = big.data();
      buffer_bytes = big.size();
    }
  }
  // Room for a few fds: more than one is refused, and every fd that came is
  // closed whatever happens (a leaked fd would pin a client's memory).
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  iovec iov{buffer, buffer_bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(c.fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  std::vector<OwnedFd> fds;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if (n == 0 && fds.empty()) return false;  // the client closed its end
  v1::ShmServerMessage answer;
  v1::ShmClientMessage m;
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    answer = Answer(absl::InvalidArgumentError(absl::StrCat(
        "a message of at most ", c.tenant != nullptr ? kMaxRunMessageBytes : int64_t{4096},
        " bytes (max_run_message_bytes; the ticket's message: 4096) with at most one fd, please: "
        "this one had ", peeked >= 0 ? peeked : n, " bytes; put tensor bytes in shared memory")));
  } else if (!m.ParseFromArray(buffer, static_cast<int>(n))) {
    answer = Answer(absl::InvalidArgumentError("not a kiln.v1.ShmClientMessage"));
  } else if (c.tenant == nullptr) {
    // The first message: a ticket, and nothing else.
    Tenant* tenant = nullptr;
    if (m.kind_case() == v1::ShmClientMessage::kTicket && fds.empty()) {
      absl::MutexLock lock(&tickets_mu_);
      auto it = tickets_.find(m.ticket());
      if (it != tickets_.end()) {
        if (it->second.expires > absl::Now()) tenant = it->second.tenant;
        tickets_.erase(it);  // one use
      }
    }
    if (tenant == nullptr) {
      answer = Answer(absl::UnauthenticatedError(
          "the first message must be a ticket from ConnectSharedMemory, unused and within its "
          "ttl"));
      const std::string bytes = answer.SerializeAsString();
      ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      return false;
    }
    // Tenants cannot pile up connections (each holds an fd of kilnd's).
    {
      absl::MutexLock lock(&connections_mu_);
      std::set<int>& mine = tenant_connections_[tenant];
      const int limit = std::max(1, tenant->quota().max_shm_regions());
      const int open = static_cast<int>(mine.size()) >= limit ? LiveConnections(mine) : 0;
      if (open >= limit) {
        answer = Answer(absl::ResourceExhaustedError(absl::StrCat(
            "tenant \"", tenant->name(), "\" has ", open,
            " shared-memory connections open, as many as its max_shm_regions")));
        const std::string bytes = answer.SerializeAsString();
        ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        return false;
      }
      mine.insert(c.fd);
    }
    c.tenant = tenant;
  } else if (m.kind_case() == v1::ShmClientMessage::kRegisterRegion) {
    if (fds.size() != 1) {
      answer = Answer(absl::InvalidArgumentError(absl::StrCat(
          "register_region takes exactly one fd (SCM_RIGHTS); ", fds.size(), " came")));
    } else {
      answer = Register(c, m.register_region(), fds[0].get());
    }
  } else if (m.kind_case() == v1::ShmClientMessage::kUnregisterRegion && fds.empty()) {
    answer = Unregister(c, m.unregister_region());
  } else if ((m.kind_case() == v1::ShmClientMessage::kRun ||
              m.kind_case() == v1::ShmClientMessage::kTrainStep) &&
             fds.empty() && own_thread) {
    return RunMessage(c, m);  // answered there
  } else {
    answer = Answer(absl::InvalidArgumentError(
        "after the ticket: register_region (with one fd), unregister_region, run or train_step "
        "(with none)"));
  }
  // Never an empty datagram: on a SOCK_SEQPACKET socket a client reads one
  // as the end of the connection (an all-default proto3 message has no bytes).
  if (answer.code() == 0 && answer.message().empty()) answer.set_message("ok");
  const std::string bytes = answer.SerializeAsString();
  // A client that does not read its answers is gone as far as kilnd cares.
  return ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(bytes.size());
}

v1::ShmServerMessage ShmRegistry::Register(Connection& c, const v1::ShmRegisterRegion& r, int fd) {
  const Tenant& tenant = *c.tenant;
  const std::string& id = r.region_id();
  if (!IsValidRegionId(id)) {
    return Answer(absl::InvalidArgumentError(absl::StrCat(
        "region id ", QuoteClientString(id), " must be 1 to 64 characters of [A-Za-z0-9._-]")));
  }
  {
    absl::MutexLock lock(&regions_mu_);
    auto t = regions_.find(tenant.name());
    if (t != regions_.end() && t->second.contains(id)) {
      return Answer(absl::AlreadyExistsError(absl::StrCat(
          "shared-memory region ", QuoteClientString(id), " is already registered")));
    }
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return Answer(absl::InvalidArgumentError(Errno("fstat of the fd")));
  if (!S_ISREG(st.st_mode)) {
    return Answer(absl::InvalidArgumentError(
        "the fd is not a regular file: register a memfd (memfd_create with MFD_ALLOW_SEALING)"));
  }
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return Answer(absl::InvalidArgumentError(Errno("fstatfs of the fd")));
  if (fs.f_type == HUGETLBFS_MAGIC) {
    return Answer(absl::InvalidArgumentError(
        "the fd is a hugetlbfs file (MFD_HUGETLB): kilnd maps regular shared memory only"));
  }
  // The seal first, the size after: once sealed it cannot shrink below
  // what is read next.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Answer(absl::FailedPreconditionError(
        "the region is not sealed against shrinking: create it with memfd_create(..., "
        "MFD_ALLOW_SEALING) and fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) after sizing it, so that it "
        "cannot be truncated under kilnd's mapping"));
  }
  if (::fstat(fd, &st) != 0) return Answer(absl::InvalidArgumentError(Errno("fstat of the fd")));
  if (st.st_size <= 0) return Answer(absl::InvalidArgumentError("the region is empty (size it first)"));
  const int64_t bytes = st.st_size;
  {
    absl::MutexLock lock(&regions_mu_);
    auto t = regions_.find(tenant.name());
    if (t != regions_.end()) {
      for (const auto& [other_id, region] : t->second) {
        if (region->dev() == st.st_dev && region->ino() == st.st_ino) {
          return Answer(absl::AlreadyExistsError(absl::StrCat(
              "this file is already registered as region ", QuoteClientString(other_id))));
        }
      }
    }
  }
  // The quota before the mapping.
  if (absl::Status s = usage_->Reserve(tenant, bytes); !s.ok()) return Answer(s);
  void* base = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = Errno("mmap");
    usage_->Release(tenant.name(), bytes);
    return Answer(absl::FailedPreconditionError(absl::StrCat(
        "cannot map the region read-write (", why,
        "); a region sealed against writes (F_SEAL_WRITE) cannot take outputs")));
  }
  auto region = std::make_shared<const ShmRegion>(id, tenant.name(), static_cast<char*>(base), bytes,
                                                  st.st_dev, st.st_ino, usage_);
  {
    absl::MutexLock lock(&regions_mu_);
    auto& mine = regions_[tenant.name()];
    // Another connection of the tenant may have taken the id meanwhile.
    if (!mine.emplace(id, region).second) {
      return Answer(absl::AlreadyExistsError(absl::StrCat(
          "shared-memory region ", QuoteClientString(id), " is already registered")));
    }
  }
  c.regions.push_back(id);
  spdlog::info("shm: tenant={} registered region {} ({} bytes)", tenant.name(),
               QuoteClientString(id), bytes);
  v1::ShmServerMessage ok;
  ok.set_region_id(id);
  ok.set_bytes(bytes);
  return ok;
}

v1::ShmServerMessage ShmRegistry::Unregister(Connection& c, const std::string& id) {
  auto it = std::find(c.regions.begin(), c.regions.end(), id);
  if (it == c.regions.end()) {
    return Answer(absl::NotFoundError(absl::StrCat(
        "region ", QuoteClientString(id), " was not registered on this connection")));
  }
  c.regions.erase(it);
  std::shared_ptr<const ShmRegion> gone;  // unmapped after the lock, unless a run holds it
  {
    absl::MutexLock lock(&regions_mu_);
    auto& mine = regions_[c.tenant->name()];
    if (auto r = mine.find(id); r != mine.end()) {
      gone = std::move(r->second);
      mine.erase(r);
    }
  }
  v1::ShmServerMessage ok;
  ok.set_region_id(id);
  return ok;
}

void ShmRegistry::Close(Connection& c) {
  if (c.tenant != nullptr && !c.regions.empty()) {
    std::vector<std::shared_ptr<const ShmRegion>> gone;
    {
      absl::MutexLock lock(&regions_mu_);
      auto& mine = regions_[c.tenant->name()];
      for (const std::string& id : c.regions) {
        if (auto r = mine.find(id); r != mine.end()) {
          gone.push_back(std::move(r->second));
          mine.erase(r);
        }
      }
    }
    spdlog::info("shm: tenant={} connection closed, {} region(s) unregistered", c.tenant->name(),
                 c.regions.size());
  }
  c.regions.clear();
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

}  // namespace kiln::server
