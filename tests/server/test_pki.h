// Test certificates made by the openssl CLI in the test, in a directory the
// test owns: a CA, a second CA nobody trusts, kilnd's certificate (SAN
// localhost and 127.0.0.1), client certificates, and CRLs in OpenSSL's hashed
// layout. Nothing is checked in: every run makes fresh keys.
//
// Thread-compatible (each call runs openssl processes in `dir`).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::testing {

class TestPki {
 public:
  // Makes ca.pem/ca.key ("Kiln Test CA"), other-ca.pem/.key ("Other CA") and
  // kilnd.pem/kilnd.key (signed by ca) under `dir`; an empty CRL for ca
  // under crl/. Errors carry openssl's output.
  static absl::StatusOr<TestPki> Create(const std::string& dir);

  // A client certificate `name`.pem / `name`.key with subject
  // "/O=Kiln/CN=<cn>" and subjectAltName `san` (e.g. "DNS:alice.clients.kiln"),
  // signed by ca (or by other-ca when `by_other_ca`).
  absl::Status MakeClient(const std::string& name, const std::string& cn, const std::string& san,
                          bool by_other_ca = false) const;
  // Revokes client `name` (made by ca) and rewrites crl/.
  absl::Status Revoke(const std::string& name) const;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }
  std::string crl_dir() const { return dir_ + "/crl"; }

 private:
  explicit TestPki(std::string dir) : dir_(std::move(dir)) {}
  // Runs `command` with /bin/sh in dir_; its output on failure.
  absl::Status Sh(const std::string& command) const;
  absl::Status Sign(const std::string& name, const std::string& subject,
                    const std::string& extensions, const std::string& ca) const;

  std::string dir_;
};

}  // namespace kiln::testing
