#include "clients/cpp/shm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kiln {
namespace {

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// How long kilnd may take to answer one socket message.
constexpr int kAnswerTimeoutMs = 10000;

}  // namespace

ShmRegion::~ShmRegion() {
  if (connection_) connection_->Unregister(id_).IgnoreError();
  ::munmap(data_, static_cast<size_t>(bytes_));
  ::close(fd_);
}

absl::StatusOr<std::shared_ptr<ShmConnection>> ShmConnection::Connect(v1::Kiln::Stub& stub,
                                                                      grpc::ClientContext& context) {
  v1::ConnectSharedMemoryRequest request;
  v1::ConnectSharedMemoryResponse ticket;
  const grpc::Status s = stub.ConnectSharedMemory(&context, request, &ticket);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  const std::string& name = ticket.socket();
  sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() >= sizeof(addr.sun_path)) {
    return absl::UnavailableError(absl::StrCat("kilnd named an unusable socket \"", name, "\""));
  }
  socklen_t len;
  if (name[0] == '@') {
    std::memcpy(addr.sun_path + 1, name.data() + 1, name.size() - 1);
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  } else {
    std::memcpy(addr.sun_path, name.data(), name.size());
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
  }
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("socket"));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const std::string why = Errno("connect");
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("kilnd's shared-memory socket ", name,
                                               " is not reachable from here (", why, ")"));
  }
  std::shared_ptr<ShmConnection> c(new ShmConnection(fd, name));
  c->max_regions_ = ticket.max_regions();
  c->max_bytes_ = ticket.max_bytes();
  c->max_run_message_bytes_ = ticket.max_run_message_bytes();
  c->train_steps_ = ticket.train_steps();
  v1::ShmClientMessage hello;
  hello.set_ticket(ticket.ticket());
  KILN_ASSIGN_OR_RETURN(v1::ShmServerMessage answer, c->Call(hello, -1));
  if (answer.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  }
  return c;
}

ShmConnection::~ShmConnection() { ::close(fd_); }

absl::StatusOr<v1::ShmServerMessage> ShmConnection::Call(const v1::ShmClientMessage& message,
                                                         int fd) {
  const std::string bytes = message.SerializeAsString();
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &fd, sizeof(int));
  }
  absl::MutexLock lock(&socket_mu_);
  if (::sendmsg(fd_, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError(Errno("sending to kilnd's shared-memory socket"));
  }
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, kAnswerTimeoutMs) != 1) {
    return absl::UnavailableError("kilnd's shared-memory socket did not answer");
  }
  char answer[4096];
  const ssize_t n = ::recv(fd_, answer, sizeof(answer), 0);
  if (n <= 0) return absl::UnavailableError("kilnd closed the shared-memory socket");
  v1::ShmServerMessage reply;
  if (!reply.ParseFromArray(answer, static_cast<int>(n))) {
    return absl::DataLossError("kilnd's shared-memory answer does not parse");
  }
  return reply;
}

std::optional<absl::StatusOr<v1::ShmServerMessage>> ShmConnection::TrySend(
    v1::ShmClientMessage& m, absl::Time deadline, const char* what) {
  if (deadline != absl::InfiniteFuture()) {
    // At least 1 ms: 0 would mean none.
    m.set_run_timeout_ms(std::max<int64_t>(
        1, absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)))));
  }
  const std::string bytes = m.SerializeAsString();
  if (static_cast<int64_t>(bytes.size()) > max_run_message_bytes_) return std::nullopt;
  if (!socket_mu_.TryLock()) return std::nullopt;
  struct Unlock {
    absl::Mutex* mu;
    ~Unlock() { mu->Unlock(); }
  } unlock{&socket_mu_};
  if (::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    const std::string doing = absl::StrCat("sending a ", what, " to kilnd's shared-memory socket");
    return absl::UnavailableError(Errno(doing.c_str()));
  }
  // kilnd answers at the deadline (DEADLINE_EXCEEDED) or when the run ends;
  // a second past it, it is not answering.
  int timeout_ms = -1;
  if (deadline != absl::InfiniteFuture()) {
    timeout_ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(deadline - absl::Now()) + 1000, 0, 1 << 30));
  }
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) {
      return absl::DeadlineExceededError(
          absl::StrCat("kilnd did not answer the ", what, " by its deadline"));
    }
    break;
  }
  run_answer_.resize(static_cast<size_t>(max_run_message_bytes_) + 1);
  const ssize_t n = ::recv(fd_, run_answer_.data(), run_answer_.size(), 0);
  if (n <= 0) {
    return absl::UnavailableError(
        absl::StrCat("kilnd closed the shared-memory socket during a ", what));
  }
  v1::ShmServerMessage reply;
  if (!reply.ParseFromArray(run_answer_.data(), static_cast<int>(n))) {
    return absl::DataLossError(absl::StrCat("kilnd's answer to a ", what, " does not parse"));
  }
  return reply;
}

