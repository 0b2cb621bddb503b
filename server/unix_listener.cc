#include "server/unix_listener.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace kiln::server {
namespace {

// The uid behind each fd a UnixListener handed to gRPC. fds are the
// process's, so one table serves every listener: an fd number reused by a
// later connection is overwritten before gRPC sees the new connection, and
// only connections handed over here have "fd:<n>" peers.
absl::Mutex peers_mu;
absl::flat_hash_map<int, uint32_t>& Peers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peers_mu) {
  static auto* peers = new absl::flat_hash_map<int, uint32_t>();
  return *peers;
}

}  // namespace

absl::StatusOr<ListenAddresses> SplitListen(const std::string& listen) {
  ListenAddresses out;
  for (absl::string_view part : absl::StrSplit(listen, ',')) {
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen \"", listen, "\" has an empty address (addresses are comma-separated)"));
    }
    if (absl::StartsWith(part, "unix:")) {
      std::string path(part.substr(5));
      // sockaddr_un.sun_path: 108 bytes with the NUL.
      if (path.empty() || path.size() > 107) {
        return absl::InvalidArgumentError(
            absl::StrCat("listen: \"", part, "\" needs a socket path of 1 to 107 bytes"));
      }
      out.unix_paths.push_back(std::move(path));
      continue;
    }
    out.grpc.emplace_back(part);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Create(const std::string& path,
                                                                   grpc::Server* server) {
  sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return fail(absl::AlreadyExistsError(
          absl::StrCat("listen unix:", path, ": the path exists and is not a socket")));
    }
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool answered =
        probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) ::close(probe);
    if (answered) {
      return fail(absl::AlreadyExistsError(
          absl::StrCat("listen unix:", path, ": another process is listening there")));
    }
    ::unlink(path.c_str());
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", std::strerror(errno))));
  }
  ::chmod(path.c_str(), 0666);  // every user may connect; its uid picks the tenant
  if (::listen(fd, 128) != 0) {
    ::unlink(path.c_str());
    return fail(absl::InternalError(absl::StrCat("listen: ", std::strerror(errno))));
  }
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    ::unlink(path.c_str());
    return fail(absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno))));
  }
  std::unique_ptr<UnixListener> l(new UnixListener(fd, wake, path, server));
  l->thread_ = std::thread([raw = l.get()] { raw->Accept(); });
  return l;
}

UnixListener::~UnixListener() {
  stopping_.store(true);
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // Accept also polls with a timeout.
  }
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  ::close(wake_fd_);
  ::unlink(path_.c_str());
}

void UnixListener::Accept() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
    if (::poll(fds, 2, 1000) <= 0 || stopping_.load()) continue;
    if ((fds[1].revents & POLLIN) == 0) continue;
    for (;;) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) break;
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        spdlog::warn("unix:{}: SO_PEERCRED: {}; connection closed", path_, std::strerror(errno));
        ::close(c);
        continue;
      }
      {
        absl::MutexLock lock(&peers_mu);
        Peers()[c] = cred.uid;
      }
      grpc::AddInsecureChannelFromFd(server_, c);  // gRPC owns c from here
    }
  }
}

std::optional<uint32_t> UnixListener::PeerUid(std::string_view peer) {
  if (!peer.starts_with("fd:")) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(absl::string_view(peer.data() + 3, peer.size() - 3), &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&peers_mu);
  auto it = Peers().find(fd);
  if (it == Peers().end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln::server
