// A Unix-domain-socket listener for kilnd's gRPC service (`--listen=...,
// unix:/run/kiln/kilnd.sock`), with the peer's credentials: each connection
// is accepted here, its peer's uid read (SO_PEERCRED), and then handed to
// the gRPC server as a plaintext HTTP/2 channel. A call on it without an API
// key is the tenant ServerConfig.unix_peer_tenants maps that uid to.
//
// Plaintext is fine here: the bytes go from one process to another through
// the kernel of one host, where no one else can read or alter them; the
// socket file's permissions and the peer's uid say who may call.
//
// Thread safety: thread-safe; one accepting thread per listener.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace kiln::server {

// `listen` split at commas into gRPC addresses and Unix socket paths (the
// entries "unix:<path>"). INVALID_ARGUMENT for an empty entry or path.
struct ListenAddresses {
  std::vector<std::string> grpc;        // host:port, as gRPC takes them
  std::vector<std::string> unix_paths;  // without "unix:"
};
absl::StatusOr<ListenAddresses> SplitListen(const std::string& listen);

class UnixListener {
 public:
  // Binds `path` (a socket file left by a kilnd that is gone is replaced;
  // one that answers is ALREADY_EXISTS), makes it connectable by every
  // user (the uid decides the tenant), and hands each accepted connection
  // to `server`, which must outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Create(const std::string& path,
                                                              grpc::Server* server);
  // Stops accepting and removes the socket file; connections already handed
  // to gRPC stay (the gRPC server ends them).
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // The uid of the process at the other end of a call's connection when it
  // came through a UnixListener: `peer` is the call's ServerContext::peer()
  // (gRPC names such connections "fd:<n>"). Nullopt for any other call.
  static std::optional<uint32_t> PeerUid(std::string_view peer);

 private:
  UnixListener(int fd, int wake_fd, std::string path, grpc::Server* server)
      : fd_(fd), wake_fd_(wake_fd), path_(std::move(path)), server_(server) {}
  void Accept();

  const int fd_;
  const int wake_fd_;
  const std::string path_;
  grpc::Server* const server_;
  std::atomic<bool> stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln::server