std::optional<absl::StatusOr<v1::RunResponse>> ShmConnection::TryRun(
    const v1::RunRequest& request, absl::Time deadline) {
  if (!takes_runs()) return std::nullopt;
  v1::ShmClientMessage m;
  if (!request.SerializeToString(m.mutable_run())) return std::nullopt;
  std::optional<absl::StatusOr<v1::ShmServerMessage>> sent = TrySend(m, deadline, "run");
  if (!sent) return std::nullopt;
  if (!sent->ok()) return sent->status();
  const v1::ShmServerMessage& reply = **sent;
  if (reply.request_id().empty()) {
    // A kilnd that takes no runs on its socket answered as to an unknown
    // message (nothing ran): gRPC from now on.
    runs_refused_.store(true);
    return std::nullopt;
  }
  if (reply.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
  }
  v1::RunResponse response;
  if (!response.ParseFromString(reply.run_response())) {
    return absl::DataLossError("kilnd's RunResponse on the shared-memory socket does not parse");
  }
  return response;
}

std::optional<absl::StatusOr<v1::TrainStepResponse>> ShmConnection::TryTrainStep(
    const v1::TrainStepRequest& request, absl::Time deadline) {
  if (!takes_train_steps()) return std::nullopt;
  v1::ShmClientMessage m;
  if (!request.SerializeToString(m.mutable_train_step())) return std::nullopt;
  std::optional<absl::StatusOr<v1::ShmServerMessage>> sent =
      TrySend(m, deadline, "training step");
  if (!sent) return std::nullopt;
  if (!sent->ok()) return sent->status();
  const v1::ShmServerMessage& reply = **sent;
  if (reply.request_id().empty() ||
      (reply.code() == static_cast<int>(absl::StatusCode::kUnimplemented) &&
       absl::StrContains(reply.message(), "no training steps"))) {
    // Nothing ran: this kilnd takes no training steps here; gRPC from now on.
    train_steps_refused_.store(true);
    return std::nullopt;
  }
  if (reply.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
  }
  v1::TrainStepResponse response;
  if (!response.ParseFromString(reply.train_step_response())) {
    return absl::DataLossError(
        "kilnd's TrainStepResponse on the shared-memory socket does not parse");
  }
  return response;
}

absl::Status ShmConnection::RegisterFd(const std::string& id, int fd, int64_t* bytes) {
  v1::ShmClientMessage m;
  m.mutable_register_region()->set_region_id(id);
  KILN_ASSIGN_OR_RETURN(v1::ShmServerMessage answer, Call(m, fd));
  if (answer.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  }
  if (bytes != nullptr) *bytes = answer.bytes();
  return absl::OkStatus();
}

absl::Status ShmConnection::Unregister(const std::string& id) {
  v1::ShmClientMessage m;
  m.set_unregister_region(id);
  KILN_ASSIGN_OR_RETURN(v1::ShmServerMessage answer, Call(m, -1));
  if (answer.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(answer.code()), answer.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmConnection::CreateRegion(const std::string& id,
                                                                       int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("a shared-memory region needs bytes > 0");
  const int fd = ::memfd_create(("kiln-" + id).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::UnavailableError(Errno("memfd_create"));
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  if (::ftruncate(fd, bytes) != 0) return fail(absl::ResourceExhaustedError(Errno("ftruncate")));
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return fail(absl::UnavailableError(Errno("F_ADD_SEALS")));
  }
  void* data = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail(absl::ResourceExhaustedError(Errno("mmap")));
  if (absl::Status s = RegisterFd(id, fd); !s.ok()) {
    ::munmap(data, static_cast<size_t>(bytes));
    return fail(s);
  }
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(shared_from_this(), id, fd, static_cast<char*>(data), bytes));
}

bool IsLocalTarget(const std::string& target) {
  std::string t = absl::AsciiStrToLower(target);
  if (absl::StartsWith(t, "unix:") || absl::StartsWith(t, "unix-abstract:")) return true;
  for (const char* scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(t, scheme)) {
      t = t.substr(std::strlen(scheme));
      break;
    }
  }
  std::string host = t;
  if (!t.empty() && t[0] == '[') {
    host = t.substr(1, t.find(']') == std::string::npos ? std::string::npos : t.find(']') - 1);
  } else if (const size_t colon = t.rfind(':');
             colon != std::string::npos && t.find(':') == colon) {
    host = t.substr(0, colon);  // host:port (one colon; more is a bare IPv6 address)
  }
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

}  // namespace kiln
