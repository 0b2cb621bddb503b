// TLS and mTLS for kilnd's gRPC port (DESIGN.md section 7), from the
// config's TlsConfig: the server's credentials, and the identity a verified
// client certificate carries into tenant authentication.
//
// The handshake, chain verification and CRL checks are gRPC's and OpenSSL's
// (grpc::experimental::TlsServerCredentials); this file only reads and checks
// the PEM files at start, so that a wrong path, a key that does not match its
// certificate or a CRL directory that is missing is a start-up error naming
// the file rather than a handshake failure at the first call.
//
// Pure functions; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "kiln/v1/config.pb.h"
#include "server/tenants.h"

namespace kiln::server {

// True when the config turns TLS on (cert_file set; ValidateConfig checks
// that key_file comes with it).
bool TlsEnabled(const v1::TlsConfig& tls);

// Reads and checks tls's files and returns the gRPC port's credentials:
// insecure when TLS is off; TLS with tls's certificate and key; with a client
// CA, client certificates requested (or required) and verified against it,
// and against crl_dir's CRLs when set. Errors name the file and the field.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFrom(
    const v1::TlsConfig& tls);

// The identity in `ctx`'s auth context (no certificate on a plaintext port,
// or when the client sent none).
PeerIdentity PeerIdentityOf(const grpc::ServerContextBase& ctx);

}  // namespace kiln::server
