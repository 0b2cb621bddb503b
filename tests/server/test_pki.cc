#include "tests/server/test_pki.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kiln::testing {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `openssl ca`'s database, for revocations and CRLs.
constexpr char kCaConfig[] = R"([ca]
default_ca = kiln_test
[kiln_test]
database = ca.index
crlnumber = ca.crlnumber
certificate = ca.pem
private_key = ca.key
default_md = sha256
default_crl_days = 2
)";

}  // namespace

absl::Status TestPki::Sh(const std::string& command) const {
  const std::string log = dir_ + "/openssl.log";
  const std::string full =
      absl::StrCat("cd '", dir_, "' && { ", command, " ; } > '", log, "' 2>&1");
  const int rc = std::system(full.c_str());
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("`", command, "` failed (", rc, "): ", Slurp(log)));
}

absl::Status TestPki::Sign(const std::string& name, const std::string& subject,
                           const std::string& extensions, const std::string& ca) const {
  std::ofstream(dir_ + "/" + name + ".ext") << extensions << "\n";
  return Sh(absl::StrCat(
      "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
      ".key -out ", name, ".csr -subj '", subject, "' && openssl x509 -req -in ", name,
      ".csr -CA ", ca, ".pem -CAkey ", ca, ".key -CAcreateserial -days 2 -sha256 -extfile ", name,
      ".ext -out ", name, ".pem"));
}

absl::StatusOr<TestPki> TestPki::Create(const std::string& dir) {
  TestPki pki(dir);
  for (const char* ca : {"ca", "other-ca"}) {
    const std::string cn = std::string(ca) == "ca" ? "Kiln Test CA" : "Other CA";
    if (absl::Status s = pki.Sh(absl::StrCat(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
            ca, ".key -out ", ca, ".pem -days 2 -subj '/O=Kiln Test/CN=", cn, "'"));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = pki.Sign("kilnd", "/O=Kiln/CN=kilnd",
                                "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                "extendedKeyUsage=serverAuth",
                                "ca");
      !s.ok()) {
    return s;
  }
  std::ofstream(dir + "/ca.cnf") << kCaConfig;
  std::ofstream(dir + "/ca.index");
  std::ofstream(dir + "/ca.crlnumber") << "1000\n";
  if (absl::Status s = pki.Sh("mkdir -p crl && openssl ca -config ca.cnf -gencrl -out crl/ca.crl "
                              "&& openssl rehash crl");
      !s.ok()) {
    return s;
  }
  return pki;
}

absl::Status TestPki::MakeClient(const std::string& name, const std::string& cn,
                                 const std::string& san, bool by_other_ca) const {
  return Sign(name, absl::StrCat("/O=Kiln/CN=", cn),
              absl::StrCat("subjectAltName=", san, "\nextendedKeyUsage=clientAuth"),
              by_other_ca ? "other-ca" : "ca");
}

absl::Status TestPki::Revoke(const std::string& name) const {
  return Sh(absl::StrCat("openssl ca -config ca.cnf -revoke ", name,
                         ".pem && rm -f crl/* && openssl ca -config ca.cnf -gencrl -out "
                         "crl/ca.crl && openssl rehash crl"));
}

}  // namespace kiln::testing
