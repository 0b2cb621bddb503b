#include "server/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"

namespace kiln::server {
namespace {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("tls.", field, ": cannot read \"", path, "\""));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// OpenSSL's first queued error, for messages.
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;
using Cert = std::unique_ptr<X509, X509Deleter>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The PEM certificates in `pem`, in order; an error when there is none or
// one does not parse.
absl::StatusOr<std::vector<Cert>> ParseCertificates(const std::string& pem, const std::string& path,
                                                    const char* field) {
  Bio bio = MemoryBio(pem);
  std::vector<Cert> certs;
  for (;;) {
    Cert c(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!c) break;
    certs.push_back(std::move(c));
  }
  const unsigned long err = ERR_peek_last_error();
  // Running out of PEM blocks ends the loop with PEM_R_NO_START_LINE: normal.
  if (err != 0 && !(ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat("tls.", field, ": \"", path,
                                                   "\" holds a certificate that does not parse: ",
                                                   OpenSslError()));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls.", field, ": \"", path, "\" holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")"));
  }
  return certs;
}

}  // namespace

bool TlsEnabled(const v1::TlsConfig& tls) { return !tls.cert_file().empty(); }

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFrom(
    const v1::TlsConfig& tls) {
  if (!TlsEnabled(tls)) return grpc::InsecureServerCredentials();
  auto cert_pem = ReadPemFile(tls.cert_file(), "cert_file");
  if (!cert_pem.ok()) return cert_pem.status();
  auto key_pem = ReadPemFile(tls.key_file(), "key_file");
  if (!key_pem.ok()) return key_pem.status();
  auto certs = ParseCertificates(*cert_pem, tls.cert_file(), "cert_file");
  if (!certs.ok()) return certs.status();
  {
    Bio bio = MemoryBio(*key_pem);
    std::unique_ptr<EVP_PKEY, KeyDeleter> key(
        PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (!key) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls.key_file: \"", tls.key_file(),
                       "\" holds no unencrypted PEM private key: ", OpenSslError()));
    }
    if (X509_check_private_key(certs->front().get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("tls.key_file: the key in \"", tls.key_file(),
                       "\" is not the key of the certificate in \"", tls.cert_file(), "\""));
    }
  }
  std::string client_ca;
  if (!tls.client_ca_file().empty()) {
    auto ca = ReadPemFile(tls.client_ca_file(), "client_ca_file");
    if (!ca.ok()) return ca.status();
    auto parsed = ParseCertificates(*ca, tls.client_ca_file(), "client_ca_file");
    if (!parsed.ok()) return parsed.status();
    client_ca = std::move(ca).value();
  }
  if (!tls.crl_dir().empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(tls.crl_dir(), ec)) {
      return absl::NotFoundError(absl::StrCat("tls.crl_dir: \"", tls.crl_dir(),
                                              "\" is not a directory (CRLs hashed by "
                                              "`openssl rehash DIR`)"));
    }
  }

  using grpc::experimental::IdentityKeyCertPair;
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      client_ca, std::vector<IdentityKeyCertPair>{{*key_pem, *cert_pem}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!client_ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(tls.require_client_cert()
                                      ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!tls.crl_dir().empty()) options.set_crl_directory(tls.crl_dir());
  }
  return grpc::experimental::TlsServerCredentials(options);
}

PeerIdentity PeerIdentityOf(const grpc::ServerContextBase& ctx) {
  PeerIdentity id;
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return id;
  // A TLS peer is "authenticated" only by a certificate that verified.
  if (auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty()) return id;
  id.has_certificate = true;
  for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
    id.subject.assign(v.data(), v.size());
  }
  for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    id.sans.emplace_back(v.data(), v.size());
  }
  return id;
}

}  // namespace kiln::server
